"""PnP: proximal-gradient plug-and-play, regions ``gradient`` then ``denoise`` per iteration.

``z = x - gamma * grad f(x)``, ``x+ = D_sigma(z)``; the operators (``distribute_physics``)
and the denoiser's tiles (``distribute_denoiser``) can be split across ranks started by
torchrun, SLURM or a local spawn (``nproc_per_node > 1``). Layouts that cannot run are
declined by ``skip`` with a reason; invalid values raise ``ValueError``. Set-up (ranks,
problem, denoiser, compilation) is untimed and reported as ``setup_time_sec``.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.imaging.inference.solver import PnPSolverMixin


class Solver(PnPSolverMixin, BaseSolver):
    name = "PnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    task = "pnp"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **PnPSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the eight profiler_*)
        # the prior
        "denoiser": ["tv"],
        "denoiser_sigma": [0.01],
        "denoiser_weights": [None],
        "pretrained": ["auto"],
        # the iteration
        "step_size": [None],
        "step_size_scale": [1.0],
        "init_method": ["adjoint"],
        "compile": ["none"],
        "device": ["auto"],
        # tiles and ranks
        "patch_size": [None],
        "overlap": [8],
        "max_batch_size": [None],
        "distribute_physics": [False],
        "distribute_denoiser": [False],
        "nproc_per_node": [1],
        "group_timeout_sec": [None],
        "slurm_gres": [None],
        "slurm_nodes": [1],
        "slurm_ntasks_per_node": [None],
    }
