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

The same class in launcher mode (``command=...``) starts *all* ``nproc`` ranks of a
multi-rank ``scopebench train`` as copies of the command, this process being none of them
(:meth:`LocalSpawn.supervise`): the same folder, store, loopback sockets and lifeline, so
that command too listens on nothing (issue 24: ``accelerate launch``'s store listened on
every interface).
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scopebench.distributed.faults import (
    RankReport,
    dump_stack,
    log_tail,
    node_name,
    process_state,
    read_progress,
    wait_for_notes,
)
from scopebench.distributed.info import SPAWN_ENV

__all__ = [
    "WORKER_KWARGS_ENV",
    "WORKER_TARGET_ENV",
    "LocalSpawn",
    "RankFailure",
    "open_store",
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
#: Launcher mode: seconds between SIGTERM and SIGKILL of the ranks that are stopped (torchrun's 30 s).
STOP_GRACE_SEC = 30.0
#: (store, rank) of this process in a local spawn, for :func:`report_progress`.
_PROGRESS: tuple | None = None


class RankFailure(RuntimeError):
    """A spawned rank died, stopped or hung; the message names it (one line per rank)."""


def open_store(path: str, world_size: int, rank: int | None, timeout_sec: float):
    """The run's ``FileStore`` at ``path``; this rank's progress marks go to it (``rank=None``:
    a launcher that is no rank, and marks nothing)."""
    import torch.distributed as dist

    store = dist.FileStore(path, world_size)
    store.set_timeout(datetime.timedelta(seconds=timeout_sec))
    if rank is not None:
        track_progress(store, rank)
    return store


def track_progress(store, rank: int) -> None:
    """Send this rank's progress marks (:func:`report_progress`) to ``store``, and publish
    its node and process id there (``pid/<rank>``) for a failure report."""
    global _PROGRESS
    _PROGRESS = (store, rank)
    store.set(f"pid/{rank}", f"{node_name()} {os.getpid()}")


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
    """Ranks on this machine, started and watched by this process: start, wait, describe, reap, clean up.

    Two modes, one lifecycle:

    * **rank 0** (``command=None``, the benchmarks' :class:`~scopebench.distributed.launch.DistSession`):
      this process is rank 0; ranks ``1 .. nproc - 1`` run ``python -m scopebench.distributed.worker``
      (``worker(**worker_kwargs)``), each writing a log in the private folder that a failure
      report quotes.
    * **launcher** (``command`` given, a multi-rank ``scopebench train``): this process is no
      rank; ranks ``0 .. nproc - 1`` run ``command``, their output on this process's stdout
      and stderr, each in its own process group, ending when this process dies
      (:func:`scopebench.distributed.orphans.watch_launcher`: the lifeline). :meth:`supervise` waits
      for them; :meth:`send_signal` forwards a signal (:func:`~scopebench.distributed.orphans.forwarding_signals`).

    In both, nothing listens on the network: the rendezvous is a ``FileStore`` in a private
    0700 folder, and the ranks' gloo / NCCL sockets are bound to the loopback interface.

    Args:
        nproc: Ranks of the run (this process included in rank-0 mode).
        worker: ``"package.module:function"`` the workers run (rank-0 mode).
        worker_kwargs: Its JSON keyword arguments.
        backend: Process-group backend the ranks use.
        timeout_sec: The group timeout, handed to the ranks.
        command: Launcher mode: the argv every rank runs.
        env: Launcher mode: variables added to the ranks' environment.
        prefix: Prefix of the private folder's name.
    """

    def __init__(
        self,
        nproc: int,
        worker: str | None,
        worker_kwargs: dict,
        backend: str,
        timeout_sec: float,
        *,
        command: list[str] | None = None,
        env: dict[str, str] | None = None,
        prefix: str = "scopebench_workers_",
    ) -> None:
        self.nproc = nproc
        self.worker = worker
        self.worker_kwargs = worker_kwargs
        self.backend = backend
        self.timeout_sec = timeout_sec
        self.command = list(command) if command is not None else None
        self.extra_env = dict(env or {})
        self.prefix = prefix
        self.run_dir: Path | None = None
        self.store = None
        self.procs: list[subprocess.Popen] = []
        self.ranks: list[int] = []
        self.logs: list[Path | None] = []
        self._lifeline: int | None = None
        #: Launcher mode: the signal forwarded to the ranks, and when they are to be killed.
        self.forwarded: int | None = None
        self._kill_at: float | None = None

    @property
    def launcher(self) -> bool:
        """Whether this process only launches the ranks (it is none of them)."""
        return self.command is not None

    def _env(self, rank: int, lifeline: int) -> dict[str, str]:
        env = {**os.environ, **loopback_env()}
        # a spawned rank's rendezvous is the file store: neither a TCP store nor torchrun's variables
        for key in (SPAWN_ENV["store_addr"], SPAWN_ENV["store_port"], "RANK", "WORLD_SIZE", "LOCAL_RANK"):
            env.pop(key, None)
        env.update(
            {
                SPAWN_ENV["rank"]: str(rank),
                SPAWN_ENV["world_size"]: str(self.nproc),
                SPAWN_ENV["store_file"]: str(self.run_dir / "store"),
                SPAWN_ENV["run_dir"]: str(self.run_dir),
                SPAWN_ENV["lifeline"]: str(lifeline),
                SPAWN_ENV["timeout"]: str(self.timeout_sec),
            }
        )
        if self.launcher:
            from scopebench.distributed.orphans import LAUNCH_DIR_ENV, LAUNCHER_PID_ENV

            env.update(self.extra_env)
            # an orphaned rank removes the folder its dead launcher no longer can
            env.update({LAUNCHER_PID_ENV: str(os.getpid()), LAUNCH_DIR_ENV: str(self.run_dir)})
        else:
            env.update({WORKER_TARGET_ENV: self.worker, WORKER_KWARGS_ENV: json.dumps(self.worker_kwargs)})
        return env

    def start(self):
        """Create the folder and the store, start the ranks; in rank-0 mode, wait until all
        joined. Returns the store."""
        self.run_dir = Path(tempfile.mkdtemp(prefix=self.prefix))
        self.store = open_store(str(self.run_dir / "store"), self.nproc, None if self.launcher else 0, self.timeout_sec)
        self.store.set("backend", self.backend)
        lifeline, self._lifeline = os.pipe()
        try:
            for rank in range(0 if self.launcher else 1, self.nproc):
                if self.forwarded is not None:  # stopped while starting: start no more ranks
                    break
                self.ranks.append(rank)
                if self.launcher:
                    from scopebench.distributed.orphans import launch_child_preexec

                    # their own process group (a Ctrl-C reaches this process only, which forwards
                    # it once); no death signal: their watch of the lifeline ends them and removes
                    # the folder (scopebench.distributed.orphans.watch_launcher)
                    self.logs.append(None)
                    self.procs.append(
                        subprocess.Popen(
                            self.command,
                            env=self._env(rank, lifeline),
                            stdin=subprocess.DEVNULL,
                            pass_fds=(lifeline,),
                            preexec_fn=launch_child_preexec(death_signal=None),
                        )
                    )
                    continue
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
            os.close(lifeline)  # the ranks hold it now; this process keeps only the write end
        if not self.launcher:
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
        """What is known about the process at ``index`` (rank ``self.ranks[index]``)."""
        proc, rank = self.procs[index], self.ranks[index]
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

    def hung(self, wait_sec: float) -> list[RankReport]:
        """The workers that hang in their own code, after rank 0 timed out in a collective.

        A worker that waited in that collective too fails at its own timeout and leaves a
        note in the store (:func:`~scopebench.distributed.faults.announce_failure`, as it
        closes its session); one that never reached it stays alive and silent. So each live,
        running worker that leaves no note within ``wait_sec`` is named, with its Python
        stack (:func:`~scopebench.distributed.faults.dump_stack`) at the end of its log.
        """
        live = [i for i, proc in enumerate(self.procs) if proc.poll() is None and process_state(proc.pid) != "T"]
        noted = wait_for_notes(self.store, [self.ranks[i] for i in live], wait_sec)
        silent = [i for i in live if self.ranks[i] not in noted]
        for i in silent:
            dump_stack(self.procs[i].pid, self.logs[i])
        progress = self._progress()
        return [dataclasses.replace(self.report(i, progress), hung=True) for i in silent]

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

    # -- launcher mode -------------------------------------------------------------
    def send_signal(self, signum: int) -> None:
        """Forward ``signum`` to every rank still running (SIGTERM, SIGINT from the user, a
        scheduler); :meth:`supervise` then kills those left after its grace period."""
        self.forwarded = signum
        self._stop(signum)

    def _stop(self, signum: int) -> None:
        if self._kill_at is None:
            self._kill_at = time.monotonic() + STOP_GRACE_SEC
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    def supervise(self) -> tuple[int, list[str]]:
        """Launcher mode: wait until every rank ended, as torchrun's agent does.

        The first rank that fails (a non-zero exit, a signal) stops the others: SIGTERM at
        once (rank 0 still names the culprit: ``scopebench.commands.train`` lets it finish
        its report), SIGKILL after :data:`STOP_GRACE_SEC` seconds. A forwarded signal
        (:meth:`send_signal`) stops them the same way.

        Returns:
            The run's exit status: 0 when every rank succeeded, else the first failed rank's
            (128 + N for signal N), or 128 + N after a forwarded signal N; and one line per
            rank that failed on its own (before it was stopped), with its exit code or signal
            and the last iteration it finished. Rank 0 ended by an exit code of its own is
            not described: it writes to this process's terminal and has said why (a refused
            input, a run stopped at a non-finite loss, a traceback).
        """
        first: list[int] = []  # the ranks that failed before any was stopped
        while True:
            codes = [proc.poll() for proc in self.procs]
            if not first and self._kill_at is None:
                first = [i for i, code in enumerate(codes) if code not in (None, 0)]
                if first:
                    self._stop(signal.SIGTERM)
            if all(code is not None for code in codes):
                break
            if self._kill_at is not None and time.monotonic() > self._kill_at:
                for proc in self.procs:
                    if proc.poll() is None:
                        proc.kill()
            time.sleep(_POLL_SEC)  # polling interval of the wait, as the agent's
        progress = self._progress()
        said = [i for i in first if self.ranks[i] == 0 and self.procs[i].returncode > 0]
        failures = [self.report(i, progress).sentence(self.timeout_sec) for i in first if i not in said]
        if first:
            code = self.procs[first[0]].returncode
            return (128 - code if code < 0 else code), failures
        if self.forwarded is not None and any(proc.returncode != 0 for proc in self.procs):
            return 128 + int(self.forwarded), failures
        return 0, failures

    def close(self) -> None:
        """Drop the store and the lifeline, remove the folder (after :meth:`reap` or
        :meth:`supervise`; in launcher mode, ranks still running, after an error, are killed)."""
        if self.launcher:
            for proc in self.procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        else:
            forget_store()
        self.store = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self.run_dir is not None:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self.run_dir = None
