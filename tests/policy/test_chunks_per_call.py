"""Best-of-N: latency and throughput against the chunks sampled per call, and the knee.

The analytic test runs on a clock the policy itself advances (a call of B chunks "takes" a
known time), so it is exact on any machine; the command's test checks that what it prints and
writes agrees with its own recorded latencies.
"""

from __future__ import annotations

import json
import types

import pytest

from scopebench.cli import main
from scopebench.policy.run import inference
from scopebench.policy.run.inference import FREE_PCT, InferenceRun
from scopebench.policy.settings import InferenceSettings
from scopebench.stats import median, percentile

from .conftest import TINY
from .helpers import SAMPLE_POLICY_SOURCE

POLICIES = SAMPLE_POLICY_SOURCE + """

#: seconds a call of B chunks takes on the test's clock: free up to 2, then it grows
COST = {1: 0.010, 2: 0.011, 4: 0.030, 8: 0.060}
CLOCK = [0.0]


def batched():
    def sample(model, obs, num_steps):
        CLOCK[0] += COST[len(obs)]
        return model(obs)

    return _policy(sample)


def stateful():
    return _policy(lambda model, obs, num_steps, state: (model(obs), state), reset=lambda model: 0)
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "chunk_policies.py"
    path.write_text(POLICIES)
    return str(path)


def _policy_module(run: InferenceRun) -> types.SimpleNamespace:
    """The test policies' module (its ``CLOCK`` and ``COST``), through the policy's ``sample``."""
    return types.SimpleNamespace(**run.policy.sample.__globals__)


def test_the_knee_is_where_more_chunks_stop_being_free(policies, monkeypatch):
    settings = InferenceSettings(policy=f"{policies}:batched", n_warmup=1)
    with InferenceRun(settings, dataset_root="", chunk_size=8) as run:
        module = _policy_module(run)  # the run's clock is the policy's: a call lasts exactly what its sample adds
        monkeypatch.setattr(inference, "time", types.SimpleNamespace(perf_counter=lambda: module.CLOCK[0]))
        found = run.chunks_per_call([1, 2, 4, 8], rounds=5)
        observation = run.work.observation
    assert tuple(observation.shape) == (1, 4)  # the run's own observation is back
    rows = {r["size"]: r for r in found["by_size"]}
    for b, cost in module.COST.items():
        assert found["latency_sec"][str(b)] == pytest.approx([cost] * 5)
        assert rows[b]["median_sec"] == pytest.approx(cost) and rows[b]["chunks_per_sec"] == pytest.approx(b / cost)
    assert rows[2]["over_smallest"] == pytest.approx(1.1) and 1.1 < 1 + FREE_PCT / 100 < 3.0
    assert found["free_up_to"] == 2 and found["knee"] == 4


def test_every_size_free_has_no_knee(policies, monkeypatch):
    with InferenceRun(InferenceSettings(policy=f"{policies}:batched"), dataset_root="", chunk_size=8) as run:
        module = _policy_module(run)
        monkeypatch.setattr(inference, "time", types.SimpleNamespace(perf_counter=lambda: module.CLOCK[0]))
        found = run.chunks_per_call([1, 2], rounds=3)
    assert found["knee"] is None and found["free_up_to"] == 2


def test_a_stateful_policy_refuses_chunks_per_call(policies):
    with InferenceRun(InferenceSettings(policy=f"{policies}:stateful"), dataset_root="", chunk_size=8) as run:
        with pytest.raises(ValueError, match=r"^chunks per call are refused for policy .*: it is stateful"):
            run.chunks_per_call([1, 2], rounds=1)


def test_bench_inference_reports_what_it_recorded(policies, tmp_path, capsys):
    args = ["bench-inference", "--config", TINY, "--policy", f"{policies}:batched", "--n-timed", "4"]
    args += ["--chunks-per-call", "4,1,2", "--output-dir", str(tmp_path), "--json", str(tmp_path / "b.json")]
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    chunks = json.loads((tmp_path / "b.json").read_text())["chunks_per_call"]
    assert chunks["sizes"] == [1, 2, 4] and chunks["rounds"] == 4
    base = median(chunks["latency_sec"]["1"])
    for row in chunks["by_size"]:
        calls = chunks["latency_sec"][str(row["size"])]
        assert len(calls) == 4 and row["median_sec"] == median(calls) and row["p95_sec"] == percentile(calls, 95)
        assert row["over_smallest"] == pytest.approx(row["median_sec"] / base)
    slow = [r["size"] for r in chunks["by_size"] if r["over_smallest"] > 1 + FREE_PCT / 100]
    assert chunks["knee"] == (slow[0] if slow else None)
    line = next(line for line in out.out.splitlines() if line.startswith("chunks per call (median of 4"))
    assert f"1: {chunks['by_size'][0]['median_sec'] * 1e3:.2f} ms" in line


@pytest.mark.parametrize("value", ["0,2", "x", ""])
def test_bad_chunks_per_call_are_refused(value, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["bench-inference", "--config", TINY, "--chunks-per-call", value])
    assert exit_info.value.code == 2
    assert "expected one or more positive integers like 1,2,4,8" in capsys.readouterr().err
