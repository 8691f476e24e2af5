"""scopebench compare: B/A of medians with a seeded bootstrap interval, flagging only real changes."""

from __future__ import annotations

import json

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
