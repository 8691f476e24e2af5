"""The validation benchmark's results page (docs/validation.md) and its matrix, from its parquet files.

``python benchmark_validation/make_page.py <parquet>...`` calls :func:`write_page`: every run of
the benchmark is read as its last row (the run's final score, :func:`runs`), then

* :func:`matrix`: per fault (and phase) x backend x profiler mode, the runs, the detection and
  naming rates, the median and p95 ``error_pct``, the false positives, the median steps to
  detect and the median overhead with the median of the runs' 95 % intervals;
* :func:`null_runs`: per backend x mode, the false positives per 100 runs without a fault and the
  rules behind them, and how many of those runs the machine was busy (``contended``);
* :func:`delay_sweep`: the ``late_rank`` runs in ``bwd`` by delay, and the smallest delay from
  which every run was named right (every step, 2 ranks);
* :func:`against_performance`: the overhead column beside docs/performance.md's measurement of
  the same mode.

The page is the tables between a fixed text (``docs/validation.md``'s template: what each column
means, what changed in the detectors, the cluster recipe), with the command, the date, the
machine and its load of the run. The matrix is also drawn (``matrix.png``: the rate named right,
fault x configuration) and written as one self-contained HTML file (``matrix.html``).
"""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from scopebench import stats

__all__ = [
    "PERFORMANCE_REFERENCE",
    "MatrixTable",
    "against_performance",
    "delay_sweep",
    "matrix",
    "null_runs",
    "run_table",
    "runs",
    "write_page",
]

#: docs/performance.md, "The ledger's cost": 2 gloo ranks, DDP, the custom profiler with the
#: ledger against ``SCOPEBENCH_LEDGER=0``: median step on / off per round 0.96 [0.85-1.04]
#: (2026-12-06). The closest measurement of what ``overhead_pct`` measures for ``custom``; no
#: section there measures the torch backend on a distributed step.
PERFORMANCE_REFERENCE = {"custom": (0.96, 0.85, 1.04)}
_KEYS = ("fault", "phase", "delay_ms", "every", "magnitude")
_NAN = float("nan")


def runs(paths: Iterable[str | Path]):
    """One row per run of the validation benchmark in the files named by ``paths`` (:func:`run_table`)."""
    from scopebench.report.results import load_results

    return run_table(load_results(paths))


def run_table(df):
    """One row per run of the validation benchmark in a benchopt results frame (its last
    evaluation), with plain column names: the dataset's and solver's parameters (``fault``,
    ``backend``, ``profiler_mode``...) and the objective columns without their ``objective_`` prefix."""
    import pandas as pd

    df = df[df["objective_name"].astype(str).str.startswith("validation")]
    if df.empty:
        raise ValueError("no run of the validation benchmark in the files given")
    keys = [c for c in ("result_file", "dataset_name", "solver_name", "idx_rep") if c in df.columns]
    last = df.sort_values("stop_val").groupby(keys, sort=False).tail(1)
    out = pd.DataFrame(
        {
            **{k: last[f"p_dataset_{k}"] for k in (*_KEYS, "rank", "step", "seed") if f"p_dataset_{k}" in last},
            **{k: last[f"p_solver_{k}"] for k in ("backend", "profiler_mode", "nproc_per_node", "profiler_memory")},
            **{c.removeprefix("objective_"): last[c] for c in last.columns if c.startswith("objective_")},
        }
    )
    memory = out["profiler_memory"].map(lambda v: v is True or v == 1 or str(v).lower() == "true")
    out["mode"] = [f"{m} + memory" if on else str(m) for m, on in zip(out["profiler_mode"], memory)]
    return out.reset_index(drop=True)


class MatrixTable:
    """``benchopt plot``'s view of the matrix (``plots/validation_matrix.py``): one row per fault x
    backend x profiler mode (:func:`matrix`), a table."""

    name = "validation_matrix"
    type = "table"
    options: dict = {}
    _COLUMNS = ("case", "backend", "mode", "runs", "detected_pct", "named_right_pct", "error_median_pct",
                "error_p95_pct", "false_positive_pct", "steps_to_detect", "overhead_pct")  # fmt: skip

    def plot(self, df):
        def cell(value):
            return None if isinstance(value, float) and math.isnan(value) else value

        return [[cell(m[c]) for c in self._COLUMNS] for m in matrix(run_table(df))]

    def get_metadata(self, df):
        return {
            "title": "What the suite found against the injected fault (docs/validation.md)",
            "columns": ["fault", "backend", "mode", "runs", "detected %", "named right %", "median error %",
                        "p95 error %", "false positive %", "steps to detect", "overhead %"],  # fmt: skip
            "default_order_column": 0,
            "default_order_ascending": True,
        }


def _mean_pct(values) -> float:
    values = [float(v) for v in values if v == v]
    return stats.mean(values) * 100.0 if values else _NAN


def _median(values) -> float:
    values = [float(v) for v in values if v == v]
    return stats.median(values) if values else _NAN


def _p95(values) -> float:
    values = [float(v) for v in values if v == v]
    return stats.percentile(values, 95) if values else _NAN


def _case(row) -> str:
    """A fault's short name with what varies.

    :Examples:
        >>> _case({"fault": "late_rank", "phase": "bwd", "delay_ms": 100.0, "every": 4})
        'late_rank bwd 100 ms 1/4'
        >>> _case({"fault": "memory_growth", "magnitude": 4.0, "every": 1})
        'memory_growth 4 MiB/step'
    """
    fault = row["fault"]
    if fault == "late_rank":
        name = f"late_rank {row['phase']} {row['delay_ms']:g} ms"
    elif fault == "slow_input":
        name = f"slow_input {row['delay_ms']:g} ms"
    elif fault in ("contention", "memory_growth", "comm_heavy") and row.get("magnitude") == row.get("magnitude"):
        unit = {"contention": " hogs", "memory_growth": " MiB/step", "comm_heavy": " M params"}[fault]
        name = f"{fault} {row['magnitude']:g}{unit}" if row.get("magnitude") is not None else fault
    elif fault == "nonfinite":
        name = f"nonfinite step {row.get('step')}"
    else:
        name = fault
    every = row.get("every", 1)
    return name + (f" 1/{int(every)}" if every == every and every and int(every) > 1 else "")


def matrix(table) -> list[dict[str, Any]]:
    """Per case (:func:`_case`) x backend x profiler mode, the figures of the page's first table."""
    out = []
    table = table.assign(case=[_case(r) for _, r in table.iterrows()])
    for (case, backend, mode), group in table.groupby(["case", "backend", "mode"], sort=True):
        fault = group["fault"].iloc[0]
        out.append(
            {
                "case": case,
                "fault": fault,
                "backend": backend,
                "mode": mode,
                "runs": len(group),
                "detected_pct": _NAN if fault == "none" else _mean_pct(group["detected"]),
                "named_right_pct": _NAN if fault == "none" else _mean_pct(group["named_right"]),
                "error_median_pct": _median(group["error_pct"]),
                "error_p95_pct": _p95(group["error_pct"]),
                "delay_error_median_pct": _median(group["delay_error_pct"]) if "delay_error_pct" in group else _NAN,
                "false_positive_pct": _mean_pct(group["false_positive"]),
                "steps_to_detect": _median(group["steps_to_detect"]),
                "overhead_pct": _median(group["overhead_pct"]),
                "overhead_low_pct": _median(group["overhead_low_pct"]),
                "overhead_high_pct": _median(group["overhead_high_pct"]),
            }
        )
    return out


def null_runs(table) -> list[dict[str, Any]]:
    """Per backend x mode, the runs without a fault: false positives per 100 runs and their rules."""
    out = []
    none = table[table["fault"] == "none"]
    for (backend, mode), group in none.groupby(["backend", "mode"], sort=True):
        rules: dict[str, int] = {}
        for text in group["false_positive_rules"].fillna(""):
            for rule in filter(None, str(text).split(",")):
                rules[rule] = rules.get(rule, 0) + 1
        out.append(
            {
                "backend": backend,
                "mode": mode,
                "runs": len(group),
                "false_positives_per_100": _mean_pct(group["false_positive"]),
                "rules": ", ".join(f"{r} ({n})" for r, n in sorted(rules.items())),
                "late_rank_per_100": _mean_pct(
                    ["late-rank" in str(f).split(",") for f in group["findings"].fillna("")]
                ),
                "contended_pct": _mean_pct(group["contended"]),
            }
        )
    return out


def delay_sweep(table) -> list[dict[str, Any]]:
    """Per backend x mode, the rate named right of ``late_rank`` in ``bwd`` every step at each delay,
    and the smallest delay from which every run at that delay and above was named right."""
    sweep = table[(table["fault"] == "late_rank") & (table["phase"] == "bwd") & (table["every"] == 1)]
    out = []
    for (backend, mode), group in sweep.groupby(["backend", "mode"], sort=True):
        rates = {float(d): _mean_pct(g["named_right"]) for d, g in group.groupby("delay_ms")}
        smallest = None
        for delay in sorted(rates, reverse=True):
            if rates[delay] < 100.0:
                break
            smallest = delay
        out.append({"backend": backend, "mode": mode, "rates": rates, "smallest_ms": smallest})
    return out


def against_performance(table) -> list[dict[str, Any]]:
    """Per mode, the median ``overhead_pct`` of every run beside :data:`PERFORMANCE_REFERENCE`:
    whether the step ratio falls in the interval docs/performance.md measured."""
    out = []
    for mode, group in table.groupby("mode", sort=True):
        if mode.endswith("+ memory"):  # the tracker's cost is another figure
            continue
        ratio = 1.0 + _median(group["overhead_pct"]) / 100.0
        low = 1.0 + _median(group["overhead_low_pct"]) / 100.0
        high = 1.0 + _median(group["overhead_high_pct"]) / 100.0
        reference = PERFORMANCE_REFERENCE.get(str(mode))
        within = None if reference is None or ratio != ratio else reference[1] <= ratio <= reference[2]
        out.append({"mode": mode, "runs": len(group), "ratio": ratio, "low": low, "high": high})
        out[-1].update(reference=reference, within=within)
    return out


def _fmt(value: Any, spec: str = ".0f", suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return f"{value:{spec}}{suffix}"


def _markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join([*lines, *("| " + " | ".join(r) + " |" for r in rows)])


def tables(table) -> dict[str, str]:
    """The page's tables as Markdown, by the name of their place in the template."""
    first = [
        [
            m["case"], m["backend"], m["mode"], str(m["runs"]), _fmt(m["detected_pct"], ".0f", " %"),
            _fmt(m["named_right_pct"], ".0f", " %"), _fmt(m["error_median_pct"], ".1f", " %"),
            _fmt(m["error_p95_pct"], ".1f", " %"), _fmt(m["delay_error_median_pct"], ".1f", " %"),
            _fmt(m["false_positive_pct"], ".0f", " %"),
            _fmt(m["steps_to_detect"], ".0f"),
            f"{_fmt(m['overhead_pct'], '+.1f', ' %')} [{_fmt(m['overhead_low_pct'], '+.1f')}, "
            f"{_fmt(m['overhead_high_pct'], '+.1f')}]",
        ]
        for m in matrix(table)
    ]  # fmt: skip
    header = ["fault", "backend", "mode", "runs", "detected", "named right", "median error", "p95 error",
              "median delay error", "false positive", "steps to detect", "overhead [95 % interval]"]  # fmt: skip
    nulls = [
        [n["backend"], n["mode"], str(n["runs"]), _fmt(n["false_positives_per_100"], ".0f"),
         n["rules"] or "–", _fmt(n["late_rank_per_100"], ".0f"), _fmt(n["contended_pct"], ".0f", " %")]
        for n in null_runs(table)
    ]  # fmt: skip
    sweep = delay_sweep(table)
    delays = sorted({d for s in sweep for d in s["rates"]})
    sweep_rows = [
        [s["backend"], s["mode"], *(_fmt(s["rates"].get(d), ".0f", " %") for d in delays),
         _fmt(s["smallest_ms"], "g", " ms")]
        for s in sweep
    ]  # fmt: skip
    perf = [
        [str(p["mode"]), str(p["runs"]), f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]",
         "–" if p["reference"] is None else "{:.2f} [{:.2f}, {:.2f}]".format(*p["reference"]),
         {True: "yes", False: "no", None: "–"}[p["within"]]]
        for p in against_performance(table)
    ]  # fmt: skip
    return {
        "MATRIX": _markdown(header, first),
        "NULL_RUNS": _markdown(
            ["backend", "mode", "runs", "false positives / 100", "rules (runs)", "late-rank / 100", "contended"], nulls
        ),
        "DELAY_SWEEP": _markdown(["backend", "mode", *(f"{d:g} ms" for d in delays), "named right from"], sweep_rows),
        "PERFORMANCE": _markdown(
            ["mode", "runs", "step ratio on / off, median [interval]", "performance.md", "within"], perf
        ),
    }


def conditions(table) -> str:
    """The machine and its load over the runs: one sentence for the page's header."""
    loads = [
        float(v) for c in ("load_average_1m_start", "load_average_1m_end") if c in table for v in table[c] if v == v
    ]
    contended = _mean_pct(table["contended"])
    load = f"load average {min(loads):.1f}–{max(loads):.1f}" if loads else "load average not recorded"
    return f"{len(table)} runs; {load}; the host sampler found other processes' work (`contended`) in {contended:.0f} % of them"


def draw_matrix(table, path: Path) -> Path:
    """``matrix.png``: the rate named right (``none``: 100 - false positives) per case x configuration."""
    from scopebench.report.drawing import pyplot

    cells = matrix(table)
    cases = sorted({c["case"] for c in cells})
    configs = sorted({(c["backend"], c["mode"]) for c in cells})
    grid = [[_NAN] * len(configs) for _ in cases]
    for c in cells:
        value = 100.0 - c["false_positive_pct"] if c["fault"] == "none" else c["named_right_pct"]
        grid[cases.index(c["case"])][configs.index((c["backend"], c["mode"]))] = value
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.2 * len(configs) + 3, 0.45 * len(cases) + 1.5))
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0, vmax=100, aspect="auto")
    ax.set_xticks(range(len(configs)), [f"{b}\n{m}" for b, m in configs])
    ax.set_yticks(range(len(cases)), cases)
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            if value == value:
                ax.text(j, i, f"{value:.0f}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="% of runs named right (none: without a false positive)")
    ax.set_title("What the suite found, against the injected fault")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _html(parts: dict[str, str], png: Path, header: str) -> str:
    image = base64.b64encode(png.read_bytes()).decode("ascii")

    def table(markdown: str) -> str:
        lines = [line.strip("|").split(" | ") for line in markdown.splitlines() if not line.startswith("|---")]
        head, *body = lines
        cells = "".join(f"<th>{html.escape(h.strip())}</th>" for h in head)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(c.strip())}</td>" for c in r) + "</tr>" for r in body)
        return f"<table><tr>{cells}</tr>{rows}</table>"

    sections = "".join(
        f"<h2>{html.escape(name.replace('_', ' ').lower())}</h2>{table(md)}" for name, md in parts.items()
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>scopebench validation</title><style>"
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:2px 6px;text-align:right}</style></head><body>"
        f"<h1>scopebench validation</h1><p>{html.escape(header)}</p>"
        f"<img alt='matrix' src='data:image/png;base64,{image}'>{sections}</body></html>"
    )


def write_page(
    paths: Iterable[str | Path],
    template: str | Path,
    page: str | Path,
    out_dir: str | Path,
    command: str,
    date: str,
    note: str = "",
) -> dict[str, Path]:
    """Write the page (``template`` with its ``<!-- NAME -->`` lines replaced by :func:`tables`
    and ``<!-- CONDITIONS -->`` by the command, the date, :func:`conditions` and ``note``),
    ``matrix.png`` and ``matrix.html`` in ``out_dir``; returns their paths."""
    from scopebench.atomic import atomic_write

    table = runs(list(paths))
    parts = tables(table)
    header = f"`{command}`, {date}: {conditions(table)}." + (f"\n\n{note}" if note else "")
    text = Path(template).read_text(encoding="utf-8")
    for name, markdown in {**parts, "CONDITIONS": header}.items():
        marker = f"<!-- {name} -->"
        if marker not in text:
            raise ValueError(f"template {str(template)!r} has no {marker} line")
        text = text.replace(marker, markdown)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    png = draw_matrix(table, out / "matrix.png")
    with atomic_write(Path(page), "w", encoding="utf-8") as fh:
        fh.write(text)
    with atomic_write(out / "matrix.html", "w", encoding="utf-8") as fh:
        fh.write(_html(parts, png, header))
    return {"page": Path(page), "png": png, "html": out / "matrix.html"}
