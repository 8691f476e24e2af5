"""Bad inputs stop before any work with one line naming the key and the value."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scopebench.policy.settings import InferenceSettings, TrainSettings, load_run_config, parse_overrides

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "policy" / "tiny.yml"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": "abc"}, r"^batch_size must be an integer >= 1, got 'abc' \(str\)$"),
        ({"batch_size": 0}, r"^batch_size must be an integer >= 1, got 0$"),
        ({"learning_rate": "abc"}, r"^learning_rate must be a finite number > 0, got 'abc' \(str\)$"),
        ({"grad_clip": "abc"}, r"^grad_clip must be a finite number >= 0, got 'abc' \(str\)$"),
        ({"preset": "huge"}, r"^preset must be one of 'tiny', 'small', 'pi05', got 'huge'$"),
        ({"precision": "fp16"}, r"^precision must be one of 'fp32', 'bf16', got 'fp16'$"),
        ({"fused_adamw": "maybe"}, r"^fused_adamw must be true or false, got 'maybe' \(str\)$"),
        ({"gather_every": 0}, r"^gather_every must be an integer >= 1, got 0$"),
        ({"group_timeout_sec": -1}, r"^group_timeout_sec must be a finite number > 0, got -1$"),
    ],
)
def test_train_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TrainSettings(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_steps": 0}, r"^num_steps must be an integer >= 1, got 0$"),
        ({"chunk_size": 4, "n_action_steps": 5}, r"^n_action_steps must be at most chunk_size=4, got 5$"),
        ({"compile_mode": "turbo"}, r"^compile_mode must be one of 'none', 'default', .*'max-autotune'.*got 'turbo'$"),
        ({"compile_mode": "default", "n_warmup": 1}, r"^n_warmup must be an integer >= 2, got 1$"),
        ({"preset": "huge"}, r"^preset must be one of"),
    ],
)
def test_inference_settings(kwargs, match):
    with pytest.raises(ValueError, match=match):
        InferenceSettings(**kwargs)


def test_run_config_reads_overrides_and_shares_top_level_keys():
    config = load_run_config(TINY, parse_overrides(["--batch_size=12", "--policy.num_steps=5", "--precision=bf16"]))
    assert config.train.batch_size == 12 and config.inference.num_steps == 5
    assert config.inference.precision == "bf16" and config.inference.preset == "tiny"
    assert config.dataset.chunk_size == 8
    assert parse_overrides(["--learning_rate=1e-3"]) == [("learning_rate", 1e-3)]


def test_missing_file_unknown_keys_and_bad_override_values(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"policy config file not found: .*nope\.yml"):
        load_run_config(tmp_path / "nope.yml")
    with pytest.raises(
        ValueError, match=r"unknown override key 'batch_sise'; expected one of \['policy', 'policy_args', 'preset', "
    ):
        load_run_config(TINY, parse_overrides(["--batch_sise=3"]))
    with pytest.raises(ValueError, match=r"unknown override key 'policy.steps'"):
        load_run_config(TINY, parse_overrides(["--policy.steps=3"]))
    with pytest.raises(ValueError, match=r"^batch_size must be an integer >= 1, got 'abc' \(str\)$"):
        load_run_config(TINY, parse_overrides(["--batch_size=abc"]))
    with pytest.raises(ValueError, match=r"expected an override --key=value, got '--batch_size'"):
        parse_overrides(["--batch_size"])
    bad = tmp_path / "bad.yml"
    bad.write_text("preset: tiny\nbatchsize: 3\npolicy:\n  steps: 2\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['batchsize'\] in .*bad\.yml"):
        load_run_config(bad)


def test_nproc_above_the_cores_is_refused_before_any_work(robot_data, monkeypatch, started):
    from scopebench.policy.run.train import PolicyTrainRun

    for key in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SCOPEBENCH_RANK"):
        monkeypatch.delenv(key, raising=False)
    settings = TrainSettings(nproc_per_node=(os.cpu_count() or 1) + 1)
    monkeypatch.setattr(PolicyTrainRun, "build", lambda self: started.append("build"))
    with pytest.raises(ValueError, match=rf"^nproc_per_node={settings.nproc_per_node} exceeds the \d+ CPU cores"):
        PolicyTrainRun(settings, dataset_root=robot_data[1], chunk_size=8)
    assert started == []  # refused at construction: nothing spawned or built


def test_pi05_training_on_this_cpu_is_refused_with_the_numbers_unless_overridden(robot_data):
    import torch

    from scopebench.policy import make_policy
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.train.memory import available_memory_bytes

    with torch.device("meta"):
        needed = make_policy("pi05").num_params() * 16
    settings = TrainSettings(preset="pi05", device="cpu")
    if needed > available_memory_bytes("cpu"):
        with pytest.raises(
            ValueError,
            match=r"^preset='pi05' needs at least \d+\.\d GB on cpu .*AdamW state.*"
            r"only \d+\.\d GB are available; .*check_memory: false",
        ):
            PolicyTrainRun(settings, dataset_root=robot_data[1], chunk_size=8)
    else:  # a machine with the memory: the check must let it through
        PolicyTrainRun(settings, dataset_root=robot_data[1], chunk_size=8)
    # the override skips the check (nothing is built by the constructor)
    PolicyTrainRun(
        TrainSettings(preset="pi05", device="cpu", check_memory=False), dataset_root=robot_data[1], chunk_size=8
    )
