"""Process groups: join the launcher's group, or spawn local workers and create one.

:class:`DistSession` is the one object that creates (and therefore destroys) the
``torch.distributed`` process group of a run:

* under ``torchrun`` / SLURM (world size from the environment) it initialises the group
  from the rendezvous in :func:`scopebench.distributed.info.get_dist_info`;
* on one machine, with ``nproc > 1`` and no launcher, rank 0 (the benchopt process)
  starts ``nproc - 1`` workers ``python -m scopebench.distributed.worker`` that run
  ``worker(**worker_kwargs)`` (:class:`~scopebench.distributed.spawn.LocalSpawn`: a file store in
  a private folder, loopback-only sockets, a lifeline), and every rank joins the group;
* with one process it does nothing.

Every collective is bounded by the group timeout (``group_timeout_sec``:
:data:`LOCAL_TIMEOUT_SEC` for a local spawn, :data:`LAUNCHER_TIMEOUT_SEC` under torchrun or
SLURM). When a run fails, :meth:`DistSession.close` names each rank that died, stopped or fell
behind (:class:`~scopebench.distributed.spawn.RankFailure`): a spawned rank with its exit code or
signal and log tail; under torchrun or SLURM, from the progress marks and process ids the
ranks leave in the rendezvous store (rank 0 reports; the launcher adds exit codes).

A group that existed before the session (created by the caller) is reused and left alone.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import sys

from scopebench.distributed.faults import announce_failure, launcher_reports, silent_nodes, timed_out
from scopebench.distributed.info import SPAWN_ENV, DistInfo, get_dist_info
from scopebench.distributed.spawn import (
    WORKER_KWARGS_ENV,
    WORKER_TARGET_ENV,
    LocalSpawn,
    RankFailure,
    environ,
    forget_store,
    loopback_env,
    open_store,
    report_progress,
    track_progress,
)

__all__ = [
    "LAUNCHER_TIMEOUT_SEC",
    "LOCAL_TIMEOUT_SEC",
    "WORKER_KWARGS_ENV",
    "WORKER_TARGET_ENV",
    "DistSession",
    "RankFailure",
    "check_launcher_nproc",
    "check_local_nproc",
    "default_backend",
    "reporting_failure",
    "report_progress",
]

#: Set while (and after) this process diagnoses a failed group, until a new session starts.
_REPORTING_FAILURE = False


def reporting_failure() -> bool:
    """Whether this process has begun naming the ranks of a failed group.

    A launcher that saw a rank die sends SIGTERM to the others at once (``accelerate
    launch`` checks its ranks every 0.1 s); a SIGTERM handler asks this to let rank 0
    finish its report instead of ending it mid-sentence.
    """
    return _REPORTING_FAILURE


#: Default group timeout of a local spawn: well above a collective's normal wait, short
#: enough that a hung rank fails the run within a minute.
LOCAL_TIMEOUT_SEC = 60.0
#: Default group timeout under torchrun / SLURM, where nodes start and load at their own pace.
LAUNCHER_TIMEOUT_SEC = 600.0
#: How long rank 0 of a failed launcher's group waits for the ranks on other nodes to say
#: they saw it fail too (at most the group timeout); a rank that does not is named
#: unreachable with its node (:func:`scopebench.distributed.faults.launcher_reports`).
NOTE_WAIT_SEC = 5.0
#: The environment variable torchrun sets when its agent hosts the job's store for every rank.
AGENT_STORE_ENV = "TORCHELASTIC_USE_AGENT_STORE"
#: Groups this process created on a launcher's agent store (each under its own prefix).
_agent_groups = 0


def default_backend(device: str = "cpu") -> str:
    """``nccl`` for CUDA devices when available, else ``gloo``."""
    import torch
    import torch.distributed as dist

    if str(device).startswith("cuda") and torch.cuda.is_available() and dist.is_nccl_available():
        return "nccl"
    return "gloo"


def check_local_nproc(key: str, nproc: object, device: str = "cpu") -> int:
    """Validate a number of processes to start on this machine (``nproc_per_node``...).

    A positive integer; on the CPU without a launcher it may not exceed the machine's
    logical cores (each rank needs a core, and a typo such as 255 would start 254 workers
    of a gigabyte each). Under torchrun or SLURM the launcher decides and only the type is
    checked.

    Raises:
        ValueError: naming ``key``, the value and the limit.
    """
    from scopebench.validate import integer

    nproc = integer(key, nproc, low=1)
    cores = os.cpu_count() or 1
    if not get_dist_info().is_distributed and not str(device).startswith("cuda") and nproc > cores:
        raise ValueError(
            f"{key}={nproc} exceeds the {cores} CPU cores of this machine: each local rank needs a core; "
            f"use at most {cores}, or start the ranks with torchrun or SLURM"
        )
    return nproc


def check_launcher_nproc(key: str, nproc: int, world_size: int, source: str, nodes: int = 1) -> None:
    """Under a launcher its ranks are the run's and nothing is spawned: ``nproc`` (the
    ``nproc_per_node`` setting...) must be 1 or the launcher's ranks per node
    (:func:`scopebench.cluster.job_layout`, the one rule).

    :Examples:
        >>> check_launcher_nproc("nproc_per_node", 3, 2, "slurm")
        Traceback (most recent call last):
        ...
        ValueError: nproc_per_node=3 disagrees with 1 node(s) x 2 task(s) per node (slurm): every task is one rank, so nproc_per_node (ranks per node) must be 2, or 1 for the launcher's ranks
        >>> check_launcher_nproc("nproc_per_node", 2, 4, "slurm", nodes=2)
    """
    from scopebench.cluster import job_layout

    if nodes > 0 and world_size % nodes == 0:
        job_layout(nproc, nodes, world_size // nodes, launcher=source, key=key)
    elif nproc != 1:
        raise ValueError(
            f"{key}={nproc} disagrees with {world_size} ranks uneven across {nodes} nodes ({source}): "
            f"set {key} to 1 (the launcher's ranks)"
        )


class DistSession:
    """Create (or join) the process group of a run; destroy what it created.

    Args:
        nproc: Processes wanted. Must equal the launcher's world size when one exists.
        worker: ``"package.module:function"`` that spawned workers run; required to spawn.
        worker_kwargs: JSON-serialisable keyword arguments for ``worker`` (workers rebuild
            their problem from plain parameters, never from pickled tensors).
        backend: ``"gloo"``, ``"nccl"`` or ``None`` (chosen from ``device``).
        device: Device the run computes on; selects the default backend.
        timeout_sec: The group timeout (the ``group_timeout_sec`` parameter): bound on
            waiting for workers to start and on every collective, so a dead or hung rank
            fails the run instead of blocking it. ``None``: :data:`LOCAL_TIMEOUT_SEC` for a
            local spawn, :data:`LAUNCHER_TIMEOUT_SEC` under torchrun or SLURM.
    """

    def __init__(
        self,
        nproc: int = 1,
        *,
        worker: str | None = None,
        worker_kwargs: dict | None = None,
        backend: str | None = None,
        device: str = "cpu",
        timeout_sec: float | None = None,
    ) -> None:
        from scopebench.validate import number, optional

        if type(nproc) is not int or nproc < 1:
            raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
        self.info: DistInfo = get_dist_info()
        timeout_sec = optional(number, "group_timeout_sec", timeout_sec, low=0, low_open=True)
        if timeout_sec is None and self.info.source == "spawn":
            timeout_sec = float(os.environ.get(SPAWN_ENV["timeout"], LOCAL_TIMEOUT_SEC))
        if timeout_sec is None:
            timeout_sec = LAUNCHER_TIMEOUT_SEC if self.info.is_distributed else LOCAL_TIMEOUT_SEC
        self.nproc = nproc
        self.worker = worker
        self.worker_kwargs = dict(worker_kwargs or {})
        self.backend = backend or default_backend(device)
        self.timeout_sec = timeout_sec
        self.created_group = False
        self._spawn: LocalSpawn | None = None
        self._store = None
        if self.info.is_distributed:
            check_launcher_nproc("nproc", nproc, self.info.world_size, self.info.source, self.info.nodes)
        if not self.info.is_distributed and nproc > 1:
            if worker is None or ":" not in worker:
                raise ValueError(f"spawning {nproc - 1} workers needs worker='module:function', got {worker!r}")
            try:
                json.dumps(self.worker_kwargs)
            except TypeError as err:
                raise TypeError(f"worker_kwargs must be JSON-serialisable plain parameters: {err}") from None

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of the spawned workers (rank ``i + 1`` at index ``i``)."""
        return self._spawn.worker_pids if self._spawn is not None else []

    @property
    def run_dir(self):
        """The spawn's private temporary folder (store, workers' logs); ``None`` otherwise."""
        return self._spawn.run_dir if self._spawn is not None else None

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> DistInfo:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    def start(self) -> DistInfo:
        """Initialise the group; returns this process's :class:`DistInfo`."""
        import torch.distributed as dist

        global _REPORTING_FAILURE
        _REPORTING_FAILURE = False
        if dist.is_initialized():
            self.info = DistInfo(
                rank=dist.get_rank(),
                local_rank=self.info.local_rank,
                world_size=dist.get_world_size(),
                master_addr=self.info.master_addr,
                master_port=self.info.master_port,
                source=self.info.source,
            )
            return self.info
        try:
            if self.info.source == "spawn":
                self._join_spawned_group()
            elif self.info.is_distributed:
                self._init_from_launcher()
            elif self.nproc > 1:
                self._spawn_and_init()
        except RankFailure:
            self.close(failed=True, diagnose=False)  # the error already names the culprits
            raise
        except BaseException:
            self.close(failed=True)
            raise
        return self.info

    def close(self, failed: bool = False, diagnose: bool = True) -> None:
        """Destroy the group if this session created it, reap workers, remove the temporary folder.

        Raises:
            RankFailure: ``failed`` and a spawned rank died, stopped or fell behind
                (named with its exit code or signal, last iteration and log tail).
            RuntimeError: not ``failed`` but a worker exited with an error.
        """
        import torch.distributed as dist

        global _REPORTING_FAILURE
        error = sys.exc_info()[1] if failed else None  # this rank's own, when closed while it propagates
        if failed and diagnose and isinstance(error, ValueError) and self.info.rank == 0:
            # rank 0 refused an input of its own (a user policy's broken contract...): every rank
            # makes the same refusal, and its one line says more than the others' exits
            diagnose = False
        if failed and diagnose:
            _REPORTING_FAILURE = True
        spawn, self._spawn = self._spawn, None
        culprits = [r for r in spawn.diagnose() if r.culprit] if (spawn and failed and diagnose) else []
        if spawn and failed and diagnose and not culprits and timed_out(error):
            # rank 0 waited in a collective for a rank that never came, and none died or fell
            # behind: a worker that neither fails at its own timeout nor leaves a note hangs
            culprits = spawn.hung(min(NOTE_WAIT_SEC, self.timeout_sec))
        nodes = ""
        if not spawn and failed and diagnose and self._store is not None and self.info.rank != 0:
            announce_failure(self._store, self.info.rank)
        if not spawn and failed and diagnose and self._store is not None and self.info.rank == 0:
            wait = min(NOTE_WAIT_SEC, self.timeout_sec)
            culprits = [r for r in launcher_reports(self._store, self.info.world_size, wait) if r.culprit]
            nodes = silent_nodes(culprits)
            for report in culprits:
                if report.state == "T" and report.pid:
                    # A stopped rank ignores the launcher's SIGTERM until continued (torchrun
                    # then waits 30 s before SIGKILL): end it now, the run has failed.
                    with contextlib.suppress(OSError):
                        os.kill(report.pid, signal.SIGKILL)
        errors = spawn.reap(kill=failed) if spawn else []
        if spawn is None and self._store is not None:
            # A launcher's store belongs to the group: drop our references before it goes
            # (destroyed afterwards, its client thread aborted the process at exit now and then).
            forget_store()
            self._store = None
        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()
        self.created_group = False
        if spawn is not None:
            spawn.close()
        self._store = None
        if culprits:
            raise RankFailure("\n".join([*filter(None, [nodes]), *(r.describe(self.timeout_sec) for r in culprits)]))
        if errors and not failed:
            raise RuntimeError("local worker(s) failed:\n" + "\n".join(errors))

    # -- the three ways in ---------------------------------------------------------
    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_sec)

    def _agent_store(self):
        """torchrun's agent store under a prefix of this group's own.

        The agent hosts one store for the whole job, and a group's gloo rendezvous keys are the
        same for every default group a process creates: a second run in the process (the
        validation cells of ``torchrun_detect.py``, benchopt's cells under torchrun) read the
        first group's listening addresses there, and its ranks waited for peers that were gone
        until the group's timeout. Each group this process creates gets the next prefix, the
        same on every rank (every rank creates the same groups in the same order).
        """
        import torch.distributed as dist

        global _agent_groups
        _agent_groups += 1
        store = dist.TCPStore(
            self.info.master_addr, self.info.master_port, self.info.world_size, False, timeout=self._timeout()
        )
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        return dist.PrefixStore(f"/worker/attempt_{attempt}/scopebench_group_{_agent_groups}", store)

    def _init_from_launcher(self) -> None:
        import torch.distributed as dist

        from scopebench.distributed.network import socket_interface_env

        # The rendezvous of get_dist_info (under SLURM the job's first node, whatever an
        # inherited MASTER_ADDR said), and the interface that reaches it for gloo / NCCL:
        # kept for the run, since DeepSpeed and accelerate create more groups later.
        os.environ["MASTER_ADDR"] = self.info.master_addr
        os.environ["MASTER_PORT"] = str(self.info.master_port)
        os.environ.update(socket_interface_env(self.info.master_addr))
        where: dict = {"init_method": f"tcp://{self.info.master_addr}:{self.info.master_port}"}
        if os.environ.get(AGENT_STORE_ENV) == "True":
            where = {"store": self._agent_store()}
        dist.init_process_group(
            self.backend, rank=self.info.rank, world_size=self.info.world_size, timeout=self._timeout(), **where
        )
        self.created_group = True
        # The rendezvous store carries progress marks, so that a failed run names a rank
        # that hangs or died (private API; without it the launcher's own report remains).
        # They go in its root (torch's group prefixes unwrapped), where anyone holding the
        # rendezvous address reads them: progress/<rank>, pid/<rank> (a monitor, a test).
        store = getattr(dist.distributed_c10d, "_get_default_store", lambda: None)()
        while isinstance(store, dist.PrefixStore):
            store = store.underlying_store
        if store is not None:
            self._store = store
            track_progress(store, self.info.rank)

    def _join_spawned_group(self) -> None:
        import torch.distributed as dist

        path, world = os.environ[SPAWN_ENV["store_file"]], self.info.world_size
        store = self._store = open_store(path, world, self.info.rank, self.timeout_sec)
        store.set(f"ready/{self.info.rank}", "1")
        backend = store.get("backend").decode()
        dist.init_process_group(backend, store=store, rank=self.info.rank, world_size=world, timeout=self._timeout())
        self.created_group = True

    def _spawn_and_init(self) -> None:
        import torch.distributed as dist

        self.info = DistInfo(
            rank=0, local_rank=0, world_size=self.nproc, master_addr="127.0.0.1", master_port=0, source="spawn"
        )
        self._spawn = LocalSpawn(self.nproc, self.worker, self.worker_kwargs, self.backend, self.timeout_sec)
        store = self._spawn.start()
        with environ(loopback_env()):
            dist.init_process_group(self.backend, store=store, rank=0, world_size=self.nproc, timeout=self._timeout())
        self.created_group = True
