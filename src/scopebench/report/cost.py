"""What the profiler cost a run: the steady state per step, the one-off start-up and the sampler apart.

The profiler reports, per recorded iteration, ``profiler_overhead_sec`` (its time outside
the clock), ``profiler_inside_sec`` (its region bookkeeping inside the clock, part of the
measured step) and ``profiler_sampler_cpu_sec`` (the host sampler thread's CPU time).
:func:`cost_of` turns them into one :class:`ProfilerCost`:

- **per step** (steady state): the median over the recorded iterations of
  ``profiler_inside_sec + profiler_overhead_sec``, and its share of the median step
  (``step_time_sec``); the first iteration's start-up does not move a median;
- **start-up**: how much the first recorded iteration's cost exceeds the steady state
  (sampler start, first-call costs), given once, apart;
- **sampler CPU**: the median ``profiler_sampler_cpu_sec`` per step, apart (another
  thread's CPU, not time on the step's clock).

``scopebench summary`` / ``report`` (:func:`profiler_cost` of a benchopt configuration), the
``profiler-too-costly`` diagnosis rule and every tool that times steps (``profile-step``,
``profile-dataloader``, ``bench-inference``, ``decompose-latency``, ``find-max-batch``,
``train``: :func:`measured_cost`, as :func:`scopebench.report.contention.measured_steps`
is for the host load) all compute through :func:`cost_of` and print
:meth:`ProfilerCost.text`. JSON fields: docs/tools.md, "Profiler cost".
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from scopebench import stats
from scopebench.report.results import Configuration

__all__ = ["COST_COLUMNS", "ProfilerCost", "cost_of", "measured_cost", "profiler_cost"]

#: The per-iteration columns the cost is read from (the profiler's, docs/profiler.md).
COST_COLUMNS = ("profiler_overhead_sec", "profiler_inside_sec", "profiler_sampler_cpu_sec")


@dataclass(frozen=True)
class ProfilerCost:
    """What the profiler cost a run, steady state apart from the one-off start-up."""

    per_step_sec: float
    """Median over the recorded iterations of ``profiler_inside_sec + profiler_overhead_sec``."""
    share_pct: float
    """``per_step_sec`` against the median step (``step_time_sec``), in percent."""
    inside_sec: float
    """Median ``profiler_inside_sec``: the part of ``per_step_sec`` inside the measured step."""
    outside_sec: float
    """Median ``profiler_overhead_sec``: the part outside the clock."""
    startup_sec: float
    """The first recorded iteration's cost above ``per_step_sec`` (0 when none): the one-off start-up."""
    sampler_cpu_sec: float | None
    """Median ``profiler_sampler_cpu_sec`` per step (the sampler thread's CPU), ``None`` when off."""
    steps: int
    """Iterations the medians are taken over."""
    after_window_sec: float | None = None
    """What the profiler's exchange after the loop's last iteration cost (the cross-rank gathers and
    the ledger's analysis of what a deferred exchange left, :attr:`~scopebench.profiler.Profiler.after_window_sec`):
    once, no step waited for it; ``None`` where the tool does not say."""

    def text(self) -> str:
        """The one line summary and every tool print.

        :Examples:

        >>> ProfilerCost(31e-6, 0.31, 7e-6, 24e-6, 2.2e-3, 40e-6, 9).text()
        'profiler cost: 31 µs / step (0.3% of the step): 7 µs inside the step + 24 µs outside the clock; start-up 2.2 ms once; sampler thread 40 µs CPU / step'
        """
        line = (
            f"profiler cost: {_duration(self.per_step_sec)} / step ({self.share_pct:.1f}% of the step): "
            f"{_duration(self.inside_sec)} inside the step + {_duration(self.outside_sec)} outside the clock; "
            f"start-up {_duration(self.startup_sec)} once"
        )
        if self.sampler_cpu_sec is not None:
            line += f"; sampler thread {_duration(self.sampler_cpu_sec)} CPU / step"
        if self.after_window_sec:
            line += f"; exchange after the window {_duration(self.after_window_sec)} once"
        return line


def _duration(sec: float) -> str:
    return f"{sec * 1e6:.0f} µs" if sec < 1e-3 else f"{sec * 1e3:.1f} ms"


def _number(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    return None if math.isnan(x) else x


def cost_of(steps: Sequence[Mapping[str, Any]]) -> ProfilerCost | None:
    """The :class:`ProfilerCost` of measured iterations, ``None`` when none carries
    ``profiler_overhead_sec`` with a positive ``step_time_sec``.

    Args:
        steps: One metrics dict per recorded iteration, in order (``step_time_sec`` and the
            :data:`COST_COLUMNS`; a missing ``profiler_inside_sec`` counts 0).

    :Examples:

        >>> rows = [{"step_time_sec": 0.01, "profiler_overhead_sec": 2e-3, "profiler_inside_sec": 1e-4}]
        >>> rows += [{"step_time_sec": 0.01, "profiler_overhead_sec": 2e-5, "profiler_inside_sec": 1e-5}] * 4
        >>> c = cost_of(rows)
        >>> round(c.per_step_sec * 1e6), round(c.share_pct, 2), round(c.startup_sec * 1e6)
        (30, 0.3, 2070)
    """
    kept = [
        (_number(m.get("profiler_overhead_sec")), _number(m.get("profiler_inside_sec")) or 0.0, m)
        for m in steps
        if _number(m.get("profiler_overhead_sec")) is not None and (_number(m.get("step_time_sec")) or 0.0) > 0
    ]
    if not kept:
        return None
    totals = [out + inside for out, inside, _ in kept]
    per_step = stats.median(totals)
    sampler = [v for v in (_number(m.get("profiler_sampler_cpu_sec")) for _, _, m in kept) if v is not None]
    return ProfilerCost(
        per_step_sec=per_step,
        share_pct=per_step / stats.median([float(m["step_time_sec"]) for _, _, m in kept]) * 100.0,
        inside_sec=stats.median([inside for _, inside, _ in kept]),
        outside_sec=stats.median([out for out, _, _ in kept]),
        startup_sec=max(totals[0] - per_step, 0.0),
        sampler_cpu_sec=stats.median(sampler) if sampler else None,
        steps=len(kept),
    )


def profiler_cost(config: Configuration) -> ProfilerCost | None:
    """The :class:`ProfilerCost` of a configuration's recorded iterations, ``None`` when its
    rows carry no ``profiler_overhead_sec``."""
    if "profiler_cost" in config.cache:
        return config.cache["profiler_cost"]
    rows = config.recorded
    result = None
    if not rows.empty and "objective_profiler_overhead_sec" in rows.columns:
        columns = {k: rows[f"objective_{k}"].tolist() for k in COST_COLUMNS if f"objective_{k}" in rows.columns}
        step = config.step_values()
        steps = [{"step_time_sec": s, **{k: v[i] for k, v in columns.items()}} for i, s in enumerate(step)]
        result = cost_of(steps)
    config.cache["profiler_cost"] = result
    return result


def measured_cost(steps: Sequence[Mapping[str, Any]], after_window_sec: float | None = None) -> dict[str, Any]:
    """A tool's JSON key for its measured steps' profiler cost (docs/tools.md, "Profiler cost").

    Args:
        steps: One metrics dict per measured step, in order (the profiler's ``step_time_sec``
            or ``total_time_sec``, and the :data:`COST_COLUMNS`).
        after_window_sec: What the profiler's exchange after the loop cost, where the tool knows
            it (:attr:`ProfilerCost.after_window_sec`).

    Returns:
        ``profiler_cost``: ``None`` when no step carries ``profiler_overhead_sec`` (the ``null``
        or ``nvidia`` backend), else ``per_step_sec``, ``share_pct``, ``inside_sec``,
        ``outside_sec``, ``startup_sec``, ``sampler_cpu_sec``, ``steps``, ``after_window_sec`` and ``line``
        (:meth:`ProfilerCost.text`).
    """
    rows = [m if "step_time_sec" in m else {**m, "step_time_sec": m.get("total_time_sec", 0.0)} for m in steps]
    found = cost_of(rows)
    if found is None:
        return {"profiler_cost": None}
    if after_window_sec is not None:
        found = replace(found, after_window_sec=after_window_sec)
    return {"profiler_cost": {**asdict(found), "line": found.text()}}
