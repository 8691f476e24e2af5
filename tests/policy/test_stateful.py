"""Policies with state (``UserPolicy.reset``): the state persists within an episode and is reset
between episodes, the calls are reported by place in the episode, compiling one is refused in one
line, and the example policy runs in ``bench-inference``.

The counting policy's output is its state before the call, so what the run carried is read
from the actions, not timed: nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from scopebench.cli import main
from scopebench.policy.run.inference import InferenceRun
from scopebench.policy.settings import InferenceSettings
from scopebench.policy.user import PolicyError, UserPolicy

from .conftest import TINY
from .helpers import SAMPLE_POLICY_SOURCE

ROOT = Path(__file__).resolve().parents[2]
POLICIES = SAMPLE_POLICY_SOURCE + """

def counting():  # the output is the number of calls since the episode began
    return _policy(lambda model, obs, num_steps, seen: (torch.tensor([seen]), seen + 1), reset=lambda model: 0)
"""


@pytest.fixture(scope="module")
def counting(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "stateful_policies.py"
    path.write_text(POLICIES)
    return f"{path}:counting"


def _seen(run: InferenceRun, n: int) -> list[int]:
    """The state each of ``n`` measured calls saw."""
    out, count = [], [0]

    def callback() -> bool:
        if count[0]:
            out.append(int(run.actions[0]))
        count[0] += 1
        return count[0] <= n

    run.loop(callback)
    return out


def test_the_state_persists_within_an_episode_and_is_reset_between_episodes(counting):
    settings = InferenceSettings(policy=counting, n_warmup=2, num_steps=1)
    with InferenceRun(settings, dataset_root="", chunk_size=8, episode_length=3) as run:
        assert run.actions[0] == 1  # the warm-up's own episode: 0, then 1
        seen = _seen(run, 8)
        report = run.episode_report([0.001] * 8)
    assert seen == [0, 1, 2, 0, 1, 2, 0, 1]
    assert run.positions == seen
    assert report["episodes"] == 3 and len(report["reset_sec"]) == 3 and report["episode_length"] == 3
    assert [(r["position"], r["calls"]) for r in report["by_position"]] == [(1, 3), (2, 3), (3, 2)]


def test_without_an_episode_length_the_measured_calls_are_one_episode(counting):
    with InferenceRun(InferenceSettings(policy=counting, n_warmup=1), dataset_root="", chunk_size=8) as run:
        seen = _seen(run, 5)
        report = run.episode_report([0.001, 0.002, 0.003, 0.004, 0.005])
    assert seen == [0, 1, 2, 3, 4]
    assert report["episodes"] == 1 and report["episode_length"] is None
    assert report["last_over_first"] == pytest.approx(5.0)  # a latency that grows with the place shows


def test_a_stateless_policy_has_no_episodes_and_refuses_an_episode_length():
    flow = f"{ROOT / 'examples/flow_policy.py'}:make_policy"
    with InferenceRun(InferenceSettings(policy=flow, n_warmup=1), dataset_root="", chunk_size=8) as run:
        assert run.episode_report([]) is None and not run.policy.stateful
    with pytest.raises(ValueError, match=r"^episode_length=4 needs a stateful policy, and policy .*flow_policy"):
        with InferenceRun(InferenceSettings(policy=flow), dataset_root="", chunk_size=8, episode_length=4):
            pass


def test_compiling_a_stateful_policy_is_refused_naming_the_reason(counting):
    settings = InferenceSettings(policy=counting, compile_mode="default", n_warmup=2)
    with pytest.raises(ValueError, match=r"^compile_mode='default' is refused for policy .*: it is stateful"):
        with InferenceRun(settings, dataset_root="", chunk_size=8):
            pass


def test_reset_must_be_callable():
    with pytest.raises(PolicyError, match=r"^UserPolicy.reset must be callable, got int$"):
        UserPolicy(model=torch.nn.Linear(2, 2), loss=lambda m, b: 0, dataset=[1], reset=3)


def test_bench_inference_runs_the_example_stateful_policy_by_episode(tmp_path, capsys):
    policy = f"{ROOT / 'examples/stateful_policy.py'}:make_policy"
    args = ["bench-inference", "--config", TINY, "--policy", policy, "--episode-length", "4", "--n-timed", "10"]
    code = main([*args, "--n-warmup", "1", "--output-dir", str(tmp_path), "--json", str(tmp_path / "b.json")])
    out = capsys.readouterr()
    assert code == 0, out.err
    episodes = json.loads((tmp_path / "b.json").read_text())["episodes"]
    assert episodes["episode_length"] == 4 and episodes["episodes"] == 3
    assert [r["calls"] for r in episodes["by_position"]] == [3, 3, 2, 2]
    assert "stateful policy: episodes of 4 calls (3 begun in the timed calls" in out.out
    assert "median latency by place in the episode (ms): 1: " in out.out


def test_bench_inference_refuses_an_episode_length_below_one(tmp_path, capsys):
    code = main(["bench-inference", "--config", TINY, "--episode-length", "0", "--output-dir", str(tmp_path)])
    assert code == 2 and capsys.readouterr().err.strip().endswith("--episode-length must be an integer >= 1, got 0")
