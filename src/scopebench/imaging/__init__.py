"""Imaging inverse problems for the two imaging benchmarks (never imports benchopt).

The folders say who uses what:

* ``common/``: what both share: pictures, quality metrics, the denoiser registry and
  weight files (:mod:`scopebench.imaging.common`);
* ``inference/``: plug-and-play reconstruction for ``benchmark_inference``
  (:mod:`scopebench.imaging.inference`);
* ``training/``: unrolled networks trained by ``benchmark_training``
  (:mod:`scopebench.imaging.training`).

Each benchmark has one run object (``PnPRun``, ``TrainingRun``, on
:class:`scopebench.harness.run.RankRun`) used alike by its solver, its spawned ranks and the
scripts. The names most used from outside are re-exported here.
"""

from scopebench.imaging.common.denoisers import DENOISERS, LEARNED, DenoiserConfig, DenoiserSpec, build_denoiser
from scopebench.imaging.common.metrics import mse, psnr, quality_metrics, ssim
from scopebench.imaging.common.weights import load_denoiser_weights, save_denoiser_weights
from scopebench.imaging.inference import PnPRun, ReconstructionConfig, build_problem, describe_problem
from scopebench.imaging.training import TrainingRun, build_training_data

__all__ = [
    "DENOISERS",
    "LEARNED",
    "DenoiserConfig",
    "DenoiserSpec",
    "PnPRun",
    "ReconstructionConfig",
    "TrainingRun",
    "build_denoiser",
    "build_problem",
    "build_training_data",
    "describe_problem",
    "load_denoiser_weights",
    "mse",
    "psnr",
    "quality_metrics",
    "save_denoiser_weights",
    "ssim",
]
