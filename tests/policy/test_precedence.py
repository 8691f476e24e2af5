"""One precedence for every policy tool: command-line flag or ``--key=value`` > environment
variable > YAML file > default. Each tool's run function is replaced by a recorder of the
config it would have run with, so nothing is trained here."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest

from scopebench.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")

#: tool -> (module, the function its ``run`` hands the loaded config to)
TOOLS = {
    "profile-step": ("profile_step", "_profile"),
    "profile-dataloader": ("profile_dataloader", "_profile"),
    "find-unused-params": ("find_unused_params", "_audit"),
    "bench-inference": ("bench_inference", "_bench"),
    "decompose-latency": ("decompose_latency", "_decompose"),
}


def config_of(monkeypatch, tool: str, *args: str):
    """The run config ``scopebench <tool> --config tiny.yml <args>`` would run."""
    module_name, function = TOOLS[tool]
    module = importlib.import_module(f"scopebench.commands.{module_name}")
    seen = []
    monkeypatch.setattr(module, function, lambda config, *a, **k: seen.append(config) or 0)
    assert main([tool, "--config", TINY, *args]) == 0
    (config,) = seen
    return config


def test_a_key_value_override_beats_the_environment_variable(monkeypatch):
    # Was: the environment-derived value was applied after --key=value and won.
    monkeypatch.setenv("FUSED_ADAMW", "0")
    assert config_of(monkeypatch, "profile-step", "--fused_adamw=true").train.fused_adamw is True
    monkeypatch.setenv("FUSED_ADAMW", "1")
    assert config_of(monkeypatch, "profile-step", "--fused_adamw=false").train.fused_adamw is False


def test_the_environment_variable_beats_the_yaml_file(monkeypatch):
    assert config_of(monkeypatch, "profile-step").train.no_optim is False
    monkeypatch.setenv("PROFILE_NO_OPTIM", "1")
    monkeypatch.setenv("FIND_UNUSED_PARAMS", "false")
    config = config_of(monkeypatch, "profile-step")
    assert config.train.no_optim is True and config.train.find_unused_params is False


def test_a_flag_beats_the_environment_variable(monkeypatch):
    monkeypatch.setenv("FUSED_ADAMW", "1")
    monkeypatch.setenv("FIND_UNUSED_PARAMS", "true")
    config = config_of(monkeypatch, "profile-step", "--fused-adamw", "false", "--find-unused-params", "false")
    assert config.train.fused_adamw is False and config.train.find_unused_params is False


def test_bench_inference_environment_variables_lose_to_the_command_line(monkeypatch):
    monkeypatch.setenv("BENCH_COMPILE_MODE", "default")
    monkeypatch.setenv("BENCH_N_WARMUP", "3")
    env_only = config_of(monkeypatch, "bench-inference").inference
    assert (env_only.compile_mode, env_only.n_warmup) == ("default", 3)
    overridden = config_of(monkeypatch, "bench-inference", "--policy.compile_mode=none", "--policy.n_warmup=1")
    assert (overridden.inference.compile_mode, overridden.inference.n_warmup) == ("none", 1)
    flagged = config_of(monkeypatch, "bench-inference", "--compile-mode", "none", "--n-warmup", "2").inference
    assert (flagged.compile_mode, flagged.n_warmup) == ("none", 2)
    monkeypatch.setenv("BENCH_NO_COMPILE", "1")
    assert config_of(monkeypatch, "bench-inference", "--compile-mode", "default").inference.compile_mode == "default"


@pytest.mark.parametrize("tool", sorted(TOOLS))
def test_every_tool_applies_key_value_overrides_over_the_yaml_file(monkeypatch, tool):
    assert config_of(monkeypatch, tool).train.batch_size != 3
    assert config_of(monkeypatch, tool, "--batch_size=3").train.batch_size == 3


def test_train_applies_flags_over_key_value_overrides(monkeypatch, tmp_path):
    from scopebench.policy.run import trainer

    seen = []
    # what train_policy returns that the command reads: where the run began, each step's host load
    result = {"start_step": 0, "host_samples": []}
    monkeypatch.setattr(trainer, "train_policy", lambda config, **kwargs: seen.append(config) or result)
    args = ["train", "--config", TINY, "--output_dir", str(tmp_path / "run")]
    assert main([*args, "--training.steps=7", "--steps", "5", "--training.log_freq=3"]) == 0
    (config,) = seen
    assert (config.training.steps, config.training.log_freq) == (5, 3)


@pytest.mark.parametrize("tool", [*sorted(TOOLS), "train"])
def test_every_tool_states_the_precedence_in_its_help(tool, capsys):
    with pytest.raises(SystemExit):
        main([tool, "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "Precedence: command-line flag or --key=value > environment variable > YAML file > default." in help_text
