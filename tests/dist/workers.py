"""Targets for spawned workers in the dist tests."""

from __future__ import annotations

import torch
import torch.distributed as dist


def crash_on_import_time():  # pragma: no cover - runs in a worker
    raise RuntimeError("boom before anything")


def sum_ranks():
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)


def fail_after_join():
    sum_ranks()
    raise RuntimeError("worker failed after the collective")
