"""Pi05Train: training steps of the pi05 policy on accelerate, one benchopt iteration per step.

Phases ``dataload_wait``, ``forward``, ``bwd``, ``unscale_clip``, ``optim_step``,
``zero_grad_sched``, ``sync_gather`` (see ``scopebench.policy.run.steps``); reports global
``samples_per_sec``, ``steps_per_sec``, per-rank and worst-rank peak memory, achieved
FLOP/s and MFU, ``setup_time_sec`` and ``world_size``. Ranks come from
torchrun / SLURM or are spawned locally (``nproc_per_node``); ``backend`` is ``ddp``,
``zero2`` or ``zero3`` (DeepSpeed ZeRO through accelerate, ZeRO knobs from
``configs/accelerate/``; declined on one process) or ``fsdp2`` (torch's ``fully_shard``,
knobs from ``configs/accelerate/fsdp2.yaml``). Every parameter but the
``slurm_*`` ones (the cell's SLURM job) is a field of
``scopebench.policy.settings.TrainSettings`` (documented there).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.cluster import SLURM_PARAMETERS, CellLayout
from scopebench.policy.run.solver import TrainSolverMixin
from scopebench.policy.settings import TrainSettings, solver_parameters


class Solver(TrainSolverMixin, BaseSolver):
    name = "Pi05Train"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    task = "train"
    parameters = {
        **TrainSolverMixin.parameters,  # the eight profiler_*
        # every run setting, with its default, from scopebench.policy.settings (seed: the dataset's)
        **solver_parameters(TrainSettings),
        # The cell's SLURM job under the submitit backend (its tasks are the ranks); not run settings.
        **solver_parameters(CellLayout, *SLURM_PARAMETERS),
    }
