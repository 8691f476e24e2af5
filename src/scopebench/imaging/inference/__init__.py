"""Imaging inference (``benchmark_inference``): plug-and-play reconstruction on one or many ranks.

* :mod:`~scopebench.imaging.inference.problems`: inverse problems built from plain parameters;
* :mod:`~scopebench.imaging.inference.topology`: which process layouts can run, decided up front;
* :mod:`~scopebench.imaging.inference.engine`: the PnP iteration (:class:`PnPEngine`) and its config;
* :mod:`~scopebench.imaging.inference.cost`: FLOPs and bytes of one denoiser pass;
* :mod:`~scopebench.imaging.inference.run`: :class:`PnPRun`, the run object of every rank;
* :mod:`~scopebench.imaging.inference.solver`: the benchopt-free half of the ``PnP`` / ``Denoiser`` solvers.
"""

from scopebench.imaging.inference.engine import COMPILE_MODES, INIT_METHODS, PnPEngine, ReconstructionConfig
from scopebench.imaging.inference.problems import PROBLEM_KINDS, Problem, build_problem, describe_problem, make_spec
from scopebench.imaging.inference.run import PnPRun, reconstruct
from scopebench.imaging.inference.topology import check_topology, count_patches

__all__ = [
    "COMPILE_MODES",
    "INIT_METHODS",
    "PROBLEM_KINDS",
    "PnPEngine",
    "PnPRun",
    "Problem",
    "ReconstructionConfig",
    "build_problem",
    "check_topology",
    "count_patches",
    "describe_problem",
    "make_spec",
    "reconstruct",
]
