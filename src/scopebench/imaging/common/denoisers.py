"""The denoiser registry of both imaging benchmarks: names, architectures, builders.

One vocabulary for inference (a PnP prior) and training (the learnable part of an
unrolled network):

* :data:`DENOISERS`: learned (:data:`LEARNED`: ``drunet``, ``dncnn``) and classical
  (``tv``, ``wavelet``, ``bm3d``, ``median``) deepinv denoisers;
* :class:`DenoiserSpec`: the architecture of a learned denoiser (what its deepinv
  constructor needs, weights aside), also stored in the header of a weight file (defined
  in :mod:`scopebench.imaging.common.architectures`, re-exported here);
* :class:`DenoiserConfig`: which denoiser a reconstruction uses, at which strength, with
  which weights (the ``denoiser*`` solver parameters);
* :func:`build_denoiser`: the ready-to-call denoiser of a :class:`DenoiserConfig`.

Nothing is ever downloaded: learned weights come from a local file
(:mod:`scopebench.imaging.common.weights`, the one loader), or are random when
``pretrained="none"`` (cost studies only). Optional packages are checked by
:func:`denoiser_unavailable` so a solver can decline instead of crashing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

# The architecture lives apart so that weights (which rebuilds one) need not import this
# registry (which loads weights): the two modules depend on each other one way only.
from scopebench.imaging.common.architectures import LEARNED, DenoiserSpec
from scopebench.imaging.common.weights import check_weights_file, load_denoiser_weights
from scopebench.validate import choice, number

__all__ = [
    "CLASSICAL",
    "DENOISERS",
    "LEARNED",
    "ONLY_2D",
    "DenoiserConfig",
    "DenoiserSpec",
    "build_denoiser",
    "denoiser_unavailable",
]

CLASSICAL = ("tv", "wavelet", "bm3d", "median")
DENOISERS = LEARNED + CLASSICAL
PRETRAINED = ("auto", "none")
#: Optional package each denoiser needs (import name), where deepinv imports it lazily.
_REQUIRES = {"bm3d": "bm3d", "wavelet": "ptwt"}
#: Denoisers deepinv implements for 2-D images only.
ONLY_2D = ("median", "bm3d", "wavelet")
#: deepinv's own default sizes, used for random weights in inference cost studies.
DEEPINV_SIZES = {"drunet": {"channels": 64, "depth": 4}, "dncnn": {"channels": 64, "depth": 20}}


@dataclass(frozen=True, kw_only=True)
class DenoiserConfig:
    """Which denoiser, at which strength, with which weights (validated when built)."""

    name: str = "tv"
    """One of ``drunet``, ``dncnn``, ``tv``, ``wavelet``, ``bm3d``, ``median``."""
    sigma: float = 0.01
    """Strength: noise std for drunet / bm3d, threshold for tv / wavelet; unused by
    dncnn (trained for one level) and median. The default is the TV threshold that suits
    the 2-D problems at their default noise (0.01 to 0.03) and the value ``benchopt run``
    always used; the library's 0.05 before issue 34 cost PnP-TV 1.2 to 3 dB of PSNR on
    them (docs/benchmark-inference.md, "Defaults")."""
    weights: str | None = None
    """Local weight file (``.safetensors``, ``.pth``, ``.pt``) for learned denoisers;
    checked when the config is built (an empty, truncated or corrupt file is refused)."""
    pretrained: str = "auto"
    """``auto``: learned denoisers need ``weights``; ``none``: random weights (cost
    studies only, the reconstruction is meaningless)."""

    def __post_init__(self) -> None:
        choice("denoiser", self.name, DENOISERS)
        object.__setattr__(self, "sigma", number("denoiser_sigma", self.sigma, low=0, low_open=True))
        pretrained = "none" if self.pretrained is None else self.pretrained
        choice("pretrained", pretrained, PRETRAINED)
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
                check_weights_file("denoiser_weights", self.weights)


def denoiser_unavailable(name: str) -> str | None:
    """Why ``name`` cannot run here (a missing optional package), or ``None``."""
    module = _REQUIRES.get(name)
    if module is not None and importlib.util.find_spec(module) is None:
        return f"denoiser={name!r} needs the optional package {module!r}, which is not installed"
    return None


def _classical(name: str) -> torch.nn.Module:
    import deepinv as dinv

    if name == "tv":
        return dinv.models.TVDenoiser(n_it_max=50, crit=1e-6)
    if name == "median":
        return dinv.models.MedianFilter(kernel_size=3)
    if name == "bm3d":
        return dinv.models.BM3D()
    return dinv.models.WaveletDenoiser(level=3, wv="db4", wvdim=2)


def build_denoiser(config: DenoiserConfig, channels: int, spatial_dims: int = 2) -> torch.nn.Module:
    """The deepinv denoiser of ``config`` for signals with ``channels`` and 2 or 3 spatial dims.

    Called before entering ``deepinv.distributed.DistributedContext`` so random weights
    are identical on every rank (the context seeds each rank differently). Random
    weights have deepinv's default sizes and are drawn from a generator seeded with 0,
    whatever the global RNG state. Learned denoisers are frozen, in eval mode.

    Raises:
        ValueError: weights whose channels or dimension do not fit the problem, a
            denoiser that does not support volumes, or a missing optional package.
    """
    reason = denoiser_unavailable(config.name)
    if reason:
        raise ValueError(reason)
    if config.name in ONLY_2D and spatial_dims != 2:
        raise ValueError(f"denoiser={config.name!r} only handles 2-D images, got a {spatial_dims}-D signal")
    if config.name in CLASSICAL:
        return _classical(config.name)
    if config.weights is not None:
        model = load_denoiser_weights(config.weights, name=config.name, key="denoiser_weights")
        first = next(model.parameters())
        in_ch = first.shape[1] - (1 if config.name == "drunet" else 0)
        if in_ch != channels or first.ndim - 2 != spatial_dims:
            raise ValueError(
                f"denoiser_weights={config.weights!r} hold a {first.ndim - 2}-D {config.name} for {in_ch} "
                f"channel(s); the problem has {channels} channel(s) in {spatial_dims}-D"
            )
    else:
        spec = DenoiserSpec(
            denoiser=config.name,
            in_channels=channels,
            out_channels=channels,
            dim=spatial_dims,
            **DEEPINV_SIZES[config.name],
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = spec.build()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
