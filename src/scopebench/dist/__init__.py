"""Ranks, process groups and cross-rank reductions (never imports benchopt)."""

from scopebench.dist.info import DistInfo, get_dist_info, is_main, print0, writes_reports
from scopebench.dist.launch import DistSession, check_local_nproc, default_backend
from scopebench.dist.reduce import broadcast_flag, gather_objects

__all__ = [
    "DistInfo",
    "DistSession",
    "broadcast_flag",
    "check_local_nproc",
    "default_backend",
    "gather_objects",
    "get_dist_info",
    "is_main",
    "print0",
    "writes_reports",
]
