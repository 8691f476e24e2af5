"""One rank's run: the lifecycle every benchmark's run object shares.

A run object (``PnPRun`` for imaging inference, ``TrainingRun`` for imaging training) is
a context manager used alike by the benchopt solver (rank 0), the spawned workers and the
scripts::

    with PnPRun(spec, config, nproc=2) as run:   # start(): ranks, device, build, profiler
        run.loop(callback)                        # rank 0's callback decides for every rank
    run.metrics()                                 # the metrics now: last iteration + setup_time_sec

The run objects: ``PnPRun`` (imaging inference), ``TrainingRun`` (imaging training),
``PolicyTrainRun`` (policy training and dataloader) and ``InferenceRun`` (policy
inference); every driver, the solvers included, uses :meth:`RankRun.start`,
:meth:`RankRun.loop`, :meth:`RankRun.metrics` and :meth:`RankRun.close`.

``start`` (benchopt's ``pre_run_hook``: untimed) joins or creates the ranks
(:class:`~scopebench.distributed.launch.DistSession`), resolves this rank's device, builds the
work (:meth:`RankRun.build`), creates the profiler, and ends with a barrier that every
rank passes before the first iteration, so no iteration holds another rank's start-up;
the time it took is ``setup_time_sec``. ``close`` (``__exit__``) undoes all of it in
reverse order, also on error; a spawned rank of a failed run writes no files.

Subclasses implement :meth:`build`, :meth:`step`, :meth:`teardown` and extend
:meth:`worker_kwargs`; their module defines the ``run_worker`` function that spawned ranks
run (:attr:`RankRun.worker_target`).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scopebench.distributed.info import get_dist_info

__all__ = ["RankRun"]


class RankRun:
    """Ranks, device, profiler, set-up barrier and teardown of one run on one rank.

    Every argument is validated here, before any work.

    Args:
        nproc: Processes wanted without a launcher (this one is rank 0; ``nproc_per_node``);
            under torchrun or SLURM the launcher's world is used.
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:<index>``
            (:func:`scopebench.distributed.device.resolve_device`).
        profiler: The validated :class:`~scopebench.profiler.ProfilerConfig` (solvers and
            tools), or its ``profiler_*`` values as a mapping (a spawned rank's JSON
            arguments, :meth:`ProfilerConfig.to_params`); ``None``: the defaults.
        output_dir: Folder of the profiler's per-rank files (checked writable when
            ``profiler_save_file`` is on).
        name: Stem of this run's file names.
        group_timeout_sec: Bound on worker start-up and on every collective; ``None``: the
            default of :class:`~scopebench.distributed.launch.DistSession`.
        worker: ``"module:function"`` spawned ranks run instead of :attr:`worker_target`
            (tests use it to slow or break one rank).
        keep_rows: Keep every recorded iteration's raw metrics in ``profiler.rows`` on
            each rank (the tools report every sample); otherwise only when
            ``profiler_save_file`` writes them.
        defer_exchange: The profiler's cross-rank exchange once per window, not after every
            iteration (:attr:`scopebench.profiler.Profiler.defer_exchange`): for a driver that
            reads the rows after the loop (``profile-step``), not rank 0's row at each callback.
        loop_steps: The iterations :meth:`loop` runs, counted by every rank itself (spawned ranks
            are told): no continue/stop broadcast between the steps (on NCCL also a host-device
            synchronisation each). None: rank 0's callback decides, broadcast every iteration.
    """

    #: ``"module:function"`` that spawned ranks run (the subclass module's ``run_worker``).
    worker_target: str = ""

    def __init__(
        self,
        *,
        nproc: int = 1,
        device: str = "auto",
        profiler: Any = None,
        output_dir: str | Path = "outputs",
        name: str = "run",
        group_timeout_sec: float | None = None,
        worker: str | None = None,
        keep_rows: bool = False,
        defer_exchange: bool = False,
        loop_steps: int | None = None,
    ) -> None:
        from scopebench.distributed.device import check_device, resolve_device
        from scopebench.distributed.launch import check_launcher_nproc, check_local_nproc
        from scopebench.profiler import ProfilerConfig
        from scopebench.validate import flag, integer, number, optional

        self.device_setting = check_device("device", device)
        self.device = resolve_device(device)  # refined by start(), which knows the local rank
        self.nproc = check_local_nproc("nproc_per_node", nproc, self.device.type)
        launcher = get_dist_info()
        if launcher.is_distributed:
            check_launcher_nproc("nproc_per_node", self.nproc, launcher.world_size, launcher.source, launcher.nodes)
        self.world_size = launcher.world_size if launcher.is_distributed else self.nproc
        if not isinstance(profiler, ProfilerConfig):
            profiler = ProfilerConfig.from_params(**dict(profiler or {}))
        self.profiler_config = profiler
        self.output_dir = Path(output_dir)
        profiler.check_outputs(self.output_dir)
        self.group_timeout_sec = optional(number, "group_timeout_sec", group_timeout_sec, low=0, low_open=True)
        self.name = name
        self.keep_rows = flag("keep_rows", keep_rows)
        self.defer_exchange = flag("defer_exchange", defer_exchange)
        self.loop_steps = optional(integer, "loop_steps", loop_steps, low=0)
        self.worker = worker or self.worker_target
        self.info = launcher
        self.session = None
        self.profiler = None
        self.setup_time_sec: float | None = None
        #: Every rank's :func:`scopebench.host.host_record`, gathered by :meth:`start`.
        self.host_records: list[dict[str, Any]] | None = None
        self._host_json: str | None = None
        self._stack = contextlib.ExitStack()
        self._failed = False

    # -- subclass hooks --------------------------------------------------------------
    def build(self) -> None:
        """Build this rank's work from plain parameters (after ranks and device exist)."""

    def step(self, profiler: Any) -> None:
        """One iteration, its regions timed by ``profiler.track_step(name)``."""
        raise NotImplementedError

    def teardown(self) -> None:
        """Release what :meth:`build` made; called on every exit, also after a partial build."""

    def memory_subjects(self) -> dict[str, Any] | None:
        """What the step trains, for ``profiler_memory``: ``{"model", "optimizer", "engine"}``
        (:meth:`scopebench.profiler.Profiler.track_memory`); None: nothing to attribute."""
        return None

    def communication_model(self) -> Any:
        """The model whose gradients the framework reduces, for the ledger's DDP hook
        (:meth:`scopebench.profiler.Profiler.track_communication`); None: none."""
        return None

    def worker_kwargs(self) -> dict[str, Any]:
        """JSON-serialisable keyword arguments that rebuild this run on a spawned rank."""
        return {
            "nproc": self.nproc,
            "device": self.device_setting,
            "profiler": self.profiler_config.to_params(),
            "output_dir": str(self.output_dir),
            "name": self.name,
            "group_timeout_sec": self.group_timeout_sec,
            "keep_rows": self.keep_rows,
            "defer_exchange": self.defer_exchange,
            "loop_steps": self.loop_steps,
        }

    # -- lifecycle -------------------------------------------------------------------
    def _session(self):
        from scopebench.distributed.launch import DistSession

        return DistSession(
            self.nproc,
            worker=self.worker or None,
            worker_kwargs=self.worker_kwargs(),
            device=self.device.type,
            timeout_sec=self.group_timeout_sec,
        )

    def start(self) -> RankRun:
        """Join or create the ranks, build the work, pass the set-up barrier (idempotent)."""
        import torch

        from scopebench.allocator import keep_freed_memory
        from scopebench.distributed.device import resolve_device
        from scopebench.distributed.reduce import barrier
        from scopebench.profiler import profiler_from_config

        if self.session is not None:
            return self
        keep_freed_memory()  # every driver of a run (solver, worker, script) gets the allocator settings
        begin = time.perf_counter()
        self._failed = False
        self.profiler, self.setup_time_sec = None, None
        self.session = self._session()
        self._stack.callback(self._close_session)
        try:
            self.info = self.session.start()
            self.device = resolve_device(self.device_setting, self.info.local_rank)
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            elif self.info.source == "spawn":
                # Spawned CPU ranks share this machine's cores: without a split each rank
                # would start one thread per core and they would fight over them.
                self._stack.callback(torch.set_num_threads, torch.get_num_threads())
                torch.set_num_threads(max(1, (os.cpu_count() or 1) // self.info.world_size))
            self._stack.callback(self.teardown)
            self._record_hosts()
            self.build()
            self.profiler = profiler_from_config(
                self.profiler_config, device=self.device, name=self.name, output_dir=self.output_dir
            )
            self.profiler.keep_rows |= self.keep_rows
            self.profiler.defer_exchange = self.defer_exchange  # alike on every rank: a collective pattern
            subjects = self.memory_subjects() if self.profiler_config.memory else None
            if subjects:
                self.profiler.track_memory(**subjects)
            model = self.communication_model()
            if model is not None:
                self.profiler.track_communication(model)
            self._stack.callback(self._finalize_profiler)
            barrier()
            self.setup_time_sec = time.perf_counter() - begin
        except BaseException:
            self.close(failed=True)
            raise
        return self

    def loop(
        self, callback: Callable[[], bool] | None = None, before_callback: Callable[[], None] | None = None
    ) -> None:
        """One :meth:`step` per iteration until rank 0's ``callback`` returns False.

        Other ranks ignore ``callback`` and follow rank 0's decision, broadcast every iteration.
        With :attr:`loop_steps` every rank runs that many iterations by its own count and nothing
        crosses the ranks between them; rank 0's ``callback`` still runs (a progress bar) and
        must not stop earlier. ``before_callback`` runs on every rank at the top of each
        iteration (collective work such as saving a checkpoint); its time counts as callback
        time, not step time.
        """
        from scopebench.distributed.launch import report_progress

        if self.profiler is None:
            raise RuntimeError(f"{type(self).__name__}.start() must run before loop()")
        callback = callback if self.info.rank == 0 else None
        if self.loop_steps is not None:
            callback = _Counted(self.loop_steps, callback)
        for i in self.profiler.iterate(callback, before_callback=before_callback):
            self.step(self.profiler)
            report_progress(i)

    @property
    def rank(self) -> int:
        """This process's rank (0 before :meth:`start` joined the ranks)."""
        return self.info.rank

    def _record_hosts(self) -> None:
        """Every rank's host record, on every rank (a collective of the untimed set-up)."""
        import json

        from scopebench.distributed.reduce import gather_objects
        from scopebench.host import host_record

        self.host_records = gather_objects({"rank": self.info.rank, **host_record(self.device)})
        self._host_json = json.dumps(self.host_records)

    def metrics(self, row: dict[str, Any] | None = None) -> dict[str, Any]:
        """The profiler's metrics of the last iteration (or ``row``, one of its
        :attr:`~scopebench.profiler.Profiler.reduced_rows`), the constant ``setup_time_sec`` and
        the host: ``host_records_json`` (one :func:`scopebench.host.host_record` per rank, as
        at the start, its ``load_average`` included), ``load_average_1m_start`` (rank 0's)
        and ``load_average_1m_end`` (now: on the last row, the end of the run)."""
        if row is not None:
            out = dict(row)
        else:
            out = self.profiler.get_current_metrics() if self.profiler is not None else {}
        if self.setup_time_sec is not None:
            out["setup_time_sec"] = self.setup_time_sec
        if self._host_json is not None:
            out["host_records_json"] = self._host_json
            start = self.host_records[0].get("load_average")
            if start:
                out["load_average_1m_start"] = start[0]
            try:
                out["load_average_1m_end"] = os.getloadavg()[0]
            except OSError:  # not available here: the column stays absent
                pass
        return out

    def close(self, failed: bool = False) -> None:
        """Undo :meth:`start` in reverse order; a failure names the rank that caused it."""
        self._failed = failed
        stack, self._stack = self._stack, contextlib.ExitStack()
        stack.close()

    def __enter__(self) -> RankRun:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # -- teardown pieces -------------------------------------------------------------
    def _finalize_profiler(self) -> None:
        # A spawned rank of a failed run writes nothing: rank 0 reports the failure, and a
        # worker's half of the files would only be mistaken for a result. Otherwise the
        # iterations of a failed run are kept, in files named partial.
        if self._failed and self.info.source == "spawn" and self.info.rank != 0:
            return
        self.profiler.finalize(partial=self._failed)

    def _close_session(self) -> None:
        session, self.session = self.session, None
        session.close(failed=self._failed)


class _Counted:
    """A loop of ``total`` iterations that every rank counts alike (``every_rank``: the profiler
    asks no broadcast), calling ``inner`` (rank 0's callback, or None) at each one as before."""

    every_rank = True

    def __init__(self, total: int, inner: Callable[[], bool] | None) -> None:
        self.total, self.inner, self.calls = total, inner, 0

    def __call__(self) -> bool:
        self.calls += 1
        go = self.calls <= self.total
        if self.inner is not None and not self.inner() and go:
            raise RuntimeError(
                f"the loop's callback stopped at iteration {self.calls} of the {self.total} its loop_steps "
                "promised every rank: the other ranks would wait for it"
            )
        return go
