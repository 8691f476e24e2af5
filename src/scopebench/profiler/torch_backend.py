"""The ``torch`` backend: ``torch.profiler`` with regions as ``record_function`` ranges.

Per-step mode (default) runs one profiler cycle per recorded iteration and reports, per
region, ``<region>_cpu_sec`` (wall time of the region's CPU range), ``<region>_cuda_sec``
(device time of the kernels launched inside it), ``<region>_comm_sec`` (time covered by
communication inside it), plus ``comm_cuda_sec`` (communication inside regions),
``comm_sync_sec`` (communication outside every region), ``total_time_sec``,
``max_gpu_mb``, ``callback_time_sec`` and ``profiler_overhead_sec`` (profiler start, stop
and event processing, outside the iteration clock).

Scheduled mode (``per_step=False``) keeps one profiler running over each ``active``-long
cycle of the window (``repeat`` cycles, 0 = forever), reports only ``total_time_sec`` and
``max_gpu_mb`` per iteration, aggregates operator rows with ``iter=agg`` and exports a
Chrome trace ``rank_<rank>.pt.trace.json`` (later cycles: ``rank_<rank>.cycle<k>...``).

Communication is any NCCL, Gloo or c10d event (all_reduce, all_gather, reduce_scatter,
broadcast, send/recv, barrier). Gloo runs collectives on its own thread, so an event is
attributed to the region whose time range contains its start, and a region's
communication time is the length of the union of its communication intervals (nested
``c10d::allreduce_`` / ``gloo:all_reduce`` events are not counted twice).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from scopebench.profiler.base import Profiler
from scopebench.profiler.device import MB
from scopebench.profiler.files import OPS_FILE, write_csv

__all__ = ["TorchProfiler", "is_comm_event", "TRACE_FILE"]

TRACE_FILE = "rank_{rank}.pt.trace.json"
_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "ncclkernel", "nccldevkernel", "record_param_comms")
_US = 1e-6


def is_comm_event(name: str) -> bool:
    """Whether a profiler event name is a communication operator.

    :Examples:
        >>> is_comm_event("gloo:all_reduce"), is_comm_event("c10d::barrier"), is_comm_event("aten::mm")
        (True, True, False)
    """
    return name.lower().startswith(_COMM_PREFIXES)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals.

    :Examples:
        >>> _union_length([(0, 2), (1, 3), (5, 6)])
        4
    """
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def _is_cpu(event) -> bool:
    return "CPU" in str(getattr(event, "device_type", "CPU"))


class TorchProfiler(Profiler):
    """``torch.profiler`` backend; see the module docstring for its metrics and files."""

    region_time_key = "{}_cpu_sec"
    reports_overhead = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prof = None
        self._cycle = 0
        self._regions: set[str] = set()
        self.op_rows: list[dict[str, Any]] = []

    # -- profiler cycles -----------------------------------------------------------------
    def _open(self) -> None:
        import torch
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.ops.is_cuda:
            activities.append(ProfilerActivity.CUDA)
        self._prof = profile(activities=activities, profile_memory=True)
        self._prof.__enter__()
        self._torch = torch

    def _close(self):
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return prof

    def _cycle_ends_at(self, i: int) -> bool:
        cfg = self.config
        return cfg.active > 0 and (i - cfg.warmup + 1) % cfg.active == 0

    # -- hooks -----------------------------------------------------------------------------
    def _start_iteration(self, i: int) -> None:
        if self._prof is None:
            self._open()

    def _enter_region(self, name: str) -> Any:
        from torch.profiler import record_function

        self._regions.add(name)
        ctx = record_function(name)
        ctx.__enter__()
        return ctx

    def _exit_region(self, name: str, token: Any) -> None:
        token.__exit__(None, None, None)

    def _discard_iteration(self, i: int) -> None:
        if self.config.per_step:
            self._close()

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        metrics: dict[str, Any] = {"max_gpu_mb": self.ops.max_memory_mb()}
        if not self.config.per_step:
            if self._cycle_ends_at(i):
                self._end_cycle()
            return metrics
        prof = self._close()
        regions, rows = self._analyse(prof.events(), iteration=i)
        self.op_rows.extend(rows)
        metrics["callback_time_sec"] = self._callback_sec
        metrics.update(regions)
        return metrics

    def _end_cycle(self) -> None:
        prof = self._close()
        if prof is None:
            return
        _, rows = self._analyse(prof.events(), iteration="agg", aggregate_only=True)
        self.op_rows.extend(dict(row, cycle=self._cycle) for row in rows)
        if self.config.trace_dir is not None:
            name = TRACE_FILE.format(rank=self.rank)
            if self._cycle > 0:
                name = name.replace(".pt.trace", f".cycle{self._cycle}.pt.trace")
            path = Path(self.config.trace_dir) / name
            path.parent.mkdir(parents=True, exist_ok=True)  # validated as creatable, created on first use
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            prof.export_chrome_trace(str(tmp))
            os.replace(tmp, path)
            self.files.append(path)
        self._cycle += 1

    def _finish(self) -> None:
        if not self.config.per_step:
            self._end_cycle()
        else:
            self._close()

    def _write_extra_files(self, stem: str) -> list[Path]:
        if not self.op_rows:
            return []
        return [write_csv(self.output_dir / OPS_FILE.format(run_name=stem), self.op_rows)]

    # -- cross-rank ------------------------------------------------------------------------
    def _cross_rank_metrics(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        keys = [k for k in per_rank[0] if k.endswith("_comm_sec") and all(k in m for m in per_rank)]
        if not keys:
            return {}
        out: dict[str, Any] = {}
        for key in keys:
            for r, m in enumerate(per_rank):
                out[f"{key}_rank{r}"] = m[key]
        waits = [sum(m[k] for k in keys) for m in per_rank]
        # The rank that waited least is the one the others waited for.
        out["straggler_rank"] = min(range(len(waits)), key=waits.__getitem__)
        return out

    # -- event analysis --------------------------------------------------------------------
    def _analyse(self, events, iteration: Any, aggregate_only: bool = False):
        """Per-region metrics and operator rows from one profiler cycle's events."""
        region_events = [e for e in events if e.name in self._regions and _is_cpu(e)]
        spans = [(e.time_range.start, e.time_range.end, e.name) for e in region_events]
        region_ids = {id(e) for e in region_events}

        def region_of(event) -> str | None:
            parent = event.cpu_parent
            while parent is not None:
                if id(parent) in region_ids:
                    return parent.name
                parent = parent.cpu_parent
            if is_comm_event(event.name):
                start = event.time_range.start
                inside = [(hi - lo, name) for lo, hi, name in spans if lo <= start <= hi]
                if inside:
                    return min(inside)[1]
            return None

        cpu_sec: dict[str, float] = {}
        cuda_sec: dict[str, float] = {}
        comm: dict[str | None, list[tuple[float, float]]] = {}
        ops: dict[tuple[str, str], dict[str, Any]] = {}
        on_cuda = self.ops.is_cuda
        for event in events:
            if id(event) in region_ids:
                cpu_sec[event.name] = cpu_sec.get(event.name, 0.0) + event.cpu_time_total * _US
                continue
            region = region_of(event)
            if is_comm_event(event.name):
                comm.setdefault(region, []).append((event.time_range.start, event.time_range.end))
            if not _is_cpu(event):
                continue
            if region is not None:
                cuda_sec[region] = cuda_sec.get(region, 0.0) + event.self_device_time_total * _US
            row = ops.setdefault(
                (region or "untracked", event.name),
                {
                    "iter": iteration,
                    "rank": self.rank,
                    "region": region or "untracked",
                    "operator": event.name,
                    "cpu_sec": 0.0,
                    "cuda_sec": 0.0,
                    "self_cuda_sec": 0.0,
                    "mem_mb": 0.0,
                    "self_mem_mb": 0.0,
                    "count": 0,
                },
            )
            row["cpu_sec"] += event.cpu_time_total * _US
            row["cuda_sec"] += event.device_time_total * _US
            row["self_cuda_sec"] += event.self_device_time_total * _US
            mem = event.device_memory_usage if on_cuda else event.cpu_memory_usage
            self_mem = event.self_device_memory_usage if on_cuda else event.self_cpu_memory_usage
            row["mem_mb"] += mem / MB
            row["self_mem_mb"] += self_mem / MB
            row["count"] += 1
        if aggregate_only:
            return {}, list(ops.values())
        metrics: dict[str, Any] = {}
        for name in cpu_sec:
            metrics[f"{name}_cpu_sec"] = cpu_sec[name]
            metrics[f"{name}_cuda_sec"] = cuda_sec.get(name, 0.0)
            metrics[f"{name}_comm_sec"] = _union_length(comm.get(name, [])) * _US
        metrics["comm_cuda_sec"] = sum(metrics[f"{n}_comm_sec"] for n in cpu_sec)
        metrics["comm_sync_sec"] = _union_length(comm.get(None, [])) * _US
        return metrics, list(ops.values())
