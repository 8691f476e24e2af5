"""Workloads run by the profiler tests, on rank 0 and in spawned workers."""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from scopebench.profiler import create_profiler

SLEEP_SEC = 0.01


def comm_loop(
    mode: str,
    iterations: int,
    slow_rank: int = -1,
    extra_sec: float = 0.0,
    save_file: bool = False,
    output_dir: str = "outputs",
    seen: list | None = None,
    profiler_kwargs: dict | None = None,
    raise_at: int = -1,
    defer: bool = False,
    exchange_chunk: int | None = None,
):
    """Two regions: ``compute`` sleeps (longer on ``slow_rank``), ``sync`` all-reduces; every
    rank raises ``RuntimeError`` inside iteration ``raise_at``, after its all-reduce.

    Rank 0 stops after ``iterations`` iterations and the other ranks follow the
    broadcast decision; rank 0 appends the metrics each callback sees to ``seen``.
    ``profiler_kwargs``: more keyword arguments of ``create_profiler`` (window, scheduled
    mode, ``trace_dir``); ``defer``, ``exchange_chunk``: the profiler's ``defer_exchange`` and
    ``exchange_chunk`` (every rank alike). Returns the finalized profiler.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    count = {"n": 0}

    def callback():
        if count["n"] and seen is not None:
            seen.append(prof.get_current_metrics())
        count["n"] += 1
        return count["n"] <= iterations

    prof = create_profiler(
        mode, "cpu", "comm_test", save_file=save_file, output_dir=output_dir, **(profiler_kwargs or {})
    )
    prof.defer_exchange = defer
    if exchange_chunk is not None:
        prof.exchange_chunk = exchange_chunk
    with prof:
        for _ in prof.iterate(callback if rank == 0 else None):
            with prof.track_step("compute"):
                time.sleep(SLEEP_SEC + (extra_sec if rank == slow_rank else 0.0))
            with prof.track_step("sync"):
                value = torch.ones(1000)
                dist.all_reduce(value)
            if prof.iteration == raise_at:
                raise RuntimeError(f"raised in iteration {raise_at}")
    return prof


def matmuls(prof, n: int = 3, size: int = 128) -> list[dict]:
    """``n`` iterations of two regions (``forward``: a product, ``update``: a tanh) under ``prof``;
    returns what each callback saw (the previous iteration's metrics)."""
    calls = {"n": 0}
    seen = []

    def callback():
        if calls["n"]:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        return calls["n"] <= n

    a = torch.randn(size, size)
    for _ in prof.iterate(callback):
        with prof.track_step("forward"):
            b = a @ a
        with prof.track_step("update"):
            a = torch.tanh(b)
    return seen
