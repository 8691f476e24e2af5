"""Run by ``tests/train/test_checkpoint_data_only.py`` under ``torchrun --nproc-per-node 2``.

``save <out> <cache>``: the tiny policy trains 2 steps under ZeRO-2 and under ZeRO-3 and saves
a checkpoint in ``<out>/<backend>``; rank 0 writes the folders to ``<out>/checkpoints.json``.

``resume <checkpoint> <cache> <facts>``: a ZeRO-2 run resumes from ``<checkpoint>`` (DeepSpeed's
engine loads its shards); each rank writes what happened (``resumed`` or the ``ValueError``)
to ``<facts>_rank<r>.json``.

One process group per launch keeps start-up to one launch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from scopebench.distributed.worker import exit_without_teardown
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.settings import load_run_config
from scopebench.policy.tools import StepCounter

TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"


def _run(backend: str, cache: str, **kwargs) -> PolicyTrainRun:
    overrides = [("backend", backend), ("find_unused_params", False), ("dataset.cache_dir", cache)]
    config = load_run_config(TINY, overrides)
    root = config.dataset.materialize()
    return PolicyTrainRun(config.train, dataset_root=root, chunk_size=config.dataset.chunk_size, **kwargs)


def save(out: str, cache: str) -> None:
    folders = {}
    for backend in ("zero2", "zero3"):
        with _run(backend, cache) as run:
            run.loop(StepCounter(2))
            folders[backend] = str(run.save_checkpoint(f"{out}/{backend}"))
    if dist.get_rank() == 0:
        Path(out, "checkpoints.json").write_text(json.dumps(folders, indent=2))


def resume(checkpoint: str, cache: str, facts: str) -> None:
    try:
        with _run("zero2", cache, resume_from=checkpoint) as run:
            seen = {"resumed": run.work.steps}
    except ValueError as err:
        seen = {"error": str(err)}
    Path(f"{facts}_rank{dist.get_rank()}.json").write_text(json.dumps(seen))


def main(mode: str, *args: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    {"save": save, "resume": resume}[mode](*args)
    dist.destroy_process_group()
    exit_without_teardown(0)  # a launched rank's occasional abort at exit (scopebench.distributed.worker)


if __name__ == "__main__":
    main(*sys.argv[1:])
