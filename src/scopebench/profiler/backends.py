"""The light backends: ``null`` (no-op) and ``custom`` (wall clock + peak memory)."""

from __future__ import annotations

from contextlib import nullcontext
from resource import RUSAGE_SELF, getrusage
from typing import Any

from scopebench.profiler.base import Profiler
from scopebench.profiler.device import MAXRSS_UNIT, MB
from scopebench.profiler.regions import clock

__all__ = ["NullProfiler", "CustomProfiler"]

_NULL_CONTEXT = nullcontext()
#: Region names whose ``<region>_time_sec`` would overwrite a whole-iteration column.
RESERVED_REGIONS = frozenset({"total", "step", "callback", "untracked"})
#: ``getrusage().ru_maxrss`` to MiB.
_RSS_TO_MB = MAXRSS_UNIT / MB
#: The custom backend reads the process's resource usage (``max_rss_mb``, ``minor_faults_count``)
#: at an iteration's end when this long passed since its last reading: a system call of about
#: 1 µs here, a fifth of the backend's own cost on an iteration of microseconds (issue 47), a
#: thousandth of one of a millisecond, which therefore always reads.
USAGE_PERIOD_SEC = 1e-3


class NullProfiler(Profiler):
    """Records nothing, synchronises nothing, writes nothing.

    Regions are a shared ``nullcontext`` and :meth:`iterate` is a plain loop, so a solver
    costs the same as without a profiler (``perf/profiler_overhead.py``).
    """

    def track_step(self, name: str):
        return _NULL_CONTEXT

    def end_iteration(self) -> None:
        self.iteration += 1

    def iterate(self, callback=None, before_callback=None):
        decide = self._decision(callback)
        while True:
            if before_callback is not None:
                before_callback()
            if not decide():
                return
            yield self.iteration
            self.iteration += 1

    def get_current_metrics(self) -> dict[str, Any]:
        return {}

    def finalize(self, partial: bool = False):
        return []


class CustomProfiler(Profiler):
    """Wall clock around regions; on CUDA, synchronisation and peak allocated memory.

    Per recorded iteration: ``total_time_sec``, ``callback_time_sec``,
    ``step_time_sec = total - callback`` (derived by the base class),
    ``untracked_time_sec = total - callback - sum(regions)``, ``max_gpu_mb``,
    ``max_rss_mb`` (process peak RSS, since start), ``minor_faults_count`` (minor page
    faults of the process during the iteration, callback included as in
    ``total_time_sec``: counted from the end of the previous recorded iteration, or from
    the clock's start for the first one; large temporaries mapped afresh on every pass
    show up here, not in wall time alone; both read at an iteration's end only when
    :data:`USAGE_PERIOD_SEC` passed since the last reading: an iteration shorter than that may
    carry the faults of the short ones before it, which then show 0, and the peak RSS of the
    last reading — the faults' sum over contiguous iterations stays whole),
    ``profiler_overhead_sec`` (this profiler's own time outside the clock),
    ``profiler_inside_sec`` (its region bookkeeping inside it), and per
    region ``<region>_time_sec`` (summed over the region's occurrences) and
    ``<region>_max_gpu_mb``. GPU memory fields are 0 on CPU. A region may not be named
    after a whole-iteration column (:data:`RESERVED_REGIONS`: ``ValueError``).
    """

    region_time_key = "{}_time_sec"
    reports_overhead = True
    region_sync = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: The last recorded iteration, and the process's resource usage at its last reading: when
        #: the next is due (the profiler's clock), the fault count and the peak RSS (MiB).
        self._usage_iter = -2
        self._usage_due = 0.0
        self._usage_faults = 0
        self._usage_rss_mb = 0.0
        #: Each region's two column names, made once (not two f-strings per region and iteration).
        self._region_keys: dict[str, tuple[str, str]] = {}
        #: Off CUDA, the names of the last recorded iteration's regions and a copy of its row's
        #: columns up to theirs (:meth:`_iteration_row`), ``None`` before the first.
        self._layout: tuple[set[str], dict[str, Any]] | None = None
        self._region_mem: dict[str, float] = {}
        self._iter_peak_mb = 0.0

    def _start_iteration(self, i: int) -> None:
        if self._cuda:
            self._region_mem = {}
            self._iter_peak_mb = 0.0
        # After the previous recorded iteration, its reading (or the one before) goes on counting;
        # after a gap, a reading starts this one.
        if self._usage_iter != i - 1:
            self._read_usage()

    def _starts_each_iteration(self) -> bool:
        # Off CUDA only a gap between recorded iterations has work here: the window's start.
        return self._cuda

    def _read_usage(self) -> int:
        """Read the process's resource usage; returns the faults since the previous reading."""
        usage = getrusage(RUSAGE_SELF)
        self._usage_due = clock() + USAGE_PERIOD_SEC
        faults = usage.ru_minflt
        new = faults - self._usage_faults
        self._usage_faults = faults
        self._usage_rss_mb = usage.ru_maxrss * _RSS_TO_MB
        return new

    def _enter_region(self, name: str) -> Any:
        if name in RESERVED_REGIONS:
            raise ValueError(
                f"track_step: region name {name!r} is reserved ({name}_time_sec is a whole-iteration "
                "column of the custom profiler); rename the region"
            )
        if self._cuda:  # the base synchronised (region_sync)
            ops = self.ops
            # Fold the peak so far into the iteration's before the reset erases it.
            self._iter_peak_mb = max(self._iter_peak_mb, ops.max_memory_mb())
            ops.reset_peak_memory()
        return None

    def _exit_region(self, name: str, token: Any) -> None:
        if self._cuda:  # the base synchronised (region_sync)
            peak = self.ops.max_memory_mb()
            self._iter_peak_mb = max(self._iter_peak_mb, peak)
            self._region_mem[name] = max(self._region_mem.get(name, 0.0), peak)

    def _region_hooks_idle(self) -> bool:
        # Off CUDA this class's hooks only check the name; a subclass's or a replaced hook runs.
        cls = type(self)
        return not self._cuda and (cls._enter_region, cls._exit_region) == _CPU_IDLE_HOOKS

    def _iteration_row(self, i: int, total_sec: float, step_sec: float) -> dict[str, Any]:
        wall = self._region_wall
        callback = self._callback_sec
        cuda = self._cuda
        # Off CUDA, a copy of the last row of the same regions (its GPU columns 0): every column in
        # place and the row's room for those the base adds, written over without the dict growing
        # (a third of this method's cost on an iteration of microseconds, issue 47); otherwise
        # the fixed columns in order, the regions' added.
        layout = self._layout  # never set on CUDA: every row there is built afresh
        fresh = layout is None or wall.keys() != layout[0]
        row = (_FIXED_COLUMNS if fresh else layout[1]).copy()
        row["total_time_sec"] = total_sec
        row["step_time_sec"] = step_sec
        row["callback_time_sec"] = callback
        if cuda:
            row["max_gpu_mb"] = max(self._iter_peak_mb, self.ops.max_memory_mb())
        # The clock stopped at _t0 + the step; the first system call after heavy compute costs
        # ~15 µs here: a reading only a period after the last.
        if self._t0 + step_sec >= self._usage_due:
            row["minor_faults_count"] = self._read_usage()
        else:
            row["minor_faults_count"] = 0
        row["max_rss_mb"] = self._usage_rss_mb
        self._usage_iter = i
        keys = self._region_keys
        regions = 0.0
        if fresh:
            region_mem = self._region_mem  # empty off CUDA
            for name, sec in wall.items():
                regions += sec
                pair = keys.get(name)
                if pair is None:
                    pair = keys[name] = (f"{name}_time_sec", f"{name}_max_gpu_mb")
                row[pair[0]] = sec
                row[pair[1]] = region_mem.get(name, 0.0) if region_mem else 0.0
        else:  # the copy holds the GPU columns (0) already
            for name, sec in wall.items():
                regions += sec
                row[keys[name][0]] = sec
        untracked = total_sec - callback - regions
        row["untracked_time_sec"] = untracked if untracked > 0.0 else 0.0
        if fresh and not cuda:
            self._layout = (set(wall), row.copy())
        return row


#: The custom backend's columns before its regions', in order (the GPU ones stay 0 off CUDA).
_FIXED_COLUMNS = {
    "total_time_sec": 0.0,
    "step_time_sec": 0.0,
    "callback_time_sec": 0.0,
    "untracked_time_sec": 0.0,
    "max_gpu_mb": 0.0,
    "max_rss_mb": 0.0,
    "minor_faults_count": 0,
}

#: The custom backend's own region hooks, which do nothing off CUDA once a name was checked.
_CPU_IDLE_HOOKS = (CustomProfiler._enter_region, CustomProfiler._exit_region)
