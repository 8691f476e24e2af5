"""Run by ``tests/policy/test_hsdp.py`` under ``torchrun --nproc-per-node 4``: FSDP2 on 4 ranks and
HSDP on a 2 x 2 mesh (2 replica groups of 2 shards) train the tiny policy 6 steps from the same
seed and data, logging every step's loss and saving at steps 3 and 6; HSDP then resumes from
step 3 to 6, and one more HSDP step records how its parameters are laid out. Each rank writes
what it saw to ``<out>/facts_rank<r>.json``.

Usage: ``hsdp_driver.py OUT CACHE HSDP_FILE`` (HSDP_FILE: an accelerate file of the 2 x 2 mesh).
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

TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"


def main(out: str, cache: str, hsdp_file: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    facts: dict = {}
    common = [("find_unused_params", False), ("dataset.cache_dir", cache), ("training.steps", 6)]
    common += [("training.save_freq", 3), ("training.log_freq", 1)]
    for backend, file in (("fsdp2", None), ("hsdp", hsdp_file)):
        overrides = [("backend", backend), ("accelerate_config", file), ("training.output_dir", f"{out}/{backend}")]
        config = load_run_config(TINY, common + overrides)
        facts[backend] = train_policy(config)
        if backend == "hsdp":
            resumed = dataclasses.replace(
                config, training=dataclasses.replace(config.training, output_dir=f"{out}/hsdp_resumed")
            )
            facts["hsdp_resumed"] = train_policy(resumed, resume_from=f"{out}/hsdp/checkpoints/000003")
            run = PolicyTrainRun(
                config.train, dataset_root=config.dataset.materialize(), chunk_size=config.dataset.chunk_size
            )
            with run:
                run.loop(StepCounter(1))
                from scopebench.train.fsdp import local_fraction

                model = run.work.model
                param = next(p for p in model.parameters() if p.dim() == 2)
                facts["layout"] = {
                    "mesh": list(param.device_mesh.shape),
                    "mesh_dims": list(param.device_mesh.mesh_dim_names),
                    "placements": [str(p) for p in param.placements],
                    "fraction": local_fraction(model),
                    "units": run.fsdp_units,
                }
    Path(out, f"facts_rank{rank}.json").write_text(json.dumps(facts, indent=2))
    dist.destroy_process_group()
    exit_without_teardown(0)  # a launched rank's occasional abort at exit (scopebench.distributed.worker)


if __name__ == "__main__":
    main(*sys.argv[1:4])
