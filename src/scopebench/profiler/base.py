"""The profiler base: window bookkeeping, the loop, rank reduction and files.

A backend implements a few hooks (``_start_iteration``, ``_enter_region``,
``_exit_region``, ``_iteration_metrics``, ``_finish``); everything else — which
iterations are recorded, the iteration clock, callback time, cross-rank reduction and
per-rank CSV files — lives here, identical for every backend.

Timeline of one recorded iteration ``i`` (0-based)::

    callback ── [backend start] ── body (regions) ── end_iteration() ── [stop, reduction]
    |<-- A -->|                    |<------------ B ------------->|
    total_time_sec = A + B,  callback_time_sec = A,  step_time_sec = B

Every backend that records ``total_time_sec`` also gets ``step_time_sec =
total_time_sec - callback_time_sec`` (the iteration without benchopt's scoring callback,
what ``samples_per_sec`` divides by), derived here in :meth:`Profiler.end_iteration`;
``callback_time_sec`` itself is a column only where the backend reports it. Under the
cross-rank reduction ``step_time_sec`` is, like every time, the maximum over ranks of
each rank's own value (the slowest rank's step), so on the reduced row it is at least,
and can exceed, ``total_time_sec - callback_time_sec`` (whose two maxima may come from
different ranks: a rank that finished its step early waits longer in the next callback).

The callback at the top of iteration ``i`` scores iteration ``i - 1``; its duration is
``callback_time_sec`` of iteration ``i``. The profiler's own work outside the clock —
backend start before it, and after it the backend's metrics (torch: stop and trace
processing), the cross-rank gather and the reduction — is reported as
``profiler_overhead_sec`` (``custom`` and ``torch``), so the interval between two
callbacks is ``total_time_sec + profiler_overhead_sec`` up to a few microseconds.
Its work inside the clock — each region's enter and exit hooks (torch's
``record_function``, the custom backend's memory reads), memory tracking and the
wall-time bookkeeping — is timed by perf_counter pairs around it and reported as
``profiler_inside_sec``; the host sampler thread's CPU time over the iteration as
``profiler_sampler_cpu_sec``. The custom backend's CUDA synchronisations around regions
are not in it: what they wait for is the step's own queued work, and what they cost
beyond that (lost CPU/GPU overlap) no timer on the host can separate from it, only an
A/B against a run without them.
When the callback says stop, no iteration begins: no empty range, no profiler cycle.

Rows are kept in memory only when they will be written (``save_file``), so a long run
without files does not grow. The process group must exist before the first iteration
(rank and world size are read once, when the loop starts, and kept for the file names
even after the group is destroyed).
"""

from __future__ import annotations

import os
import socket
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from scopebench.distributed.reduce import broadcast_flag, gather_objects, world
from scopebench.profiler.config import ProfilerConfig
from scopebench.profiler.device import DeviceOps
from scopebench.profiler.exchange import BUFFER_MAX, EXCHANGE_CHUNK, CrossRank, reduce_across_ranks
from scopebench.profiler.files import METRICS_FILE, new_run_id, run_name, write_csv
from scopebench.profiler.regions import IdleRegion, Region, clock

__all__ = ["BUFFER_MAX", "EXCHANGE_CHUNK", "Profiler", "reduce_across_ranks"]


def _go_on() -> bool:
    """The decision of a loop without a callback on one rank."""
    return True


class Profiler(CrossRank):
    """Shared machinery of every backend; use :func:`scopebench.profiler.create_profiler`.

    Args:
        config: Validated settings.
        device: Device the solver computes on.
        name: Stem of this run's file names.
        output_dir: Directory of the per-rank CSV files.
    """

    #: Per-region metric whose cross-rank skew is reported (``None``: only the total).
    region_time_key: str | None = None
    #: Whether rows carry ``profiler_overhead_sec`` (the profiler's time outside the clock),
    #: ``profiler_inside_sec`` (its region bookkeeping inside the clock) and, with the host
    #: sampler on, ``profiler_sampler_cpu_sec``.
    reports_overhead = False
    #: Whether regions synchronise on CUDA: the base then synchronises before ``_enter_region``
    #: and ``_exit_region`` (which find the device idle), outside ``profiler_inside_sec``, so
    #: the wait for work queued before and inside a region is never taken for the profiler's.
    region_sync = False
    #: Whether a collective the step leaves running past its iteration's end is safe: the
    #: training step's loss gather is then waited for later, outside the step (else inside it).
    async_collectives = True

    def __init__(self, config: ProfilerConfig, device: Any = "cpu", name: str = "run", output_dir: Any = "outputs"):
        self.config = config
        #: ``config.window()``, read every iteration (the config is frozen).
        self._window = config.window()
        self.device = device
        self.name = name
        self.output_dir = Path(output_dir)
        self.ops = DeviceOps(device)
        self.iteration = 0
        self.recorded = 0
        #: Every recorded iteration's raw metrics on this rank; kept only when they will be
        #: written (``save_file``) or a caller asks for them (:attr:`keep_rows`), so a long
        #: run without files does not grow.
        self.rows: list[dict[str, Any]] = []
        self.keep_rows = config.save_file
        #: This rank's own metrics of the last recorded iteration (before the cross-rank
        #: reduction that :meth:`get_current_metrics` shows on rank 0).
        self.last_local: dict[str, Any] = {}
        self.files: list[Path] = []
        self._run_id = new_run_id()
        self._world: tuple[int, int] | None = None
        self._named = False
        self._current: dict[str, Any] = {}
        self._begun = False
        self._recording = False
        self._finalized = False
        self._t0 = 0.0
        self._callback_sec = 0.0
        self._region_wall: dict[str, float] = {}
        self._overhead_sec = 0.0
        self._inside_sec = 0.0
        #: Set when the first recorded iteration begins (instance attributes: the hot path reads
        #: them): whether the device is CUDA, whether regions synchronise on it (``region_sync``
        #: there), whether the backend's region hooks are idle (:meth:`_region_hooks_idle`),
        #: whether the host sampler was started (or is off), whether every recorded iteration
        #: calls ``_start_iteration`` (:meth:`_starts_each_iteration`).
        self._cuda = False
        self._sync_regions = False
        self._idle_hooks = False
        self._sampler_tried = False
        self._start_each = True
        self._reports_overhead = self.reports_overhead
        #: The host sampler of the window (:mod:`scopebench.profiler.sampler`), ``None`` until
        #: the window begins or when off; the process groups of the ranks on this host.
        self.sampler: Any = None
        self._sample_mark = 0
        self._rank_pgids: set[int] | None = None
        #: ``profiler_memory``'s per-region breakdown, once :meth:`track_memory` was called.
        self._memory: Any = None
        #: The ledger's clock alignment ``(offset, error, how)`` once it is on (:meth:`_ledger_possible`),
        #: and the recorded iteration's region spans.
        self._ledger: tuple[float, float, str] | None = None
        #: Each region name's :class:`IdleRegion` where the backend's region hooks are idle (in
        #: the window: emptied when it ends, a reference cycle otherwise left to the collector).
        self._fast_regions: dict[str, IdleRegion] = {}
        self._trains = False  # track_communication was called: the ledger also on one rank
        self._spans: list[tuple[str, float, float]] | None = None
        #: Every rank's ledger record of the last recorded iteration (:class:`~scopebench.profiler.ledger.RankRecord`,
        #: on rank 0's clock), for a backend that writes them out; and how many iterations carried
        #: their ``ledger_timeline`` so far.
        self.ledger_records: list[Any] = []
        self._timelines = 0
        #: Exchange once per window instead of after every recorded iteration (set by a run that
        #: reads the rows after its loop, ``profile-step``): the ledger's records and the metrics
        #: cross the ranks when the window or the loop ends (or every :data:`BUFFER_MAX` recorded
        #: iterations), never on the step path. Until then rank 0's :meth:`get_current_metrics` is
        #: its own iteration's, without the ledger's columns.
        self.defer_exchange = False
        #: The loop has no barrier between its steps (every rank counts them: :meth:`iterate`'s
        #: callback is ``every_rank``, set as it starts): rank 0's reduced rows take the ranks'
        #: mean of the iteration and region times, not their maximum (:func:`reduce_across_ranks`).
        self.unaligned_steps = False
        #: Recorded iterations per gather of an exchange (:data:`EXCHANGE_CHUNK`; the same on
        #: every rank).
        self.exchange_chunk = EXCHANGE_CHUNK
        #: Rank 0's reduced row of every recorded iteration, what :meth:`get_current_metrics`
        #: shows after an exchange (with :attr:`keep_rows`; on other ranks empty).
        self.reduced_rows: list[dict[str, Any]] = []
        #: Recorded iterations whose cross-rank part waits for :meth:`_exchange`: ``(i, metrics,
        #: ledger record)``.
        self._pending: list[tuple[int, dict[str, Any], Any]] = []
        #: When :meth:`iterate`'s loop ended (its last iteration's end, before the exchange that
        #: follows it), and what the exchanges after the window's (or the loop's) last recorded
        #: iteration cost (seconds, in no iteration's ``profiler_overhead_sec``: no recorded step
        #: waited for them).
        self.loop_ended_at: float | None = None
        self.after_window_sec = 0.0

    # -- public API ----------------------------------------------------------------
    @property
    def rank(self) -> int:
        """Rank in the process group (0 without one), as read when the loop started."""
        return self._world[0] if self._world is not None else world()[0]

    @property
    def world_size(self) -> int:
        return self._world[1] if self._world is not None else world()[1]

    @property
    def recording(self) -> bool:
        """Whether the current iteration is inside the recording window."""
        self._ensure_begun()
        return self._recording

    def track_step(self, name: str) -> Region | IdleRegion:
        """Time (and, per backend, trace) one named region of the current iteration."""
        if not self._begun:
            self._ensure_begun()
        region = self._fast_regions.get(name)
        if region is not None and region.start is None:  # not open (a region nested in itself)
            return region
        return Region(self, name)

    def track_memory(self, model: Any, optimizer: Any = None, engine: Any = None) -> None:
        """What the step trains, for ``profiler_memory`` (called once, after building; a no-op
        when ``profiler_memory`` is off). ``engine``: DeepSpeed's engine under ZeRO."""
        if not self.config.memory or self._memory is not None:
            return
        from scopebench.profiler.memory import MemoryTracking

        def where():  # the snapshot's folder (the traces' when set, else the CSV files') and stem
            return Path(self.config.trace_dir or self.output_dir), run_name(self.name, self._run_id, self.rank)

        self._memory = MemoryTracking(self.device, model, optimizer, engine, self.ops.cuda_module(), where)
        self._fast_regions.clear()  # its hooks run around every region

    def track_communication(self, model: Any) -> None:
        """What the step trains, for the ledger (called once, after building, before the first
        backward): a DDP-wrapped model gets the all-reduce hook that shows its buckets to the
        ledger (:mod:`scopebench.profiler.collectives`). A step that trains keeps the ledger on
        one rank without a group too (one-rank DDP: every phase is work, split into compute and
        host overhead under torch). A no-op where the ledger is off."""
        self._trains = True
        if not self._ledger_possible():
            return
        from torch.nn.parallel import DistributedDataParallel

        if isinstance(model, DistributedDataParallel):
            from scopebench.profiler.collectives import recorder

            recorder.install()
            model.register_comm_hook(None, recorder.ddp_hook)

    def end_iteration(self) -> None:
        """Close the current iteration; its metrics become :meth:`get_current_metrics`."""
        if not self._begun:
            self._ensure_begun()
        i = self.iteration
        self.iteration = i + 1
        self._begun = False
        if not self._recording:
            self._current = {}
            return
        if self._cuda:
            self.ops.synchronize()
        stop = clock()
        if self._ledger is not None:
            from scopebench.profiler.collectives import recorder

            recorder.stop()
        # The callback ran just before the clock started (so backends never trace it).
        callback = self._callback_sec
        total = stop - self._t0 + callback
        # The one place step time is derived: consumers read it rather than subtract.
        metrics = self._iteration_row(i, total, total - callback)
        record = self._ledger_record(i, stop, metrics) if self._ledger is not None else None
        if self._memory is not None:
            metrics.update(self._memory.iteration_metrics())
        reports = self._reports_overhead
        if reports:
            metrics["profiler_inside_sec"] = self._inside_sec
        sampler = self.sampler
        if sampler is not None:  # its thread's CPU time with the profiler's own costs
            steady = sampler.steady  # set only with ``reports`` (its thread's CPU time in it)
            if steady[0] == self._sample_mark == sampler.seq:  # no sample since the last
                metrics.update(steady[1])
            else:
                sampler.window_into(metrics, self._sample_mark, total, reports)
        if reports:
            metrics["profiler_overhead_sec"] = self._overhead_sec + (clock() - stop)
        self.recorded += 1
        self.last_local = metrics
        if record is None and not self.defer_exchange and not self._pending and self._world[1] == 1:
            # One rank without the ledger, exchanged every iteration (benchopt's loop): nothing
            # crosses the ranks, the iteration's own row is its reduced row (_exchange_items).
            self._current = metrics
            if self.keep_rows:
                self.rows.append({"iter": i, "rank": self._world[0], **metrics})
                self.reduced_rows.append(metrics)
            return
        self._pending.append((i, metrics, record))
        if not self.defer_exchange or len(self._pending) >= BUFFER_MAX or self._exchange_due(i):
            self._exchange()
        else:
            self._current = metrics

    def get_current_metrics(self) -> dict[str, Any]:
        """Metrics of the last finished iteration; ``{}`` when it was not recorded."""
        return dict(self._current)

    def split_region(self, region: str, part: str, seconds: float) -> None:
        """Count ``seconds`` of the current iteration's ``region`` as region ``part`` instead: work
        measured inside the region by its own clock (the frame decoding a dataloader fetch ran).
        At most the region's time moves, so the regions still add up to the iteration's wall
        time. Nothing happens outside the recording window.
        """
        if not self._recording:
            return
        wall = self._region_wall
        moved = min(max(seconds, 0.0), wall.get(region, 0.0))
        wall[region] = wall.get(region, 0.0) - moved
        wall[part] = wall.get(part, 0.0) + moved

    def iterate(
        self, callback: Callable[[], bool] | None = None, before_callback: Callable[[], None] | None = None
    ) -> Iterator[int]:
        """The solver loop: ``for i in profiler.iterate(callback): <one iteration>``.

        Rank 0 calls ``callback`` (benchopt's) at the top of each iteration and every rank
        follows its decision, so all ranks stop together. Other ranks pass ``None``, unless the
        callback decides alike on every rank (``every_rank``: each rank calls its own, no broadcast).
        ``before_callback``, when given, runs on every rank just before (work all ranks
        must do for the scoring or a checkpoint); its time counts in ``callback_time_sec``.
        """
        self.unaligned_steps = bool(getattr(callback, "every_rank", False))
        decide = self._decision(callback)
        while True:
            start = clock()
            if before_callback is not None:
                before_callback()
            go = decide()
            called = clock()
            if not go:
                # every rank stops here together; what the loop left for the exchange crosses
                # after its last iteration, in no iteration's time (``after_window_sec``)
                self.loop_ended_at = time.perf_counter()
                self._exchange(after_window=True)
                return
            self._ensure_begun(called, called - start)  # what follows the callback is the profiler's
            yield self.iteration
            self.end_iteration()

    def _decision(self, callback: Callable[[], bool] | None) -> Callable[[], Any]:
        """What decides, at the top of each iteration, whether the loop goes on: chosen once, as
        the loop starts (the process group must exist by then).

        Rank 0's callback (or go on without one), its answer broadcast to every rank; alone, the
        callback itself. A callback whose ``every_rank`` attribute is true (a fixed count every
        rank keeps, :attr:`scopebench.harness.run.RankRun.loop_steps`) is called on every rank
        and gives every rank the same answer by itself: nothing crosses the ranks (on NCCL the
        broadcast would also be a host-device synchronisation every iteration).
        """
        rank, size = self._world or self._read_world()
        if getattr(callback, "every_rank", False) or (size == 1 and callback is not None):
            return callback
        if size == 1:
            return _go_on
        device = str(self.device)

        def broadcast() -> bool:
            go = callback() if (rank == 0 and callback is not None) else (rank == 0 or None)
            return broadcast_flag(go, device)

        return broadcast

    def finalize(self, partial: bool = False) -> list[Path]:
        """Stop the backend and write this rank's files (once); returns their paths.

        ``partial``: the run failed; the iterations recorded so far are kept, in files
        whose names say so (``<run-name>_partial_gpu_metrics.csv``...), never taken for a
        whole run's. A file that cannot be written is reported with a ``RuntimeWarning``
        naming it and the error; the run's results (benchopt's parquet) are not lost over it.
        """
        if self._finalized:
            return self.files
        self._finalized = True
        if self._begun:
            self._abandon_iteration()
        if partial:  # a failed run: no collective (a rank may be gone); its rows stay its own
            self._keep_unexchanged()
        else:
            self._exchange(after_window=True)
        if self.sampler is not None:
            self.sampler.stop()
        self._fast_regions.clear()  # they refer back to the profiler: no cycle outlives the run
        self._finish()
        if self._memory is not None:
            self.files.extend(self._memory.close())
        if self.config.save_file and self.rows:
            stem = run_name(self.name, self._run_id, self.rank) + ("_partial" if partial else "")
            path = self.output_dir / METRICS_FILE.format(run_name=stem)
            if self._try_write("profiler_save_file", path, lambda: write_csv(path, self.rows)):
                self.files.append(path)
            self.files.extend(self._write_extra_files(stem))
        self._warn_if_window_missed()
        return self.files

    def __enter__(self) -> Profiler:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        self.finalize(partial=exc_type is not None)

    # -- bookkeeping -------------------------------------------------------------------
    def _read_world(self) -> tuple[int, int]:
        self._world = world()
        return self._world

    def _ensure_begun(self, start: float | None = None, callback_sec: float = 0.0) -> None:
        """Begin the current iteration if it has not (``start``: when the profiler's work before
        its clock began, the callback's end in :meth:`iterate`, else now; ``callback_sec``: the
        callback's time, :meth:`iterate`'s)."""
        if self._begun:
            return
        self._begun = True
        first, end = self._window
        resumed = not self._recording  # the iteration before was not recorded
        self._recording = recording = first <= self.iteration < end
        self._callback_sec = callback_sec
        if recording:
            if not self._named:  # the window's first iteration: what stays for the run
                self._named = True
                if self._world is None:
                    self._read_world()
                self._cuda = self.ops.is_cuda
                self._sync_regions = self.region_sync and self._cuda
                self._idle_hooks = self._region_hooks_idle()
                self._start_each = self._starts_each_iteration()
                if self._world[1] > 1:  # every rank names its files after rank 0's run
                    ids = gather_objects((self._run_id, socket.gethostname(), os.getpgrp()))
                    self._run_id = ids[0][0]
                    self._rank_pgids = {pgid for _, host, pgid in ids if host == socket.gethostname()}
                if self._ledger_possible():
                    from scopebench.profiler.collectives import align_clocks, recorder

                    recorder.install()
                    self._ledger = align_clocks() if self._world[1] > 1 else (0.0, 0.0, "shared")
                    recorder.restart_sequences()  # after align_clocks' own collectives
                start = None  # that set-up is the run's, in no iteration's overhead (as before)
            self._region_wall = {}
            self._inside_sec = 0.0
            if start is None:
                start = clock()
            if not self._sampler_tried:  # once: off (period 0) stays off without asking again
                self._sampler_tried = True
                self._start_sampler()
            if resumed or self._start_each:
                self._start_iteration(self.iteration)
            if self._memory is not None:
                self._memory.start_iteration()
            if self._cuda:
                ops = self.ops
                ops.synchronize()
                ops.reset_peak_memory()
            sampler = self.sampler
            if sampler is not None:
                self._sample_mark = sampler.seq
            if self._ledger is not None:
                from scopebench.profiler.collectives import recorder

                self._spans = []
                recorder.start()
            self._t0 = t0 = clock()
            self._overhead_sec = t0 - start
        else:
            if self._pending:  # the window is over (every rank is at the same iteration)
                self._exchange(after_window=True)
            if self.sampler is not None and self.sampler.running:
                self.sampler.stop()
            self._fast_regions.clear()

    def _ledger_possible(self) -> bool:
        """The ledger runs on CPU under a backend that reports its own cost (``custom``,
        ``torch``) wherever a process group exists (several ranks, or FSDP2 alone, a group of
        one) or a training step was named (:meth:`track_communication`: one-rank DDP). Any other
        process without a group (the imaging benchmarks alone) has nothing to wait for or
        transfer, and pays nothing. On CUDA a collective's call returns before its kernels run,
        so host-side intervals do not say when a rank waited: not measured there yet.
        ``SCOPEBENCH_LEDGER=0`` turns it off (``perf/ledger_cost.py`` measures it against that)."""
        import torch.distributed as dist

        from scopebench.environment import env_setting

        if not env_setting("SCOPEBENCH_LEDGER"):
            return False
        grouped = dist.is_available() and dist.is_initialized()
        return self.reports_overhead and not self.ops.is_cuda and (grouped or self._trains)

    def _start_sampler(self) -> None:
        """Start the host sampler when the window begins (off: ``SCOPEBENCH_SAMPLER_PERIOD_SEC=0``)."""
        from scopebench.profiler.sampler import HostSampler, sampler_period

        period = sampler_period()
        if period > 0:
            self.sampler = HostSampler(self.device, period, pgids=self._rank_pgids, cuda=self.ops.is_cuda)
            self.sampler.start()
            # A profiler dropped without finalize() (a loop left early, an error in a caller
            # that does not close it) must not leave its thread sampling for the process's life.
            weakref.finalize(self, self.sampler.stop)

    def _abandon_iteration(self) -> None:
        """The loop stopped before the body ran: discard the begun iteration."""
        if self._begun and self._recording:
            if self._ledger is not None:
                from scopebench.profiler.collectives import recorder

                recorder.stop()  # a recorder left on would count other runs' collectives
            self._discard_iteration(self.iteration)
            if self._memory is not None:
                self._memory.stop()
        self._begun = False

    def _try_write(self, key: str, path: Path, write: Callable[[], Any]) -> bool:
        """Run ``write``; on ``OSError`` warn (naming ``key``, the path, the error) and go on."""
        try:
            write()
        except OSError as exc:
            warnings.warn(
                f"{key}: could not write {str(path)!r} ({exc}); the run's results are kept without this file",
                RuntimeWarning,
                stacklevel=3,
            )
            return False
        return True

    def _warn_if_window_missed(self) -> None:
        """Say, at the end of a run, that iterations ran but none was recorded."""
        if self.recorded or not self.iteration or self.rank != 0:
            return
        cfg = self.config
        files = " and no file was written" if cfg.save_file else ""
        warnings.warn(
            f"the profiler window was never reached: profiler_warmup={cfg.warmup}, "
            f"profiler_active={cfg.active}, but only {self.iteration} iteration(s) ran, so no "
            f"profiler metrics were recorded{files}; lower profiler_warmup below {self.iteration} "
            "or run more iterations",
            RuntimeWarning,
            stacklevel=3,
        )

    # -- backend hooks -------------------------------------------------------------------
    def _start_iteration(self, i: int) -> None:
        """A recorded iteration begins (before its clock starts): every one, or where
        :meth:`_starts_each_iteration` says no, the first after one not recorded."""

    def _starts_each_iteration(self) -> bool:
        """Whether :meth:`_start_iteration` has work at every recorded iteration (asked when the
        first begins); no: only where recording resumes (the window's first iteration)."""
        return True

    def _enter_region(self, name: str) -> Any:
        """A region of a recorded iteration opens; the return value reaches ``_exit_region``."""
        return None

    def _region_hooks_idle(self) -> bool:
        """Whether ``_enter_region`` and ``_exit_region`` have nothing to do once a region's name
        passed them (asked when the first recorded iteration begins): its later occurrences then
        only keep the clock (:class:`IdleRegion`), without the hooks' calls and their timers."""
        return False

    def _exit_region(self, name: str, token: Any) -> None:
        """A region of a recorded iteration closes."""

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        """Backend metrics of recorded iteration ``i`` (after its clock stopped)."""
        return {}

    def _iteration_row(self, i: int, total_sec: float, step_sec: float) -> dict[str, Any]:
        """Recorded iteration ``i``'s row: ``total_time_sec``, ``step_time_sec`` (derived by
        :meth:`end_iteration`) and :meth:`_iteration_metrics` (a backend may build it whole: the
        custom backend)."""
        row = {"total_time_sec": total_sec, "step_time_sec": step_sec}
        row.update(self._iteration_metrics(i, total_sec))
        return row

    def _discard_iteration(self, i: int) -> None:
        """A begun recorded iteration will never run (the loop stopped)."""

    def _cross_rank_metrics(self, per_rank: list[dict[str, Any]]) -> dict[str, Any]:
        """Extra rank-0 metrics derived from all ranks (e.g. the straggler)."""
        return {}

    def _finish(self) -> None:
        """Release backend resources at the end of the run."""

    def _write_extra_files(self, stem: str) -> list[Path]:
        """Backend files beside the metrics CSV."""
        return []
