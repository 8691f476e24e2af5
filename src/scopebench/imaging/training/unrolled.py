"""Unrolled proximal-gradient networks: the model ``benchmark_training`` trains.

The model is deepinv's PGD with ``unfold=True``: ``n_unrolled`` iterations

    u_k = x_k - gamma_k * A^T (A x_k - y),    x_{k+1} = D(u_k; sigma_k)

with a learnable deepinv denoiser ``D`` (a :class:`~scopebench.imaging.common.denoisers.DenoiserSpec`:
DnCNN or DRUNet, one set of weights shared by all iterations) and learnable step sizes
``gamma_k`` and noise levels ``sigma_k``. This module knows nothing about distribution or
profiling; :mod:`scopebench.imaging.training.trainer` wraps it. The trained denoiser is
written by :func:`scopebench.imaging.common.weights.save_denoiser_weights`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.validate import choice, integer, number

__all__ = ["CHECKPOINT_MODES", "CheckpointedDenoiser", "UnrolledConfig", "build_unrolled", "unrolled_parameters"]

CHECKPOINT_MODES = ("never", "auto", "always")


class CheckpointedDenoiser(torch.nn.Module):
    """Activation checkpointing around a denoiser: its activations are recomputed in the
    backward pass instead of being kept from the forward pass (same values and gradients,
    less memory, one more denoiser forward per backward).

    Only wraps while gradients are enabled; the wrapped module keeps its own
    ``state_dict`` keys under ``denoiser.``.
    """

    def __init__(self, denoiser: torch.nn.Module) -> None:
        super().__init__()
        self.denoiser = denoiser

    def forward(self, x: torch.Tensor, sigma: Any = None, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return self.denoiser(x, sigma, *args, **kwargs)
        from torch.utils.checkpoint import checkpoint

        return checkpoint(lambda inp, sig: self.denoiser(inp, sig, *args, **kwargs), x, sigma, use_reentrant=False)


@dataclass(frozen=True, kw_only=True)
class UnrolledConfig:
    """Architecture of the unrolled network."""

    n_unrolled: int = 3
    """Number of unrolled PGD iterations (the depth of the network)."""
    denoiser: DenoiserSpec = DenoiserSpec()
    """The learnable denoiser shared by every iteration."""
    stepsize: float = 1.0
    """Initial step size gamma_k of every iteration (1 / ||A||^2 = 1 for the operators here)."""
    sigma: float = 0.05
    """Initial denoiser noise level sigma_k of every iteration (DRUNet reads it, DnCNN ignores it)."""
    checkpoint: str = "auto"
    """Activation checkpointing of the denoiser: ``never``; ``always`` (every denoiser call);
    ``auto`` (deepinv's rule: only when a rank processes its tiles in more than one batch,
    so never without ``distribute_model``)."""

    def __post_init__(self) -> None:
        integer("n_unrolled", self.n_unrolled, low=1)
        if not isinstance(self.denoiser, DenoiserSpec):
            raise TypeError(f"denoiser must be a DenoiserSpec, got {type(self.denoiser).__name__}")
        object.__setattr__(self, "stepsize", number("stepsize", self.stepsize, low=0, low_open=True))
        object.__setattr__(self, "sigma", number("sigma", self.sigma, low=0, low_open=True))
        choice("checkpoint_batches", self.checkpoint, CHECKPOINT_MODES)


def build_unrolled(config: UnrolledConfig, denoiser: torch.nn.Module, wrap_checkpoint: bool = False):
    """deepinv's unfolded PGD around ``denoiser`` with learnable ``stepsize`` and ``g_param``.

    Args:
        config: Architecture.
        denoiser: The (already built) learnable denoiser; it is shared, not copied.
        wrap_checkpoint: Wrap the denoiser in :class:`CheckpointedDenoiser` (single-process
            ``checkpoint="always"``; tiled models checkpoint inside deepinv.distributed).
    """
    import deepinv as dinv

    k = config.n_unrolled
    prior = dinv.optim.PnP(CheckpointedDenoiser(denoiser) if wrap_checkpoint else denoiser)
    return dinv.optim.PGD(
        data_fidelity=dinv.optim.L2(),
        prior=prior,
        stepsize=[config.stepsize] * k,
        sigma_denoiser=[config.sigma] * k,
        max_iter=k,
        unfold=True,
        trainable_params=["stepsize", "g_param"],
    )


def unrolled_parameters(model) -> list[torch.nn.Parameter]:
    """The learnable step sizes and noise levels of an unfolded PGD (not the denoiser)."""
    return [p for key in ("stepsize", "g_param") for p in model.params_algo[key]]
