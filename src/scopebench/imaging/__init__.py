"""Imaging inverse problems for the inference and training benchmarks.

Problems (physics + data) built deterministically from plain parameters, offline
denoisers, quality metrics, and the plug-and-play engine that runs on one or many ranks.
Never imports benchopt; the benchopt adapters live in ``benchmark_inference/`` (and the
unrolled-network pieces used by ``benchmark_training/`` in this package's ``unrolled``,
``training_data`` and ``train`` modules).
"""

from scopebench.imaging.cost import ByteCounterMode, count_cost
from scopebench.imaging.denoisers import (
    DENOISERS,
    LEARNED,
    DenoiserConfig,
    build_denoiser,
    denoiser_unavailable,
    load_state_dict,
)
from scopebench.imaging.images import NATURAL_IMAGES, natural_image, phantom_image, synthetic_volume
from scopebench.imaging.metrics import mse, psnr, quality_metrics, ssim
from scopebench.imaging.pnp import COMPILE_MODES, INIT_METHODS, PnPEngine, ReconstructionConfig, resolve_device
from scopebench.imaging.problems import PROBLEM_KINDS, Problem, build_problem, describe_problem, make_spec
from scopebench.imaging.topology import Topology, check_topology, count_patches, gres_gpu_count

__all__ = [
    "COMPILE_MODES",
    "DENOISERS",
    "INIT_METHODS",
    "LEARNED",
    "NATURAL_IMAGES",
    "PROBLEM_KINDS",
    "ByteCounterMode",
    "DenoiserConfig",
    "PnPEngine",
    "Problem",
    "ReconstructionConfig",
    "Topology",
    "build_denoiser",
    "build_problem",
    "check_topology",
    "count_cost",
    "count_patches",
    "denoiser_unavailable",
    "describe_problem",
    "gres_gpu_count",
    "load_state_dict",
    "make_spec",
    "mse",
    "natural_image",
    "phantom_image",
    "psnr",
    "quality_metrics",
    "resolve_device",
    "ssim",
    "synthetic_volume",
]
