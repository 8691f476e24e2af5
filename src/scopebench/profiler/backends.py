"""The light backends: ``null`` (no-op) and ``custom`` (wall clock + peak memory)."""

from __future__ import annotations

from contextlib import nullcontext
from resource import RUSAGE_SELF, getrusage
from typing import Any

from scopebench.profiler.base import Profiler
from scopebench.profiler.device import MAXRSS_UNIT, MB

__all__ = ["NullProfiler", "CustomProfiler"]

_NULL_CONTEXT = nullcontext()
#: Region names whose ``<region>_time_sec`` would overwrite a whole-iteration column.
RESERVED_REGIONS = frozenset({"total", "step", "callback", "untracked"})


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
        while True:
            if before_callback is not None:
                before_callback()
            if not self._should_continue(callback):
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
    show up here, not in wall time alone),
    ``profiler_overhead_sec`` (this profiler's own time outside the clock),
    ``profiler_inside_sec`` (its region bookkeeping inside it), and per
    region ``<region>_time_sec`` (summed over the region's occurrences) and
    ``<region>_max_gpu_mb``. GPU memory fields are 0 on CPU. A region may not be named
    after a whole-iteration column (:data:`RESERVED_REGIONS`: ``ValueError``).
    """

    region_time_key = "{}_time_sec"
    reports_overhead = True
    region_sync = True
    #: Iteration whose end last read the process's resource usage, and its fault count.
    _usage_at: tuple[int, int] = (-2, 0)

    def _start_iteration(self, i: int) -> None:
        self._region_mem: dict[str, float] = {}
        self._iter_peak_mb = 0.0
        # One getrusage per iteration: the previous iteration's closing read starts this
        # one (the first system call after heavy compute costs ~15 µs here).
        last, faults = self._usage_at
        self._faults0 = faults if last == i - 1 else getrusage(RUSAGE_SELF).ru_minflt

    def _enter_region(self, name: str) -> Any:
        if name in RESERVED_REGIONS:
            raise ValueError(
                f"track_step: region name {name!r} is reserved ({name}_time_sec is a whole-iteration "
                "column of the custom profiler); rename the region"
            )
        ops = self.ops
        if ops.is_cuda:  # the base synchronised (region_sync)
            # Fold the peak so far into the iteration's before the reset erases it.
            self._iter_peak_mb = max(self._iter_peak_mb, ops.max_memory_mb())
            ops.reset_peak_memory()
        return None

    def _exit_region(self, name: str, token: Any) -> None:
        ops = self.ops
        if ops.is_cuda:  # the base synchronised (region_sync)
            peak = ops.max_memory_mb()
            self._iter_peak_mb = max(self._iter_peak_mb, peak)
            self._region_mem[name] = max(self._region_mem.get(name, 0.0), peak)

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        usage = getrusage(RUSAGE_SELF)
        wall = self._region_wall
        metrics: dict[str, Any] = {
            "callback_time_sec": self._callback_sec,
            "untracked_time_sec": max(0.0, total_sec - self._callback_sec - sum(wall.values())),
            "max_gpu_mb": max(self._iter_peak_mb, self.ops.max_memory_mb()) if self.ops.is_cuda else 0.0,
            "max_rss_mb": usage.ru_maxrss * MAXRSS_UNIT / MB,
            "minor_faults_count": usage.ru_minflt - self._faults0,
        }
        self._usage_at = (i, usage.ru_minflt)
        region_mem = self._region_mem
        for name, sec in wall.items():
            metrics[f"{name}_time_sec"] = sec
            metrics[f"{name}_max_gpu_mb"] = region_mem.get(name, 0.0)
        return metrics
