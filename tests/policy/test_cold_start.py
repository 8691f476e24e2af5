"""Cold start: process start -> build -> first action in ``bench-inference``, and a compile that
falls back to eager reported, not hidden.

Only lower bounds on time are asserted (a factory that sleeps 0.3 s builds in at least 0.3 s),
and sums of the tool's own numbers: nothing here depends on how busy the machine is.
"""

from __future__ import annotations

import json

import pytest

from scopebench.cli import main

from .conftest import TINY
from .helpers import SAMPLE_POLICY_SOURCE

POLICIES = SAMPLE_POLICY_SOURCE + """

def slow_build():  # the factory takes at least 0.3 s
    time.sleep(0.3)
    return _policy(lambda model, obs, num_steps: model(obs))


def eager_only():  # torch.compile cannot trace it: no graph is compiled, the calls run eagerly
    @torch._dynamo.disable
    def sample(model, obs, num_steps):
        return model(obs)

    return _policy(sample)
"""


@pytest.fixture(scope="module")
def policies(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "cold_start_policies.py"
    path.write_text(POLICIES)
    return str(path)


def _bench(policy: str, tmp_path, capsys, *extra: str) -> tuple[dict, str]:
    args = ["bench-inference", "--config", TINY, "--policy", policy, "--n-timed", "3"]
    args += ["--output-dir", str(tmp_path), "--json", str(tmp_path / "b.json"), *extra]
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads((tmp_path / "b.json").read_text()), out.out


def test_the_cold_start_adds_up_from_the_process_start_to_the_first_action(policies, tmp_path, capsys):
    report, out = _bench(f"{policies}:slow_build", tmp_path, capsys, "--n-warmup", "2")
    cold = report["cold_start"]
    assert cold["build_sec"] >= 0.3  # the factory's sleep is inside the build
    assert cold["process_to_build_sec"] > 0  # this process started before the build
    assert cold["first_action_sec"] == report["warmup_sec"][0] == cold["warmup_sec"][0]
    total = cold["process_to_build_sec"] + cold["build_sec"] + cold["first_action_sec"]
    assert cold["process_to_first_action_sec"] == pytest.approx(total)
    assert cold["compile_note"] is None and cold["compile_time_sec"] is None and "compiled_graphs" not in cold
    line = next(line for line in out.splitlines() if line.startswith("cold start: "))
    assert line.endswith(f"{cold['process_to_first_action_sec']:.2f} s from process start to the first action")
    assert f"build {cold['build_sec']:.2f} s" in line and "WARNING" not in out


def test_a_compile_that_falls_back_to_eager_is_reported(policies, tmp_path, capsys):
    with pytest.warns(UserWarning, match="torch.compile compiled no graph"):
        report, out = _bench(f"{policies}:eager_only", tmp_path, capsys, "--compile-mode", "default", "--n-warmup", "3")
    cold = report["cold_start"]
    assert cold["compiled_graphs"] == 0 and cold["graph_breaks"] >= 1
    # whatever the first call's ratio says, no graph means no compilation
    assert cold["compile_note"] == (
        "compile_mode='default': torch.compile compiled no graph (the calls ran eagerly): "
        "compilation may not have happened"
    ) or cold["compile_note"].endswith(
        "and torch.compile compiled no graph (the calls ran eagerly): compilation may not have happened"
    )
    assert f"WARNING: {cold['compile_note']}" in out
    assert f"{cold['compiled_graphs']} graph(s), {cold['graph_breaks']} graph break(s)" in out
