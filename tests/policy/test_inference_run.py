"""The inference run object: phases, observation, n_action_steps, compilation, latency fit."""

from __future__ import annotations

import pytest
import torch

from scopebench.policy.phases import INFERENCE_PHASES
from scopebench.policy.run.inference import FIT_MIN_Z, InferenceRun, fit_latency, fit_verdict
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


# -- whether the fit applies: pure, on given calls (20 interleaved rounds unless said) -----------------
def _rounds(pattern, rounds=20):
    return [pattern[r % len(pattern)] for r in range(rounds)]


def test_a_latency_that_does_not_grow_gets_no_fit_whatever_its_slope():
    # the issue's case: calls that ignore N, the medians' slope slightly negative
    flat = {1: _rounds([1.00, 1.03, 0.98, 1.01]), 10: _rounds([0.99, 1.02, 0.97, 1.00])}
    slope = fit_latency([1, 10], [median(flat[n]) for n in (1, 10)])["per_step_sec"]
    verdict = fit_verdict(flat, slope)
    assert slope < 0 and not verdict["fit_applies"]
    assert "is not above 0: the latency does not grow with num_steps" in verdict["fit_reason"]
    # a positive slope of noise: the medians differ, the rounds' order does not follow N
    noisy = {1: _rounds([1.00, 1.10, 0.90, 1.05]), 10: _rounds([1.08, 0.95, 1.02, 1.06])}
    verdict = fit_verdict(noisy, 0.004)
    assert not verdict["fit_applies"] and verdict["trend_z"] < FIT_MIN_Z
    assert "do not grow with num_steps within the 20 rounds (Page's trend test z = " in verdict["fit_reason"]


def test_a_latency_that_grows_gets_its_fit_through_skewed_noise():
    # one step costs 0.01; the calls' noise is skewed (a slow call now and then, up to 50 steps' worth)
    base = [1.00, 1.002, 1.5, 1.001, 1.003, 1.0, 1.004, 1.2]
    grows = {
        n: [b + 0.01 * n + (0.3 if (r + n) % 7 == 0 else 0) for r, b in enumerate(_rounds(base))] for n in (1, 2, 5, 10)
    }
    verdict = fit_verdict(grows, 0.01)
    assert verdict["fit_applies"] and verdict["fit_reason"] is None and verdict["trend_p"] < 1e-4


def test_too_few_rounds_never_claim_a_fit():
    perfect = {1: [1.0] * 13, 8: [2.0] * 13}  # every round in order, but 13 rounds of two N: z = sqrt(13) < 3.719
    assert not fit_verdict(perfect, 0.14)["fit_applies"]
    assert fit_verdict({1: [1.0] * 14, 8: [2.0] * 14}, 0.14)["fit_applies"]
    with pytest.raises(ValueError, match="as many calls at every num_steps"):
        fit_verdict({1: [1.0, 1.0], 8: [2.0]}, 0.1)


@pytest.mark.slow
def test_compiled_calls_report_compile_time_and_first_call_ratio(robot_data):
    settings = InferenceSettings(compile_mode="default", n_warmup=3, num_steps=1)
    with InferenceRun(settings, dataset_root=robot_data[1], chunk_size=8) as run:
        m = calls(run, 2)[-1]
    first, rest = run.warmup_sec[1][0], run.warmup_sec[1][1:]
    assert m["compile_time_sec"] == pytest.approx(first - median(rest)) and m["compile_time_sec"] > 0
    assert m["first_call_ratio"] == pytest.approx(first / median(rest)) and m["first_call_ratio"] >= 5
    cold = run.cold_start_report()
    assert cold["compiled_graphs"] >= 1 and cold["compile_note"] is None  # it compiled, and says so
    assert cold["first_action_sec"] == first and cold["compile_time_sec"] == m["compile_time_sec"]


def test_a_ratio_below_five_warns_that_compilation_may_not_have_happened(robot_data):
    run = InferenceRun(InferenceSettings(compile_mode="default", n_warmup=3), dataset_root=robot_data[1], chunk_size=8)
    run.warmup_sec = {10: [0.011, 0.010, 0.010]}
    with pytest.warns(
        UserWarning, match=r"first call took only 1\.1x a steady call .*compilation may not have happened"
    ):
        run._check_compilation()
