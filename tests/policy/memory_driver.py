"""Run by ``tests/policy/test_memory_tracking.py`` (and ``perf/memory_tracking.py``), alone or
under ``torchrun --nproc-per-node 2``: the tiny (or given) policy trains ``STEPS`` (3) steps per
backend and batch size with ``profiler_memory: true`` from the second step on; each rank writes
what it saw to ``<out>/memory_rank<r>.json``.

For every run: this rank's memory columns of the last iteration, the bytes the tracker held
when it started, and, measured independently, the peak of the CPU allocator's bytes in use
during it (torch.profiler's memory events, relative to their start); the parameter count; the
estimate of :func:`scopebench.policy.memory.run_memory`.

Usage: ``memory_driver.py OUT CACHE PRESET BACKENDS BATCHES [STEPS [EXTRA]]`` (comma-separated
lists; ``EXTRA``: more runs as ``backend:batch,batch;backend:batch``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "policy"


class Window:
    """A callback that runs ``steps`` iterations and wraps the last one in torch.profiler."""

    def __init__(self, run, steps: int) -> None:
        self.run, self.steps, self.calls = run, steps, 0
        self.prof = None
        self.start_bytes = 0.0
        self.allocated_peak = None

    def __call__(self) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.calls += 1
        if self.prof is not None:
            self.prof.__exit__(None, None, None)
            self.allocated_peak = _allocated_peak(self.prof)
            self.prof = None
        if self.calls == self.steps:  # the next iteration is the last: measure it
            self.start_bytes = self.run.profiler._memory.held_bytes()
            self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            self.prof.__enter__()


def _allocated_peak(prof) -> float:
    """The peak of the CPU allocator's bytes in use during the profile, relative to its start:
    the running sum of its memory events (allocations positive, frees negative), in time order."""
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    level = peak = 0.0
    for event in sorted(events, key=lambda e: e.start_ns()):
        level += event.nbytes()
        peak = max(peak, level)
    return peak


def measure(preset: str, backend: str, batch: int, cache: str, steps: int) -> dict:
    from scopebench.policy.data.dataset import RobotDataset
    from scopebench.policy.memory import run_memory
    from scopebench.policy.pi05.policy import config_for_dataset
    from scopebench.policy.run.train import PolicyTrainRun, model_overrides
    from scopebench.policy.settings import load_run_config
    from scopebench.profiler import ProfilerConfig

    overrides = [("backend", backend), ("batch_size", batch), ("find_unused_params", False), ("num_workers", 0)]
    config = load_run_config(CONFIGS / f"{preset}.yml", [*overrides, ("dataset.cache_dir", cache)])
    root = config.dataset.materialize()
    run = PolicyTrainRun(
        config.train,
        dataset_root=root,
        chunk_size=config.dataset.chunk_size,
        profiler=ProfilerConfig(mode="custom", warmup=1, memory=True),  # DDP rebuilds its buckets in iteration 1
    )
    with run:
        window = Window(run, steps)
        run.loop(lambda: window.calls <= steps, before_callback=window)
        local = dict(run.profiler.last_local)
        reduced = run.metrics() if run.rank == 0 else {}
        world = run.world_size
    model_config = config_for_dataset(preset, RobotDataset(root, chunk_size=config.dataset.chunk_size),
                                      **model_overrides(config.train))  # fmt: skip
    with torch.device("meta"):
        from scopebench.policy.pi05.model import Pi05Policy

        num_params = sum(p.numel() for p in Pi05Policy(model_config).parameters())
    estimate = run_memory(config.train, model_config, world)
    return {
        "local": {k: v for k, v in local.items() if "mem_" in k or "overhead" in k or k.endswith("time_sec")},
        "reduced": {k: v for k, v in reduced.items() if "mem_" in k},
        "start_bytes": window.start_bytes,
        "allocated_peak_bytes": window.allocated_peak,
        "num_params": num_params,
        "world_size": world,
        "estimate": {k: v for k, v in estimate.items() if isinstance(v, (int, float))},
    }


def main(out: str, cache: str, preset: str, backends: str, batches: str, steps: str = "3", extra: str = "") -> None:
    """``extra``: more runs as ``backend:batch,batch;backend:batch``."""
    from scopebench.distributed.worker import exit_without_teardown

    torch.set_num_threads(1)
    launched = "RANK" in __import__("os").environ
    if launched:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if launched else 0
    runs = [(backend, batch) for backend in backends.split(",") for batch in batches.split(",")]
    runs += [(item.split(":")[0], b) for item in extra.split(";") if item for b in item.split(":")[1].split(",")]
    seen = {}
    for backend, batch in runs:
        start = time.perf_counter()
        seen[f"{backend}/{batch}"] = measure(preset, backend, int(batch), cache, int(steps))
        print(f"rank {rank}: {backend}/{batch} in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    Path(out, f"memory_rank{rank}.json").write_text(json.dumps(seen, indent=1))
    if launched:
        dist.destroy_process_group()
        exit_without_teardown(0)


if __name__ == "__main__":
    main(*sys.argv[1:])
