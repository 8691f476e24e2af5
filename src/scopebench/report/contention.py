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
``scopebench compare`` check all read :func:`contention`; the tools that time steps
(``profile-step``, ``profile-dataloader``, ``bench-inference``, ``decompose-latency``,
``find-max-batch``, ``train``) read :func:`measured_steps`. Both compute through
:func:`contention_of`, and print :func:`contention_line`. Thresholds: docs/diagnosis.md.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scopebench.report.results import Configuration

__all__ = [
    "Contention",
    "ITERATION_OTHER_CPU_PCT",
    "OTHER_CPU_PCT",
    "STEAL_PCT",
    "ab_note",
    "contention",
    "contention_line",
    "contention_of",
    "iteration_ranges",
    "measured_steps",
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


def contention_of(iterations: Iterable[tuple[int, float, float | None, float | None]]) -> Contention | None:
    """The contention of measured iterations, ``None`` when none has a sampler value.

    The one computation behind :func:`contention` (a benchopt configuration) and the tools'
    ``contention`` (:func:`measured_steps`). Each item is ``(iteration, total_time_sec,
    host_other_cpu_pct, host_steal_pct)``, a value ``None`` (or NaN) when the sampler gave
    none. A share over the window is the mean of the iterations that have it, weighted by
    their time: ``sum(v_i * t_i) / sum(t_i)`` (negative times count 0; all zero: the plain
    mean).
    """
    items = list(iterations)

    def column(k: int) -> tuple[float | None, float | None, list[tuple[int, float]]]:
        present = [(int(it[0]), float(it[k]), _weight(it[1])) for it in items if _value(it[k])]
        if not present:
            return None, None, []
        weights = sum(w for _, _, w in present)
        values = [v for _, v, _ in present]
        if weights > 0:
            mean = sum(v * w for _, v, w in present) / weights
        else:
            mean = sum(values) / len(values)
        return mean, max(values), [(i, v) for i, v, _ in present]

    other, other_max, other_rows = column(2)
    steal, steal_max, steal_rows = column(3)
    if not (other_rows or steal_rows):
        return None
    affected = {i for i, v in other_rows if v > OTHER_CPU_PCT} | {i for i, v in steal_rows if v > STEAL_PCT}
    sampled = len({i for i, _ in other_rows} | {i for i, _ in steal_rows})
    return Contention(other, other_max, steal, steal_max, tuple(sorted(affected)), sampled)


def _value(x: Any) -> bool:
    """Whether ``x`` is a sampler value (not ``None``, not NaN)."""
    return x is not None and not math.isnan(float(x))


def _weight(seconds: Any) -> float:
    """An iteration's weight: its time, 0 when negative or missing."""
    return max(float(seconds), 0.0) if _value(seconds) else 0.0


def contention(config: Configuration) -> Contention | None:
    """The contention of ``config``'s recorded iterations, ``None`` without sampler columns.

    The row logged at ``stop_val = k`` is iteration ``k - 1`` (docs/design.md).
    """
    if "contention" in config.cache:
        return config.cache["contention"]
    result = None
    rows = config.recorded
    if not rows.empty and ({"objective_host_other_cpu_pct", "objective_host_steal_pct"} & set(rows.columns)):

        def col(name: str) -> list[Any]:
            key = f"objective_{name}"
            return list(rows[key]) if key in rows.columns else [None] * len(rows)

        iterations = zip(
            [int(s) - 1 for s in rows["stop_val"]],
            col("total_time_sec"),
            col("host_other_cpu_pct"),
            col("host_steal_pct"),
        )
        result = contention_of(iterations)
    config.cache["contention"] = result
    return result


def contention_line(found: Contention) -> str:
    """The line the phase tables and every tool print: ``CONTENDED: <text>`` when
    :attr:`Contention.contended`, else ``host load: <text>``."""
    return ("CONTENDED: " if found.contended else "host load: ") + found.text()


def measured_steps(steps: Sequence[Mapping[str, Any]], first: int = 0) -> dict[str, Any]:
    """A tool's JSON keys for its measured steps' host load (docs/tools.md, "Contention").

    Args:
        steps: One metrics dict per measured step, in order (the profiler's
            ``total_time_sec``, ``host_other_cpu_pct``, ``host_steal_pct``); a step is
            numbered by its place among them, from ``first``.

    Returns:
        ``host_other_cpu_pct`` and ``host_steal_pct`` (lists aligned with ``steps``, ``None``
        where the sampler gave nothing) and ``contention``: ``None`` when no step has a
        sampler value (sampler off), else ``other_pct``, ``other_max_pct``, ``steal_pct``,
        ``steal_max_pct``, ``affected`` (step numbers), ``sampled``, ``contended`` and
        ``line`` (:func:`contention_line`).
    """
    other = [m.get("host_other_cpu_pct") for m in steps]
    steal = [m.get("host_steal_pct") for m in steps]
    found = contention_of(
        (i, m.get("total_time_sec", 0.0), o, s) for i, (m, o, s) in enumerate(zip(steps, other, steal), first)
    )
    record = None
    if found is not None:
        record = {
            "other_pct": found.other_pct,
            "other_max_pct": found.other_max_pct,
            "steal_pct": found.steal_pct,
            "steal_max_pct": found.steal_max_pct,
            "affected": list(found.affected),
            "sampled": found.sampled,
            "contended": found.contended,
            "line": contention_line(found),
        }
    return {"host_other_cpu_pct": other, "host_steal_pct": steal, "contention": record}


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
