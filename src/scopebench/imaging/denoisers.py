"""Denoisers for plug-and-play: deepinv models built offline, with local weights.

Learned denoisers (``drunet``, ``dncnn``) never download: their weights come from a
local state-dict file (safetensors or ``.pth``, e.g. one written by benchmark_training;
the architecture is read from the tensors' shapes), or are random when
``pretrained="none"`` — meaningful for cost studies only. Classical denoisers (``tv``,
``wavelet``, ``bm3d``, ``median``) have no weights. Optional packages are checked by
:func:`denoiser_unavailable` so a solver can decline instead of crashing.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

__all__ = [
    "DENOISERS",
    "LEARNED",
    "DenoiserConfig",
    "build_denoiser",
    "denoiser_unavailable",
    "load_state_dict",
]

LEARNED = ("drunet", "dncnn")
CLASSICAL = ("tv", "wavelet", "bm3d", "median")
DENOISERS = LEARNED + CLASSICAL
PRETRAINED = ("auto", "none")
#: Optional package each denoiser needs (import name), where deepinv imports it lazily.
_REQUIRES = {"bm3d": "bm3d", "wavelet": "ptwt"}
#: Prefixes that wrappers add to parameter names (DDP, torch.compile, an enclosing model).
_PREFIXES = ("module.", "_orig_mod.")


@dataclass(frozen=True, kw_only=True)
class DenoiserConfig:
    """Which denoiser, at which strength, with which weights."""

    name: str = "tv"
    """One of ``drunet``, ``dncnn``, ``tv``, ``wavelet``, ``bm3d``, ``median``."""
    sigma: float = 0.05
    """Strength: noise std for drunet / bm3d, threshold for tv / wavelet; unused by
    dncnn (trained for one level) and median."""
    weights: str | None = None
    """Local state-dict file (``.safetensors``, ``.pth``, ``.pt``) for learned denoisers."""
    pretrained: str = "auto"
    """``auto``: learned denoisers need ``weights``; ``none``: random weights (cost
    studies only, the reconstruction is meaningless)."""

    def __post_init__(self) -> None:
        if self.name not in DENOISERS:
            raise ValueError(f"denoiser must be one of {list(DENOISERS)}, got {self.name!r}")
        if isinstance(self.sigma, bool) or not isinstance(self.sigma, (int, float)) or not self.sigma > 0:
            raise ValueError(f"denoiser_sigma must be a positive number, got {self.sigma!r}")
        object.__setattr__(self, "sigma", float(self.sigma))
        pretrained = "none" if self.pretrained is None else self.pretrained
        if pretrained not in PRETRAINED:
            raise ValueError(f"pretrained must be 'auto' or 'none', got {self.pretrained!r}")
        object.__setattr__(self, "pretrained", pretrained)
        if self.name in CLASSICAL and self.weights is not None:
            raise ValueError(f"denoiser={self.name!r} has no weights, got denoiser_weights={self.weights!r}")
        if self.name in LEARNED:
            if self.weights is not None and pretrained == "none":
                raise ValueError(
                    f"denoiser_weights={self.weights!r} and pretrained='none' contradict each other: choose one"
                )
            if self.weights is None and pretrained != "none":
                raise ValueError(
                    f"denoiser={self.name!r} needs weights and none can be downloaded here: set "
                    "denoiser_weights to a local .safetensors/.pth state dict, or pretrained: none "
                    "for random weights (cost studies only)"
                )
            if self.weights is not None:
                path = Path(self.weights).expanduser()
                if not path.is_file():
                    raise ValueError(f"denoiser_weights={self.weights!r} is not a file")
                if path.suffix not in (".safetensors", ".pth", ".pt"):
                    raise ValueError(f"denoiser_weights must be a .safetensors, .pth or .pt file, got {self.weights!r}")


def denoiser_unavailable(name: str) -> str | None:
    """Why ``name`` cannot run here (a missing optional package), or ``None``."""
    module = _REQUIRES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"denoiser={name!r} needs the optional package {module!r}, which is not installed"
    return None


def load_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a local state-dict file, with wrapper prefixes removed.

    Accepts a plain state dict or a checkpoint dict holding one under ``state_dict`` /
    ``model``; ``module.`` and ``_orig_mod.`` prefixes (DDP, torch.compile) are dropped.
    """
    path = Path(path).expanduser()
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        state = load_file(str(path))
    else:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
        for key in ("state_dict", "model"):
            if isinstance(state, dict) and isinstance(state.get(key), dict):
                state = state[key]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict of tensors")
    clean = {}
    for key, value in state.items():
        for prefix in _PREFIXES:
            key = key.replace(prefix, "")
        clean[key] = value
    return clean


def _strip_to(state: dict[str, torch.Tensor], anchor: str) -> dict[str, torch.Tensor]:
    # Weights saved from an enclosing model (e.g. an unrolled network's ``denoiser.``)
    # carry a prefix before the denoiser's own names: find it from a known key.
    for key in state:
        if key.endswith(anchor):
            prefix = key[: -len(anchor)]
            return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    raise ValueError(f"the weights file has no {anchor!r} tensor; keys start with {sorted(state)[:5]}")


def _drunet_from_state(state: dict[str, torch.Tensor]):
    import deepinv as dinv

    state = _strip_to(state, "m_head.weight")
    head = state["m_head.weight"]  # (nc0, in + 1, k, k[, k])
    nb = len({m.group(1) for k in state if (m := re.match(r"m_down1\.(\d+)\.res\.0\.weight$", k))})
    nc = [head.shape[0]] + [state[f"m_down{i}.{nb}.weight"].shape[0] for i in (1, 2, 3)]
    model = dinv.models.DRUNet(
        in_channels=head.shape[1] - 1,
        out_channels=state["m_tail.weight"].shape[0] if state["m_tail.weight"].ndim == head.ndim else head.shape[1] - 1,
        nc=tuple(int(c) for c in nc),
        nb=nb,
        pretrained=None,
        dim=head.ndim - 2,
    )
    return model, state


def _dncnn_from_state(state: dict[str, torch.Tensor]):
    import deepinv as dinv

    state = _strip_to(state, "in_conv.weight")
    head = state["in_conv.weight"]  # (nf, in, k, k[, k])
    depth = len([k for k in state if re.match(r"conv_list\.\d+\.weight$", k)]) + 2
    model = dinv.models.DnCNN(
        in_channels=head.shape[1],
        out_channels=state["out_conv.weight"].shape[0],
        depth=depth,
        bias="in_conv.bias" in state,
        nf=head.shape[0],
        pretrained=None,
        dim=head.ndim - 2,
    )
    return model, state


def build_denoiser(config: DenoiserConfig, channels: int, spatial_dims: int = 2) -> torch.nn.Module:
    """The deepinv denoiser of ``config`` for signals with ``channels`` and 2 or 3 spatial dims.

    Called before entering ``deepinv.distributed.DistributedContext`` so random weights
    are identical on every rank (the context seeds each rank differently). Random
    weights are drawn from a generator seeded with 0, whatever the global RNG state.

    Raises:
        ValueError: weights whose channels or dimension do not fit the problem, a
            denoiser that does not support volumes, or a missing optional package.
    """
    import deepinv as dinv

    reason = denoiser_unavailable(config.name)
    if reason:
        raise ValueError(reason)
    if config.name in ("median", "bm3d", "wavelet") and spatial_dims != 2:
        raise ValueError(f"denoiser={config.name!r} only handles 2-D images, got a {spatial_dims}-D signal")
    if config.name == "tv":
        return dinv.models.TVDenoiser(n_it_max=50, crit=1e-6)
    if config.name == "median":
        return dinv.models.MedianFilter(kernel_size=3)
    if config.name == "bm3d":
        return dinv.models.BM3D()
    if config.name == "wavelet":
        return dinv.models.WaveletDenoiser(level=3, wv="db4", wvdim=2)

    if config.weights is not None:
        builder = _drunet_from_state if config.name == "drunet" else _dncnn_from_state
        model, state = builder(load_state_dict(config.weights))
        model.load_state_dict(state)
        first = next(model.parameters())
        in_ch = first.shape[1] - (1 if config.name == "drunet" else 0)
        if in_ch != channels or first.ndim - 2 != spatial_dims:
            raise ValueError(
                f"denoiser_weights={config.weights!r} hold a {first.ndim - 2}-D {config.name} for {in_ch} "
                f"channel(s); the problem has {channels} channel(s) in {spatial_dims}-D"
            )
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            if config.name == "drunet":
                model = dinv.models.DRUNet(channels, channels, pretrained=None, dim=spatial_dims)
            else:
                model = dinv.models.DnCNN(channels, channels, pretrained=None, dim=spatial_dims)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def denoiser_call(denoiser: Any, sigma: float):
    """``z -> D_sigma(z)`` for any deepinv denoiser (dncnn and median ignore ``sigma``)."""

    def apply(z: torch.Tensor) -> torch.Tensor:
        return denoiser(z, sigma)

    return apply
