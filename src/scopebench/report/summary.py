"""The phase table: per solver run, mean / median / p95 / share of each timed phase."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.stats import summarize

__all__ = ["read_results", "phase_table", "format_phase_table", "short_labels", "PHASE_SUFFIXES"]

#: Per-region time columns, by backend: custom wall time, torch CPU time.
PHASE_SUFFIXES = ("_time_sec", "_cpu_sec")
_NOT_PHASES = {"total", "callback", "untracked", "compile"}


def read_results(path: str | Path):
    """A benchopt parquet as a pandas DataFrame (``ValueError`` naming a bad file)."""
    import pandas as pd

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {str(path)!r} does not exist")
    try:
        return pd.read_parquet(path)
    except Exception as err:  # pyarrow raises several unrelated types for a bad file
        raise ValueError(f"results file {str(path)!r} is not a readable parquet file: {err}") from None


def short_labels(names: list[str]) -> dict[str, str]:
    """``Name[k=v,...]`` labels reduced to the parameters that differ between runs.

    :Examples:
        >>> short_labels(["PnP[a=1,mode=custom]", "PnP[a=1,mode=torch]", "Denoiser[a=1]"])
        {'PnP[a=1,mode=custom]': 'PnP[mode=custom]', 'PnP[a=1,mode=torch]': 'PnP[mode=torch]', 'Denoiser[a=1]': 'Denoiser'}
    """

    def parse(name: str) -> tuple[str, dict[str, str]]:
        base, _, rest = name.partition("[")
        pairs = [p.split("=", 1) for p in rest.rstrip("]").split(",") if "=" in p]
        return base, dict(pairs)

    parsed = {name: parse(name) for name in names}
    labels = {}
    for name, (base, params) in parsed.items():
        siblings = [p for b, p in parsed.values() if b == base]
        keep = [k for k, v in params.items() if any(other.get(k) != v for other in siblings)]
        labels[name] = f"{base}[{','.join(f'{k}={params[k]}' for k in keep)}]" if keep else base
    return labels


def phase_table(df) -> list[dict[str, Any]]:
    """One row per (solver, phase): statistics over the recorded iterations.

    ``share_pct`` is the phase's mean divided by the mean of ``total_time_sec``
    (so shares need not add up to 100: callback and untracked time make the rest).
    Rows of iterations outside the profiler window (no ``total_time_sec``) are ignored.
    """
    rows: list[dict[str, Any]] = []
    if "objective_total_time_sec" not in df.columns:
        return rows
    labels = short_labels([str(n) for n in df["solver_name"].unique()])
    for solver, group in df.groupby("solver_name", sort=False):
        group = group[group["objective_total_time_sec"].notna()]
        if group.empty:
            continue
        total_mean = float(group["objective_total_time_sec"].mean())
        for column in group.columns:
            if not column.startswith("objective_") or not column.endswith(PHASE_SUFFIXES):
                continue
            phase = column.removeprefix("objective_")
            stem = phase.rsplit("_", 2)[0]
            values = group[column].dropna().tolist()
            if not values:
                continue
            s = summarize(values)
            rows.append(
                {
                    "solver": labels[str(solver)],
                    "phase": phase,
                    "n": s.count,
                    "mean_ms": s.mean * 1e3,
                    "median_ms": s.median * 1e3,
                    "p95_ms": s.p95 * 1e3,
                    "share_pct": (
                        (s.mean / total_mean * 100.0) if (total_mean > 0 and stem not in _NOT_PHASES) else None
                    ),
                }
            )
    return rows


def format_phase_table(rows: list[dict[str, Any]]) -> str:
    """Fixed-width text of :func:`phase_table` rows."""
    if not rows:
        return "no profiled iterations in these results"
    width = max(len("solver"), *(len(str(r["solver"])) for r in rows))
    phase_width = max(len("phase"), *(len(r["phase"]) for r in rows))
    header = f"{'solver':<{width}} {'phase':<{phase_width}} {'n':>4} {'mean ms':>10} {'median ms':>10} {'p95 ms':>10} {'share':>7}"
    lines = [header]
    for r in rows:
        share = f"{r['share_pct']:6.1f}%" if r["share_pct"] is not None else "      -"
        lines.append(
            f"{str(r['solver']):<{width}} {r['phase']:<{phase_width}} {r['n']:>4} {r['mean_ms']:>10.3f} "
            f"{r['median_ms']:>10.3f} {r['p95_ms']:>10.3f} {share:>7}"
        )
    return "\n".join(lines)
