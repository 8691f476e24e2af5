"""The profiler's cost in every tool that times steps: each prints the ``profiler cost:`` line
of ``scopebench summary`` once and writes the same numbers in its JSON (``profiler_cost``)."""

from __future__ import annotations

import re

import pytest

from scopebench.report.cost import measured_cost

from .test_tool_contention import TOOLS, run

LINE = re.compile(r"^profiler cost: [\d.]+ (µs|ms) / step \([\d.]+% of the step\): .* inside the step \+ .*start-up")


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_a_tool_prints_the_profiler_cost_and_writes_it(tool, monkeypatch, data_args, tmp_path, capsys):
    text, report, steps = run(tool, data_args, tmp_path, capsys, monkeypatch)
    cost = report["profiler_cost"]
    assert cost is not None, report.keys()
    lines = [line for line in text.splitlines() if line.startswith("profiler cost: ")]
    assert lines == [cost["line"]], text
    assert LINE.match(cost["line"]), cost["line"]
    assert cost["steps"] == steps
    assert cost["per_step_sec"] == pytest.approx(cost["inside_sec"] + cost["outside_sec"], rel=0.5)
    assert 0 < cost["inside_sec"] and 0 < cost["outside_sec"] and cost["startup_sec"] >= 0
    assert 0 < cost["share_pct"] < 100
    assert cost["sampler_cpu_sec"] is not None and cost["sampler_cpu_sec"] >= 0


def test_measured_cost_takes_the_steady_state_and_the_start_up_apart():
    steps = [{"total_time_sec": 0.01, "profiler_overhead_sec": 3e-3, "profiler_inside_sec": 1e-5}]
    steps += [
        {"total_time_sec": 0.01, "step_time_sec": 0.01, "profiler_overhead_sec": 4e-5, "profiler_inside_sec": 6e-5}
    ] * 5
    cost = measured_cost(steps)["profiler_cost"]
    assert cost["per_step_sec"] == pytest.approx(1e-4) and cost["share_pct"] == pytest.approx(1.0)
    assert cost["inside_sec"] == pytest.approx(6e-5) and cost["outside_sec"] == pytest.approx(4e-5)
    assert cost["startup_sec"] == pytest.approx(3.01e-3 - 1e-4) and cost["sampler_cpu_sec"] is None
    assert cost["line"] == (
        "profiler cost: 100 µs / step (1.0% of the step): 60 µs inside the step + 40 µs outside the clock; "
        "start-up 2.9 ms once"
    )
    assert measured_cost([{"total_time_sec": 0.01}]) == {"profiler_cost": None}
