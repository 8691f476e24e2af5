"""A/B comparison of two result sets: per matched configuration and region, B/A of the medians.

Matching: a configuration of A and one of B match when they have the same benchmark,
dataset, solver and parameters, *ignoring the parameters that tell A from B*: a parameter
whose values in A and in B have nothing in common (``fused_adamw`` False in every A run,
True in every B run; ``backend`` ddp vs zero2) is the change under test, so it is left out
of the match and printed once as the A/B difference.

Per region (and the step, ``step_time_sec`` = total - callback): ``ratio = median(B) / median(A)`` over
the recorded iterations, with a seeded percentile-bootstrap confidence interval
(:func:`scopebench.stats.median_ratio_ci`, iterations resampled). A row is flagged when its
interval excludes 1 (``slower`` above, ``faster`` below). With a 95 % interval about one
unchanged row in twenty is flagged by chance; raise ``level`` for many regions.

A matched pair whose sides ran under different contention (the host sampler's columns,
:func:`scopebench.report.contention.ab_note`) gets a note under its block, and its
flagged rows read ``slower?`` / ``faster?``: their interval is not a speed difference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from scopebench import stats
from scopebench.report.contention import ab_note, contention
from scopebench.report.results import Configuration

__all__ = ["Comparison", "Row", "compare", "format_comparison"]


@dataclass(frozen=True)
class Row:
    """One region of one matched configuration."""

    benchmark: str
    config: str
    """Label of the A configuration."""
    region: str
    n_a: int
    n_b: int
    median_a_ms: float
    median_b_ms: float
    ratio: float
    ci_low: float
    ci_high: float
    change: str | None
    """``slower`` / ``faster`` when the interval excludes 1, else ``None``."""
    contention: str | None = None
    """Why this pair's interval is not a speed difference (different contention), else ``None``."""


@dataclass
class Comparison:
    rows: list[Row]
    differences: dict[str, tuple[list[str], list[str]]]
    """Parameter -> (values in A, values in B) for the parameters that tell A from B."""
    unmatched_a: list[str]
    unmatched_b: list[str]
    level: float

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "differences": {k: {"a": a, "b": b} for k, (a, b) in self.differences.items()},
            "rows": [asdict(r) for r in self.rows],
            "unmatched_a": self.unmatched_a,
            "unmatched_b": self.unmatched_b,
        }


def _values(configs: list[Configuration]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for c in configs:
        for k, v in c.params().items():
            out.setdefault(k, set()).add(str(v))
    return out


def _key(c: Configuration, ignore: set[str]) -> tuple:
    params = tuple(sorted((k, str(v)) for k, v in c.params().items() if k not in ignore))
    return (c.benchmark, c.dataset.partition("[")[0], c.solver_base, params)


def _series(c: Configuration) -> dict[str, list[float]]:
    out = {r: c.region_values(r) for r in (*c.regions, *c.composites)}
    out["step"] = c.step_values()
    return {k: v for k, v in out.items() if v}


def compare(a: list[Configuration], b: list[Configuration], level: float = 0.95, seed: int = 0) -> Comparison:
    """Match configurations of ``a`` and ``b`` and compare each shared region's median (B/A)."""
    va, vb = _values(a), _values(b)
    differences = {k: (sorted(va[k]), sorted(vb[k])) for k in sorted(set(va) & set(vb)) if not (va[k] & vb[k])}
    ignore = set(differences)
    index_b: dict[tuple, list[Configuration]] = {}
    for c in b:
        index_b.setdefault(_key(c, ignore), []).append(c)
    rows: list[Row] = []
    matched_b: set[int] = set()
    unmatched_a = []
    for ca in a:
        candidates = [c for c in index_b.get(_key(ca, ignore), []) if id(c) not in matched_b]
        if not candidates or ca.recorded.empty:
            unmatched_a.append(ca.label)
            continue
        cb = candidates[0]
        matched_b.add(id(cb))
        sa, sb = _series(ca), _series(cb)
        note = ab_note(contention(ca), contention(cb))
        for region in [r for r in sa if r in sb]:
            ratio, low, high = stats.median_ratio_ci(sa[region], sb[region], level=level, seed=seed)
            change = "slower" if low > 1.0 else "faster" if high < 1.0 else None
            rows.append(
                Row(
                    benchmark=ca.benchmark,
                    config=ca.label,
                    region=region,
                    n_a=len(sa[region]),
                    n_b=len(sb[region]),
                    median_a_ms=stats.median(sa[region]) * 1e3,
                    median_b_ms=stats.median(sb[region]) * 1e3,
                    ratio=ratio,
                    ci_low=low,
                    ci_high=high,
                    change=change,
                    contention=note,
                )
            )
    unmatched_b = [c.label for c in b if id(c) not in matched_b]
    return Comparison(rows, differences, unmatched_a, unmatched_b, level)


def format_comparison(result: Comparison) -> str:
    """Text table: one block per matched configuration, flagged rows marked ``*``."""
    lines = []
    if result.differences:
        lines.append(
            "A/B difference: "
            + "; ".join(f"{k}: {','.join(a)} -> {','.join(b)}" for k, (a, b) in result.differences.items())
        )
    pct = f"{result.level * 100:g}%"
    current = None
    for r in result.rows:
        if (r.benchmark, r.config) != current:
            current = (r.benchmark, r.config)
            lines.append(f"\n== {r.config} ({r.benchmark}) ==")
            if r.contention:
                lines.append(f"! contended: {r.contention}")
            lines.append(
                f"{'region':<18} {'n A/B':>9} {'A median ms':>12} {'B median ms':>12} {'B/A':>7}  {pct + ' CI':<18}"
            )
        flag = (f"* {r.change}" + ("?" if r.contention else "")) if r.change else ""
        n = f"{r.n_a}/{r.n_b}"
        lines.append(
            f"{r.region:<18} {n:>9} {r.median_a_ms:>12.3f} {r.median_b_ms:>12.3f} {r.ratio:>7.3f}  "
            f"[{r.ci_low:.3f}, {r.ci_high:.3f}]  {flag}"
        )
    flagged = [r for r in result.rows if r.change]
    lines.append(
        f"\n{len(flagged)} of {len(result.rows)} rows changed ({pct} bootstrap interval of B/A excludes 1)"
        if result.rows
        else "\nno configuration of A matches one of B"
    )
    doubtful = sorted({r.config for r in result.rows if r.contention})
    if doubtful:
        lines.append(
            f"different contention on the two sides of {', '.join(doubtful)}: their B/A intervals are not speed "
            "differences (rows marked ?); rerun both sides on a quiet machine"
        )
    for side, names in (("A", result.unmatched_a), ("B", result.unmatched_b)):
        if names:
            lines.append(f"unmatched in {side}: {', '.join(names)}")
    return "\n".join(lines).lstrip("\n")
