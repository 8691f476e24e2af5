"""Run by ``tests/policy/test_user_policy.py`` under ``torchrun --nproc-per-node 2``: user policies
on two gloo ranks in one launch. The PaliGemma policy trains one step under every backend, the
``examples/`` policy under DDP, then ``scopebench train`` saves and resumes the example. Each
rank writes what it saw to ``<out>/facts_rank<r>.json``.

One process group (created here, reused by every run) keeps start-up to one launch.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from scopebench.distributed.worker import exit_without_teardown
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.run.trainer import train_policy
from scopebench.policy.settings import load_run_config
from scopebench.policy.tools import StepCounter

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "policy" / "tiny.yml"
PALIGEMMA = "scopebench.policy.paligemma:make_paligemma_policy"
EXAMPLE = f"{REPO}/examples/flow_policy.py:make_policy"
BACKENDS = ("ddp", "zero2", "zero3", "fsdp2")


def _train(policy: str, backend: str, steps: int = 1) -> dict:
    config = load_run_config(TINY, [("policy", policy), ("backend", backend), ("batch_size", 2)])
    run = PolicyTrainRun(config.train, dataset_root="", chunk_size=8, eval_batch_size=2)
    with run:
        run.loop(StepCounter(steps))
        metrics = run.metrics()
        seen = {
            "world_size": metrics["world_size"],
            "train_loss": metrics["train_loss"],
            "val_loss": run.val_loss,
            "steps": run.work.steps,
            "flops_per_sample": run.flops_per_sample,
            "phases": sorted(k[: -len("_time_sec")] for k in metrics if k.endswith("_time_sec")),
            "accelerate_num_processes": run.accelerator.num_processes,
        }
        if backend == "fsdp2":
            seen["units"] = run.fsdp_units
    assert math.isfinite(seen["train_loss"]), seen
    return seen


def _log(rank: int, what: str) -> None:
    print(f"[rank {rank} {time.strftime('%H:%M:%S')}] {what}", flush=True)


def main(out: str) -> None:
    # A hang prints every thread's stack and ends the rank, before the test's own timeout.
    faulthandler.dump_traceback_later(480, exit=True)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    facts: dict = {"paligemma": {}}
    for backend in BACKENDS:
        _log(rank, f"paligemma {backend}")
        facts["paligemma"][backend] = _train(PALIGEMMA, backend)
    _log(rank, "example ddp")
    facts["example"] = _train(EXAMPLE, "ddp")
    _log(rank, "example train and resume")
    config = load_run_config(
        TINY,
        [("policy", EXAMPLE), ("policy_args.hidden", 16), ("training.output_dir", f"{out}/train/full")]
        + [("training.steps", 4), ("training.save_freq", 2)],
    )
    full = train_policy(config)
    resumed_config = dataclasses.replace(
        config, training=dataclasses.replace(config.training, output_dir=f"{out}/train/resumed")
    )
    resumed = train_policy(resumed_config, resume_from=f"{out}/train/full/checkpoints/000002")
    facts["train"] = {"full": full, "resumed": resumed}
    Path(out, f"facts_rank{rank}.json").write_text(json.dumps(facts, indent=2))
    dist.destroy_process_group()
    exit_without_teardown(0)  # a launched rank's occasional abort at exit (scopebench.distributed.worker)


if __name__ == "__main__":
    main(sys.argv[1])
