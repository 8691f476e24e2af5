"""Process groups: join the launcher's group, or spawn local workers and create one.

:class:`DistSession` is the one object that creates (and therefore destroys) the
``torch.distributed`` process group of a run:

* under ``torchrun`` / SLURM (world size from the environment) it initialises the group
  from the rendezvous in :func:`scopebench.dist.info.get_dist_info`;
* on one machine, with ``nproc > 1`` and no launcher, rank 0 (the benchopt process)
  creates a private temporary folder (mode 0700), opens a ``FileStore`` in it, starts
  ``nproc - 1`` subprocesses ``python -m scopebench.dist.worker`` that run
  ``worker(**worker_kwargs)``, waits for them while polling their liveness, and then
  every rank joins the group. Nothing listens on the network: the store is a file and
  the ranks' own sockets are bound to the loopback interface;
* with one process it does nothing.

Faults (DESIGN.md, "Ranks and launch"): every collective is bounded by the group timeout
(``group_timeout_sec``: :data:`LOCAL_TIMEOUT_SEC` for a local spawn,
:data:`LAUNCHER_TIMEOUT_SEC` under torchrun or SLURM; joining waits at least
:data:`LOCAL_TIMEOUT_SEC`, the time a Python process needs to import torch on a busy
machine), ranks record their last finished iteration in the store, and when a local run
fails rank 0 names each spawned rank that died, stopped or fell behind, with its exit
code or signal and the tail of its log (:mod:`scopebench.dist.faults`). Each spawned rank
holds the read end of a pipe whose write end only rank 0 holds (its "lifeline"): when
rank 0 dies the pipe closes, and the workers remove the temporary folder and exit.

A group that existed before the session (created by the caller) is reused and left alone.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scopebench.dist.faults import RankReport, log_tail, process_state
from scopebench.dist.info import SPAWN_ENV, DistInfo, get_dist_info

__all__ = [
    "LAUNCHER_TIMEOUT_SEC",
    "LOCAL_TIMEOUT_SEC",
    "WORKER_KWARGS_ENV",
    "WORKER_TARGET_ENV",
    "DistSession",
    "RankFailure",
    "check_local_nproc",
    "default_backend",
    "report_progress",
]

WORKER_TARGET_ENV = "SCOPEBENCH_WORKER_TARGET"
WORKER_KWARGS_ENV = "SCOPEBENCH_WORKER_KWARGS"
#: Default group timeout of a local spawn: well above a collective's normal wait, short
#: enough that a hung rank fails the run within a minute.
LOCAL_TIMEOUT_SEC = 60.0
#: Default group timeout under torchrun / SLURM, where nodes start and load at their own pace.
LAUNCHER_TIMEOUT_SEC = 600.0
_POLL_SEC = 0.05
#: How long rank 0 lets failing workers finish dying before it describes them.
_EXIT_GRACE_SEC = 2.0
#: (store, rank) of this process in a local spawn, for :func:`report_progress`.
_PROGRESS: tuple | None = None


class RankFailure(RuntimeError):
    """A spawned rank died, stopped or hung; the message names it (one line per rank)."""


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


def report_progress(iteration: int) -> None:
    """Record that this rank finished ``iteration`` (local spawn only; no-op otherwise).

    Rank 0 reads these marks when the run fails, to say where each rank was.
    """
    if _PROGRESS is not None:
        store, rank = _PROGRESS
        store.set(f"progress/{rank}", str(iteration))


def _loopback_env() -> dict[str, str]:
    """Bind gloo's and NCCL's sockets to the loopback interface (a local run stays local)."""
    names = [name for _, name in socket.if_nameindex() if name.startswith("lo")] if hasattr(socket, "if_nameindex") else []
    loopback = names[0] if names else "lo"
    return {"GLOO_SOCKET_IFNAME": loopback, "NCCL_SOCKET_IFNAME": loopback}


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    before = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


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
        self.run_dir: Path | None = None
        """The spawn's private temporary folder (store, workers' logs); ``None`` otherwise."""
        self._procs: list[subprocess.Popen] = []
        self._logs: list[Path] = []
        self._lifeline: int | None = None
        self._store = None
        self._reported = False  # a RankFailure already names the culprits
        if self.info.is_distributed and nproc not in (1, self.info.world_size):
            raise ValueError(
                f"nproc={nproc} disagrees with the launcher's world size "
                f"{self.info.world_size} ({self.info.source})"
            )
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
        return [proc.pid for proc in self._procs]

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> DistInfo:
        return self.start()

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    def start(self) -> DistInfo:
        """Initialise the group; returns this process's :class:`DistInfo`."""
        import torch.distributed as dist

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
        except BaseException:
            self.close(failed=True)
            raise
        return self.info

    def close(self, failed: bool = False) -> None:
        """Destroy the group if this session created it, reap workers, remove the temporary folder.

        Raises:
            RankFailure: ``failed`` and a spawned rank died, stopped or fell behind
                (named with its exit code or signal, last iteration and log tail).
            RuntimeError: not ``failed`` but a worker exited with an error.
        """
        import torch.distributed as dist

        global _PROGRESS
        diagnose = failed and self._procs and not self._reported
        culprits = [r for r in self._diagnose() if r.culprit] if diagnose else []
        self._reported = False
        errors = self._reap_workers(kill=failed)
        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()
        self.created_group = False
        if self._store is not None:
            _PROGRESS = None
        self._store = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
        if culprits:
            raise RankFailure("\n".join(r.describe(self.timeout_sec) for r in culprits))
        if errors and not failed:
            raise RuntimeError("local worker(s) failed:\n" + "\n".join(errors))

    # -- the three ways in ---------------------------------------------------------
    def _timeout(self) -> datetime.timedelta:
        return datetime.timedelta(seconds=self.timeout_sec)

    def _init_from_launcher(self) -> None:
        import torch.distributed as dist

        os.environ.setdefault("MASTER_ADDR", self.info.master_addr)
        os.environ.setdefault("MASTER_PORT", str(self.info.master_port))
        dist.init_process_group(
            self.backend,
            init_method=f"tcp://{self.info.master_addr}:{self.info.master_port}",
            rank=self.info.rank,
            world_size=self.info.world_size,
            timeout=self._timeout(),
        )
        self.created_group = True

    def _open_store(self, path: str, world_size: int):
        import torch.distributed as dist

        global _PROGRESS
        store = dist.FileStore(path, world_size)
        store.set_timeout(self._timeout())
        self._store = store
        _PROGRESS = (store, self.info.rank)
        return store

    def _join_spawned_group(self) -> None:
        import torch.distributed as dist

        store = self._open_store(os.environ[SPAWN_ENV["store_file"]], self.info.world_size)
        store.set(f"ready/{self.info.rank}", "1")
        backend = store.get("backend").decode()
        dist.init_process_group(
            backend, store=store, rank=self.info.rank, world_size=self.info.world_size, timeout=self._timeout()
        )
        self.created_group = True

    def _spawn_and_init(self) -> None:
        import torch.distributed as dist

        self.info = DistInfo(rank=0, local_rank=0, world_size=self.nproc, master_addr="127.0.0.1", master_port=0, source="spawn")
        # mkdtemp: mode 0700, an unpredictable name; the store and the logs live here.
        self.run_dir = Path(tempfile.mkdtemp(prefix="scopebench_workers_"))
        store_file = str(self.run_dir / "store")
        store = self._open_store(store_file, self.nproc)
        store.set("backend", self.backend)
        network = _loopback_env()
        lifeline, self._lifeline = os.pipe()
        try:
            for rank in range(1, self.nproc):
                env = dict(os.environ)
                env.update(network)
                env.update(
                    {
                        SPAWN_ENV["rank"]: str(rank),
                        SPAWN_ENV["world_size"]: str(self.nproc),
                        SPAWN_ENV["store_file"]: store_file,
                        SPAWN_ENV["run_dir"]: str(self.run_dir),
                        SPAWN_ENV["lifeline"]: str(lifeline),
                        SPAWN_ENV["timeout"]: str(self.timeout_sec),
                        WORKER_TARGET_ENV: self.worker,
                        WORKER_KWARGS_ENV: json.dumps(self.worker_kwargs),
                    }
                )
                for key in (SPAWN_ENV["store_addr"], SPAWN_ENV["store_port"]):
                    env.pop(key, None)
                log = self.run_dir / f"rank_{rank}.log"
                self._logs.append(log)
                with open(log, "wb") as fh:
                    self._procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "scopebench.dist.worker"],
                            env=env,
                            stdin=subprocess.DEVNULL,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            pass_fds=(lifeline,),
                        )
                    )
        finally:
            os.close(lifeline)  # the workers hold it now; rank 0 keeps only the write end
        self._wait_for_workers(store)
        with _environ(network):
            dist.init_process_group(self.backend, store=store, rank=0, world_size=self.nproc, timeout=self._timeout())
        self.created_group = True

    def _wait_for_workers(self, store) -> None:
        keys = [f"ready/{rank}" for rank in range(1, self.nproc)]
        limit = max(self.timeout_sec, LOCAL_TIMEOUT_SEC)
        deadline = time.monotonic() + limit
        while not store.check(keys):
            dead = [self._report(i).describe(self.timeout_sec) for i, p in enumerate(self._procs) if p.poll() is not None]
            if dead:
                self._reported = True
                raise RankFailure("local worker(s) died before joining the process group:\n" + "\n".join(dead))
            if time.monotonic() > deadline:
                missing = [key.split("/")[1] for key in keys if not store.check([key])]
                raise TimeoutError(f"rank(s) {', '.join(missing)} did not join within {limit:g} s")
            time.sleep(_POLL_SEC)

    # -- workers -------------------------------------------------------------------
    def _progress(self) -> dict[int, int]:
        out: dict[int, int] = {}
        if self._store is None:
            return out
        for rank in range(self.nproc):
            key = f"progress/{rank}"
            with contextlib.suppress(Exception):  # a store file already gone: nothing known
                if self._store.check([key]):
                    out[rank] = int(self._store.get(key))
        return out

    def _report(self, index: int, progress: dict[int, int] | None = None) -> RankReport:
        proc, rank = self._procs[index], index + 1
        progress = self._progress() if progress is None else progress
        returncode = proc.poll()
        return RankReport(
            rank=rank,
            returncode=returncode,
            state=process_state(proc.pid) if returncode is None else None,
            last_iteration=progress.get(rank),
            lead_iteration=max(progress.values(), default=None),
            log=log_tail(self._logs[index]),
        )

    def _diagnose(self) -> list[RankReport]:
        """Each spawned rank's state, after letting the dying ones finish (``_EXIT_GRACE_SEC``)."""
        deadline = time.monotonic() + _EXIT_GRACE_SEC
        while any(p.poll() is None for p in self._procs) and time.monotonic() < deadline:
            time.sleep(_POLL_SEC)
        progress = self._progress()
        return [self._report(i, progress) for i in range(len(self._procs))]

    def _reap_workers(self, kill: bool) -> list[str]:
        deadline = time.monotonic() + (0.0 if kill else self.timeout_sec)
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        progress = self._progress()
        errors = [
            self._report(i, progress).describe(self.timeout_sec) for i, p in enumerate(self._procs) if p.returncode != 0
        ]
        self._procs, self._logs = [], []
        return errors
