"""Ranks, process groups, devices and cross-rank reductions (never imports benchopt).

* :mod:`~scopebench.distributed.info`: rank discovery (the one reader of launcher variables);
* :mod:`~scopebench.distributed.device`: the device of a rank (``resolve_device``);
* :mod:`~scopebench.distributed.launch`: :class:`DistSession`, local spawn and its fault reports
  (:mod:`~scopebench.distributed.faults`), the worker entry point :mod:`~scopebench.distributed.worker`;
* :mod:`~scopebench.distributed.reduce`: barrier, broadcast and gather, no-ops on one process.

The run lifecycle built on them (``RankRun``) is :mod:`scopebench.harness`, a layer above.
"""

from scopebench.distributed.device import check_device, resolve_device
from scopebench.distributed.info import DistInfo, get_dist_info, is_main, writes_reports
from scopebench.distributed.launch import DistSession, RankFailure, check_local_nproc, default_backend
from scopebench.distributed.reduce import barrier, broadcast_flag, gather_objects

__all__ = [
    "DistInfo",
    "DistSession",
    "RankFailure",
    "barrier",
    "broadcast_flag",
    "check_device",
    "check_local_nproc",
    "default_backend",
    "gather_objects",
    "get_dist_info",
    "is_main",
    "resolve_device",
    "writes_reports",
]
