"""Was the machine busy while a configuration was measured: the sampler's columns, read once.

The host sampler (:mod:`scopebench.profiler.sampler`) gives each recorded iteration
``host_other_cpu_pct`` (the share of the run's CPUs that other processes took) and
``host_steal_pct`` (time the hypervisor gave to another machine). A configuration is
**contended** when, over its recorded iterations (weighted by their ``total_time_sec``),
other processes took more than :data:`OTHER_CPU_PCT` of its CPUs or steal exceeded
:data:`STEAL_PCT`, or when a single iteration's other share exceeded
:data:`ITERATION_OTHER_CPU_PCT` (one 100 ms interval on two CPUs is only good to about
±10 %, so one iteration needs a larger share to count on its own). Its iterations above
:data:`OTHER_CPU_PCT` or :data:`STEAL_PCT` are the *affected* ones.

The diagnosis rule ``contended``, the phase tables' ``host load`` line and the
``scopebench compare`` check all read :func:`contention`; thresholds: docs/diagnosis.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from scopebench.report.results import Configuration

__all__ = [
    "Contention",
    "ITERATION_OTHER_CPU_PCT",
    "OTHER_CPU_PCT",
    "STEAL_PCT",
    "ab_note",
    "contention",
    "iteration_ranges",
]

#: Other processes' share of the run's CPUs over the window above which it is contended (%).
OTHER_CPU_PCT = 10.0
#: Steal time over the window above which it is contended (%).
STEAL_PCT = 5.0
#: One iteration whose other share exceeds this makes the configuration contended on its own (%).
ITERATION_OTHER_CPU_PCT = 50.0
#: Two sides of an A/B whose window shares differ by more than this did not run alike (points of %).
DIFFERENT_OTHER_CPU_PCT = OTHER_CPU_PCT


@dataclass(frozen=True)
class Contention:
    """How busy the machine was over one configuration's recorded iterations."""

    other_pct: float | None
    """Other processes' share of the run's CPUs over the window (weighted by iteration time)."""
    other_max_pct: float | None
    steal_pct: float | None
    steal_max_pct: float | None
    affected: tuple[int, ...]
    """Iterations above :data:`OTHER_CPU_PCT` or :data:`STEAL_PCT`."""
    sampled: int
    """Recorded iterations with a sampler value."""

    @property
    def contended(self) -> bool:
        return (
            (self.other_pct is not None and self.other_pct > OTHER_CPU_PCT)
            or (self.steal_pct is not None and self.steal_pct > STEAL_PCT)
            or (self.other_max_pct is not None and self.other_max_pct > ITERATION_OTHER_CPU_PCT)
        )

    def text(self) -> str:
        """``other processes took 48.2% of the run's CPUs (max 61.0%), steal 0.0%; 9 of 10
        iterations affected (2-10)``."""
        parts = []
        if self.other_pct is not None:
            parts.append(
                f"other processes took {self.other_pct:.1f}% of the run's CPUs (max {self.other_max_pct:.1f}%)"
            )
        if self.steal_pct is not None:
            parts.append(f"steal {self.steal_pct:.1f}% (max {self.steal_max_pct:.1f}%)")
        affected = (
            f"{len(self.affected)} of {self.sampled} iterations affected ({iteration_ranges(self.affected)})"
            if self.affected
            else f"none of {self.sampled} iterations above {OTHER_CPU_PCT:g}% other / {STEAL_PCT:g}% steal"
        )
        return ", ".join(parts) + "; " + affected


def iteration_ranges(iterations: list[int] | tuple[int, ...]) -> str:
    """Iteration numbers as ranges.

    :Examples:
        >>> iteration_ranges([1, 2, 3, 5, 8, 9])
        '1-3, 5, 8-9'
    """
    out: list[str] = []
    for i in sorted(iterations):
        if out and out[-1][1] == i - 1:
            out[-1] = (out[-1][0], i)
        else:
            out.append((i, i))
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in out)


def _weighted(rows, column: str) -> tuple[float | None, float | None, list[tuple[int, float]]]:
    """(weighted mean, max, [(iteration, value)]) of ``objective_<column>`` over recorded rows."""
    name = f"objective_{column}"
    if name not in rows.columns:
        return None, None, []
    present = rows[rows[name].notna()]
    if present.empty:
        return None, None, []
    values = present[name].astype(float)
    weights = present["objective_total_time_sec"].astype(float).clip(lower=0.0)
    mean = float((values * weights).sum() / weights.sum()) if float(weights.sum()) > 0 else float(values.mean())
    pairs = [(int(s) - 1, float(v)) for s, v in zip(present["stop_val"], values)]
    return mean, float(values.max()), pairs


def contention(config: Configuration) -> Contention | None:
    """The contention of ``config``'s recorded iterations, ``None`` without sampler columns."""
    if "contention" in config.cache:
        return config.cache["contention"]
    result = None
    if not config.recorded.empty:
        other, other_max, other_rows = _weighted(config.recorded, "host_other_cpu_pct")
        steal, steal_max, steal_rows = _weighted(config.recorded, "host_steal_pct")
        if other_rows or steal_rows:
            affected = {i for i, v in other_rows if v > OTHER_CPU_PCT} | {i for i, v in steal_rows if v > STEAL_PCT}
            sampled = len({i for i, _ in other_rows} | {i for i, _ in steal_rows})
            result = Contention(other, other_max, steal, steal_max, tuple(sorted(affected)), sampled)
    config.cache["contention"] = result
    return result


def ab_note(a: Contention | None, b: Contention | None) -> str | None:
    """Why an A/B of two configurations does not measure a speed difference, ``None`` when it may.

    Flagged: at least one side contended and the sides' window shares of other processes
    more than :data:`DIFFERENT_OTHER_CPU_PCT` points apart, or their steal more than
    :data:`STEAL_PCT` apart.
    """
    if a is None or b is None or not (a.contended or b.contended):
        return None
    other_gap = abs((a.other_pct or 0.0) - (b.other_pct or 0.0))
    steal_gap = abs((a.steal_pct or 0.0) - (b.steal_pct or 0.0))
    if other_gap <= DIFFERENT_OTHER_CPU_PCT and steal_gap <= STEAL_PCT:
        return None
    return (
        f"the sides ran under different contention (A: {a.text()}; B: {b.text()}): "
        "their interval is not a speed difference"
    )
