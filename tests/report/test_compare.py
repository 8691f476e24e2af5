"""scopebench compare: B/A of medians with a seeded bootstrap interval, flagging only real changes."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from scopebench import stats
from scopebench.cli import main
from scopebench.report.build import read
from scopebench.report.compare import compare

from .helpers import config_rows, write

REGIONS = {"forward": 0.010, "bwd": 0.020, "optim_step": 0.004}


def run_of(tmp_path, name, seed, slow_region=None, params=None):
    regions = dict(REGIONS)
    if slow_region:
        regions[slow_region] *= 2.0
    rows = config_rows("Pi05Train", regions, n=40, noise=0.05, seed=seed, params=params)
    return write(tmp_path / f"{name}.parquet", rows)


def flagged(result):
    return {r.region for r in result.rows if r.change and r.region != "step"}


def test_two_runs_of_the_same_configuration_flag_nothing(tmp_path):
    # Independent noise draws of the same configuration (seeded, so the test is deterministic).
    for seed in range(1, 6):
        a, b = read([run_of(tmp_path, "a", 100 + seed)]), read([run_of(tmp_path, "b", 200 + seed)])
        result = compare(a.configs, b.configs)
        assert {r.region for r in result.rows} == {"forward", "bwd", "optim_step", "step"}
        assert [r for r in result.rows if r.change] == [], result.rows


def test_injected_slowdown_is_flagged_in_that_region_only(tmp_path):
    a, b = read([run_of(tmp_path, "a", 1)]), read([run_of(tmp_path, "b", 2, slow_region="bwd")])
    result = compare(a.configs, b.configs)
    assert flagged(result) == {"bwd"}
    (bwd,) = [r for r in result.rows if r.region == "bwd"]
    assert bwd.change == "slower" and bwd.ci_low > 1.0 and bwd.ratio == pytest.approx(2.0, rel=0.1)
    # The step holds bwd, so it is slower as well.
    assert [r.change for r in result.rows if r.region == "step"] == ["slower"]


def test_interval_is_seeded_and_lives_in_stats(tmp_path):
    a = [0.01 * (1 + 0.01 * k) for k in range(30)]
    b = [2 * x for x in a]
    assert stats.median_ratio_ci(a, b, seed=3) == stats.median_ratio_ci(a, b, seed=3)
    ratio, low, high = stats.median_ratio_ci(a, b)
    assert ratio == pytest.approx(2.0) and low <= 2.0 <= high


def test_ab_parameter_is_left_out_of_the_match(tmp_path, capsys):
    a = run_of(tmp_path, "unfused", 1, params={"fused_adamw": False, "batch_size": 8})
    b = run_of(tmp_path, "fused", 2, slow_region="optim_step", params={"fused_adamw": True, "batch_size": 8})
    assert main(["compare", a, b, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["differences"] == {"fused_adamw": {"a": ["False"], "b": ["True"]}}
    assert {r["region"] for r in payload["rows"] if r["change"]} == {"optim_step", "step"}
    assert payload["unmatched_a"] == payload["unmatched_b"] == []
    assert main(["compare", a, b]) == 0
    assert "A/B difference: fused_adamw: False -> True" in capsys.readouterr().out


def test_nothing_matches_is_an_error(tmp_path, capsys):
    a = write(tmp_path / "a.parquet", config_rows("PnP", {"x": 0.01}, objective="Imaging inference"))
    b = write(tmp_path / "b.parquet", config_rows("UnrolledPnP", {"y": 0.01}, objective="unrolled"))
    assert main(["compare", a, b]) == 2
    assert "no configuration of A matches one of B" in capsys.readouterr().err


@pytest.mark.slow
def test_real_quickstart_against_itself_and_against_a_slowed_copy(quickstarts, tmp_path):
    real = quickstarts["training"]
    same = compare(read([real]).configs, read([real]).configs)
    assert same.rows and [r for r in same.rows if r.change] == []
    df = pd.read_parquet(real)
    recorded = df["objective_forward_time_sec"].notna()
    df.loc[recorded, "objective_total_time_sec"] += df.loc[recorded, "objective_forward_time_sec"]
    df.loc[recorded, "objective_forward_time_sec"] *= 2.0
    df.to_parquet(tmp_path / "slow.parquet")
    result = compare(read([real]).configs, read([tmp_path / "slow.parquet"]).configs)
    assert flagged(result) == {"forward"}


# --- the gate (compare --fail-slower / --fail-memory) ---------------------------------------


def gated_run(tmp_path, name, seed, factor=1.0, n=40, other=None, rss=1000.0):
    regions = {region: t * factor for region, t in REGIONS.items()}
    extra = {"max_rss_mb": rss, **({"host_other_cpu_pct": other, "host_steal_pct": 0.0} if other is not None else {})}
    return write(
        tmp_path / f"{name}.parquet", config_rows("Pi05Train", regions, n=n, noise=0.05, seed=seed, extra=extra)
    )


def gate_of(capsys, a, b, *flags):
    code = main(["compare", a, b, *flags, "--json"])
    return code, json.loads(capsys.readouterr().out)["gate"]


def test_the_gate_fails_a_30_percent_slower_b_and_passes_an_equal_one(tmp_path, capsys):
    a = gated_run(tmp_path, "a", 1)
    code, verdict = gate_of(capsys, a, gated_run(tmp_path, "slow", 2, factor=1.3), "--fail-slower", "10")
    assert (code, verdict["verdict"], verdict["exit_status"]) == (1, "regression", 1)
    assert {r["what"] for r in verdict["rows"] if r["verdict"] == "regression"} == {*REGIONS, "step"}
    code, verdict = gate_of(capsys, a, gated_run(tmp_path, "same", 3), "--fail-slower", "10")
    assert (code, verdict["verdict"]) == (0, "pass") and all(r["verdict"] == "pass" for r in verdict["rows"])
    assert main(["compare", a, gated_run(tmp_path, "slow2", 4, factor=1.3), "--fail-slower", "10"]) == 1
    text = capsys.readouterr().out
    assert "gate: REGRESSION: step of Pi05Train" in text and text.rstrip().endswith(
        "gate: REGRESSION (0 rows within their limits)"
    )


def test_a_contended_side_makes_the_gate_inconclusive(tmp_path, capsys):
    a = gated_run(tmp_path, "a", 1, other=2.0)
    code, verdict = gate_of(capsys, a, gated_run(tmp_path, "busy", 2, factor=1.3, other=45.0), "--fail-slower", "10")
    assert (code, verdict["verdict"]) == (3, "inconclusive")
    assert all("the run was contended (B: other processes took 45.0%" in r["reason"] for r in verdict["rows"])
    both = gated_run(tmp_path, "both", 3, other=45.0)
    code, verdict = gate_of(capsys, gated_run(tmp_path, "a_busy", 4, other=45.0), both, "--fail-slower", "10")
    assert code == 3 and "A: other processes took 45.0%" in verdict["rows"][0]["reason"]


def test_at_small_samples_the_interval_decides_and_only_a_straddled_limit_is_inconclusive(tmp_path, capsys):
    # 8 iterations a side, B 10x slower: the interval lies far above the limit (was "needs 10")
    small = gated_run(tmp_path, "a8", 1, n=9), gated_run(tmp_path, "b8", 2, n=9, factor=10.0)
    code, verdict = gate_of(capsys, *small, "--fail-slower", "10")
    assert (code, verdict["verdict"]) == (1, "regression"), verdict
    assert all(r["verdict"] == "regression" and r["ci_low"] > 8.0 for r in verdict["rows"]), verdict
    # ... and the same configuration at 8 a side lies within a 50 % limit
    code, verdict = gate_of(capsys, small[0], gated_run(tmp_path, "same8", 3, n=9), "--fail-slower", "50")
    assert (code, verdict["verdict"]) == (0, "pass"), verdict
    # 4 a side (the rank interval) still decides a 10x slow-down; 3 a side holds no 95 % interval
    four = gated_run(tmp_path, "a4", 4, n=5), gated_run(tmp_path, "b4", 5, n=5, factor=10.0)
    assert gate_of(capsys, *four, "--fail-slower", "10")[0] == 1
    three = gated_run(tmp_path, "a3", 6, n=4), gated_run(tmp_path, "b3", 7, n=4, factor=10.0)
    code, verdict = gate_of(capsys, *three, "--fail-slower", "step=10")
    (step,) = verdict["rows"]
    assert (code, step["ci_high"]) == (3, None), step
    assert step["reason"].endswith(
        "from 3 / 3 iterations: too few for a 95% interval (stats.scale_ratio_ci): rerun both sides with more iterations"
    )
    # B about 10 % slower against a 10 % limit: the interval holds the limit
    code, verdict = gate_of(
        capsys, gated_run(tmp_path, "a", 3), gated_run(tmp_path, "b", 4, factor=1.1), "--fail-slower", "step=10"
    )
    (step,) = verdict["rows"]
    assert code == 3 and step["what"] == "step" and step["ci_low"] <= 1.1 < step["ci_high"], step
    assert step["reason"].endswith("straddles the limit 1.100: rerun both sides with more iterations")


def test_a_configuration_on_one_side_only_is_never_passed(tmp_path, capsys):
    # A ran batch sizes 8 and 16; in B the 16 one was renamed (17) and runs 2x slower
    a = write(
        tmp_path / "a.parquet",
        config_rows("Pi05Train", REGIONS, n=40, seed=1, params={"batch_size": 8}),
        config_rows("Pi05Train", REGIONS, n=40, seed=2, params={"batch_size": 16}),
    )
    slow = {region: 2 * t for region, t in REGIONS.items()}
    b = write(
        tmp_path / "b.parquet",
        config_rows("Pi05Train", REGIONS, n=40, seed=3, params={"batch_size": 8}),
        config_rows("Pi05Train", slow, n=40, seed=4, params={"batch_size": 17}),
    )
    code, verdict = gate_of(capsys, a, b, "--fail-slower", "10")
    assert (code, verdict["verdict"]) == (3, "inconclusive"), verdict
    named = {(r["config"], r["reason"]) for r in verdict["rows"] if r["what"] == "configuration"}
    assert named == {
        ("Pi05Train[batch_size=16]", "not compared: in A only: no configuration of B matches it"),
        ("Pi05Train[batch_size=17]", "not compared: in B only: no configuration of A matches it"),
    }
    assert main(["compare", a, b, "--fail-slower", "10"]) == 3
    text = capsys.readouterr().out
    assert "gate: INCONCLUSIVE: Pi05Train[batch_size=16]: not compared: in A only" in text
    assert text.rstrip().endswith("gate: INCONCLUSIVE (4 rows within their limits)")
    # a memory gate alone does not pass it either
    assert gate_of(capsys, a, b, "--fail-memory", "10")[0] == 3


def _unrecorded(rows):
    """``rows`` as a run whose profiler recorded no iteration (no time column on any row)."""
    return [{k: v for k, v in row.items() if not k.endswith("_time_sec")} for row in rows]


def test_a_configuration_without_a_recorded_iteration_is_listed_and_never_passed(tmp_path, capsys):
    a = write(
        tmp_path / "a.parquet",
        config_rows("Pi05Train", REGIONS, n=40, seed=1, params={"batch_size": 8}),
        config_rows("Pi05Train", REGIONS, n=40, seed=2, params={"batch_size": 16}),
    )
    b = write(
        tmp_path / "b.parquet",
        config_rows("Pi05Train", REGIONS, n=40, seed=3, params={"batch_size": 8}),
        _unrecorded(config_rows("Pi05Train", REGIONS, n=40, seed=4, params={"batch_size": 16})),
    )
    code, verdict = gate_of(capsys, a, b, "--fail-slower", "10")
    assert code == 3 and [r for r in verdict["rows"] if r["verdict"] != "pass"] == [
        {
            "benchmark": "pi05 policy",
            "config": "Pi05Train[batch_size=16]",
            "what": "configuration",
            "limit": None,
            "ratio": None,
            "ci_low": None,
            "ci_high": None,
            "verdict": "inconclusive",
            "reason": "not compared: B recorded no iteration of it",
        }
    ]
    assert main(["compare", a, b]) == 0  # without a gate: listed, not refused
    assert "not compared: Pi05Train[batch_size=16]: B recorded no iteration of it" in capsys.readouterr().out
    # the only configuration unrecorded: matched, nothing compared, inconclusive (not "nothing matches")
    lone_a = write(tmp_path / "lone_a.parquet", config_rows("Pi05Train", REGIONS, n=40, seed=5))
    lone_b = write(tmp_path / "lone_b.parquet", _unrecorded(config_rows("Pi05Train", REGIONS, n=40, seed=6)))
    assert gate_of(capsys, lone_a, lone_b, "--fail-slower", "10")[0] == 3


def test_non_finite_step_times_are_never_passed(tmp_path, capsys):
    a = gated_run(tmp_path, "a", 1)
    rows = config_rows("Pi05Train", REGIONS, n=40, noise=0.05, seed=2, extra={"max_rss_mb": 1000.0})
    rows[5]["objective_total_time_sec"] = math.inf
    rows[6]["objective_total_time_sec"] = math.inf
    rows[7]["objective_bwd_time_sec"] = math.nan
    b = write(tmp_path / "b.parquet", rows)
    code, verdict = gate_of(capsys, a, b, "--fail-slower", "10")
    assert (code, verdict["verdict"]) == (3, "inconclusive"), verdict
    reasons = {r["what"]: r["reason"] for r in verdict["rows"]}
    assert reasons["step"].endswith("but non-finite times were left out of it (B: 2 in total_time_sec)")
    assert reasons["bwd"].endswith("(B: 2 in total_time_sec, 1 in bwd_time_sec)")
    assert main(["compare", a, b]) == 0
    assert "! non-finite times left out: B: 2 in total_time_sec" in capsys.readouterr().out


def test_a_region_one_side_lacks_is_never_passed(tmp_path, capsys):
    a = gated_run(tmp_path, "a", 1)
    renamed = {("optim" if region == "optim_step" else region): t for region, t in REGIONS.items()}
    b = write(tmp_path / "b.parquet", config_rows("Pi05Train", renamed, n=40, noise=0.05, seed=2))
    code, verdict = gate_of(capsys, a, b, "--fail-slower", "10")
    assert code == 3 and {r["what"]: r["reason"] for r in verdict["rows"] if r["verdict"] != "pass"} == {
        "optim_step": "not compared: only A records it",
        "optim": "not compared: only B records it",
    }
    assert gate_of(capsys, a, b, "--fail-slower", "bwd=10")[0] == 0  # a threshold on bwd only


def test_a_zero_median_region_is_named_and_the_rest_compared(tmp_path, capsys):
    regions = {**REGIONS, "zero_grad": 0.0}
    a = write(tmp_path / "a.parquet", config_rows("Pi05Train", regions, n=40, seed=1))
    b = write(tmp_path / "b.parquet", config_rows("Pi05Train", regions, n=40, seed=2))
    assert main(["compare", a, b, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {r["region"] for r in payload["rows"]} == {*REGIONS, "step"}
    assert payload["not_compared"] == [
        {
            "benchmark": "pi05 policy",
            "config": "Pi05Train",
            "what": "zero_grad",
            "reason": "A's median is 0 ms: B/A has no value",
        }
    ]
    assert gate_of(capsys, a, b, "--fail-slower", "10")[0] == 3
    assert gate_of(capsys, a, b, "--fail-slower", "bwd=10")[0] == 0


def test_per_region_and_memory_thresholds(tmp_path, capsys):
    a, slow = gated_run(tmp_path, "a", 1), gated_run(tmp_path, "slow", 2, factor=1.3)
    code, verdict = gate_of(capsys, a, slow, "--fail-slower", "bwd=50")  # only bwd, at 50 %
    assert (code, [r["what"] for r in verdict["rows"]]) == (0, ["bwd"])
    code, verdict = gate_of(capsys, a, gated_run(tmp_path, "fat", 3, rss=1300.0), "--fail-memory", "20")
    assert code == 1 and [(r["what"], r["verdict"]) for r in verdict["rows"]] == [("max_rss_mb", "regression")]
    assert verdict["rows"][0]["reason"] == "peak 1300.0 MB against 1000.0 MB (B/A 1.300) above the limit 1.200"
    assert gate_of(capsys, a, gated_run(tmp_path, "lean", 4, rss=1100.0), "--fail-memory", "20")[0] == 0
    # a peak of 0 (max_gpu_mb of a CPU run) is no memory to judge: nothing gated, inconclusive
    none = gated_run(tmp_path, "cpu_a", 5, rss=0.0), gated_run(tmp_path, "cpu_b", 6, rss=0.0)
    assert gate_of(capsys, *none, "--fail-memory", "20") == (
        3,
        {"verdict": "inconclusive", "exit_status": 3, "rows": []},
    )


@pytest.mark.parametrize(
    "flags, line",
    [
        (["--fail-slower", "ten"], "--fail-slower must be PCT or REGION=PCT with PCT a number >= 0, got 'ten'"),
        (["--fail-slower", "=5"], "--fail-slower must be PCT or REGION=PCT"),
        (["--fail-memory", "-1"], "--fail-memory must be"),
        (["--seed", "-1"], "scopebench compare: --seed must be an integer >= 0, got -1\n"),
        (
            ["--fail-slower", "bwdd=5"],
            "scopebench compare: --fail-slower names region 'bwdd', which neither side records "
            "(known: bwd, forward, optim_step, step)\n",
        ),
    ],
)
def test_the_gate_refuses_bad_thresholds_and_unreadable_input_with_2(tmp_path, capsys, flags, line):
    a = gated_run(tmp_path, "a", 1)
    assert main(["compare", a, a, *flags]) == 2
    assert line in capsys.readouterr().err
    (tmp_path / "broken.parquet").write_bytes(b"not a parquet file")
    assert main(["compare", a, str(tmp_path / "broken.parquet"), "--fail-slower", "10"]) == 2
    assert capsys.readouterr().err.startswith("scopebench compare: ")
