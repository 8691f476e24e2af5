"""The ``torch`` backend: ``torch.profiler`` with regions as ``record_function`` ranges.

Per-step mode (default) runs one profiler cycle per recorded iteration and reports, per
region, ``<region>_cpu_sec`` (wall time of the region's CPU range), ``<region>_cuda_sec``
(device time of the kernels launched inside it), ``<region>_comm_sec`` (time covered by
communication inside it), plus ``comm_cuda_sec`` (communication inside regions),
``comm_sync_sec`` (communication outside every region), ``total_time_sec``,
``step_time_sec`` (``total_time_sec - callback_time_sec``, derived by the base class),
``max_gpu_mb``, ``callback_time_sec`` and ``profiler_overhead_sec`` (profiler start, stop
and event processing, outside the iteration clock). On CPU, ``<region>_compute_sec`` (its
thread's operators), where the framework marks its hooks
(:data:`~scopebench.profiler.torch_ranges.HOOK_PREFIXES`) ``<region>_hooks_compute_sec`` (the
operators inside them) and, with the ledger, ``<region>_host_hooks_sec`` (the time inside them
outside operators and blocked waits, mapped from kineto's clock to the ledger's). On CUDA the
ledger's columns come from the cycle's GPU work instead (:meth:`TorchProfiler._device_ledger`,
:mod:`scopebench.profiler.gpu_collectives`): ``<region>_compute_sec`` (its compute kernels),
``_comm_wait_peer_sec``, ``_comm_transfer_sec``, ``_comm_hidden_sec`` (its NCCL kernels' waits for
the last rank, the rest of their time, the part under compute) and the iteration's ``late_rank``.

Scheduled mode (``per_step=False``) keeps one profiler running over each ``active``-long
cycle of the window (``repeat`` cycles, 0 = forever), reports only ``total_time_sec``,
``step_time_sec`` and ``max_gpu_mb`` per iteration, aggregates operator rows with ``iter=agg`` and,
with a trace folder, exports each cycle ``k`` (0-based) of each rank as a gzipped Chrome trace
:data:`~scopebench.profiler.files.TRACE_FILE`,
``<trace_dir>/<name>_<run-id>/cycle<k>/<name>_<run-id>_rank<r>.pt.trace.json.gz``: every rank
of a run shares rank 0's run id, so one cycle folder holds one cycle of one run, every rank's
file, and is what Holistic Trace Analysis loads (``TraceAnalysis(trace_dir=<cycle folder>)``)
or Perfetto opens (docs/profiler.md, "Opening a trace"). torch writes the rank, world size and
backend into each trace (``distributedInfo``). With ``repeat=0`` only the last
:data:`KEPT_TRACES` cycles are kept: each rank removes its older files, and the last rank to
leave a cycle folder removes the folder. With the ledger on (several CPU ranks), each rank's trace
also carries its own ledger of each iteration of the cycle, its collectives (``<op> #<seq>``), the
intervals it was blocked and the iteration's late rank, in a track of their own
(:mod:`scopebench.profiler.trace_ledger`).

Each recorded iteration ``i`` of scheduled mode is a ``ProfilerStep#<i>`` range in the trace
(``i`` the profiler's iteration index, 0-based, as in the window): HTA groups events by
these steps, Perfetto shows them as slices. It is the range torch's own ``profile.step()`` opens (a
``record_function("ProfilerStep#<n>")``, torch/profiler/profiler.py), but torch's spans from
one ``step()`` call to the next, counting ``n`` from 0 per profiler, so it would hold the
benchopt callback and the cross-rank reduction; ours opens when the iteration's clock starts
and closes when it stops: the trace's step is ``step_time_sec``. The markers are left out of
the operator rows, which stay those of the operators alone.

Operator rows (``cpu_sec, cuda_sec, self_cuda_sec, mem_mb, self_mem_mb, count`` by
iteration, region and operator) exist only to be written to ``_torch_ops.csv``: they are
built, and memory is profiled (``profile_memory``), only with ``save_file`` (memory also
with a trace folder, so the trace shows allocations).

Communication (NCCL, Gloo and c10d events) is attributed to its enclosing region as
described in :mod:`scopebench.profiler.torch_events`, which reads the events.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from scopebench.profiler.base import Profiler
from scopebench.profiler.files import OPS_FILE, TRACE_FILE, run_name, shared_run_name, write_csv, write_exported
from scopebench.profiler.ledger import host_hooks
from scopebench.profiler.torch_events import STEP_MARKER, analyse_events, kineto_events
from scopebench.profiler.trace_ledger import ledger_iteration, ledger_rewriter, record_epoch_ns

__all__ = ["KEPT_TRACES", "STEP_MARKER", "TRACE_FILE", "TorchProfiler"]

#: With ``profiler_repeat: 0`` and a trace folder, traces of older cycles are deleted so
#: that only this many (the latest) remain per rank.
KEPT_TRACES = 3


class TorchProfiler(Profiler):
    """``torch.profiler`` backend; see the module docstring for its metrics and files."""

    region_time_key = "{}_cpu_sec"
    reports_overhead = True
    #: A collective still running on gloo's thread when a cycle stops races kineto's teardown of
    #: the cycle (a rank died with SIGSEGV at the loop's end, DDP under per-step cycles): the
    #: training step's loss gather completes inside its iteration here.
    async_collectives = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._prof = None
        self._cycle = 0
        self._regions: set[str] = set()
        self._traces: list[Path] = []
        #: A stopped cycle's profiler and number whose trace is not written yet, and the ledger of
        #: that cycle's iterations on this rank, which its trace carries.
        self._unwritten: tuple[Any, int] | None = None
        self._trace_ledger: list[Any] = []
        #: The open ``ProfilerStep#N`` range of the current iteration (scheduled mode).
        self._step_marker: Any = None
        #: The last analysed iteration's framework-hook intervals per region (ns, kineto's clock;
        #: :func:`~scopebench.profiler.torch_events.analyse_events`), for the ledger's host hooks.
        self._hooks: dict[str, list[tuple[int, int]]] = {}
        #: Recorded iteration -> its hook intervals, until the exchange gives its ledger.
        self._pending_hooks: dict[int, dict[str, list[tuple[int, int]]]] = {}
        #: Operator rows only exist to be written (``save_file``).
        self._with_ops = self.config.save_file
        self.op_rows: list[dict[str, Any]] = []

    # -- profiler cycles -----------------------------------------------------------------
    def _open(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if self.ops.is_cuda:
            activities.append(ProfilerActivity.CUDA)
        memory = self._with_ops or self.config.trace_dir is not None
        self._prof = profile(activities=activities, profile_memory=memory)
        self._prof.__enter__()

    def _close(self):
        self._end_step_marker()
        prof, self._prof = self._prof, None
        if prof is not None:
            prof.__exit__(None, None, None)
        return prof

    def _analyse(self, prof, iteration: Any, region_metrics: bool = True) -> dict[str, Any]:
        """Region metrics of a stopped cycle; operator rows go to :attr:`op_rows`."""
        if not (region_metrics or self._with_ops):
            return {}
        self._hooks = {}
        metrics, rows = analyse_events(
            kineto_events(prof),
            self._regions,
            iteration=iteration,
            rank=self.rank,
            on_cuda=self.ops.is_cuda,
            with_ops=self._with_ops,
            region_metrics=region_metrics,
            hooks=self._hooks if region_metrics else None,
        )
        if rows:
            if not region_metrics:
                rows = [dict(row, cycle=self._cycle) for row in rows]
            self.op_rows.extend(rows)
        return metrics

    def _cycle_ends_at(self, i: int) -> bool:
        cfg = self.config
        return cfg.active > 0 and (i - cfg.warmup + 1) % cfg.active == 0

    def _end_step_marker(self) -> None:
        """Close the current iteration's ``ProfilerStep#N`` range, if one is open."""
        marker, self._step_marker = self._step_marker, None
        if marker is not None:
            marker.__exit__(None, None, None)

    # -- hooks -----------------------------------------------------------------------------
    def _start_iteration(self, i: int) -> None:
        if self._prof is None:
            self._open()
        if not self.config.per_step:
            from torch.profiler import record_function

            self._step_marker = record_function(STEP_MARKER.format(i))
            self._step_marker.__enter__()

    def _enter_region(self, name: str) -> Any:
        from torch.profiler import record_function

        self._regions.add(name)
        ctx = record_function(name)
        ctx.__enter__()
        return ctx

    def _exit_region(self, name: str, token: Any) -> None:
        token.__exit__(None, None, None)

    def _discard_iteration(self, i: int) -> None:
        # The marker of an iteration that never ended (an error in its body) is closed, not
        # dropped: the trace shows how far it ran.
        self._end_step_marker()
        if self.config.per_step:
            self._close()

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        self._end_step_marker()
        metrics: dict[str, Any] = {"max_gpu_mb": self.ops.max_memory_mb()}
        if not self.config.per_step:
            if self._cycle_ends_at(i):
                # The ledger of iteration i comes after this hook: its trace waits for it.
                self._end_cycle(ledger_pending=self._ledger is not None)
            return metrics
        prof = self._close()
        metrics["callback_time_sec"] = self._callback_sec
        metrics.update(self._analyse(prof, iteration=i))
        if self.ops.is_cuda:
            metrics.update(self._device_ledger(prof))
        return metrics

    def _device_ledger(self, prof) -> dict[str, Any]:
        """The ledger on CUDA (per-step mode): each region's ``_compute_sec``, ``_comm_wait_peer_sec``,
        ``_comm_transfer_sec`` and ``_comm_hidden_sec``, and the late rank, from this cycle's GPU work
        and every rank's (:func:`~scopebench.profiler.gpu_collectives.device_columns`; one gather,
        outside the clock). ``SCOPEBENCH_LEDGER=0`` turns it off."""
        from scopebench.environment import env_setting

        if not env_setting("SCOPEBENCH_LEDGER"):
            return {}
        from scopebench.distributed.reduce import gather_objects
        from scopebench.profiler.gpu_collectives import device_columns, device_record
        from scopebench.profiler.kineto import from_profiler

        record = device_record(from_profiler(kineto_events(prof)), self._regions, self.rank)
        return device_columns(gather_objects(record), self.rank)

    def _end_cycle(self, ledger_pending: bool = False) -> None:
        prof = self._close()
        if prof is None:
            return
        self._analyse(prof, iteration="agg", region_metrics=False)
        if self.config.trace_dir is not None:
            self._unwritten = (prof, self._cycle)
            if not ledger_pending:
                self._write_trace()
        self._cycle += 1

    def _ledger_record(self, i: int, stop: float, metrics: dict[str, Any]) -> Any:
        record = super()._ledger_record(i, stop, metrics)
        hooks, self._hooks = self._hooks, {}
        if hooks:  # the iteration's framework-hook intervals wait for the exchange with it
            self._pending_hooks[i] = hooks
        return record

    def _ledger_columns(self, i: int, records: list[Any], metrics: dict[str, Any]) -> dict[str, Any]:
        out = super()._ledger_columns(i, records, metrics)
        hooks = self._pending_hooks.pop(i, None)
        if hooks:
            # kineto's clock is the wall clock's; the record's, perf_counter's less the offset
            # to rank 0's (the trace ledger's mapping, within ±0.5 µs).
            shift = record_epoch_ns(self._ledger[0])
            mine = next(rec for rec in records if rec.rank == self.rank)
            on_record = {name: [((s - shift) / 1e9, (e - shift) / 1e9) for s, e in ivs] for name, ivs in hooks.items()}
            out.update(host_hooks(mine, on_record, out))
        if self.config.trace_dir is not None and not self.config.per_step:
            self._trace_ledger.append(ledger_iteration(i, records, self.rank, out, self._ledger[0]))
            if self._cycle_ends_at(i):  # the cycle's last iteration: its trace has every ledger now
                self._write_trace()
        return out

    def _exchange_due(self, i: int) -> bool:
        # A cycle's trace carries the ledger of its iterations: it is written once they are in.
        return self.config.trace_dir is not None and not self.config.per_step and self._cycle_ends_at(i)

    def _write_trace(self) -> None:
        """The stopped cycle's gzipped Chrome trace in its cycle folder, with this rank's ledger of
        its iterations; with ``repeat=0`` only the last :data:`KEPT_TRACES` cycles stay."""
        if self._unwritten is None:
            return
        (prof, cycle), self._unwritten = self._unwritten, None
        ledger, self._trace_ledger = self._trace_ledger, []
        name = TRACE_FILE.format(
            shared_run_name=shared_run_name(self.name, self._run_id),
            cycle=cycle,
            run_name=run_name(self.name, self._run_id, self.rank),
        )
        path = Path(self.config.trace_dir) / name
        rewrite = ledger_rewriter(ledger) if ledger else None
        if not self._try_write(
            "profiler_trace_dir", path, lambda: write_exported(path, prof.export_chrome_trace, rewrite)
        ):
            return
        self.files.append(path)
        self._traces.append(path)
        if self.config.repeat == 0 and len(self._traces) > KEPT_TRACES:
            old = self._traces.pop(0)
            old.unlink(missing_ok=True)
            self.files.remove(old)
            # The other ranks' files of that cycle may still be there: the last one out
            # removes the folder. The ranks keep step (a gather per iteration), so none is
            # still writing into a cycle KEPT_TRACES behind.
            with contextlib.suppress(OSError):
                os.rmdir(old.parent)

    def _finish(self) -> None:
        if not self.config.per_step:
            self._write_trace()  # a cycle whose last ledger never came (an error after it stopped)
            self._end_cycle()
        else:
            self._close()

    def _write_extra_files(self, stem: str) -> list[Path]:
        if not self.op_rows:
            return []
        path = self.output_dir / OPS_FILE.format(run_name=stem)
        return [path] if self._try_write("profiler_save_file", path, lambda: write_csv(path, self.op_rows)) else []

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
