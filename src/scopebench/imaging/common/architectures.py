"""The architecture of a learned denoiser: :class:`DenoiserSpec` and its deepinv constructor.

Shared by the denoiser registry (:mod:`scopebench.imaging.common.denoisers`, which
builds denoisers and loads their weights) and the weight files
(:mod:`scopebench.imaging.common.weights`, whose header stores a spec in the format
:data:`WEIGHTS_FORMAT`). Both import this module, so the dependency between them goes one
way only: ``denoisers`` imports ``weights``, ``weights`` never imports ``denoisers``
(``tests/imaging/test_denoisers.py`` checks it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from scopebench.validate import choice, integer

__all__ = ["DEFAULT_DEPTH", "LEARNED", "SPEC_KEYS", "WEIGHTS_FORMAT", "DenoiserSpec", "construct"]

LEARNED = ("drunet", "dncnn")
#: Default depth of a trained network: conv layers of DnCNN, residual blocks per scale of
#: DRUNet (small, for CPU training).
DEFAULT_DEPTH = {"dncnn": 6, "drunet": 1}
#: Fields of :class:`DenoiserSpec` stored in a weight file's header.
SPEC_KEYS = ("denoiser", "channels", "depth", "in_channels", "out_channels", "dim")
#: Value of the ``format`` header key of a weight file written by scopebench.
WEIGHTS_FORMAT = "scopebench.denoiser.v1"


@dataclass(frozen=True, kw_only=True)
class DenoiserSpec:
    """The architecture of a learned deepinv denoiser (weights aside)."""

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
        choice("denoiser", self.denoiser, sorted(LEARNED))
        integer("denoiser_channels", self.channels, low=1)
        if self.depth is None:
            object.__setattr__(self, "depth", DEFAULT_DEPTH[self.denoiser])
        integer("denoiser depth", self.depth, low=1)
        if self.denoiser == "dncnn" and self.depth < 2:
            raise ValueError(f"DnCNN needs at least 2 conv layers, got depth={self.depth}")
        integer("in_channels", self.in_channels, low=1)
        integer("out_channels", self.out_channels, low=1)
        choice("dim", self.dim, (2, 3))

    def constructor_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the deepinv constructor (``pretrained=None``: no download)."""
        if self.denoiser == "dncnn":
            size = {"depth": self.depth, "nf": self.channels}
        else:
            c = self.channels
            size = {"nc": (c, 2 * c, 4 * c, 8 * c), "nb": self.depth}
        return {"in_channels": self.in_channels, "out_channels": self.out_channels, "dim": self.dim, **size}

    def build(self, device: Any = "cpu") -> torch.nn.Module:
        """A freshly initialised network (drawn from the global RNG: seed it first)."""
        return construct(self.denoiser, self.constructor_kwargs()).to(device)

    def to_metadata(self) -> dict[str, str]:
        """String-valued weight-file header entries (safetensors stores strings only)."""
        return {"format": WEIGHTS_FORMAT, **{key: str(getattr(self, key)) for key in SPEC_KEYS}}

    @classmethod
    def from_metadata(cls, metadata: dict[str, str]) -> DenoiserSpec:
        """Inverse of :meth:`to_metadata`; ``ValueError`` on a foreign or incomplete header."""
        if metadata.get("format") != WEIGHTS_FORMAT:
            raise ValueError(f"expected a weight file of format {WEIGHTS_FORMAT!r}, got {metadata.get('format')!r}")
        missing = [key for key in SPEC_KEYS if key not in metadata]
        if missing:
            raise ValueError(f"weight file metadata lacks {missing}")
        ints = {key: int(metadata[key]) for key in SPEC_KEYS if key != "denoiser"}
        return cls(denoiser=metadata["denoiser"], **ints)


def construct(name: str, kwargs: dict[str, Any]) -> torch.nn.Module:
    """The deepinv ``DRUNet`` / ``DnCNN`` with constructor ``kwargs``, on the CPU, never downloaded."""
    import deepinv as dinv

    cls = dinv.models.DRUNet if name == "drunet" else dinv.models.DnCNN
    return cls(**kwargs, pretrained=None)
