"""Two local gloo ranks reconstruct what one process does, and report cross-rank metrics."""

from __future__ import annotations

import pytest
import torch

from scopebench.imaging.runner import reconstruct

pytestmark = pytest.mark.slow

FRAMES = {"kind": "multiframe_superres", "image_size": 32, "num_operators": 4, "scale": 2, "noise_level": 0.02}
SETTINGS = {"denoiser": "tv", "denoiser_sigma": 0.01, "patch_size": 16, "overlap": 4, "device": "cpu"}


@pytest.fixture(scope="module")
def one_process():
    x, _ = reconstruct(FRAMES, SETTINGS, num_iterations=8, nproc=1)
    return x


@pytest.mark.parametrize("flag", ["distribute_physics", "distribute_denoiser"])
def test_two_ranks_match_one(one_process, flag):
    x, metrics = reconstruct(FRAMES, {**SETTINGS, flag: True}, num_iterations=8, nproc=2, timeout_sec=120)
    rel = float((x - one_process).norm() / one_process.norm())
    assert rel < 1e-5, rel
    assert metrics["world_size"] == 2
    assert 0.0 <= metrics["rank_skew_pct"] <= 100.0
    assert "gradient_rank_skew_pct" in metrics and "denoise_rank_skew_pct" in metrics
    assert torch.isfinite(x).all()
