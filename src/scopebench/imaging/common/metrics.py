"""Reconstruction quality against the ground truth (signals in [0, 1], peak 1).

Pure torch, so scoring runs where the reconstruction lives (GPU included) and the
benchopt callback stays cheap.
"""

from __future__ import annotations

import math

import torch

__all__ = ["mse", "psnr", "ssim", "quality_metrics"]


def _check(x: torch.Tensor, ref: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or not isinstance(ref, torch.Tensor):
        raise TypeError(f"expected two tensors, got {type(x).__name__} and {type(ref).__name__}")
    if x.shape != ref.shape:
        raise ValueError(
            f"expected a reconstruction of the ground truth's shape {tuple(ref.shape)}, got {tuple(x.shape)}"
        )


def mse(x: torch.Tensor, ref: torch.Tensor) -> float:
    """Mean squared error ``mean((x - ref)^2)``.

    :Examples:
        >>> mse(torch.ones(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
        1.0
    """
    _check(x, ref)
    return float(torch.mean((x.detach().double() - ref.detach().double()) ** 2))


def psnr(x: torch.Tensor, ref: torch.Tensor, peak: float = 1.0) -> float:
    """Peak signal-to-noise ratio ``10 * log10(peak^2 / mse)`` in dB (``inf`` when equal).

    :Examples:
        >>> round(psnr(torch.full((1, 1, 4, 4), 0.1), torch.zeros(1, 1, 4, 4)), 6)
        20.0
    """
    err = mse(x, ref)
    return math.inf if err == 0.0 else 10.0 * math.log10(peak * peak / err)


def _gaussian_window(size: int, sigma: float, dtype: torch.dtype, device) -> torch.Tensor:
    coords = torch.arange(size, dtype=dtype, device=device) - (size - 1) / 2.0
    g = torch.exp(-(coords**2) / (2.0 * sigma**2))
    return g / g.sum()


def ssim(x: torch.Tensor, ref: torch.Tensor, peak: float = 1.0, window: int = 11, sigma: float = 1.5) -> float:
    """Structural similarity of 2-D images ``(B, C, H, W)``, averaged over pixels and channels.

    Per pixel, with Gaussian-weighted local means ``mu``, variances ``s^2`` and covariance
    ``s_xy`` (window ``window``, std ``sigma``), ``C1 = (0.01 peak)^2``, ``C2 = (0.03 peak)^2``:
    ``SSIM = (2 mu_x mu_y + C1)(2 s_xy + C2) / ((mu_x^2 + mu_y^2 + C1)(s_x^2 + s_y^2 + C2))``
    (Wang et al. 2004), averaged over the valid region (no padding), as
    ``skimage.metrics.structural_similarity(..., gaussian_weights=True)`` does.

    :Examples:
        >>> img = torch.rand(1, 3, 16, 16, generator=torch.Generator().manual_seed(0))
        >>> round(ssim(img, img), 6)
        1.0
    """
    _check(x, ref)
    if x.ndim != 4:
        raise ValueError(f"ssim needs 2-D images (B, C, H, W), got shape {tuple(x.shape)}")
    if min(x.shape[-2:]) < window:
        raise ValueError(f"ssim needs images of at least {window}x{window} pixels, got {tuple(x.shape[-2:])}")
    a = x.detach().double()
    b = ref.detach().double()
    channels = a.shape[1]
    g = _gaussian_window(window, sigma, a.dtype, a.device)
    # The Gaussian window is separable: two 1-D passes over the five moment maps at once
    # cost a tenth of one 2-D pass per map (this runs in every benchopt callback).
    stack = torch.cat([a, b, a * a, b * b, a * b], dim=1)  # (B, 5C, H, W)
    groups = stack.shape[1]
    blurred = torch.nn.functional.conv2d(stack, g.view(1, 1, window, 1).expand(groups, 1, window, 1), groups=groups)
    blurred = torch.nn.functional.conv2d(blurred, g.view(1, 1, 1, window).expand(groups, 1, 1, window), groups=groups)
    mu_a, mu_b, e_aa, e_bb, e_ab = blurred.split(channels, dim=1)
    var_a = e_aa - mu_a**2
    var_b = e_bb - mu_b**2
    cov = e_ab - mu_a * mu_b
    c1, c2 = (0.01 * peak) ** 2, (0.03 * peak) ** 2
    num = (2 * mu_a * mu_b + c1) * (2 * cov + c2)
    den = (mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2)
    return float(torch.mean(num / den))


def quality_metrics(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """``psnr``, ``mse`` and, for 2-D images, ``ssim`` (absent for volumes, never faked)."""
    out = {"psnr": psnr(x, ref), "mse": mse(x, ref)}
    if ref.ndim == 4 and min(ref.shape[-2:]) >= 11:
        out["ssim"] = ssim(x, ref)
    return out
