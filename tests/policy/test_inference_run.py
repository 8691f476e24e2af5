"""The inference run object: phases, observation, n_action_steps, compilation, latency fit."""

from __future__ import annotations

import pytest
import torch

from scopebench.policy.phases import INFERENCE_PHASES
from scopebench.policy.run.inference import InferenceRun, fit_latency
from scopebench.policy.settings import InferenceSettings
from scopebench.stats import median


def calls(run: InferenceRun, n: int) -> list[dict]:
    out, count = [], [0]

    def callback() -> bool:
        if count[0]:
            out.append(run.metrics())
        count[0] += 1
        return count[0] <= n

    run.loop(callback)
    return out


def test_one_call_per_iteration_in_four_phases(robot_data):
    settings = InferenceSettings(n_warmup=1, num_cameras=3, n_action_steps=5, num_steps=4)
    with InferenceRun(settings, dataset_root=robot_data[1], chunk_size=8) as run:
        metrics = calls(run, 3)
        assert run.model.config.num_cameras == 3 and run.model.config.chunk_size == 8
        assert run.actions.shape == (1, 5, 7)  # n_action_steps x the dataset's 7 action dims (model pads to 7)
    for m in metrics:
        assert {f"{p}_time_sec" for p in INFERENCE_PHASES} <= set(m)
        assert m["total_time_sec"] >= sum(m[f"{p}_time_sec"] for p in INFERENCE_PHASES)
        assert "compile_time_sec" not in m and m["setup_time_sec"] > 0
    assert len(run.warmup_sec[4]) == 1


def test_observation_has_the_prompt_words_and_cycled_cameras(robot_data):
    with InferenceRun(
        InferenceSettings(n_warmup=0, num_cameras=3, prompt_words=24), dataset_root=robot_data[1], chunk_size=8
    ) as run:
        batch = run.work.observation
    assert len(batch["prompt"][0].split()) == 24
    assert torch.equal(batch["camera2"], batch["camera0"]) and not torch.equal(batch["camera1"], batch["camera0"])


def test_bf16_inference(robot_data):
    with InferenceRun(InferenceSettings(n_warmup=1, precision="bf16"), dataset_root=robot_data[1], chunk_size=8) as run:
        calls(run, 1)
        assert next(run.model.parameters()).dtype == torch.bfloat16
        assert torch.isfinite(run.actions).all()


def test_n_action_steps_above_the_chunk_is_refused(robot_data):
    with pytest.raises(ValueError, match=r"^n_action_steps must be at most chunk_size=8, got 9$"):
        InferenceRun(InferenceSettings(n_action_steps=9), dataset_root=robot_data[1], chunk_size=8)


def test_fit_latency_recovers_a_line_and_its_quality():
    fit = fit_latency([1, 2, 5, 10], [0.012, 0.014, 0.020, 0.030])
    assert fit["fixed_sec"] == pytest.approx(0.010) and fit["per_step_sec"] == pytest.approx(0.002)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit_latency([1, 2, 3], [1.0, 3.0, 1.0])["r2"] < 0.1
    with pytest.raises(ValueError, match="two or more distinct"):
        fit_latency([2, 2], [1.0, 1.0])


@pytest.mark.slow
def test_compiled_calls_report_compile_time_and_first_call_ratio(robot_data):
    settings = InferenceSettings(compile_mode="default", n_warmup=3, num_steps=1)
    with InferenceRun(settings, dataset_root=robot_data[1], chunk_size=8) as run:
        m = calls(run, 2)[-1]
    first, rest = run.warmup_sec[1][0], run.warmup_sec[1][1:]
    assert m["compile_time_sec"] == pytest.approx(first - median(rest)) and m["compile_time_sec"] > 0
    assert m["first_call_ratio"] == pytest.approx(first / median(rest)) and m["first_call_ratio"] >= 5


def test_a_ratio_below_five_warns_that_compilation_may_not_have_happened(robot_data):
    run = InferenceRun(InferenceSettings(compile_mode="default", n_warmup=3), dataset_root=robot_data[1], chunk_size=8)
    run.warmup_sec = {10: [0.011, 0.010, 0.010]}
    with pytest.warns(
        UserWarning, match=r"first call took only 1\.1x a steady call .*compilation may not have happened"
    ):
        run._check_compilation()
