"""Quality metrics: formulas, agreement with scikit-image, volumes without SSIM."""

from __future__ import annotations

import math

import pytest
import torch

from scopebench.imaging.common.metrics import mse, psnr, quality_metrics, ssim


def test_psnr_and_mse_formulas():
    ref = torch.zeros(1, 1, 8, 8)
    x = torch.full((1, 1, 8, 8), 0.1)
    assert mse(x, ref) == pytest.approx(0.01)
    assert psnr(x, ref) == pytest.approx(20.0)
    assert psnr(ref, ref) == math.inf


def test_ssim_matches_scikit_image():
    from skimage.metrics import structural_similarity

    gen = torch.Generator().manual_seed(0)
    ref = torch.rand(1, 3, 40, 40, generator=gen)
    x = (ref + 0.1 * torch.randn(ref.shape, generator=gen)).clamp(0, 1)
    expected = structural_similarity(
        x[0].numpy(),
        ref[0].numpy(),
        channel_axis=0,
        data_range=1.0,
        gaussian_weights=True,
        sigma=1.5,
        use_sample_covariance=False,
    )
    assert ssim(x, ref) == pytest.approx(expected, abs=1e-5)
    assert ssim(ref, ref) == pytest.approx(1.0)


def test_volumes_get_psnr_and_mse_but_no_ssim():
    vol = torch.rand(1, 1, 12, 12, 12)
    out = quality_metrics(vol * 0.9, vol)
    assert set(out) == {"psnr", "mse"}
    assert set(quality_metrics(vol[:, :, 0], vol[:, :, 0])) == {"psnr", "mse", "ssim"}


def test_shape_mismatch_is_a_clear_error():
    with pytest.raises(
        ValueError, match=r"expected a reconstruction of the ground truth's shape \(1, 1, 4, 4\), got \(1, 1, 4, 5\)"
    ):
        psnr(torch.zeros(1, 1, 4, 5), torch.zeros(1, 1, 4, 4))
