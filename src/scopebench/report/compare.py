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

What is not compared is said, never dropped (:class:`NotCompared`): a configuration on one
side only (``unmatched_a`` / ``unmatched_b``), one with no recorded iteration, a region (or
peak memory column) one side of a pair lacks, a region whose A median is 0 (no ratio; the
pair's other regions are compared). A row whose times lost non-finite values when the files
were read (:meth:`scopebench.report.results.Configuration.non_finite`) carries them in
``non_finite``.

The gate (:func:`gate`, ``compare --fail-slower PCT``, ``--fail-memory PCT``) turns the rows
into one verdict for a CI job: **regression** when a row's whole interval lies above its
limit (B slower than A by more than ``PCT`` %, at the interval's level) or a peak memory
column of B exceeds A's by more than its ``PCT``; **pass** when its whole interval lies at
or below the limit, however few the iterations (:func:`scopebench.stats.median_ratio_ci`
keeps the interval honest at small samples); **inconclusive** when a row cannot say: either
side ran contended, non-finite times were left out of it, or its interval straddles the
limit (too noisy, or too few iterations: from 3 a side at 95 % no interval exists). Every
configuration, region or memory column the thresholds cover that was not compared is an
inconclusive row naming it: the gate never passes what it did not compare. Any regression
makes the run's verdict a regression, else any inconclusive row makes it inconclusive. Exit
status (:data:`GATE_EXIT`): 0 pass, 1 regression, 3 inconclusive. A region threshold naming
a region neither side records is refused (``ValueError`` listing the known ones).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from scopebench import stats
from scopebench.report.contention import ab_note, contention
from scopebench.report.results import Configuration

__all__ = [
    "GATE_EXIT",
    "MEMORY_COLUMNS",
    "STEP_COLUMNS",
    "Comparison",
    "Gate",
    "GateRow",
    "MemoryRow",
    "NotCompared",
    "Row",
    "compare",
    "format_comparison",
    "format_gate",
    "gate",
]

#: Peak memory columns the gate compares (``--fail-memory``): B's maximum over its recorded
#: rows against A's.
MEMORY_COLUMNS = ("max_rss_mb", "max_gpu_mb")
#: The time columns the step is derived from (:func:`scopebench.report.results.step_times`):
#: a non-finite value in one of them touches the step; in the total, whose row is then no
#: longer recorded, every region of the configuration too.
STEP_COLUMNS = ("total_time_sec", "step_time_sec", "callback_time_sec")
PASS, REGRESSION, INCONCLUSIVE = "pass", "regression", "inconclusive"
_ONLY_IN = {side: f"in {side} only: no configuration of {other} matches it" for side, other in (("A", "B"), ("B", "A"))}
#: ``compare``'s exit status for each verdict of the gate (2 stays a refused input).
GATE_EXIT = {PASS: 0, REGRESSION: 1, INCONCLUSIVE: 3}


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
    non_finite: str | None = None
    """The non-finite times left out of this row's values (``B: 2 in total_time_sec``), else ``None``."""


@dataclass(frozen=True)
class NotCompared:
    """A configuration, region or peak memory column that was not compared, and why."""

    benchmark: str
    config: str
    """Label of the configuration (of the side that has it)."""
    what: str
    """``configuration``, a region, ``step``, or a memory column."""
    reason: str


@dataclass(frozen=True)
class MemoryRow:
    """One peak memory column of one matched configuration: the maxima over the recorded rows."""

    benchmark: str
    config: str
    column: str
    max_a_mb: float
    max_b_mb: float

    @property
    def ratio(self) -> float:
        return self.max_b_mb / self.max_a_mb if self.max_a_mb > 0 else float("inf")


@dataclass
class Comparison:
    rows: list[Row]
    differences: dict[str, tuple[list[str], list[str]]]
    """Parameter -> (values in A, values in B) for the parameters that tell A from B."""
    unmatched_a: list[str]
    unmatched_b: list[str]
    level: float
    memory: list[MemoryRow] = field(default_factory=list)
    """The peak memory columns both sides of a pair hold."""
    contended: dict[str, str] = field(default_factory=dict)
    """Configuration (A's label) -> which sides ran contended and how (absent: neither)."""
    not_compared: list[NotCompared] = field(default_factory=list)
    """What was not compared (unmatched configurations included), in the order met."""
    regions: list[str] = field(default_factory=list)
    """Every region either side records, and ``step``: what a region threshold may name."""
    pairs: int = 0
    """How many configurations of A matched one of B (compared or not)."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "differences": {k: {"a": a, "b": b} for k, (a, b) in self.differences.items()},
            "rows": [{**asdict(r), "ci_high": _finite(r.ci_high)} for r in self.rows],
            "memory": [{**asdict(m), "ratio": m.ratio} for m in self.memory],
            "contended": self.contended,
            "unmatched_a": self.unmatched_a,
            "unmatched_b": self.unmatched_b,
            "not_compared": [asdict(n) for n in self.not_compared],
            "regions": self.regions,
            "pairs": self.pairs,
        }


def _finite(value: float | None) -> float | None:
    """``value``, or ``None`` for an unbounded end (JSON has no infinity)."""
    return value if value is None or math.isfinite(value) else None


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


def _non_finite(c: Configuration, side: str) -> dict[str, str]:
    """Region (or ``step``) of ``c`` -> the non-finite times left out of it, as a note."""
    lost = c.non_finite()
    if not lost:
        return {}
    columns = {"step": STEP_COLUMNS, **{r: ("total_time_sec", c.region_columns[r]) for r in c.region_columns}}
    notes = {}
    for region, names in columns.items():
        found = [f"{lost[name]} in {name}" for name in names if name in lost]
        if found:
            notes[region] = f"{side}: {', '.join(found)}"
    return notes


def compare(a: list[Configuration], b: list[Configuration], level: float = 0.95, seed: int = 0) -> Comparison:
    """Match configurations of ``a`` and ``b`` and compare each shared region's median (B/A);
    what cannot be compared is listed in :attr:`Comparison.not_compared` (module docstring)."""
    va, vb = _values(a), _values(b)
    differences = {k: (sorted(va[k]), sorted(vb[k])) for k in sorted(set(va) & set(vb)) if not (va[k] & vb[k])}
    ignore = set(differences)
    index_b: dict[tuple, list[Configuration]] = {}
    for c in b:
        index_b.setdefault(_key(c, ignore), []).append(c)
    rows: list[Row] = []
    memory: list[MemoryRow] = []
    contended: dict[str, str] = {}
    skipped: list[NotCompared] = []
    matched_b: set[int] = set()
    unmatched_a = []
    for ca in a:
        candidates = [c for c in index_b.get(_key(ca, ignore), []) if id(c) not in matched_b]
        if not candidates:
            unmatched_a.append(ca.label)
            skipped.append(NotCompared(ca.benchmark, ca.label, "configuration", _ONLY_IN["A"]))
            continue
        cb = candidates[0]
        matched_b.add(id(cb))
        empty = [side for side, c in (("A", ca), ("B", cb)) if c.recorded.empty]
        if empty:
            which = " and ".join(empty)
            skipped.append(NotCompared(ca.benchmark, ca.label, "configuration", f"{which} recorded no iteration of it"))
            continue
        sa, sb = _series(ca), _series(cb)
        hosts = {"A": contention(ca), "B": contention(cb)}
        note = ab_note(hosts["A"], hosts["B"])
        busy = [f"{side}: {host.text()}" for side, host in hosts.items() if host is not None and host.contended]
        if busy:
            contended[ca.label] = "; ".join(busy)
        lost_a, lost_b = _non_finite(ca, "A"), _non_finite(cb, "B")
        for column in MEMORY_COLUMNS:
            peaks = [max(c.values(column), default=None) for c in (ca, cb)]
            if None not in peaks and min(peaks) > 0:  # a GPU column of a CPU run holds 0
                memory.append(MemoryRow(ca.benchmark, ca.label, column, *peaks))
            elif any(p is not None and p > 0 for p in peaks):
                side = "A" if peaks[0] else "B"
                skipped.append(NotCompared(ca.benchmark, ca.label, column, f"only {side} records a peak"))
        for region in [*sa, *[r for r in sb if r not in sa]]:
            lost = "; ".join(n for n in (lost_a.get(region), lost_b.get(region)) if n) or None
            if region not in sa or region not in sb:
                side = "A" if region in sa else "B"
                why = f"only {side} records it" + (f" (non-finite times left out: {lost})" if lost else "")
                skipped.append(NotCompared(ca.benchmark, ca.label, region, why))
                continue
            median_a = stats.median(sa[region])
            if median_a <= 0.0:
                why = f"A's median is {median_a * 1e3:g} ms: B/A has no value"
                skipped.append(NotCompared(ca.benchmark, ca.label, region, why))
                continue
            ratio, low, high = stats.median_ratio_ci(sa[region], sb[region], level=level, seed=seed)
            change = "slower" if low > 1.0 else "faster" if high < 1.0 else None
            rows.append(
                Row(
                    benchmark=ca.benchmark,
                    config=ca.label,
                    region=region,
                    n_a=len(sa[region]),
                    n_b=len(sb[region]),
                    median_a_ms=median_a * 1e3,
                    median_b_ms=stats.median(sb[region]) * 1e3,
                    ratio=ratio,
                    ci_low=low,
                    ci_high=high,
                    change=change,
                    contention=note,
                    non_finite=lost,
                )
            )
    unmatched_b = [c.label for c in b if id(c) not in matched_b]
    skipped += [NotCompared(c.benchmark, c.label, "configuration", _ONLY_IN["B"]) for c in b if id(c) not in matched_b]
    regions = sorted({r for c in (*a, *b) for r in (*c.regions, *c.composites)} | {"step"})
    return Comparison(
        rows, differences, unmatched_a, unmatched_b, level, memory, contended, skipped, regions, len(matched_b)
    )


# -- the gate --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GateRow:
    """The verdict on one gated row: a region (or the step) or a peak memory column."""

    benchmark: str
    config: str
    what: str
    """The region, ``step``, the memory column, or ``configuration``."""
    limit: float | None
    """The largest B/A that passes (1 + PCT / 100); None for a configuration not compared."""
    ratio: float | None
    """B/A; None for what was not compared."""
    ci_low: float | None
    ci_high: float | None
    """The interval of a time row (None for memory: peaks have none; ``ci_high`` None when
    the interval is unbounded, or nothing was compared)."""
    verdict: str
    reason: str


@dataclass
class Gate:
    """The gate's verdict on a comparison: one of ``pass``, ``regression``, ``inconclusive``."""

    verdict: str
    rows: list[GateRow]

    @property
    def exit_status(self) -> int:
        return GATE_EXIT[self.verdict]

    def as_dict(self) -> dict[str, Any]:
        rows = [{**asdict(r), "ci_high": _finite(r.ci_high)} for r in self.rows]
        return {"verdict": self.verdict, "exit_status": self.exit_status, "rows": rows}


def gate(
    result: Comparison,
    *,
    slower_pct: float | None = None,
    region_pct: dict[str, float] | None = None,
    memory_pct: float | None = None,
) -> Gate:
    """The gate's verdict (module docstring) on every row a threshold applies to, and on
    everything those thresholds cover that was not compared.

    Args:
        result: :func:`compare`'s comparison.
        slower_pct: Largest slow-down in percent that passes, for every region and the step.
        region_pct: Region (or ``step``) -> its own threshold; with ``slower_pct`` None only
            these regions are gated.
        memory_pct: Largest growth of a peak memory column (:data:`MEMORY_COLUMNS`) in percent.

    Raises:
        ValueError: ``region_pct`` names a region neither side records.

    :Examples:

    >>> row = Row("b", "PnP", "step", 30, 30, 10.0, 13.0, 1.3, 1.25, 1.36, "slower")
    >>> gate(Comparison([row], {}, [], [], 0.95, regions=["step"]), slower_pct=10).verdict
    'regression'
    >>> gate(Comparison([row], {}, [], [], 0.95, regions=["step"]), slower_pct=40).verdict
    'pass'
    >>> gate(Comparison([row], {}, [], [], 0.95, regions=["step"]), slower_pct=30).rows[0].reason
    'B/A 1.300, interval [1.250, 1.360] straddles the limit 1.300: rerun both sides with more iterations'
    >>> gate(Comparison([row], {}, [], [], 0.95, regions=["step"]), region_pct={"bwdd": 5})
    Traceback (most recent call last):
    ValueError: --fail-slower names region 'bwdd', which neither side records (known: step)
    """
    region_pct = dict(region_pct or {})
    unknown = sorted(set(region_pct) - set(result.regions))
    if unknown:
        raise ValueError(
            f"--fail-slower names region {unknown[0]!r}, which neither side records "
            f"(known: {', '.join(result.regions) or 'none'})"
        )
    rows: list[GateRow] = []
    level = f"{result.level * 100:g}%"
    for r in result.rows:
        pct = region_pct.get(r.region, slower_pct)
        if pct is None:
            continue
        limit = 1.0 + pct / 100.0
        high = f"{r.ci_high:.3f}" if math.isfinite(r.ci_high) else "inf"
        shown = f"B/A {r.ratio:.3f}, interval [{r.ci_low:.3f}, {high}]"
        busy = result.contended.get(r.config)
        if busy or r.contention:
            verdict, reason = INCONCLUSIVE, f"{shown}, but the run was contended ({busy or r.contention})"
        elif r.non_finite:
            verdict, reason = INCONCLUSIVE, f"{shown}, but non-finite times were left out of it ({r.non_finite})"
        elif r.ci_low > limit:
            verdict, reason = REGRESSION, f"{shown} lies above the limit {limit:.3f} (B slower by more than {pct:g}%)"
        elif r.ci_high <= limit:
            verdict, reason = PASS, f"{shown} within the limit {limit:.3f}"
        elif not math.isfinite(r.ci_high):
            verdict = INCONCLUSIVE
            reason = (
                f"{shown} from {r.n_a} / {r.n_b} iterations: too few for a {level} interval "
                "(stats.scale_ratio_ci): rerun both sides with more iterations"
            )
        else:
            verdict = INCONCLUSIVE
            reason = f"{shown} straddles the limit {limit:.3f}: rerun both sides with more iterations"
        rows.append(GateRow(r.benchmark, r.config, r.region, limit, r.ratio, r.ci_low, r.ci_high, verdict, reason))
    if memory_pct is not None:
        limit = 1.0 + memory_pct / 100.0
        for m in result.memory:
            shown = f"peak {m.max_b_mb:.1f} MB against {m.max_a_mb:.1f} MB (B/A {m.ratio:.3f})"
            if m.ratio > limit:
                verdict, reason = REGRESSION, f"{shown} above the limit {limit:.3f}"
            else:
                verdict, reason = PASS, f"{shown} within the limit {limit:.3f}"
            rows.append(GateRow(m.benchmark, m.config, m.column, limit, m.ratio, None, None, verdict, reason))
    for n in result.not_compared:
        if n.what in MEMORY_COLUMNS:
            pct = memory_pct
        elif n.what == "configuration":
            pct = 0.0 if slower_pct is not None or region_pct or memory_pct is not None else None
        else:
            pct = region_pct.get(n.what, slower_pct)
        if pct is not None:
            limit = None if n.what == "configuration" else 1.0 + pct / 100.0
            reason = f"not compared: {n.reason}"
            rows.append(GateRow(n.benchmark, n.config, n.what, limit, None, None, None, INCONCLUSIVE, reason))
    verdicts = {row.verdict for row in rows}
    verdict = REGRESSION if REGRESSION in verdicts else INCONCLUSIVE if INCONCLUSIVE in verdicts or not rows else PASS
    return Gate(verdict, rows)


def format_gate(result: Gate) -> str:
    """The gate's lines: each row that did not pass, then the verdict.

    :Examples:

    >>> print(format_gate(Gate("pass", [GateRow("b", "PnP", "step", 1.1, 1.0, 0.98, 1.02, "pass", "ok")])))
    gate: PASS (1 row within its limit)
    """
    lines = [
        f"gate: {r.verdict.upper()}: "
        + (r.config if r.what == "configuration" else f"{r.what} of {r.config}")
        + f": {r.reason}"
        for r in result.rows
        if r.verdict != PASS
    ]
    passed = sum(r.verdict == PASS for r in result.rows)
    if not result.rows:
        lines.append("gate: INCONCLUSIVE (no row to gate: no region, step or memory column matched a threshold)")
    else:
        within = "1 row within its limit" if passed == 1 else f"{passed} rows within their limits"
        lines.append(f"gate: {result.verdict.upper()} ({within})")
    return "\n".join(lines)


def format_comparison(result: Comparison) -> str:
    """Text table: one block per matched configuration, flagged rows marked ``*``, then what
    was not compared."""
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
            lost = {x.non_finite for x in result.rows if (x.benchmark, x.config) == current and x.non_finite}
            lines += [f"! non-finite times left out: {note}" for note in sorted(lost)]
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
    if result.rows:
        lines.append(f"\n{len(flagged)} of {len(result.rows)} rows changed ({pct} interval of B/A excludes 1)")
    elif result.pairs:
        lines.append("\nno region was compared")
    else:
        lines.append("\nno configuration of A matches one of B")
    doubtful = sorted({r.config for r in result.rows if r.contention})
    if doubtful:
        lines.append(
            f"different contention on the two sides of {', '.join(doubtful)}: their B/A intervals are not speed "
            "differences (rows marked ?); rerun both sides on a quiet machine"
        )
    for side, names in (("A", result.unmatched_a), ("B", result.unmatched_b)):
        if names:
            lines.append(f"unmatched in {side}: {', '.join(names)}")
    for n in result.not_compared:
        if n.reason not in _ONLY_IN.values():  # unmatched: listed above
            where = n.config if n.what == "configuration" else f"{n.what} of {n.config}"
            lines.append(f"not compared: {where}: {n.reason}")
    return "\n".join(lines).lstrip("\n")
