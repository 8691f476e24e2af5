"""Denoiser: one denoiser pass over the noisy image per iteration (region ``denoise``).

Measures the denoiser alone, with the same tiling, distribution and profiler parameters
as PnP. At set-up it counts one pass's FLOPs and bytes (``flops_per_iter``,
``bytes_per_iter``); rows with ``denoise_time_sec`` also carry
``achieved_gflop_per_sec`` and ``achieved_gbyte_per_sec`` to compare with the machine's
peaks.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.imaging.solver import DENOISER_PARAMETERS, ImagingSolverMixin


class Solver(ImagingSolverMixin, BaseSolver):
    name = "Denoiser"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    parameters = dict(DENOISER_PARAMETERS)
    task = "denoise"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"

    def get_next(self, stop_val):
        return stop_val + 1
