"""Control-rate figures: the pure function on given latencies, the tools and the solver end to end.

Nothing here depends on how fast the machine is: the figures are computed on given
latencies, and the tools run policies whose calls are far from their deadline either way
(a call of microseconds against 8 s; a call that sleeps 50 ms against 1 ms).
"""

from __future__ import annotations

import json
import math
import random

import pandas as pd
import pytest
import yaml

from scopebench.cli import main
from scopebench.policy.control.figures import P999_MIN_CALLS, ControlRate, check_control, control_figures

from ..conftest import TINY
from ..helpers import SAMPLE_POLICY_SOURCE


def _pattern(n: int = 200, seed: int = 0) -> list[float]:
    """``n`` calls of 20 ms with 60 ms on every tenth, each +-1 ms of seeded jitter."""
    rng = random.Random(seed)
    return [(0.060 if i % 10 == 9 else 0.020) + rng.uniform(-0.001, 0.001) for i in range(n)]


def test_every_tenth_call_at_60_ms_misses_a_one_action_chunk_at_30_hz():
    f = control_figures(_pattern(), ControlRate(30, 1))
    assert f.deadline_sec == pytest.approx(1 / 30)
    assert f.calls == 200 and f.missed == 20 and f.missed_share == 0.1
    assert f.delay_steps == {1: 180, 2: 20} and f.worst_delay_steps == 2  # ceil(0.6) = 1, ceil(1.8) = 2
    assert f.line() == (
        "misses the deadline at 30 Hz with 1 action a chunk: 10.0% of 200 calls over 33.3 ms, worst d = 2"
    )
    d = f.as_dict()
    assert d["missed_share"] == 0.1 and d["delay_steps"] == {"1": 180, "2": 20} and d["keeps_up"] is False


def test_four_actions_a_chunk_keep_up_with_the_same_calls():
    f = control_figures(_pattern(), ControlRate(30, 4))
    assert f.deadline_sec == pytest.approx(4 / 30) and f.missed == 0 and f.keeps_up
    assert f.delay_steps == {1: 180, 2: 20}  # d does not depend on the actions executed
    assert f.line() == "keeps up at 30 Hz with 4 actions a chunk: 0.0% missed, worst d = 2"


def test_p999_needs_a_thousand_calls():
    few = control_figures(_pattern(P999_MIN_CALLS - 1), ControlRate(30, 1))
    assert few.p999_sec is None
    assert few.as_dict()["p999_sec"] is None
    assert few.as_dict()["p999_note"] == "not estimable (999 calls; needs 1000)"
    enough = control_figures([i / 1000 for i in range(P999_MIN_CALLS)], ControlRate(30, 1))  # 0 .. 999 ms
    assert enough.p999_sec == pytest.approx(0.998001)  # (1000 - 1) * 0.999 = 998.001th of the sorted values
    assert enough.as_dict()["p999_note"] is None


def test_jitter_on_a_crafted_list():
    f = control_figures([0.001, 0.002, 0.003, 0.004, 0.005], ControlRate(10, 1))
    assert f.std_sec == pytest.approx(math.sqrt(2.5) * 1e-3, rel=1e-12)  # sample std of 1..5 ms
    assert f.p99_minus_p50_sec == pytest.approx(0.00196, rel=1e-12)  # p99 = 4.96 ms, p50 = 3 ms


def test_a_latency_on_a_step_boundary_is_not_rounded_up():
    assert control_figures([0.5, 0.25], ControlRate(2, 1)).delay_steps == {1: 2}  # 0.5 s at 2 Hz is one step


@pytest.mark.parametrize(
    ("hz", "steps", "chunk", "message"),
    [
        (0, 1, 8, r"^control_hz must be a finite number > 0, got 0$"),
        ("30", 1, 8, r"^control_hz must be a finite number > 0, got '30' \(str\)$"),
        (float("inf"), 1, 8, r"^control_hz must be a finite number > 0, got inf$"),
        (30, 0, 8, r"^n_action_steps must be an integer >= 1, got 0$"),
        (30, 1.5, 8, r"^n_action_steps must be an integer >= 1, got 1.5 \(float\)$"),
        (30, 9, 8, r"^n_action_steps must be at most the chunk size 8, got 9$"),
    ],
)
def test_bad_rates_and_steps_are_refused_naming_the_key(hz, steps, chunk, message):
    with pytest.raises(ValueError, match=message):
        check_control(hz, steps, chunk)


def test_a_control_rate_is_validated_once_when_built_and_taken_as_it_is():
    # control_hz was validated 5 to 8 times per bench-inference command (and at every row of
    # Pi05Inference): the figures, the replay and its estimates now take a validated ControlRate.
    rate = ControlRate(30, 4, keys=("--control-hz", "--n-action-steps"))
    assert (rate.control_hz, rate.n_action_steps, rate.deadline_sec) == (30.0, 4, 4 / 30)
    with pytest.raises(ValueError, match=r"^--n-action-steps must be an integer >= 1, got 0$"):
        ControlRate(30, 0, keys=("--control-hz", "--n-action-steps"))
    with pytest.raises(ValueError, match=r"^n_action_steps must be given for the control-rate figures, got None$"):
        ControlRate(30, None)
    assert control_figures([0.1], rate).deadline_sec == rate.deadline_sec


def test_no_latency_is_refused():
    with pytest.raises(ValueError, match=r"^latencies must hold one call or more, got none$"):
        control_figures([], ControlRate(30, 1))


CONTROL_POLICIES = SAMPLE_POLICY_SOURCE + """

def quick():  # microseconds a call
    return _policy(lambda model, obs, num_steps: model(obs))


def slow():  # at least 50 ms a call
    def sample(model, obs, num_steps):
        time.sleep(0.05)
        return model(obs)

    return _policy(sample)
"""


@pytest.fixture(scope="module")
def control_policies(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("policies") / "control_policies.py"
    path.write_text(CONTROL_POLICIES)
    return str(path)


def _tool(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def _consistent(control: dict, latencies: list[float], hz: float, steps: int) -> None:
    """The JSON's figures agree with the JSON's own latencies."""
    deadline = steps / hz
    assert control["control_hz"] == hz and control["n_action_steps"] == steps
    assert control["deadline_sec"] == pytest.approx(deadline) and control["calls"] == len(latencies)
    assert control["missed"] == sum(t > deadline for t in latencies)
    assert control["missed_share"] == control["missed"] / len(latencies)
    assert sum(control["delay_steps"].values()) == len(latencies)
    assert control["worst_delay_steps"] == max(math.ceil(t * hz) for t in latencies)
    assert control["p999_sec"] is None and control["p999_note"] == f"not estimable ({len(latencies)} calls; needs 1000)"


def test_bench_inference_keeps_up_with_a_quick_policy(control_policies, tmp_path, capsys):
    args = ["bench-inference", "--config", TINY, "--policy", f"{control_policies}:quick", "--n-warmup", "1"]
    args += ["--n-timed", "20", "--control-hz", "1", "--n-action-steps", "8", "--output-dir", str(tmp_path)]
    code, out, err = _tool([*args, "--json", f"{tmp_path}/b.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    control = report["control"]
    _consistent(control, report["samples_sec"], 1.0, 8)
    assert control["keeps_up"] and control["missed"] == 0 and control["delay_steps"] == {"1": 20}
    assert control["verdict"] == "keeps up at 1 Hz with 8 actions a chunk: 0.0% missed, worst d = 1"
    assert f"control: {control['verdict']}" in out
    assert "p99.9 not estimable (20 calls; needs 1000)" in out
    figure = report["control_figure"]
    assert figure.endswith("_control.png") and f"control figure: {figure}" in out
    with open(figure, "rb") as fh:
        assert fh.read(8) == b"\x89PNG\r\n\x1a\n"


def test_bench_inference_names_a_policy_that_misses(control_policies, tmp_path, capsys):
    args = ["bench-inference", "--config", TINY, "--policy", f"{control_policies}:slow", "--n-warmup", "0"]
    args += ["--n-timed", "5", "--control-hz", "1000", "--n-action-steps", "1", "--output-dir", str(tmp_path)]
    code, out, err = _tool([*args, "--json", f"{tmp_path}/b.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    control = report["control"]
    _consistent(control, report["samples_sec"], 1000.0, 1)
    assert control["missed"] == 5 and not control["keeps_up"] and control["worst_delay_steps"] >= 50
    assert "control: misses the deadline at 1000 Hz with 1 action a chunk: 100.0% of 5 calls over 1.0 ms" in out


def test_bench_inference_without_a_control_rate_has_no_figures(control_policies, tmp_path, capsys):
    args = ["bench-inference", "--config", TINY, "--policy", f"{control_policies}:quick", "--n-warmup", "0"]
    code, out, err = _tool(
        [*args, "--n-timed", "2", "--output-dir", str(tmp_path), "--json", f"{tmp_path}/b.json"], capsys
    )
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    assert report["control"] is None and report["control_figure"] is None and "control:" not in out
    assert not list(tmp_path.glob("*.png"))


def test_decompose_latency_gives_the_figures_at_every_num_steps(control_policies, tmp_path, capsys):
    args = ["decompose-latency", "--config", TINY, "--policy", f"{control_policies}:quick", "--policy.n_warmup=0"]
    args += ["--num-steps", "1,3", "--repeats", "4", "--control-hz", "1", "--json", f"{tmp_path}/l.json"]
    code, out, err = _tool(args, capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "l.json").read_text())
    assert set(report["control"]) == {"1", "3"}
    for n, control in report["control"].items():
        _consistent(control, report["latency_sec"][n], 1.0, 8)  # n_action_steps: the whole chunk of 8
        assert control["keeps_up"]
        assert f"control at N={n}: keeps up at 1 Hz with 8 actions a chunk: 0.0% missed, worst d = 1" in out


@pytest.mark.parametrize(
    ("flags", "line"),
    [
        (["--control-hz", "0"], "scopebench {tool}: --control-hz must be a finite number > 0, got 0"),
        (["--control-hz", "-3"], "scopebench {tool}: --control-hz must be a finite number > 0, got -3"),
        (["--n-action-steps", "0"], "scopebench {tool}: --n-action-steps must be an integer >= 1, got 0"),
        (["--n-action-steps", "9"], "scopebench {tool}: --n-action-steps must be at most the chunk size 8, got 9"),
        (
            ["--policy.control_hz=0", "--control-hz", "5"],  # the flag wins: accepted, then --n-action-steps
            None,
        ),
        (["--policy.n_action_steps=8", "--policy.chunk_size=4"], "n_action_steps must be at most chunk_size=4, got 8"),
        (["--policy.control_hz=-1"], "scopebench {tool}: control_hz must be a finite number > 0, got -1"),
    ],
)
@pytest.mark.parametrize("tool", ["bench-inference", "decompose-latency"])
def test_bad_flags_are_refused_in_one_line_before_any_work(tool, flags, line, tmp_path, capsys, monkeypatch):
    import scopebench.policy.run.inference as inference

    def no_run(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr(inference.InferenceRun, "__init__", no_run)
    extra = ["--output-dir", str(tmp_path)] if tool == "bench-inference" else []
    flags = [*flags, "--n-action-steps", "9"] if line is None else flags
    code, _, err = _tool([tool, "--config", TINY, *flags, *extra], capsys)
    expected = "scopebench {tool}: --n-action-steps must be at most the chunk size 8, got 9" if line is None else line
    assert code == 2 and err.strip().endswith(expected.format(tool=tool)), err
    assert len(err.strip().splitlines()) == 1


def test_pi05_tiny_bench_inference_gives_the_figures_from_its_config(data_args, tmp_path, capsys):
    """The tiny config executes the whole chunk (``n_action_steps: null``, chunk 8); the rate
    comes from ``policy.control_hz``, as a config would set it."""
    args = ["bench-inference", *data_args, "--policy.control_hz=1", "--n-warmup", "1", "--n-timed", "3"]
    code, out, err = _tool([*args, "--output-dir", str(tmp_path), "--json", f"{tmp_path}/b.json"], capsys)
    assert code == 0, err
    report = json.loads((tmp_path / "b.json").read_text())
    control = report["control"]
    _consistent(control, report["samples_sec"], 1.0, 8)
    assert control["verdict"] in out and report["settings"]["control_hz"] == 1


@pytest.mark.slow
def test_pi05_inference_writes_control_columns(tmp_path):
    from conftest import REPO

    from scopebench.runs import run_benchopt

    config = tmp_path / "control.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "dataset": ["synthetic_robot"],
                "solver": [
                    {"Pi05Inference": {"n_warmup": 1, "control_hz": 1.0, "n_action_steps": 4, "profiler_warmup": 1}}
                ],
                "max-runs": 5,
                "n-repetitions": 1,
                "timeout": 600,
            }
        )
    )
    parquet = run_benchopt(REPO, config, output=tmp_path / "r.parquet").parquet
    df = pd.read_parquet(parquet)
    recorded = df[df["objective_step_time_sec"].notna()].sort_values("stop_val")
    assert len(recorded) >= 2
    assert (recorded["objective_control_hz"] == 1.0).all() and (recorded["objective_control_n_action_steps"] == 4).all()
    assert (recorded["objective_control_deadline_sec"] == 4.0).all()
    assert recorded["objective_control_calls"].tolist() == list(range(1, len(recorded) + 1))  # every call so far
    assert recorded["objective_control_p999_sec"].isna().all()
    deadline = 4.0
    missed = (recorded["objective_step_time_sec"] > deadline).cumsum()  # the rows' own calls so far
    assert recorded["objective_control_missed"].tolist() == missed.tolist()
    calls = recorded["objective_control_calls"]
    assert (recorded["objective_control_missed_pct"] - 100 * missed / calls).abs().max() < 1e-9
    last = recorded.iloc[-1]
    hist = json.loads(last["objective_control_delay_steps_json"])
    assert sum(hist.values()) == last["objective_control_calls"]
    assert (
        last["objective_control_verdict"]
        == control_figures(recorded["objective_step_time_sec"], ControlRate(1.0, 4)).line()
    )
    # the report's latency figure draws the deadline on its histogram and CDF (PNG and HTML)
    from scopebench.report import figures, html, plots
    from scopebench.report.build import read

    (series,) = figures.latency_series(read([parquet]).configs)
    assert series["deadline_ms"] == pytest.approx(4000.0)
    shapes = html._latency([series], "t")["layout"]["shapes"]
    assert [(d["xref"], d["x0"]) for d in shapes] == [("x", 4000.0), ("x2", 4000.0)]
    axes = plots._latency_figure([series], "t").axes
    assert all(any(list(line.get_xdata()) == [4000.0, 4000.0] for line in ax.get_lines()) for ax in axes)
