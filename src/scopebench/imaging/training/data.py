"""Supervised training pairs (ground truth, measurements) for unrolled networks.

:func:`build_training_data` is deterministic given its plain parameters (seed included),
so every rank of a distributed run rebuilds bit for bit the set rank 0 holds; tensors and
physics objects never cross process boundaries.

Operators (one validated :class:`TrainingDataSpec` for all):

* ``blur``: 2-D Gaussian blur (std 2 px, circular boundary), the same operator as the
  inference benchmark's ``simulated`` problem.
* ``downsampling``: 2-D super-resolution, Gaussian anti-aliasing then decimation by 2.
* ``denoising_3d``: 3-D volumes (soft-edged synthetic ellipsoids), identity operator.

2-D ground truths are random ``image_size`` crops of scikit-image's bundled pictures
(at native scale or after 2x area reduction), flipped and rotated by multiples of 90
degrees. Validation crops come from pictures never used for training. Measurements are
``A(x) + noise_level * n`` computed at the measurement's own size (for ``downsampling``
half the crop size): noise is never resized after the fact.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from scopebench.imaging.common.images import check_noise_level
from scopebench.validate import choice, integer

__all__ = [
    "OPERATORS",
    "TRAIN_IMAGES",
    "VAL_IMAGES",
    "TrainingData",
    "TrainingDataSpec",
    "build_training_data",
    "build_training_physics",
]

OPERATORS = ("blur", "downsampling", "denoising_3d")
#: Bundled scikit-image pictures the training crops come from (none is a test image of
#: the inference benchmark, so weights trained here never saw its ground truths).
TRAIN_IMAGES = (
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "coins",
    "moon",
    "brick",
    "grass",
    "gravel",
    "clock",
    "cell",
)
#: Held-out pictures of the validation crops.
VAL_IMAGES = ("astronaut", "coffee", "camera")
_MAX_SAMPLES = 100_000
_BLUR_STD_PX = 2.0
_SR_FACTOR = 2


@dataclass(frozen=True, kw_only=True)
class TrainingDataSpec:
    """Plain parameters of a training set; validated when built."""

    image_size: int = 32
    """Side of the square crops (2-D) or cubic volumes (3-D), in pixels (>= 8)."""
    operator: str = "blur"
    """``blur``, ``downsampling`` (x2 super-resolution) or ``denoising_3d``."""
    noise_level: float = 0.03
    """Standard deviation of the white Gaussian noise (signals are in [0, 1])."""
    n_train: int = 64
    """Number of training pairs."""
    n_val: int = 8
    """Number of held-out validation pairs."""
    seed: int = 0
    """Seed of the crops, augmentations, volumes and noise."""
    channels: int | None = None
    """1 (grey) or 3 (colour) for 2-D operators; ``None`` picks 3 for 2-D, 1 for 3-D
    (volumes are always single-channel)."""

    def __post_init__(self) -> None:
        choice("operator", self.operator, OPERATORS)
        integer("image_size", self.image_size, low=8, high=4096)
        if self.operator == "downsampling" and self.image_size % _SR_FACTOR:
            raise ValueError(
                f"operator='downsampling' halves the crops: image_size must be even, got {self.image_size}"
            )
        object.__setattr__(self, "noise_level", check_noise_level(self.noise_level))
        integer("n_train", self.n_train, low=1, high=_MAX_SAMPLES)
        integer("n_val", self.n_val, low=1, high=_MAX_SAMPLES)
        integer("seed", self.seed, low=0, high=2**31 - 1)
        channels = self.channels
        if channels is None:
            channels = 1 if self.operator == "denoising_3d" else 3
        choice("channels", integer("channels", channels), (1, 3))
        if self.operator == "denoising_3d" and channels != 1:
            raise ValueError(f"operator='denoising_3d' uses single-channel volumes: channels must be 1, got {channels}")
        object.__setattr__(self, "channels", channels)

    @property
    def spatial_dims(self) -> int:
        """2 for images, 3 for volumes."""
        return 3 if self.operator == "denoising_3d" else 2

    @property
    def signal_shape(self) -> tuple[int, ...]:
        """Shape of one ground truth without the batch axis, ``(C, H, W)`` or ``(1, D, H, W)``."""
        return (self.channels,) + (self.image_size,) * self.spatial_dims

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable parameters that rebuild this set (``build_training_data(**d)``)."""
        return dataclasses.asdict(self)


@dataclass
class TrainingData:
    """A training set and its held-out validation set on one device."""

    spec: TrainingDataSpec
    """The parameters that rebuilt it."""
    x_train: torch.Tensor
    """Ground truths ``(n_train, *signal_shape)`` in [0, 1]."""
    y_train: torch.Tensor
    """Noisy measurements of ``x_train`` (half-size for ``downsampling``)."""
    x_val: torch.Tensor
    """Held-out ground truths ``(n_val, *signal_shape)``."""
    y_val: torch.Tensor
    """Noisy measurements of ``x_val``."""
    physics: Any
    """The noise-free deepinv ``LinearPhysics`` of the operator."""

    def to(self, device: Any) -> TrainingData:
        for name in ("x_train", "y_train", "x_val", "y_val"):
            setattr(self, name, getattr(self, name).to(device))
        self.physics = self.physics.to(device)
        return self


def build_training_physics(spec: TrainingDataSpec, device: Any = "cpu"):
    """The (noise-free) linear operator of ``spec.operator`` as deepinv physics."""
    import deepinv as dinv

    if spec.operator == "blur":
        kernel = dinv.physics.functional.gaussian_blur(sigma=(_BLUR_STD_PX, _BLUR_STD_PX))
        return dinv.physics.Blur(filter=kernel, padding="circular", device=device)
    if spec.operator == "downsampling":
        return dinv.physics.Downsampling(
            img_size=spec.signal_shape, filter="gaussian", factor=_SR_FACTOR, padding="circular", device=device
        )
    return dinv.physics.Denoising(device=device)


@functools.lru_cache(maxsize=32)
def _picture(name: str, channels: int) -> np.ndarray:
    """A bundled picture as float32 ``(H, W, channels)`` in [0, 1] (cached per process)."""
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)(), dtype=np.float32) / 255.0
    if img.ndim == 2:
        img = img[:, :, None]
    img = img[:, :, :3]
    if channels == 1 and img.shape[2] == 3:
        img = img @ np.array([0.2125, 0.7154, 0.0721], dtype=np.float32)[:, None]  # ITU-R 709 luma
    elif channels == 3 and img.shape[2] == 1:
        img = np.repeat(img, 3, axis=2)
    img.setflags(write=False)
    return img


def _random_crop(img: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """One augmented ``(C, size, size)`` crop: native scale or 2x area-reduced, flips, rot90."""
    h, w = img.shape[:2]
    scale = 2 if (rng.random() < 0.5 and min(h, w) >= 2 * size) else 1
    side = size * scale
    top = int(rng.integers(0, h - side + 1))
    left = int(rng.integers(0, w - side + 1))
    crop = img[top : top + side, left : left + side]
    if scale > 1:
        crop = crop.reshape(size, scale, size, scale, -1).mean(axis=(1, 3))
    crop = np.rot90(crop, k=int(rng.integers(0, 4)))
    if rng.random() < 0.5:
        crop = crop[:, ::-1]
    return np.ascontiguousarray(crop.transpose(2, 0, 1))


def _crops(names: tuple[str, ...], n: int, spec: TrainingDataSpec, rng: np.random.Generator) -> torch.Tensor:
    pictures = [_picture(name, spec.channels) for name in names]
    usable = [p for p in pictures if min(p.shape[:2]) >= spec.image_size]
    if not usable:
        raise ValueError(f"image_size={spec.image_size} is larger than every bundled picture")
    out = np.stack([_random_crop(usable[int(rng.integers(0, len(usable)))], spec.image_size, rng) for _ in range(n)])
    return torch.from_numpy(out).float().clamp_(0.0, 1.0)


def _volumes(first_seed: int, n: int, size: int) -> torch.Tensor:
    from scopebench.imaging.common.images import synthetic_volume

    return torch.cat([synthetic_volume(size, seed=first_seed + i) for i in range(n)], dim=0)


def _measure(physics, x: torch.Tensor, noise_level: float, seed: int, chunk: int = 64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for start in range(0, x.shape[0], chunk):
            clean = physics.A(x[start : start + chunk])
            out.append(clean + noise_level * torch.randn(clean.shape, generator=gen, dtype=clean.dtype))
    return torch.cat(out, dim=0)


def build_training_data(**params: Any) -> TrainingData:
    """Build the training and validation pairs of :class:`TrainingDataSpec` ``params`` (CPU).

    Unknown keys and bad values raise ``ValueError`` before anything is computed.

    :Examples:
        >>> data = build_training_data(image_size=16, operator="downsampling", n_train=3, n_val=2)
        >>> tuple(data.x_train.shape), tuple(data.y_train.shape), tuple(data.x_val.shape)
        ((3, 3, 16, 16), (3, 3, 8, 8), (2, 3, 16, 16))
    """
    allowed = [f.name for f in dataclasses.fields(TrainingDataSpec)]
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"unknown training data parameter(s) {unknown}; allowed: {allowed}")
    spec = TrainingDataSpec(**params)
    if spec.spatial_dims == 3:
        # Disjoint seed ranges: a validation volume is never a training volume.
        base = spec.seed * 2 * _MAX_SAMPLES
        x_train = _volumes(base, spec.n_train, spec.image_size)
        x_val = _volumes(base + _MAX_SAMPLES, spec.n_val, spec.image_size)
    else:
        x_train = _crops(TRAIN_IMAGES, spec.n_train, spec, np.random.default_rng([spec.seed, 0]))
        x_val = _crops(VAL_IMAGES, spec.n_val, spec, np.random.default_rng([spec.seed, 1]))
    physics = build_training_physics(spec)
    return TrainingData(
        spec=spec,
        x_train=x_train,
        y_train=_measure(physics, x_train, spec.noise_level, seed=2 * spec.seed + 1),
        x_val=x_val,
        y_val=_measure(physics, x_val, spec.noise_level, seed=2 * spec.seed + 2),
        physics=physics,
    )
