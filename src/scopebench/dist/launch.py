"""Process groups: join the launcher's group, or spawn local workers and create one.

:class:`DistSession` is the one object that creates (and therefore destroys) the
``torch.distributed`` process group of a run:

* under ``torchrun`` / SLURM (world size from the environment) it initialises the group
  from the rendezvous in :func:`scopebench.dist.info.get_dist_info`;
* on a laptop, with ``nproc > 1`` and no launcher, rank 0 (the benchopt process) opens a
  ``TCPStore`` on port 0, starts ``nproc - 1`` subprocesses ``python -m
  scopebench.dist.worker`` that run ``worker(**worker_kwargs)``, waits for them while
  polling their liveness, and then every rank joins the group;
* with one process it does nothing.

A group that existed before the session (created by the caller) is reused and left alone.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scopebench.dist.info import SPAWN_ENV, DistInfo, get_dist_info

__all__ = ["DistSession", "WORKER_TARGET_ENV", "WORKER_KWARGS_ENV", "check_local_nproc", "default_backend"]

WORKER_TARGET_ENV = "SCOPEBENCH_WORKER_TARGET"
WORKER_KWARGS_ENV = "SCOPEBENCH_WORKER_KWARGS"
_POLL_SEC = 0.05


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


class DistSession:
    """Create (or join) the process group of a run; destroy what it created.

    Args:
        nproc: Processes wanted. Must equal the launcher's world size when one exists.
        worker: ``"package.module:function"`` that spawned workers run; required to spawn.
        worker_kwargs: JSON-serialisable keyword arguments for ``worker`` (workers rebuild
            their problem from plain parameters, never from pickled tensors).
        backend: ``"gloo"``, ``"nccl"`` or ``None`` (chosen from ``device``).
        device: Device the run computes on; selects the default backend.
        timeout_sec: Bound on waiting for workers to start and on every collective, so a
            dead or hung rank fails the run instead of blocking it.
    """

    def __init__(
        self,
        nproc: int = 1,
        *,
        worker: str | None = None,
        worker_kwargs: dict | None = None,
        backend: str | None = None,
        device: str = "cpu",
        timeout_sec: float = 300.0,
    ) -> None:
        if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
            raise ValueError(f"nproc must be a positive integer, got {nproc!r}")
        if timeout_sec <= 0:
            raise ValueError(f"timeout_sec must be positive, got {timeout_sec!r}")
        self.nproc = nproc
        self.worker = worker
        self.worker_kwargs = dict(worker_kwargs or {})
        self.backend = backend or default_backend(device)
        self.timeout_sec = float(timeout_sec)
        self.info: DistInfo = get_dist_info()
        self.created_group = False
        self._procs: list[subprocess.Popen] = []
        self._logs: list[Path] = []
        self._logdir: tempfile.TemporaryDirectory | None = None
        self._store = None
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
        """Destroy the group if this session created it, reap workers, free the store."""
        import torch.distributed as dist

        if self.created_group and dist.is_initialized():
            dist.destroy_process_group()
        self.created_group = False
        self._store = None
        errors = self._reap_workers(kill=failed)
        if self._logdir is not None:
            self._logdir.cleanup()
            self._logdir = None
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

    def _join_spawned_group(self) -> None:
        import torch.distributed as dist

        store = dist.TCPStore(
            self.info.master_addr,
            self.info.master_port,
            self.info.world_size,
            is_master=False,
            timeout=self._timeout(),
        )
        store.set(f"ready/{self.info.rank}", "1")
        backend = store.get("backend").decode()
        dist.init_process_group(
            backend, store=store, rank=self.info.rank, world_size=self.info.world_size, timeout=self._timeout()
        )
        self._store = store
        self.created_group = True

    def _spawn_and_init(self) -> None:
        import torch.distributed as dist

        # Port 0: the OS picks a free port, so concurrent runs never collide.
        store = dist.TCPStore(
            "127.0.0.1", 0, self.nproc, is_master=True, wait_for_workers=False, timeout=self._timeout()
        )
        store.set("backend", self.backend)
        self._store = store
        self._logdir = tempfile.TemporaryDirectory(prefix="scopebench_workers_")
        for rank in range(1, self.nproc):
            env = dict(os.environ)
            env.update(
                {
                    SPAWN_ENV["rank"]: str(rank),
                    SPAWN_ENV["world_size"]: str(self.nproc),
                    SPAWN_ENV["store_addr"]: "127.0.0.1",
                    SPAWN_ENV["store_port"]: str(store.port),
                    WORKER_TARGET_ENV: self.worker,
                    WORKER_KWARGS_ENV: json.dumps(self.worker_kwargs),
                }
            )
            log = Path(self._logdir.name) / f"rank_{rank}.log"
            self._logs.append(log)
            with open(log, "wb") as fh:
                self._procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "scopebench.dist.worker"],
                        env=env,
                        stdout=fh,
                        stderr=subprocess.STDOUT,
                    )
                )
        self._wait_for_workers(store)
        dist.init_process_group(self.backend, store=store, rank=0, world_size=self.nproc, timeout=self._timeout())
        self.created_group = True
        self.info = DistInfo(
            rank=0,
            local_rank=0,
            world_size=self.nproc,
            master_addr="127.0.0.1",
            master_port=store.port,
            source="spawn",
        )

    def _wait_for_workers(self, store) -> None:
        keys = [f"ready/{rank}" for rank in range(1, self.nproc)]
        deadline = time.monotonic() + self.timeout_sec
        while not store.check(keys):
            dead = self._dead_workers()
            if dead:
                raise RuntimeError("local worker(s) died before joining the process group:\n" + "\n".join(dead))
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.nproc - 1} local worker(s) did not join within {self.timeout_sec:.0f} s")
            time.sleep(_POLL_SEC)

    # -- workers -------------------------------------------------------------------
    def _describe(self, index: int) -> str:
        proc, log = self._procs[index], self._logs[index]
        tail = log.read_text(errors="replace")[-3000:] if log.exists() else ""
        return f"[rank {index + 1}] exit code {proc.returncode}:\n{tail}"

    def _dead_workers(self) -> list[str]:
        return [self._describe(i) for i, p in enumerate(self._procs) if p.poll() not in (None, 0)]

    def _reap_workers(self, kill: bool) -> list[str]:
        deadline = time.monotonic() + (1.0 if kill else self.timeout_sec)
        for proc in self._procs:
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        errors = [self._describe(i) for i, p in enumerate(self._procs) if p.returncode != 0]
        self._procs, self._logs = [], []
        return errors
