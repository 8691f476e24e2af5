"""Ground-truth signals that need no download: scikit-image's bundled pictures and
synthetic phantoms / volumes.

Every function returns a float32 tensor in ``[0, 1]`` with a batch axis, ``(1, C, H, W)``
for images and ``(1, 1, D, H, W)`` for volumes, and is deterministic given its seed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from scopebench.validate import number

__all__ = ["NATURAL_IMAGES", "check_noise_level", "natural_image", "phantom_image", "synthetic_volume", "fit_to_size"]

#: Bundled scikit-image pictures (shipped inside the wheel, so offline) and their channels.
NATURAL_IMAGES = {"astronaut": 3, "chelsea": 3, "coffee": 3, "camera": 1}


def check_noise_level(value: Any, key: str = "noise_level") -> float:
    """A standard deviation of Gaussian noise on these signals: a number in ``[0, 1]``, as
    they are (both imaging benchmarks' problems and training sets check it here).

    :Examples:
        >>> check_noise_level(0.03)
        0.03
        >>> check_noise_level(1.5)
        Traceback (most recent call last):
        ...
        ValueError: noise_level must be a finite number >= 0 and <= 1, got 1.5
    """
    return number(key, value, low=0, high=1)


def fit_to_size(img: np.ndarray, size: int) -> np.ndarray:
    """Square ``size x size`` view of an ``(H, W, C)`` array.

    The centred square crop is shrunk with area averaging when it is larger than
    ``size`` and mirror-tiled when it is smaller, so large benchmark images keep the
    picture's natural statistics at native scale instead of an upsampling blur.

    :Examples:
        >>> fit_to_size(np.ones((10, 20, 1)), 4).shape
        (4, 4, 1)
        >>> fit_to_size(np.arange(4.0).reshape(2, 2, 1), 5)[:, :, 0].tolist()[0]
        [0.0, 1.0, 1.0, 0.0, 0.0]
    """
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be a positive integer, got {size!r}")
    h, w = img.shape[:2]
    side = min(h, w)
    top, left = (h - side) // 2, (w - side) // 2
    square = img[top : top + side, left : left + side]
    if size <= side:
        t = torch.from_numpy(np.ascontiguousarray(square)).permute(2, 0, 1)[None].float()
        t = torch.nn.functional.interpolate(t, size=(size, size), mode="area")
        return t[0].permute(1, 2, 0).numpy()
    extra = size - side
    return np.pad(square, ((0, extra), (0, extra), (0, 0)), mode="symmetric")[:size, :size]


def natural_image(size: int, name: str = "astronaut") -> torch.Tensor:
    """A bundled scikit-image picture as ``(1, C, size, size)`` in ``[0, 1]``."""
    if name not in NATURAL_IMAGES:
        raise ValueError(f"image must be one of {sorted(NATURAL_IMAGES)}, got {name!r}")
    import skimage.data

    img = np.asarray(getattr(skimage.data, name)(), dtype=np.float32) / 255.0
    if img.ndim == 2:
        img = img[:, :, None]
    out = fit_to_size(img, size)
    return torch.from_numpy(np.ascontiguousarray(out)).permute(2, 0, 1)[None].float().clamp_(0.0, 1.0)


def phantom_image(size: int) -> torch.Tensor:
    """The Shepp-Logan phantom (bundled with scikit-image) as ``(1, 1, size, size)``."""
    import skimage.data

    img = np.asarray(skimage.data.shepp_logan_phantom(), dtype=np.float32)[:, :, None]
    out = fit_to_size(img, size) if size <= img.shape[0] else _pad_zero(img, size)
    return torch.from_numpy(np.ascontiguousarray(out)).permute(2, 0, 1)[None].float().clamp_(0.0, 1.0)


def _pad_zero(img: np.ndarray, size: int) -> np.ndarray:
    # A phantom is an object on an empty background: enlarge by resampling, not tiling.
    t = torch.from_numpy(img).permute(2, 0, 1)[None]
    t = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
    return t[0].permute(1, 2, 0).numpy()


def synthetic_volume(size: int, seed: int = 0, num_blobs: int = 12) -> torch.Tensor:
    """Random soft-edged ellipsoids on a smooth background, ``(1, 1, size, size, size)``.

    Intensity at voxel ``p`` is ``clip(0.1 + 0.1 * z + sum_k a_k * s(1 - ||R_k (p - c_k)||), 0, 1)``
    with ``s`` a smooth step, so the volume has edges for a denoiser to keep and flat
    regions for it to clean.
    """
    if not isinstance(size, int) or size < 4:
        raise ValueError(f"volume_size must be an integer >= 4, got {size!r}")
    gen = torch.Generator().manual_seed(int(seed))
    axis = torch.linspace(-1.0, 1.0, size)
    zz, yy, xx = torch.meshgrid(axis, axis, axis, indexing="ij")
    grid = torch.stack([zz, yy, xx], dim=-1)  # (D, H, W, 3)
    vol = 0.1 + 0.1 * (zz + 1.0) / 2.0
    for _ in range(num_blobs):
        centre = torch.rand(3, generator=gen) * 1.2 - 0.6
        radii = torch.rand(3, generator=gen) * 0.35 + 0.1
        amp = float(torch.rand(1, generator=gen)) * 0.6 + 0.2
        sign = 1.0 if float(torch.rand(1, generator=gen)) > 0.25 else -0.5
        dist = torch.linalg.vector_norm((grid - centre) / radii, dim=-1)
        edge = torch.clamp((1.0 - dist) * 8.0, 0.0, 1.0)
        vol = vol + sign * amp * edge * edge * (3.0 - 2.0 * edge)
    return vol.clamp_(0.0, 1.0)[None, None].float()
