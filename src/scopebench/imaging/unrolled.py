"""Unrolled proximal-gradient networks and their denoiser weight files.

The model is deepinv's PGD with ``unfold=True``: ``n_unrolled`` iterations

    u_k = x_k - gamma_k * A^T (A x_k - y),    x_{k+1} = D(u_k; sigma_k)

with a learnable deepinv denoiser ``D`` (DnCNN or DRUNet, one set of weights shared by all
iterations) and learnable step sizes ``gamma_k`` and noise levels ``sigma_k``. This module
knows nothing about distribution or profiling; :mod:`scopebench.imaging.train` wraps it.

Weight files (safetensors) hold the plain ``state_dict`` of the deepinv denoiser, and the
header's metadata holds what rebuilds it (see :data:`WEIGHTS_FORMAT`), so
:func:`load_denoiser_weights` returns a ready denoiser for any PnP loop.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "CHECKPOINT_MODES",
    "DENOISERS",
    "WEIGHTS_FORMAT",
    "CheckpointedDenoiser",
    "DenoiserSpec",
    "UnrolledConfig",
    "build_denoiser",
    "build_unrolled",
    "load_denoiser_weights",
    "read_denoiser_metadata",
    "save_denoiser_weights",
    "unrolled_parameters",
]

DENOISERS = ("dncnn", "drunet")
CHECKPOINT_MODES = ("never", "auto", "always")
#: Value of the ``format`` metadata key of a weight file written by this module.
WEIGHTS_FORMAT = "scopebench.denoiser.v1"
#: Default depth: conv layers of DnCNN, residual blocks per scale of DRUNet (small for CPU).
DEFAULT_DEPTH = {"dncnn": 6, "drunet": 1}
_SPEC_KEYS = ("denoiser", "channels", "depth", "in_channels", "out_channels", "dim")


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive integer, got {value!r}")
    return value


def _positive_float(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{key} must be a positive number, got {value!r}")
    return float(value)


@dataclass(frozen=True, kw_only=True)
class DenoiserSpec:
    """Everything the deepinv constructor of a denoiser needs (weights aside)."""

    denoiser: str = "dncnn"
    """``dncnn`` or ``drunet``."""
    channels: int = 16
    """Width: DnCNN's ``nf``; DRUNet's first scale (``nc = (c, 2c, 4c, 8c)``)."""
    depth: int | None = None
    """DnCNN conv layers (>= 2) or DRUNet residual blocks per scale; ``None``: :data:`DEFAULT_DEPTH`."""
    in_channels: int = 3
    """Image channels in."""
    out_channels: int = 3
    """Image channels out."""
    dim: int = 2
    """2 for images, 3 for volumes."""

    def __post_init__(self) -> None:
        if self.denoiser not in DENOISERS:
            raise ValueError(f"denoiser must be one of {list(DENOISERS)}, got {self.denoiser!r}")
        _positive_int("denoiser_channels", self.channels)
        if self.depth is None:
            object.__setattr__(self, "depth", DEFAULT_DEPTH[self.denoiser])
        _positive_int("denoiser depth", self.depth)
        if self.denoiser == "dncnn" and self.depth < 2:
            raise ValueError(f"DnCNN needs at least 2 conv layers, got depth={self.depth}")
        _positive_int("in_channels", self.in_channels)
        _positive_int("out_channels", self.out_channels)
        if self.dim not in (2, 3):
            raise ValueError(f"dim must be 2 or 3, got {self.dim!r}")

    def to_metadata(self) -> dict[str, str]:
        """String-valued safetensors metadata (the header only stores strings)."""
        return {"format": WEIGHTS_FORMAT, **{key: str(getattr(self, key)) for key in _SPEC_KEYS}}

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> DenoiserSpec:
        """Inverse of :meth:`to_metadata`; ``ValueError`` on a foreign or incomplete header."""
        if metadata.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"expected a weight file of format {WEIGHTS_FORMAT!r}, got {metadata.get('format')!r}")
        missing = [key for key in _SPEC_KEYS if key not in metadata]
        if missing:
            raise ValueError(f"weight file metadata lacks {missing}")
        ints = {key: int(metadata[key]) for key in _SPEC_KEYS if key != "denoiser"}
        return cls(denoiser=metadata["denoiser"], **ints)


def build_denoiser(spec: DenoiserSpec, device: Any = "cpu") -> torch.nn.Module:
    """A randomly initialised deepinv denoiser (``pretrained=None``, no download)."""
    import deepinv as dinv

    if spec.denoiser == "dncnn":
        net = dinv.models.DnCNN(
            in_channels=spec.in_channels,
            out_channels=spec.out_channels,
            depth=spec.depth,
            nf=spec.channels,
            pretrained=None,
            device=device,
            dim=spec.dim,
        )
    else:
        c = spec.channels
        net = dinv.models.DRUNet(
            in_channels=spec.in_channels,
            out_channels=spec.out_channels,
            nc=(c, 2 * c, 4 * c, 8 * c),
            nb=spec.depth,
            pretrained=None,
            device=device,
            dim=spec.dim,
        )
    return net.to(device)


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
        _positive_int("n_unrolled", self.n_unrolled)
        if not isinstance(self.denoiser, DenoiserSpec):
            raise TypeError(f"denoiser must be a DenoiserSpec, got {type(self.denoiser).__name__}")
        _positive_float("stepsize", self.stepsize)
        _positive_float("sigma", self.sigma)
        if self.checkpoint not in CHECKPOINT_MODES:
            raise ValueError(f"checkpoint_batches must be one of {list(CHECKPOINT_MODES)}, got {self.checkpoint!r}")


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


def save_denoiser_weights(
    path: str | os.PathLike, denoiser: torch.nn.Module, spec: DenoiserSpec, extra: dict[str, Any] | None = None
) -> Path:
    """Write ``denoiser``'s ``state_dict`` and ``spec`` (plus ``extra``, JSON-encoded) to safetensors.

    The file is written beside its destination and renamed, so it appears complete or not at all.
    """
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {key: value.detach().cpu().contiguous() for key, value in denoiser.state_dict().items()}
    metadata = spec.to_metadata()
    for key, value in (extra or {}).items():
        if key in metadata:
            raise ValueError(f"extra metadata key {key!r} collides with the denoiser spec")
        metadata[key] = json.dumps(value)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        save_file(state, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_denoiser_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The header metadata of a weight file: spec keys as strings, extra keys JSON-decoded."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        raw = dict(fh.metadata() or {})
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _SPEC_KEYS or key == "format":
            out[key] = value
        else:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
    return out


def load_denoiser_weights(path: str | os.PathLike, device: Any = "cpu") -> torch.nn.Module:
    """Rebuild the deepinv denoiser stored in a weight file of this benchmark.

    Args:
        path: ``benchmark_training/outputs/<run>_denoiser.safetensors``.
        device: Where the returned network lives.

    Returns:
        The deepinv ``DnCNN`` / ``DRUNet`` with the trained weights, in eval mode; call it
        as ``denoiser(x, sigma)`` (DnCNN ignores ``sigma``). The trained step sizes and
        noise levels are in :func:`read_denoiser_metadata` (``unrolled_stepsize``,
        ``unrolled_sigma``).
    """
    from safetensors.torch import load_file

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no denoiser weight file at {path}")
    spec = DenoiserSpec.from_metadata(read_denoiser_metadata(path))
    net = build_denoiser(spec, device="cpu")
    net.load_state_dict(load_file(str(path)), strict=True)
    return net.to(device).eval()
