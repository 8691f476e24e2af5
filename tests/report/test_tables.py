"""Phase tables: shares of the step without the callback, the profile_step layout, latency percentiles."""

from __future__ import annotations

import json

import pytest

from scopebench import stats
from scopebench.cli import main
from scopebench.report.results import configurations, load_results
from scopebench.report.tables import format_config, phase_rows

from .helpers import config_rows, write

TRAIN = {
    "dataload_wait": 0.001,
    "forward": 0.010,
    "bwd": 0.020,
    "unscale_clip": 0.001,
    "optim_step": 0.004,
    "zero_grad_sched": 0.0005,
    "sync_gather": 0.002,
}


@pytest.fixture
def train(tmp_path):
    extra = {"samples_per_sec": lambda i: None, "backward_step_time_sec": 0.0255}
    rows = config_rows("Pi05Train", TRAIN, callback=0.050, params={"batch_size": 8}, extra=extra, noise=0.0)
    for row in rows:  # samples_per_sec = global batch / (total - callback): 16 samples per step on 2 ranks
        if "objective_total_time_sec" in row:
            row["objective_samples_per_sec"] = 16 / (row["objective_total_time_sec"] - 0.050)
    return configurations(load_results([write(tmp_path / "t.parquet", rows)]))[0]


def test_share_is_of_the_step_without_the_callback(train):
    rows = {r["phase"]: r for r in phase_rows(train)}
    step = sum(TRAIN.values()) + 1e-4
    assert rows["step"]["mean_ms"] == pytest.approx(step * 1e3)
    assert rows["forward"]["share_pct"] == pytest.approx(0.010 / step * 100)
    assert rows["step"]["share_pct"] == pytest.approx(100.0)
    # The callback (here longer than the step) gets its own line, never a share of the step.
    assert rows["callback"]["kind"] == "callback" and rows["callback"]["share_pct"] is None
    assert rows["total"]["mean_ms"] == pytest.approx((step + 0.050) * 1e3) and rows["total"]["share_pct"] is None
    assert rows["backward_step"]["kind"] == "composite"


def test_training_step_follows_the_profile_step_layout(train):
    text = format_config(train)
    phases = [line.split()[0] for line in text.splitlines() if "mean=" in line]
    assert phases == [
        "dataload_wait", "forward", "bwd", "unscale_clip", "optim_step", "zero_grad_sched",
        "backward_step", "sync_gather", "untracked", "step", "callback", "total",
    ]  # fmt: skip
    assert "warmup=1 measured=19 ranks=1" in text
    step = sum(TRAIN.values()) + 1e-4
    assert f"throughput: {1 / step:.2f} steps/s, {16 / step:.1f} global samples/s" in text


def test_inference_gets_latency_percentiles(tmp_path):
    rows = config_rows(
        "Pi05Inference", {"prefill": 0.004, "denoise": 0.018}, noise=0.2, extra={"first_call_ratio": 7.5}
    )
    config = configurations(load_results([write(tmp_path / "i.parquet", rows)]))[0]
    step_ms = [v * 1e3 for v in config.step_values()]
    line = next(x for x in format_config(config).splitlines() if x.startswith("latency per call"))
    for name, value in (
        ("mean", stats.mean(step_ms)),
        ("p50", stats.median(step_ms)),
        ("p99", stats.percentile(step_ms, 99)),
    ):
        assert f"{name}={value:.3f}ms" in line
    assert "first call / steady state: 7.50x" in format_config(config)


def test_summary_command_prints_tables_and_json(tmp_path, capsys):
    path = write(tmp_path / "s.parquet", config_rows("PnP", {"gradient": 0.003, "denoise": 0.01}))
    assert main(["summary", path]) == 0
    out = capsys.readouterr().out
    assert "denoise" in out and "<-- step" in out and "[no-problem] PnP" in out
    assert main(["summary", path, "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert {r["phase"] for r in payload["rows"]} == {"gradient", "denoise", "untracked", "step", "callback", "total"}
    assert payload["warnings"] == [] and payload["findings"][0]["rule"] == "no-problem"
