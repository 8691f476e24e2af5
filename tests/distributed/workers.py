"""Targets for spawned workers in the dist tests."""

from __future__ import annotations

import torch
import torch.distributed as dist

import scopebench.profiler  # noqa: F401  (imported before joining: set-up fits a short group timeout)
from scopebench.harness.run import RankRun


def crash_on_import_time():  # pragma: no cover - runs in a worker
    raise RuntimeError("boom before anything")


def sum_ranks():
    value = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(value)


def fail_after_join():
    sum_ranks()
    raise RuntimeError("worker failed after the collective")


class CountingRun(RankRun):
    """One all-reduce per iteration, in region ``sum``: the smallest real run."""

    worker_target = "distributed.workers:run_counting"

    def step(self, profiler):
        with profiler.track_step("sum"):
            value = torch.ones(1)
            dist.all_reduce(value)


def run_counting(**kwargs):
    with CountingRun(**kwargs) as run:
        run.loop(None)


def hold_until_released():
    """Stay in the group until rank 0 passes the same barrier (tests inspect this worker)."""
    dist.barrier()
