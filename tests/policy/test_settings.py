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


# -- issue 44: run configs ---------------------------------------------------------------------------
def _config(tmp_path, text, name="run.yml"):
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("section", ["training", "dataset"])
@pytest.mark.parametrize(("value", "shown"), [("5", "5"), ("[1, 2]", r"\[1, 2\]"), ("fast", "'fast'")])
def test_a_section_of_the_wrong_type_is_refused_naming_it(tmp_path, section, value, shown):
    """``training: 5`` ended in ``TypeError: 'int' object is not iterable``."""
    path = _config(tmp_path, f"preset: tiny\n{section}: {value}\n")
    match = rf"^{path}: section '{section}' must be a mapping of settings \({section}:, then one 'key: value' per "
    with pytest.raises(ValueError, match=match + rf"indented line\), got {shown}$"):
        load_run_config(path)


def test_a_duplicate_key_in_a_run_config_is_refused_naming_the_key_and_line(tmp_path):
    path = _config(tmp_path, "preset: tiny\ntraining:\n  steps: 10\n  log_freq: 2\n  steps: 1000\n")
    with pytest.raises(ValueError, match=rf"^{path}: key 'steps' appears twice in one mapping, at line 3 and line 5"):
        load_run_config(path)


def test_a_run_config_that_is_not_utf8_is_refused_naming_it(tmp_path):
    path = tmp_path / "run.yml"
    path.write_bytes(b"preset: tiny\nbatch_size: 2 # \xff\n")
    with pytest.raises(ValueError, match=rf"^{path} is not UTF-8 text \(byte 0xff at offset 29\)"):
        load_run_config(path)


@pytest.mark.parametrize("where", ["seed: {}", "dataset:\n  seed: {}"])
def test_a_seed_torch_cannot_take_is_refused_naming_the_bound(tmp_path, where):
    path = _config(tmp_path, "preset: tiny\n" + where.format(2**64) + "\n")
    key = "dataset.seed" if where.startswith("dataset") else "seed"
    with pytest.raises(ValueError, match=rf"^{key} must be an integer from 0 to 2\*\*63 - 1 \(torch .*, got {2**64}$"):
        load_run_config(path)
    with pytest.raises(ValueError, match=r"^seed must be an integer from 0 to 2\*\*63 - 1"):
        InferenceSettings(seed=2**64)


def test_a_float_yaml_1_1_reads_as_a_string_is_read_as_the_command_line_reads_it(tmp_path):
    """``1e-3`` in a file is the string ``'1e-3'`` for PyYAML (and benchopt): accepted as the
    number, as ``--learning_rate=1e-3`` is, in every way in: a run config, an override, a
    benchopt solver's parameters (``settings_from``)."""
    from scopebench.policy.settings import settings_from

    path = _config(tmp_path, "preset: tiny\nlearning_rate: 1e-3\ngrad_clip: 5e-1\npolicy:\n  control_hz: 3e1\n")
    config = load_run_config(path)
    assert (config.train.learning_rate, config.train.grad_clip, config.inference.control_hz) == (1e-3, 0.5, 30.0)
    assert type(config.train.learning_rate) is float
    assert load_run_config(TINY, parse_overrides(["--learning_rate=1e-3"])).train.learning_rate == 1e-3
    assert settings_from(TrainSettings, {"learning_rate": "1e-3"}).learning_rate == 1e-3
    with pytest.raises(ValueError, match=r"^learning_rate must be a finite number > 0, got 'abc' \(str\)$"):
        load_run_config(_config(tmp_path, "learning_rate: abc\n", "abc.yml"))


def test_check_config_reads_a_benchopt_float_as_the_run_does(tmp_path, capsys):
    """benchopt hands ``learning_rate: 1e-3`` to the solver as a string; check-config, which
    reads the benchopt config through the suite's loader, and the solver agree on it."""
    from scopebench.cli import main

    path = _config(
        tmp_path, "dataset: [synthetic_robot]\nsolver:\n  - Pi05Train: {preset: tiny, learning_rate: 1e-3}\n"
    )
    assert main(["check-config", str(REPO), "--config", str(path)]) == 0, capsys.readouterr()
    assert "learning_rate=1e-3] on synthetic_robot: ok" in capsys.readouterr().out
    dup = _config(
        tmp_path, "dataset: [synthetic_robot]\nsolver:\n  - Pi05Train:\n      preset: tiny\n      preset: small\n"
    )
    assert main(["check-config", str(REPO), "--config", str(dup)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "key 'preset' appears twice in one mapping, at line 4 and line 5" in err, err


def test_resume_reads_the_saved_run_config_through_the_one_loader(tmp_path):
    """The allowed changes a resume prints come from the checkpoint's ``train_config.yaml``, read
    as every run config is: a ``training:`` that is not a mapping no longer ends in an
    ``AttributeError``, a duplicate key is refused as in any config."""
    from scopebench.policy.run.trainer import _allowed_changes
    from scopebench.train.checkpoint import CONFIG_FILE

    config = load_run_config(TINY, parse_overrides(["--training.steps=20"]))
    (tmp_path / CONFIG_FILE).write_text("training:\n  steps: 10\n")
    assert _allowed_changes(config, tmp_path) == ["resume: training.steps 10 -> 20 (allowed to change)"]
    (tmp_path / CONFIG_FILE).write_text("training: 5\n")
    assert _allowed_changes(config, tmp_path) == []
    (tmp_path / CONFIG_FILE).write_text("training:\n  steps: 10\n  steps: 30\n")
    with pytest.raises(ValueError, match=r"train_config\.yaml: key 'steps' appears twice in one mapping"):
        _allowed_changes(config, tmp_path)
