"""Entry point of a locally spawned rank: ``python -m scopebench.dist.worker``.

Started by :class:`scopebench.dist.launch.DistSession` (never by hand). It joins the
process group announced in its environment, imports the target named in
``SCOPEBENCH_WORKER_TARGET`` (``"package.module:function"``) and calls it with the JSON
keyword arguments of ``SCOPEBENCH_WORKER_KWARGS``. The target runs the same loop as rank
0 without the benchopt callback (``profiler.iterate(None)`` follows rank 0's decisions).
Exit status 0 on success; a traceback and status 1 on failure, which rank 0 reports.

A worker never outlives rank 0: a watcher thread notices when its parent process is gone
(it was killed, or crashed without teardown), removes the run's temporary folder and
ends the worker with status :data:`ORPHANED_STATUS`.

After the target returned and the group is destroyed, the worker leaves with
``os._exit``: a rank that imported deepinv otherwise aborts now and then in a native
destructor at interpreter exit ("terminate called without an active exception"), after
all its work succeeded, and rank 0 would report a failed worker.
"""

from __future__ import annotations

import importlib
import json
import os
import shutil
import sys
import threading
import time

from scopebench.allocator import keep_freed_memory
from scopebench.dist.info import SPAWN_ENV
from scopebench.dist.launch import WORKER_KWARGS_ENV, WORKER_TARGET_ENV, DistSession

#: Exit status of a worker whose rank 0 died.
ORPHANED_STATUS = 3
_WATCH_SEC = 0.2


def parent_gone() -> bool:
    """Whether the rank 0 that started this worker has died (the worker was re-parented)."""
    parent = os.environ.get(SPAWN_ENV["parent_pid"])
    return parent is not None and os.getppid() != int(parent)


def _remove_run_dir() -> None:
    run_dir = os.environ.get(SPAWN_ENV["run_dir"])
    if run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)


def _watch_parent() -> None:
    while not parent_gone():
        time.sleep(_WATCH_SEC)
    _remove_run_dir()
    print("rank 0 is gone: this worker stops", file=sys.stderr, flush=True)
    os._exit(ORPHANED_STATUS)


def main() -> int:
    target = os.environ.get(WORKER_TARGET_ENV)
    if not target or ":" not in target:
        print(f"{WORKER_TARGET_ENV} must be 'module:function', got {target!r}", file=sys.stderr)
        return 2
    threading.Thread(target=_watch_parent, name="scopebench-parent-watch", daemon=True).start()
    module_name, func_name = target.split(":", 1)
    kwargs = json.loads(os.environ.get(WORKER_KWARGS_ENV, "{}"))
    try:
        # Import before joining, so a broken import is reported as a dead worker at once.
        func = getattr(importlib.import_module(module_name), func_name)
        keep_freed_memory()
        with DistSession():
            func(**kwargs)
    finally:
        if parent_gone():
            _remove_run_dir()
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
