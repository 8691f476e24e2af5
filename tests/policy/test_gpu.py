"""The policy's CUDA paths (scripts/gpu_check.sh runs the same on a GPU machine)."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA; run scripts/gpu_check.sh on a GPU machine"),
]


def test_training_run_on_cuda_reports_gpu_memory_and_a_table_peak(robot_data):
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings

    calls, metrics = [0], []

    def callback():
        if calls[0]:
            metrics.append(run.metrics())
        calls[0] += 1
        return calls[0] <= 3

    run = PolicyTrainRun(TrainSettings(device="cuda"), dataset_root=robot_data[1], chunk_size=8)
    with run:
        run.loop(callback)
    m = metrics[-1]
    assert m["forward_max_gpu_mb"] > 0 and m["max_gpu_mb_rank0"] > 0
    assert m["peak_flops_source"] is None or m["peak_flops_source"].startswith("table:")


def test_inference_run_on_cuda(robot_data):
    from scopebench.policy.run.inference import InferenceRun
    from scopebench.policy.settings import InferenceSettings

    with InferenceRun(InferenceSettings(device="cuda", n_warmup=1), dataset_root=robot_data[1], chunk_size=8) as run:
        assert run.timed_call() > 0 and run.actions.device.type == "cpu"


def test_user_policies_train_and_sample_on_cuda():
    """A user policy's batches (dicts of tensors, pinned) reach the GPU inside dataload_wait, its
    FLOPs are counted there (FlopCounterMode, CUDA RNG forked), and PaliGemma generates on it."""
    from pathlib import Path

    from scopebench.policy.run.inference import InferenceRun
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import InferenceSettings, TrainSettings

    example = f"{Path(__file__).resolve().parents[2]}/examples/flow_policy.py:make_policy"
    for policy in (example, "scopebench.policy.paligemma:make_paligemma_policy"):
        run = PolicyTrainRun(TrainSettings(policy=policy, device="cuda"), dataset_root="", chunk_size=8)
        with run:
            run.loop(lambda: run.work.steps < 2)
            m = run.metrics()
        assert m["forward_max_gpu_mb"] > 0 and run.flops_per_sample > 0 and m["train_loss"] == m["train_loss"]
    settings = InferenceSettings(policy="scopebench.policy.paligemma:make_paligemma_policy", device="cuda", n_warmup=1)
    with InferenceRun(settings, dataset_root="", chunk_size=8) as run:
        assert run.timed_call(3) > 0 and run.actions.device.type == "cpu" and run.actions.shape == (1, 3)
