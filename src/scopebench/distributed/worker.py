"""Entry point of a locally spawned rank: ``python -m scopebench.distributed.worker``.

Started by :class:`scopebench.distributed.launch.DistSession` (never by hand). It joins the
process group announced in its environment, imports the target named in
``SCOPEBENCH_WORKER_TARGET`` (``"package.module:function"``) and calls it with the JSON
keyword arguments of ``SCOPEBENCH_WORKER_KWARGS``. The target runs the same loop as rank
0 without the benchopt callback (``profiler.iterate(None)`` follows rank 0's decisions).
Exit status 0 on success; a traceback and status 1 on failure, which rank 0 reports. On
:data:`~scopebench.distributed.faults.STACK_SIGNAL` (SIGUSR1) it writes its main thread's
Python stack into its log and goes on: rank 0 asks a rank that hangs for it.

A worker never outlives rank 0: it holds the read end of a pipe whose write end only rank
0 holds (``SCOPEBENCH_LIFELINE_FD``). When rank 0 dies (killed, or crashed without
teardown) the pipe reads end-of-file: a watcher thread then removes the run's temporary
folder and ends the worker with status :data:`ORPHANED_STATUS`, and a worker whose loop
failed because rank 0 vanished removes the folder too before it exits.

After the target returned and the group is destroyed, the worker leaves with
``os._exit``: a rank that imported deepinv otherwise aborts now and then in a native
destructor at interpreter exit ("terminate called without an active exception"), after
all its work succeeded, and rank 0 would report a failed worker.
"""

from __future__ import annotations

import faulthandler
import importlib
import json
import os
import select
import shutil
import sys
import threading

from scopebench.allocator import keep_freed_memory
from scopebench.distributed.faults import STACK_SIGNAL
from scopebench.distributed.info import SPAWN_ENV
from scopebench.distributed.launch import WORKER_KWARGS_ENV, WORKER_TARGET_ENV, DistSession

#: Exit status of a worker whose rank 0 died.
ORPHANED_STATUS = 3
#: How long a failing worker waits to learn whether rank 0 died: rank 0's sockets (whose
#: reset failed this worker's collective) and its end of the lifeline close together.
_LIFELINE_GRACE_SEC = 0.5


def _lifeline() -> int | None:
    fd = os.environ.get(SPAWN_ENV["lifeline"])
    return int(fd) if fd is not None else None


def rank0_gone(wait_sec: float | None = 0.0) -> bool:
    """Whether rank 0 has died, waiting up to ``wait_sec`` (``None``: until it does)."""
    fd = _lifeline()
    if fd is None:
        return False
    readable, _, _ = select.select([fd], [], [], wait_sec)
    return bool(readable)


def _remove_run_dir() -> None:
    run_dir = os.environ.get(SPAWN_ENV["run_dir"])
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)


def _watch_rank0() -> None:
    rank0_gone(wait_sec=None)
    _remove_run_dir()
    print("rank 0 is gone: this worker stops", file=sys.stderr, flush=True)
    os._exit(ORPHANED_STATUS)


def main() -> int:
    target = os.environ.get(WORKER_TARGET_ENV)
    if not target or ":" not in target:
        print(f"{WORKER_TARGET_ENV} must be 'module:function', got {target!r}", file=sys.stderr)
        return 2
    if _lifeline() is not None:
        threading.Thread(target=_watch_rank0, name="scopebench-rank0-watch", daemon=True).start()
    # rank 0 asks a rank that hangs for its stack, into this log (scopebench.distributed.faults.dump_stack)
    faulthandler.register(STACK_SIGNAL, all_threads=False)
    module_name, func_name = target.split(":", 1)
    kwargs = json.loads(os.environ.get(WORKER_KWARGS_ENV, "{}"))
    try:
        # Import before joining, so a broken import is reported as a dead worker at once.
        func = getattr(importlib.import_module(module_name), func_name)
        keep_freed_memory()
        with DistSession():
            func(**kwargs)
    except BaseException:
        if rank0_gone(_LIFELINE_GRACE_SEC):
            _remove_run_dir()
            return ORPHANED_STATUS
        raise
    return 0


def exit_without_teardown(status: int = 0) -> None:
    """Flush and leave with ``os._exit``: for a rank whose work is done, saved, and whose
    group is destroyed (see the module docstring; ranks started by torchrun abort the same
    way now and then, and torchrun then reports a failed run)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_without_teardown(main())
