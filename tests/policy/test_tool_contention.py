"""Contention in every tool that times steps: beside a busy loop on each core each tool prints
the ``CONTENDED:`` line of ``scopebench summary`` and records it in its JSON; alone it does not;
with the sampler off it prints nothing and writes ``contention: null``."""

from __future__ import annotations

import json
import os

import pytest
from conftest import machine_other_pct

from scopebench.cli import main
from scopebench.report.contention import ITERATION_OTHER_CPU_PCT, OTHER_CPU_PCT, STEAL_PCT, measured_steps


def tool_args(tool: str, data_args: list[str], tmp_path) -> tuple[list[str], int]:
    """A tiny run of ``tool`` writing its JSON to ``tmp_path / out.json``, and its measured steps."""
    out = ["--json", str(tmp_path / "out.json")]
    runs = {
        "profile-step": (["--warmup", "1", "--steps", "20"], 20),
        "profile-dataloader": (["--warmup", "1", "--batches", "60"], 60),
        "bench-inference": (["--n-timed", "30", "--n-warmup", "1", "--output-dir", str(tmp_path)], 30),
        "decompose-latency": (["--num-steps", "1,2", "--repeats", "40", "--policy.n_warmup=1"], 80),
        # one measured step per trial (None: as many as the JSON's trials)
        "find-max-batch": (["--memory-gb", "1", "--max-batch", "4", "--find_unused_params=false"], None),
        "train": (["--steps", "30", "--output-dir", str(tmp_path / "run")], 30),
    }
    extra, steps = runs[tool]
    return [tool, *data_args, *extra, *out], steps


TOOLS = ["profile-step", "profile-dataloader", "bench-inference", "decompose-latency", "find-max-batch", "train"]
#: The sampler's period in these tests: each tool's window on the tiny config lasts a few hundred
#: milliseconds on a quiet machine (a trial's one measured step, 60 batches, 30 calls, 80 calls of
#: one or two denoising steps, 20 or 30 training steps), and a CPU share needs 20 clock ticks (100 ms
#: on two CPUs, the sampler's rule), so with the default 100 ms period the first steps get none and a
#: quick run none at all.
PERIOD_SEC = "0.01"


def run(tool, data_args, tmp_path, capsys, monkeypatch):
    if "SCOPEBENCH_SAMPLER_PERIOD_SEC" not in os.environ:  # a test that turns the sampler off set it
        monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", PERIOD_SEC)
    args, steps = tool_args(tool, data_args, tmp_path)
    code = main(args)
    out = capsys.readouterr()
    assert code == 0, out.err
    report = json.loads((tmp_path / "out.json").read_text())
    return out.out, report, steps if steps is not None else len(report["trials"])


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_next_to_a_cpu_hog_on_each_core_says_contended(tool, hogs, monkeypatch, data_args, tmp_path, capsys):
    text, report, steps = run(tool, data_args, tmp_path, capsys, monkeypatch)
    host = report["contention"]
    assert host is not None and host["contended"], host
    assert host["other_pct"] > OTHER_CPU_PCT and host["affected"], host
    lines = [line for line in text.splitlines() if line.startswith("CONTENDED: ")]
    assert len(lines) == 1, text
    assert lines[0].startswith(f"CONTENDED: {host['line'][len('CONTENDED: '):]}")
    assert f"other processes took {host['other_pct']:.1f}% of the run's CPUs" in lines[0]
    assert f"{len(host['affected'])} of {host['sampled']} iterations affected (" in lines[0]
    assert len(report["host_other_cpu_pct"]) == len(report["host_steal_pct"]) == steps
    if tool == "decompose-latency":
        assert lines[0].endswith(": the fit's points were measured on a busy machine")


@pytest.mark.slow
@pytest.mark.alone
@pytest.mark.parametrize("tool", TOOLS)
def test_the_same_tool_alone_is_not_contended(tool, monkeypatch, data_args, tmp_path, capsys):
    before = machine_other_pct()
    if before > OTHER_CPU_PCT / 2:
        pytest.skip(f"the machine is busy: other processes took {before:.1f}% of its CPUs before the run")
    text, report, _ = run(tool, data_args, tmp_path, capsys, monkeypatch)
    host = report["contention"]
    assert host is not None, f"no step of {tool} got a sampler value: {report['host_other_cpu_pct']}"
    if host["contended"]:
        after = machine_other_pct()
        if after > OTHER_CPU_PCT / 2:
            pytest.skip(f"the machine became busy during the run ({before:.1f}% before, {after:.1f}% after)")
    quiet = f"on a quiet machine ({before:.1f}% other before the run): {host['line']}"
    assert host["other_pct"] <= OTHER_CPU_PCT and host["other_max_pct"] <= ITERATION_OTHER_CPU_PCT, quiet
    if host["steal_pct"] <= STEAL_PCT:  # steal is another machine's doing: a run that had it is contended
        assert not host["contended"] and "CONTENDED" not in text, f"flagged {quiet}"
        assert "\nhost load: other processes took" in text


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["profile-step", "train"])
def test_with_the_sampler_off_a_tool_says_nothing_of_the_host(tool, monkeypatch, data_args, tmp_path, capsys):
    monkeypatch.setenv("SCOPEBENCH_SAMPLER_PERIOD_SEC", "0")
    text, report, steps = run(tool, data_args, tmp_path, capsys, monkeypatch)
    assert report["contention"] is None and "CONTENDED" not in text and "host load:" not in text
    assert report["host_other_cpu_pct"] == [None] * steps


def test_measured_steps_numbers_the_steps_and_weights_them_by_time():
    steps = [
        {"total_time_sec": 0.1},  # the first step of a window: no sampler value yet
        {"total_time_sec": 0.1, "host_other_cpu_pct": 5.0, "host_steal_pct": 0.0},
        {"total_time_sec": 0.3, "host_other_cpu_pct": 45.0, "host_steal_pct": 0.0},
    ]
    found = measured_steps(steps, first=11)
    host = found["contention"]
    assert found["host_other_cpu_pct"] == [None, 5.0, 45.0]
    assert host["other_pct"] == pytest.approx((5.0 * 0.1 + 45.0 * 0.3) / 0.4) and host["other_max_pct"] == 45.0
    assert host["affected"] == [13] and host["sampled"] == 2 and host["contended"]
    assert host["line"] == (
        "CONTENDED: other processes took 35.0% of the run's CPUs (max 45.0%), steal 0.0% (max 0.0%); "
        "1 of 2 iterations affected (13)"
    )
    assert measured_steps([{"total_time_sec": 0.1}])["contention"] is None
    quiet = measured_steps(steps[:2])["contention"]
    assert not quiet["contended"] and quiet["line"].startswith("host load: other processes took 5.0%")
