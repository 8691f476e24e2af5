"""PnP: proximal-gradient plug-and-play, regions ``gradient`` then ``denoise`` per iteration.

``z = x - gamma * grad f(x)``, ``x+ = D_sigma(z)``; the operators (``distribute_physics``)
and the denoiser's tiles (``distribute_denoiser``) can be split across ranks started by
torchrun, SLURM or a local spawn (``nproc_per_node > 1``). Layouts that cannot run are
declined by ``skip`` with a reason; invalid values raise ``ValueError``. Set-up (ranks,
problem, denoiser, compilation) is untimed and reported as ``setup_time_sec``. Every
parameter but the profiler's and ``group_timeout_sec`` is a field of
``scopebench.imaging.inference.engine.ReconstructionConfig`` or ``scopebench.cluster.CellLayout``
(documented there, defaults included).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.cluster import CellLayout
from scopebench.imaging.inference.engine import ReconstructionConfig
from scopebench.imaging.inference.solver import PnPSolverMixin
from scopebench.parameters import solver_parameters


class Solver(PnPSolverMixin, BaseSolver):
    name = "PnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    task = "pnp"
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **PnPSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the eight profiler_*)
        # the prior, the iteration, the tiles: every field of ReconstructionConfig, its default included
        **solver_parameters(ReconstructionConfig),
        # the ranks and the cell's SLURM job: CellLayout's fields (every solver's)
        **solver_parameters(CellLayout),
        "group_timeout_sec": [None],
    }
