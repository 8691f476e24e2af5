"""Targets for spawned workers in the dist tests."""

from __future__ import annotations

import threading

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


def hang_in_user_code():
    """A user's code that never returns (waits on an event nobody sets)."""
    threading.Event().wait()


class HangingRun(CountingRun):
    """Rank 1 stops in code of its own at iteration 5, before that iteration's all-reduce."""

    worker_target = "distributed.workers:run_hanging"

    def step(self, profiler):
        if self.rank == 1 and profiler.iteration == 5:
            hang_in_user_code()
        super().step(profiler)


def run_hanging(**kwargs):
    with HangingRun(**kwargs) as run:
        run.loop(None)


def hold_until_released():
    """Stay in the group until rank 0 passes the same barrier (tests inspect this worker)."""
    dist.barrier()
