"""PnP: proximal-gradient plug-and-play, regions ``gradient`` then ``denoise`` per iteration.

``z = x - gamma * grad f(x)``, ``x+ = D_sigma(z)``; the operators (``distribute_physics``)
and the denoiser's tiles (``distribute_denoiser``) can be split across ranks started by
torchrun, SLURM or a local spawn (``nproc_per_node > 1``). Layouts that cannot run are
declined by ``skip`` with a reason; invalid values raise ``ValueError``.
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.imaging.solver import PNP_PARAMETERS, ImagingSolverMixin


class Solver(ImagingSolverMixin, BaseSolver):
    name = "PnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    parameters = dict(PNP_PARAMETERS)
    task = "pnp"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"

    def get_next(self, stop_val):
        return stop_val + 1
