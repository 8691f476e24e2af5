"""Entry point of a locally spawned rank: ``python -m scopebench.dist.worker``.

Started by :class:`scopebench.dist.launch.DistSession` (never by hand). It joins the
process group announced in its environment, imports the target named in
``SCOPEBENCH_WORKER_TARGET`` (``"package.module:function"``) and calls it with the JSON
keyword arguments of ``SCOPEBENCH_WORKER_KWARGS``. The target runs the same loop as rank
0 without the benchopt callback (``profiler.iterate(None)`` follows rank 0's decisions).
Exit status 0 on success; a traceback and status 1 on failure, which rank 0 reports.

After the target returned and the group is destroyed, the worker leaves with
``os._exit``: a rank that imported deepinv otherwise aborts now and then in a native
destructor at interpreter exit ("terminate called without an active exception"), after
all its work succeeded, and rank 0 would report a failed worker.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

from scopebench.allocator import keep_freed_memory
from scopebench.dist.launch import WORKER_KWARGS_ENV, WORKER_TARGET_ENV, DistSession


def main() -> int:
    target = os.environ.get(WORKER_TARGET_ENV)
    if not target or ":" not in target:
        print(f"{WORKER_TARGET_ENV} must be 'module:function', got {target!r}", file=sys.stderr)
        return 2
    module_name, func_name = target.split(":", 1)
    kwargs = json.loads(os.environ.get(WORKER_KWARGS_ENV, "{}"))
    # Import before joining, so a broken import is reported as a dead worker at once.
    func = getattr(importlib.import_module(module_name), func_name)
    keep_freed_memory()
    with DistSession():
        func(**kwargs)
    return 0


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
