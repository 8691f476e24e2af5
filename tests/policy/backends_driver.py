"""Run by ``tests/policy/test_backends.py`` under ``torchrun --nproc-per-node 2``: every backend of
the registry, one after another in this process (what one leaves behind, the next meets), trains the tiny policy 10 steps saving at step 5 (logging every step's loss), then a second run
resumes from step 5 to 10, and 5 more steps in bf16 give the bf16 losses;
runs of a backend that does not save whole weights (ZeRO, FSDP2) also record the live model's
validation loss, runs with gradient
accumulation their step counters, and FSDP2 runs its shard sizes, its gradient norm against
DDP's and its loss with gradient checkpointing; the accumulation runs warm the learning rate up
(the schedule steps once per optimizer step on every backend). Each rank writes what it saw
to ``<out>/facts_rank<r>.json``.

One process group (created here, reused by every run) keeps start-up to one launch.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from scopebench.distributed.worker import exit_without_teardown
from scopebench.policy.run.train import PolicyTrainRun
from scopebench.policy.run.trainer import train_policy
from scopebench.policy.settings import load_run_config
from scopebench.policy.tools import StepCounter
from scopebench.train.backends import backend_names

TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"
BACKENDS = backend_names()
#: Backends whose checkpoint is converted and compared with the live model's loss.
LIVE = ("zero1", "zero3", "fsdp2")
#: Backends trained with two micro-batches per step against DDP's update.
ACCUMULATED = ("ddp", "zero1", "zero2", "fsdp2")


def main(out: str, cache: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    facts: dict = {}
    for backend in BACKENDS:
        overrides = [
            ("backend", backend),
            ("find_unused_params", False),
            ("dataset.cache_dir", cache),
            ("training.output_dir", f"{out}/{backend}/full"),
            ("training.steps", 10),
            ("training.save_freq", 5),
            ("training.log_freq", 1),  # every step's loss, for the golden losses
        ]
        config = load_run_config(TINY, overrides)
        full = train_policy(config)
        resumed_config = dataclasses.replace(
            config, training=dataclasses.replace(config.training, output_dir=f"{out}/{backend}/resumed")
        )
        resumed = train_policy(resumed_config, resume_from=f"{out}/{backend}/full/checkpoints/000005")
        facts[backend] = {"full": full, "resumed": resumed}
    facts["bf16"] = {}
    for backend in BACKENDS:  # the same 5 steps in bf16 (autocast; DeepSpeed's bf16 mode under ZeRO)
        overrides = [("backend", backend), ("precision", "bf16"), ("find_unused_params", False)]
        overrides += [("dataset.cache_dir", cache), ("training.output_dir", f"{out}/bf16/{backend}")]
        overrides += [("training.steps", 5), ("training.save_freq", 5), ("training.log_freq", 1)]
        facts["bf16"][backend] = train_policy(load_run_config(TINY, overrides))["log"]
    for backend in LIVE:
        config = load_run_config(TINY, [("backend", backend), ("dataset.cache_dir", cache)])
        run = PolicyTrainRun(
            config.train,
            dataset_root=config.dataset.materialize(),
            chunk_size=config.dataset.chunk_size,
            eval_batch_size=4,
        )
        with run:
            run.loop(StepCounter(3))
            live = run.val_loss  # computed by every rank after the third step
            checkpoint = run.save_checkpoint(f"{out}/{backend}_live")
        facts[f"{backend}_live"] = {"val_loss": live, "checkpoint": str(checkpoint), "seed": config.train.seed}
    facts["clip"] = {}
    for backend, checkpointing in (("ddp", False), ("fsdp2", False), ("fsdp2", True)):
        overrides = [("backend", backend), ("gradient_checkpointing", checkpointing), ("find_unused_params", False)]
        config = load_run_config(TINY, [*overrides, ("grad_clip", 0.5), ("dataset.cache_dir", cache)])
        run = PolicyTrainRun(
            config.train, dataset_root=config.dataset.materialize(), chunk_size=config.dataset.chunk_size
        )
        with run:
            run.loop(StepCounter(2))
            seen = {"grad_norm": float(run.work.grad_norm), "train_loss": run.metrics()["train_loss"]}
            if backend == "fsdp2":
                from scopebench.train.fsdp import local_fraction

                model = run.work.model
                seen["units"] = run.fsdp_units
                seen["fractions"] = {name: local_fraction(model.get_submodule(name)) for name in run.fsdp_units}
                seen["local_elements"] = sum(p.to_local().numel() for p in model.parameters())
                seen["elements"] = sum(p.numel() for p in model.parameters())
        facts["clip"][f"{backend}{'_checkpointing' if checkpointing else ''}"] = seen
    for backend in ACCUMULATED:  # two micro-batches per step, the same update either way
        overrides = [("backend", backend), ("gradient_accumulation_steps", 2), ("find_unused_params", False)]
        warmup = [("warmup_steps", 4)]  # the learning rate after 2 steps: 3/5 of its setting on every backend
        config = load_run_config(TINY, [*overrides, *warmup, ("dataset.cache_dir", cache)])
        root = config.dataset.materialize()
        run = PolicyTrainRun(config.train, dataset_root=root, chunk_size=config.dataset.chunk_size)
        with run:
            run.loop(StepCounter(2))
            engine = run.work.engine
            facts[f"{backend}_accumulation"] = {
                "optimizer_steps": engine.global_steps if engine is not None else run.work.steps,
                "position": run.work.batches.position,
                "lr": run.work.optimizer.param_groups[0]["lr"],
                "learning_rate": config.train.learning_rate,
                "checkpoint": str(run.save_checkpoint(f"{out}/{backend}_accumulation")),
            }
    Path(out, f"facts_rank{rank}.json").write_text(json.dumps(facts, indent=2))
    dist.destroy_process_group()
    exit_without_teardown(0)  # a launched rank's occasional abort at exit (scopebench.distributed.worker)


if __name__ == "__main__":
    main(*sys.argv[1:3])
