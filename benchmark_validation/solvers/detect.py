"""Detect: the suite's findings on a run of the dataset's fault, one benchopt iteration per step.

A policy training run (``scopebench.validation.run.DetectRun``: the ``Pi05Train`` run object with
the fault policy ``scopebench.validation.faults:fault_policy``) on ``backend`` (``ddp``,
``zero2``, ``zero3``, ``fsdp2``, ``hsdp``) and ``nproc_per_node`` ranks, under ``profiler_mode``
(``custom``, ``torch``); each iteration runs one unprofiled step, then the profiled one
(``interleave``: the overhead column). Cells a fault cannot run on are declined with the reason
(``scopebench.validation.solver.DetectSolverMixin.check_cell``).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.validation.solver import DETECT_PARAMETERS, DetectSolverMixin


class Solver(DetectSolverMixin, BaseSolver):
    name = "Detect"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **DetectSolverMixin.parameters,  # the eight profiler_*
        **DETECT_PARAMETERS,  # backend, nproc_per_node, batch_size, ... and the cell's SLURM job
    }
    test_config = {"profiler_warmup": 1}
