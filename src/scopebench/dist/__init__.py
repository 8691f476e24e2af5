"""Ranks, process groups, devices, cross-rank reductions and the run lifecycle (never imports benchopt).

* :mod:`~scopebench.dist.info`: rank discovery (the one reader of launcher variables);
* :mod:`~scopebench.dist.device`: the device of a rank (``resolve_device``);
* :mod:`~scopebench.dist.launch`: :class:`DistSession`, local spawn and its fault reports
  (:mod:`~scopebench.dist.faults`), the worker entry point :mod:`~scopebench.dist.worker`;
* :mod:`~scopebench.dist.reduce`: barrier, broadcast and gather, no-ops on one process;
* :mod:`~scopebench.dist.run`: :class:`RankRun`, the base of every benchmark's run object.
"""

from scopebench.dist.device import check_device, resolve_device
from scopebench.dist.info import DistInfo, get_dist_info, is_main, writes_reports
from scopebench.dist.launch import DistSession, RankFailure, check_local_nproc, default_backend
from scopebench.dist.reduce import barrier, broadcast_flag, gather_objects
from scopebench.dist.run import RankRun

__all__ = [
    "DistInfo",
    "DistSession",
    "RankFailure",
    "RankRun",
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
