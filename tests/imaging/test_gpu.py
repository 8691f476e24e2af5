"""The imaging run objects on CUDA (skipped with a reason without it; run by scripts/gpu_check.sh)."""

from __future__ import annotations

import pytest
import torch

pytestmark = pytest.mark.gpu

BLUR = {"kind": "simulated", "image_size": 32, "operator": "blur", "noise_level": 0.03}


def test_pnp_run_on_the_gpu_matches_the_cpu(tmp_path):
    from scopebench.imaging.inference.run import reconstruct

    config = {"denoiser": "tv", "denoiser_sigma": 0.01}
    x_gpu, metrics = reconstruct(BLUR, {**config, "device": "cuda"}, num_iterations=5, output_dir=tmp_path)
    x_cpu, _ = reconstruct(BLUR, {**config, "device": "cpu"}, num_iterations=5, output_dir=tmp_path)
    assert float((x_gpu - x_cpu).norm() / x_cpu.norm()) < 1e-4
    # On CUDA the custom profiler synchronises and reads the peak of allocated memory.
    assert metrics["denoise_max_gpu_mb"] > 0 and metrics["setup_time_sec"] > 0


def test_training_run_on_the_gpu_lowers_the_loss(tmp_path):
    from scopebench.imaging.common.denoisers import DenoiserSpec
    from scopebench.imaging.training import TrainConfig, TrainingRun, UnrolledConfig

    run = TrainingRun(
        data_params={"image_size": 32, "n_train": 16, "n_val": 2},
        unrolled=UnrolledConfig(denoiser=DenoiserSpec(channels=8)),
        train=TrainConfig(batch_size=4),
        device="cuda",
        output_dir=tmp_path,
    )
    losses = []

    def callback():
        if run.trainer.last_loss is not None:
            losses.append(run.trainer.last_loss.item())
        return len(losses) < 20

    with run:
        assert run.device.type == "cuda" and next(run.trainer.model.parameters()).is_cuda
        run.loop(callback)
    assert sum(losses[-5:]) < sum(losses[:5])
    assert run.metrics()["forward_max_gpu_mb"] > 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs for two NCCL ranks")
def test_two_nccl_ranks_on_two_gpus(tmp_path, worker_path):
    from scopebench.imaging.inference.run import reconstruct

    frames = {"kind": "multiframe_superres", "image_size": 32, "num_operators": 4, "scale": 2, "noise_level": 0.02}
    config = {"denoiser": "tv", "denoiser_sigma": 0.01, "device": "cuda"}
    x1, _ = reconstruct(frames, config, num_iterations=4, output_dir=tmp_path)
    x2, metrics = reconstruct(
        frames, {**config, "distribute_physics": True}, num_iterations=4, nproc=2, output_dir=tmp_path
    )
    assert metrics["world_size"] == 2
    assert float((x2 - x1).norm() / x1.norm()) < 1e-4
