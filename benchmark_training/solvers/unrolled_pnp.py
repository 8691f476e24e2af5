"""UnrolledPnP: supervised training of an unrolled proximal-gradient network.

deepinv's unfolded PGD (``n_unrolled`` iterations) with a learnable DnCNN / DRUNet and
learnable step sizes / noise levels, Adam with two parameter groups (``learning_rate``
for the step sizes and noise levels, ``model_learning_rate`` for the denoiser). One
benchopt iteration = one optimizer step, regions ``forward``, ``backward``,
``optimizer_step``. With ``distribute_model`` the denoiser is tiled over the ranks
(torchrun / SLURM, or spawned locally: ``nproc_per_node``). Set-up is untimed and reported
as ``setup_time_sec``. The trained denoiser goes to
``outputs/unrolled_pnp_<run id>_denoiser.safetensors`` (``load_denoiser_weights`` reads it).
The network's, the optimisation's and the tiles' defaults are the library's
(``scopebench.imaging.training.trainer.solver_defaults``).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.cluster import CellLayout
from scopebench.imaging.training.solver import UnrolledSolverMixin
from scopebench.imaging.training.trainer import solver_defaults
from scopebench.parameters import solver_parameters


class Solver(UnrolledSolverMixin, BaseSolver):
    name = "UnrolledPnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **UnrolledSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the eight profiler_*)
        # the network, the optimisation, the tiles: defaults from the library's configs
        **solver_defaults(),
        "save_weights": [True],
        # the ranks and the cell's SLURM job: CellLayout's fields (every solver's)
        **solver_parameters(CellLayout),
        "group_timeout_sec": [None],
    }
    test_config = {"batch_size": 2, "save_weights": False}
