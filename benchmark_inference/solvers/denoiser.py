"""Denoiser: one denoiser pass over the noisy image per iteration (region ``denoise``).

Measures the denoiser alone, with the same tiling, distribution and profiler parameters
as PnP. At set-up it counts one pass's FLOPs and bytes (``flops_per_iter``,
``bytes_per_iter``); rows with ``denoise_time_sec`` also carry
``achieved_gflop_per_sec`` and ``achieved_gbyte_per_sec`` to compare with the machine's
peaks. Set-up is untimed and reported as ``setup_time_sec``. Parameters and their defaults
come from ``ReconstructionConfig`` and ``CellLayout``, as PnP's.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.cluster import CellLayout
from scopebench.imaging.inference.engine import PNP_ONLY, ReconstructionConfig
from scopebench.imaging.inference.solver import PnPSolverMixin
from scopebench.parameters import solver_parameters


class Solver(PnPSolverMixin, BaseSolver):
    name = "Denoiser"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    task = "denoise"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **PnPSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the eight profiler_*)
        # the denoiser and its tiles: ReconstructionConfig's fields and defaults, less the iteration's
        **solver_parameters(ReconstructionConfig, exclude=PNP_ONLY),
        # the ranks and the cell's SLURM job: CellLayout's fields (every solver's)
        **solver_parameters(CellLayout),
        "group_timeout_sec": [None],
    }
