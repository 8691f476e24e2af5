"""Local spawn: rank 0 starts its workers on this machine, watches them, and names the culprit.

:class:`LocalSpawn` is the rank-0 half of a run whose ranks :class:`~scopebench.distributed.launch.DistSession`
starts itself (no torchrun, no SLURM):

* a private temporary folder (``tempfile.mkdtemp``: mode 0700, unpredictable name) holds
  the rendezvous, a ``FileStore``, and each worker's log, so nothing listens on the
  network; the ranks' own gloo / NCCL sockets are bound to the loopback interface;
* ``nproc - 1`` subprocesses ``python -m scopebench.distributed.worker`` join through the store;
  a worker that dies before joining is reported within a poll interval;
* each worker holds the read end of a pipe whose write end only rank 0 holds (its
  lifeline): when rank 0 dies the workers see end-of-file and stop
  (:mod:`scopebench.distributed.worker`);
* every rank marks the last iteration it finished in the store (:func:`report_progress`),
  so that when the run fails rank 0 can say which rank died (exit code or signal), is
  stopped, or fell behind, where, and quote the end of its log (:mod:`scopebench.distributed.faults`).
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

from scopebench.distributed.faults import RankReport, log_tail, process_state
from scopebench.distributed.info import SPAWN_ENV

__all__ = [
    "WORKER_KWARGS_ENV",
    "WORKER_TARGET_ENV",
    "LocalSpawn",
    "RankFailure",
    "launcher_reports",
    "open_store",
    "read_progress",
    "report_progress",
    "track_progress",
]

WORKER_TARGET_ENV = "SCOPEBENCH_WORKER_TARGET"
WORKER_KWARGS_ENV = "SCOPEBENCH_WORKER_KWARGS"
#: Joining waits at least this long: a Python process importing torch on a busy machine.
JOIN_TIMEOUT_SEC = 60.0
_POLL_SEC = 0.05
#: How long rank 0 lets failing workers finish dying before it describes them.
_EXIT_GRACE_SEC = 2.0
#: (store, rank) of this process in a local spawn, for :func:`report_progress`.
_PROGRESS: tuple | None = None


class RankFailure(RuntimeError):
    """A spawned rank died, stopped or hung; the message names it (one line per rank)."""


def open_store(path: str, world_size: int, rank: int, timeout_sec: float):
    """The run's ``FileStore`` at ``path``; this rank's progress marks go to it."""
    import torch.distributed as dist

    store = dist.FileStore(path, world_size)
    store.set_timeout(datetime.timedelta(seconds=timeout_sec))
    track_progress(store, rank)
    return store


def track_progress(store, rank: int) -> None:
    """Send this rank's progress marks (:func:`report_progress`) to ``store``, and publish
    its host and process id there (``pid/<rank>``) for a failure report."""
    global _PROGRESS
    _PROGRESS = (store, rank)
    store.set(f"pid/{rank}", f"{socket.gethostname()} {os.getpid()}")


def read_progress(store, world_size: int) -> dict[int, int]:
    """Last finished iteration of every rank that reported one (``{}`` if the store is gone)."""
    out: dict[int, int] = {}
    for rank in range(world_size):
        key = f"progress/{rank}"
        with contextlib.suppress(Exception):  # a store already gone: nothing known
            if store is not None and store.check([key]):
                out[rank] = int(store.get(key))
    return out


def launcher_reports(store, world_size: int) -> list[RankReport]:
    """Rank 0's view of the other ranks of a launcher's group (torchrun, SLURM) when it fails:
    their progress marks and, for ranks on this host, whether their process is stopped or gone."""
    progress = read_progress(store, world_size)
    host = socket.gethostname()
    reports = []
    for rank in range(1, world_size):
        state, gone, local_pid = None, False, None
        with contextlib.suppress(Exception):
            if store.check([f"pid/{rank}"]):
                where, pid = store.get(f"pid/{rank}").decode().rsplit(" ", 1)
                if where == host:
                    local_pid = int(pid)
                    state = process_state(local_pid)
                    gone = state is None or state == "Z"
        reports.append(
            RankReport(
                rank=rank,
                returncode=None,
                state=state,
                last_iteration=progress.get(rank),
                lead_iteration=max(progress.values(), default=None),
                gone=gone,
                pid=local_pid,
            )
        )
    return reports


def forget_store() -> None:
    """Stop writing progress marks (the store is being closed)."""
    global _PROGRESS
    _PROGRESS = None


def report_progress(iteration: int) -> None:
    """Record that this rank finished ``iteration`` (local spawn only; no-op otherwise)."""
    if _PROGRESS is not None:
        store, rank = _PROGRESS
        store.set(f"progress/{rank}", str(iteration))


def loopback_env() -> dict[str, str]:
    """Bind gloo's and NCCL's sockets to the loopback interface (a local run stays local)."""
    names = (
        [name for _, name in socket.if_nameindex() if name.startswith("lo")] if hasattr(socket, "if_nameindex") else []
    )
    loopback = names[0] if names else "lo"
    return {"GLOO_SOCKET_IFNAME": loopback, "NCCL_SOCKET_IFNAME": loopback}


@contextlib.contextmanager
def environ(values: dict[str, str]):
    """``os.environ`` updated with ``values`` inside the block, restored after."""
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


class LocalSpawn:
    """Rank 0's workers on this machine: start, wait, describe, reap, clean up.

    Args:
        nproc: Ranks of the run, this process included.
        worker: ``"package.module:function"`` the workers run.
        worker_kwargs: Its JSON keyword arguments.
        backend: Process-group backend the workers use.
        timeout_sec: The group timeout, handed to the workers.
    """

    def __init__(self, nproc: int, worker: str, worker_kwargs: dict, backend: str, timeout_sec: float) -> None:
        self.nproc = nproc
        self.worker = worker
        self.worker_kwargs = worker_kwargs
        self.backend = backend
        self.timeout_sec = timeout_sec
        self.run_dir: Path | None = None
        self.store = None
        self.procs: list[subprocess.Popen] = []
        self.logs: list[Path] = []
        self._lifeline: int | None = None

    def _env(self, rank: int, lifeline: int) -> dict[str, str]:
        env = {**os.environ, **loopback_env()}
        for key in (SPAWN_ENV["store_addr"], SPAWN_ENV["store_port"]):
            env.pop(key, None)
        env.update(
            {
                SPAWN_ENV["rank"]: str(rank),
                SPAWN_ENV["world_size"]: str(self.nproc),
                SPAWN_ENV["store_file"]: str(self.run_dir / "store"),
                SPAWN_ENV["run_dir"]: str(self.run_dir),
                SPAWN_ENV["lifeline"]: str(lifeline),
                SPAWN_ENV["timeout"]: str(self.timeout_sec),
                WORKER_TARGET_ENV: self.worker,
                WORKER_KWARGS_ENV: json.dumps(self.worker_kwargs),
            }
        )
        return env

    def start(self):
        """Create the folder and the store, start the workers, wait until all joined; returns the store."""
        self.run_dir = Path(tempfile.mkdtemp(prefix="scopebench_workers_"))
        self.store = open_store(str(self.run_dir / "store"), self.nproc, 0, self.timeout_sec)
        self.store.set("backend", self.backend)
        lifeline, self._lifeline = os.pipe()
        try:
            for rank in range(1, self.nproc):
                log = self.run_dir / f"rank_{rank}.log"
                self.logs.append(log)
                with open(log, "wb") as fh:
                    self.procs.append(
                        subprocess.Popen(
                            [sys.executable, "-m", "scopebench.distributed.worker"],
                            env=self._env(rank, lifeline),
                            stdin=subprocess.DEVNULL,
                            stdout=fh,
                            stderr=subprocess.STDOUT,
                            pass_fds=(lifeline,),
                        )
                    )
        finally:
            os.close(lifeline)  # the workers hold it now; rank 0 keeps only the write end
        self._wait_for_workers()
        return self.store

    def _wait_for_workers(self) -> None:
        keys = [f"ready/{rank}" for rank in range(1, self.nproc)]
        limit = max(self.timeout_sec, JOIN_TIMEOUT_SEC)
        deadline = time.monotonic() + limit
        while not self.store.check(keys):
            dead = [self.report(i).describe(self.timeout_sec) for i, p in enumerate(self.procs) if p.poll() is not None]
            if dead:
                raise RankFailure("local worker(s) died before joining the process group:\n" + "\n".join(dead))
            if time.monotonic() > deadline:
                missing = [key.split("/")[1] for key in keys if not self.store.check([key])]
                raise TimeoutError(f"rank(s) {', '.join(missing)} did not join within {limit:g} s")
            time.sleep(_POLL_SEC)

    @property
    def worker_pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def _progress(self) -> dict[int, int]:
        return read_progress(self.store, self.nproc)

    def report(self, index: int, progress: dict[int, int] | None = None) -> RankReport:
        """What is known about the worker at ``index`` (rank ``index + 1``)."""
        proc, rank = self.procs[index], index + 1
        progress = self._progress() if progress is None else progress
        returncode = proc.poll()
        return RankReport(
            rank=rank,
            returncode=returncode,
            state=process_state(proc.pid) if returncode is None else None,
            last_iteration=progress.get(rank),
            lead_iteration=max(progress.values(), default=None),
            log=log_tail(self.logs[index]),
        )

    def diagnose(self) -> list[RankReport]:
        """Every worker's report, after letting the dying ones finish (``_EXIT_GRACE_SEC``)."""
        deadline = time.monotonic() + _EXIT_GRACE_SEC
        while any(p.poll() is None for p in self.procs) and time.monotonic() < deadline:
            time.sleep(_POLL_SEC)
        progress = self._progress()
        return [self.report(i, progress) for i in range(len(self.procs))]

    def reap(self, kill: bool) -> list[str]:
        """Wait for the workers (at most the group timeout), killing them at once if ``kill``.

        Returns:
            A description of each worker that ended with an error.
        """
        deadline = time.monotonic() + (0.0 if kill else self.timeout_sec)
        for proc in self.procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        progress = self._progress()
        failed = [i for i, p in enumerate(self.procs) if p.returncode != 0]
        return [self.report(i, progress).describe(self.timeout_sec) for i in failed]

    def close(self) -> None:
        """Drop the store and the lifeline, remove the folder (after :meth:`reap`)."""
        forget_store()
        self.store = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
