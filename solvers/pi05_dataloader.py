"""Pi05Dataloader: the dataloader ceiling, one benchopt iteration per batch.

The same dataloader as ``Pi05Train`` (sampler, workers, prefetch, the host preprocessing
and copy to the device of its ``dataload_wait``), without a model and without any
collective: regions ``fetch`` and ``h2d``; reports ``batches_per_sec`` (per rank, the
slowest) and cluster ``samples_per_sec``. Compare with ``Pi05Train``'s samples/s: when
this ceiling is not well above it, the input pipeline is the bottleneck.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.cluster import SLURM_PARAMETERS, CellLayout
from scopebench.policy.run.solver import DATALOADER_SETTINGS, TrainSolverMixin
from scopebench.policy.settings import TrainSettings, solver_parameters


class Solver(TrainSolverMixin, BaseSolver):
    name = "Pi05Dataloader"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    task = "dataloader"
    parameters = {
        **TrainSolverMixin.parameters,  # the eight profiler_*
        # every run setting, with its default, from scopebench.policy.settings (seed: the dataset's)
        **solver_parameters(TrainSettings, *DATALOADER_SETTINGS),
        # The cell's SLURM job under the submitit backend (its tasks are the ranks); not run settings.
        **solver_parameters(CellLayout, *SLURM_PARAMETERS),
    }
