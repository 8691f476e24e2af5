"""The suite's findings on one validation run, scored against the fault that was injected.

:class:`RunRecord` collects what rank 0 saw of a :class:`~scopebench.validation.run.DetectRun`,
iteration by iteration (the profiler's reduced row, its own unprofiled and profiled step times,
what the fault policy measured it injected, a non-finite stop); :func:`score` turns it into the
objective columns of the validation benchmark (docs/validation.md, "Columns"):

* the findings are the suite's own: every diagnosis rule (:func:`scopebench.report.diagnosis.diagnose`)
  over the recorded rows, read as a benchopt configuration of one run; the late rank through
  :func:`scopebench.report.ledger.late_rank_summary`; the non-finite stop through
  :class:`~scopebench.policy.run.nonfinite.NonFiniteLoss`. Nothing here detects anything itself.
* ``detected``: the fault's rule (:data:`~scopebench.validation.faults.RULES`) fired;
  ``named_right``: it named the faulty rank and phase (``late_rank``), the injected step and rank
  (``nonfinite``), the input (``slow_input``: ``dataload_wait``), or fired at all (``contention``,
  ``memory_growth``, ``comm_heavy``: a finding without a rank or phase); ``error_pct``: the
  reported magnitude against what the policy measured it injected (``late_rank``: the late rank's
  own extra work in the region; ``delay_error_pct``: the delay the others waited, which a busy
  machine makes longer than the fault); ``false_positive``: a finding about the step of another
  kind than the fault's (on a ``none`` run, any); ``steps_to_detect``: recorded iterations until
  the fault was first named right (``nonfinite``: from the NaN to the stop).
* :data:`CONDITION_RULES` judge the measurement, not the step: ``contended`` (other processes'
  work, which a shared machine has on every run) and ``profiler-too-costly``; they are reported
  (``contended``, ``findings``) but are never a false positive, except ``contended`` being the
  very fault of a ``contention`` run. :data:`ALSO_RIGHT` lists the findings that describe the same
  fault from another side (``rank-imbalance`` naming the late rank; ``input-bound`` for a rank late
  in its input).
* ``overhead_pct``: the median profiled step over the median unprofiled step of the same run,
  interleaved (rank 0's own clock), less 1, in %, with its 95 % bootstrap interval
  (:func:`scopebench.stats.median_ratio_ci`); ``overhead_total_pct`` adds the profiler's own time
  outside the clock (``profiler_overhead_sec``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from scopebench import stats
from scopebench.validation.faults import INJECTED_TERM, FaultSpec

__all__ = ["ALSO_RIGHT", "CONDITION_RULES", "COLUMNS", "INJECTED_TERM", "RunRecord", "score"]

#: Rules about the measurement (the machine, the profiler), never a false positive of the step.
CONDITION_RULES = frozenset({"contended", "profiler-too-costly", "hidden-communication", "no-problem", "no-data"})
#: Findings that describe a fault's own effect from another side: not a false positive with it
#: (``rank-imbalance`` naming the late rank; a rank late in its input is an input that does not
#: keep up, ``input-bound``). Keys: the fault, or (the fault, its phase).
ALSO_RIGHT = {"late_rank": frozenset({"rank-imbalance"}), ("late_rank", "dataload_wait"): frozenset({"input-bound"})}
#: The objective columns :func:`score` returns (besides benchopt's ``value``), in this order.
COLUMNS = (
    "detected",
    "named_right",
    "error_pct",
    "delay_error_pct",
    "false_positive",
    "false_positive_rules",
    "findings",
    "contended",
    "reported",
    "injected",
    "steps_to_detect",
    "overhead_pct",
    "overhead_low_pct",
    "overhead_high_pct",
    "overhead_total_pct",
    "stopped_at",
)
_NAN = float("nan")


@dataclass
class RunRecord:
    """What rank 0 saw of one validation run, one entry per recorded iteration."""

    params: dict[str, Any] = field(default_factory=dict)
    """The solver's parameters (``backend``, ``profiler_mode``, ``nproc_per_node``...): the
    configuration the rules read."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """The profiler's reduced row of each recorded iteration (rank 0's ``run.metrics()``)."""
    pairs: list[tuple[float, float, float]] = field(default_factory=list)
    """(unprofiled step, profiled step, the profiler's time outside the clock), rank 0's seconds."""
    injected: list[float] = field(default_factory=list)
    """Per recorded iteration, the largest :data:`INJECTED_TERM` over the ranks (seconds)."""
    hog_cpu: list[tuple[float, float]] = field(default_factory=list)
    """(``contention``) per recorded iteration, (CPU seconds the hogs had, wall seconds)."""
    stopped_at: int | None = None
    """The iteration (1-based) whose non-finite loss stopped the run, and on which rank."""
    stopped_rank: int | None = None
    first_detected: int | None = None
    """Recorded iterations when the fault's finding first held (:func:`score` sets it)."""

    def add(self, metrics: dict[str, Any], injected: float | None = None) -> None:
        """One recorded iteration: its reduced row and what the policy injected in it."""
        self.rows.append({k: v for k, v in metrics.items() if isinstance(v, (int, float, str)) or v is None})
        self.injected.append(_NAN if injected is None else injected)


def _frame(record: RunRecord):
    """The recorded rows as one benchopt configuration (``objective_<key>`` columns)."""
    import pandas as pd

    from scopebench.report.results import configurations

    params = {f"p_solver_{k}": v for k, v in record.params.items() if isinstance(v, (int, float, str))}
    label = ",".join(f"{k}={v}" for k, v in sorted(record.params.items()))
    rows = [
        {
            "objective_name": "validation",
            "dataset_name": "injected",
            "solver_name": f"Detect[{label}]",
            "stop_val": i + 1,
            **params,
            **{f"objective_{k}": v for k, v in row.items()},
        }
        for i, row in enumerate(record.rows)
    ]
    return configurations(pd.DataFrame(rows))[0]


def _findings(record: RunRecord):
    from scopebench.report.diagnosis import diagnose

    if not record.rows:
        return None, []
    config = _frame(record)
    return config, diagnose(config, [config])


def _error_pct(reported: float | None, injected: float | None) -> float:
    """``100 * |reported - injected| / injected``; NaN without both or without an injected magnitude.

    :Examples:
        >>> round(_error_pct(0.051, 0.050), 6), _error_pct(None, 0.05) != _error_pct(None, 0.05)
        (2.0, True)
    """
    if reported is None or injected is None or not injected > 0 or reported != reported:
        return _NAN
    return abs(reported - injected) / injected * 100.0


def _late(record: RunRecord, config, spec: FaultSpec) -> tuple[bool, float | None, float | None, float | None]:
    """(named right, reported extra work, injected, reported delay) of a late rank: the ledger's
    ``late_rank_work_excess_sec`` (its own work in the region over the other ranks') is the claim
    the injected work checks on any machine; the delay (how long the others waited) adds whatever
    else made the rank late, which on a busy machine is more than the fault."""
    from scopebench.report.ledger import config_late_rank

    found = config_late_rank(config) if config is not None else None
    if found is None:
        return False, None, None, None
    named = found.rank == spec.rank and found.region == spec.phase
    # the injected work of the iterations that carry it (the policy measured its extra work)
    hits = [x for x in record.injected if x == x and x > 0]
    return named, found.work_excess_sec, stats.median(hits) if hits else None, found.delay_sec


def _magnitudes(record: RunRecord, config, spec: FaultSpec, found: set[str]) -> tuple[bool, Any, Any]:
    """(named right, reported, injected) for the faults scored by a finding without a rank."""
    fault = spec.fault
    if fault == "slow_input":  # the region's wall time (custom: _time_sec; torch: _cpu_sec)
        waits = config.region_values("dataload_wait") if "dataload_wait" in config.region_columns else []
        reported = stats.median(waits) if waits else None
        hits = [x for x in record.injected if x == x and x > 0]
        return "input-bound" in found, reported, stats.median(hits) if hits else None
    if fault == "contention":
        from scopebench.report.contention import contention

        measured = contention(config)
        reported = measured.other_pct if measured is not None else None
        return "contended" in found, reported, _hog_pct(record, spec)
    if fault == "memory_growth":
        peaks, iterations = config.values("mem_peak_mb"), config.iterations()
        reported = None
        if len(peaks) >= 2 and len(peaks) == len(iterations) and len(set(iterations)) > 1:
            reported = stats.linear_fit([float(i) for i in iterations], peaks)[1]  # MB per iteration
        return "memory-creep" in found, reported, spec.size / spec.every
    if fault == "comm_heavy":
        return "communication-bound" in found, None, None
    return False, None, None


def _hog_pct(record: RunRecord, spec: FaultSpec) -> float:
    """The share of the run's CPUs the hogs had over the recorded iterations (%): measured when
    the run kept it (a hog gets less than its CPU on a busy machine), else what they ask for."""
    from scopebench.host_load import usable_cpus

    cpus = len(usable_cpus()) or os.cpu_count() or 1
    wall = sum(w for _, w in record.hog_cpu)
    if wall > 0:
        return 100.0 * sum(c for c, _ in record.hog_cpu) / (wall * cpus)
    return min(100.0, spec.size / cpus * 100.0)


def _overhead(record: RunRecord) -> dict[str, float]:
    out = dict(overhead_pct=_NAN, overhead_low_pct=_NAN, overhead_high_pct=_NAN, overhead_total_pct=_NAN)
    if len(record.pairs) < 2:
        return out
    off = [p[0] for p in record.pairs]
    on = [p[1] for p in record.pairs]
    total = [p[1] + p[2] for p in record.pairs]
    ratio, low, high = stats.median_ratio_ci(off, on)
    out.update(overhead_pct=(ratio - 1) * 100.0, overhead_low_pct=(low - 1) * 100.0)
    out.update(overhead_high_pct=(high - 1) * 100.0)
    out["overhead_total_pct"] = (stats.median(total) / stats.median(off) - 1) * 100.0
    return out


def score(spec: FaultSpec, record: RunRecord) -> dict[str, Any]:
    """The objective columns of one validation run so far (:data:`COLUMNS`, plus ``value``).

    ``value`` is 0 when the run was scored right (its fault detected and named right, no false
    positive; on a ``none`` run: no false positive), else 1. Columns that do not apply are NaN
    (``detected`` on a ``none`` run, ``error_pct`` of a fault without a magnitude).
    """
    config, findings = _findings(record)
    rules = {f.rule for f in findings}
    fault = spec.fault
    expected = spec.rule
    allowed = {expected, *ALSO_RIGHT.get(fault, ()), *ALSO_RIGHT.get((fault, spec.phase), ())} - {None}
    wrong = sorted(r for r in rules - CONDITION_RULES - allowed)
    if fault == "contention":
        wrong = sorted(set(wrong) - {"contended"})
    out: dict[str, Any] = dict.fromkeys(COLUMNS, _NAN)
    out["findings"] = ",".join(sorted(rules))
    out["contended"] = float("contended" in rules) if config is not None else _NAN
    out["false_positive"] = float(bool(wrong)) if config is not None else _NAN
    out["false_positive_rules"] = ",".join(wrong)
    detected = named = False
    reported = injected = None
    if fault == "late_rank":
        detected = "late-rank" in rules
        named, reported, injected, delay = _late(record, config, spec)
        named = detected and named
        out["delay_error_pct"] = _error_pct(delay, injected)
    elif fault == "nonfinite":
        detected = record.stopped_at is not None
        named = detected and record.stopped_at == spec.step and record.stopped_rank == spec.rank
        reported, injected = record.stopped_at, spec.step
        out["stopped_at"] = _NAN if record.stopped_at is None else float(record.stopped_at)
    elif fault != "none" and config is not None:
        named, reported, injected = _magnitudes(record, config, spec, rules)
        detected = expected in rules
        named = detected and named
    if fault != "none":
        out["detected"], out["named_right"] = float(detected), float(named)
        out["reported"] = _NAN if reported is None else float(reported)
        out["injected"] = _NAN if injected is None else float(injected)
        if fault != "nonfinite":
            out["error_pct"] = _error_pct(reported, injected)
        if record.first_detected is None:  # the stop's delay; else the first prefix named right
            if fault == "nonfinite" and detected:
                record.first_detected = max(1, record.stopped_at - spec.step + 1)
            elif fault != "nonfinite" and named:
                record.first_detected = len(record.rows)
        holds = detected if fault == "nonfinite" else named
        if record.first_detected is not None and holds:  # a finding that came and went is not one
            out["steps_to_detect"] = float(record.first_detected)
    out.update(_overhead(record))
    right = not wrong if fault == "none" else (named and not wrong)
    out["value"] = 0.0 if right and out["false_positive"] == out["false_positive"] else 1.0
    return out
