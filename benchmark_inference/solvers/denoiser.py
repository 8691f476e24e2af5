"""Denoiser: one denoiser pass over the noisy image per iteration (region ``denoise``).

Measures the denoiser alone, with the same tiling, distribution and profiler parameters
as PnP. At set-up it counts one pass's FLOPs and bytes (``flops_per_iter``,
``bytes_per_iter``); rows with ``denoise_time_sec`` also carry
``achieved_gflop_per_sec`` and ``achieved_gbyte_per_sec`` to compare with the machine's
peaks. Set-up is untimed and reported as ``setup_time_sec``.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.imaging.inference.solver import PnPSolverMixin


class Solver(PnPSolverMixin, BaseSolver):
    name = "Denoiser"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    task = "denoise"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **PnPSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the eight profiler_*)
        # the denoiser
        "denoiser": ["tv"],
        "denoiser_sigma": [0.01],
        "denoiser_weights": [None],
        "pretrained": ["auto"],
        "compile": ["none"],
        "device": ["auto"],
        # tiles and ranks
        "patch_size": [None],
        "overlap": [8],
        "max_batch_size": [None],
        "distribute_denoiser": [False],
        "nproc_per_node": [1],
        "group_timeout_sec": [None],
        "slurm_gres": [None],
        "slurm_nodes": [1],
        "slurm_ntasks_per_node": [None],
    }
