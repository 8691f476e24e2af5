"""Pi05Train: training steps of the pi05 policy on accelerate, one benchopt iteration per step.

Phases ``dataload_wait``, ``forward``, ``bwd``, ``unscale_clip``, ``optim_step``,
``zero_grad_sched``, ``sync_gather`` (see ``scopebench.policy.steps``); reports global
``samples_per_sec``, ``steps_per_sec``, per-rank and worst-rank peak memory, achieved
FLOP/s and MFU, ``setup_time_sec`` and ``world_size``. Ranks come from
torchrun / SLURM or are spawned locally (``nproc_per_node``); ``backend`` is ``ddp``,
``zero2`` or ``zero3`` (DeepSpeed ZeRO through accelerate, ZeRO knobs from
``configs/accelerate/``; declined on one process). Every parameter but the
``slurm_*`` ones (the cell's SLURM job) is a field of
``scopebench.policy.settings.TrainSettings`` (documented there).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.policy.solver import TrainSolverMixin


class Solver(TrainSolverMixin, BaseSolver):
    name = "Pi05Train"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    task = "train"
    parameters = {
        **TrainSolverMixin.parameters,
        "preset": ["tiny"],
        "batch_size": [4],
        "num_workers": [0],
        "prefetch_factor": [2],
        "nproc_per_node": [1],
        "backend": ["ddp"],
        "accelerate_config": [None],
        "gradient_accumulation_steps": [1],
        "no_optim": [False],
        "find_unused_params": [True],
        "fused_adamw": [None],
        "attention_implementation": ["sdpa"],
        "gradient_checkpointing": [False],
        "torch_compile": [False],
        "precision": ["fp32"],
        "learning_rate": [1e-3],
        "weight_decay": [0.0],
        "grad_clip": [1.0],
        "scheduler": ["constant"],
        "warmup_steps": [0],
        "gather_every": [1],
        "ce_weight": [1.0],
        "group_timeout_sec": [None],
        "peak_tflops": [None],
        "check_memory": [True],
        "device": ["auto"],
        # The cell's SLURM job under the submitit backend (its tasks are the ranks); not run settings.
        "slurm_gres": [None],
        "slurm_nodes": [1],
        "slurm_ntasks_per_node": [None],
    }
