"""Imaging training (``benchmark_training``): unrolled PnP networks trained by supervised MSE.

* :mod:`~scopebench.imaging.training.data`: training and validation pairs built from plain parameters;
* :mod:`~scopebench.imaging.training.unrolled`: the unrolled network (deepinv's unfolded PGD);
* :mod:`~scopebench.imaging.training.trainer`: one optimizer step, configs, validation scores;
* :mod:`~scopebench.imaging.training.run`: :class:`TrainingRun`, the run object of every rank.
"""

from scopebench.imaging.training.data import TrainingData, TrainingDataSpec, build_training_data
from scopebench.imaging.training.run import TrainingRun
from scopebench.imaging.training.trainer import (
    REGIONS,
    SOLVER_PARAMS,
    TrainConfig,
    UnrolledReconstructor,
    UnrolledTrainer,
    configs_from_params,
    evaluate_reconstruction,
)
from scopebench.imaging.training.unrolled import UnrolledConfig, build_unrolled

__all__ = [
    "REGIONS",
    "SOLVER_PARAMS",
    "TrainConfig",
    "TrainingData",
    "TrainingDataSpec",
    "TrainingRun",
    "UnrolledConfig",
    "UnrolledReconstructor",
    "UnrolledTrainer",
    "build_training_data",
    "build_unrolled",
    "configs_from_params",
    "evaluate_reconstruction",
]
