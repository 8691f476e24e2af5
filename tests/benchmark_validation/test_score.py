"""Scoring one validation run: crafted records (the rows a run's profiler writes) against their fault."""

from __future__ import annotations

import math

import pytest

from scopebench.validation import FaultSpec, RunRecord, score
from scopebench.validation.score import COLUMNS

#: A 2-rank DDP step of 120 ms: the regions, and the columns every recorded row has.
REGIONS = {"dataload_wait": 0.0005, "forward": 0.05, "bwd": 0.06, "optim_step": 0.001, "sync_gather": 0.002}
PARAMS = {"backend": "ddp", "nproc_per_node": 2, "profiler_mode": "custom"}


def row(**extra) -> dict:
    step = sum(REGIONS.values()) + 1e-4
    out = {f"{region}_time_sec": seconds for region, seconds in REGIONS.items()}
    out.update(total_time_sec=step + 0.002, step_time_sec=step, callback_time_sec=0.002, world_size=2)
    out.update({"bwd_comm_wait_peer_sec": 0.0, "bwd_comm_transfer_sec": 0.001, "bwd_work_sec": 0.059})
    out.update(extra)
    return out


def record(rows: list[dict], injected: float = 0.0, **kw) -> RunRecord:
    out = RunRecord(params=dict(PARAMS))
    for r in rows:
        out.add(r, injected)
    for key, value in kw.items():
        setattr(out, key, value)
    return out


#: Rank 1 late by 50 ms in bwd every iteration: the ledger's columns.
LATE = dict(late_rank=1, late_rank_delay_sec=0.051, late_rank_region="bwd", late_rank_work_excess_sec=0.05,
            late_rank_cause="work", late_rank_wait_region="bwd", bwd_comm_wait_peer_sec=0.05)  # fmt: skip


def test_every_column_is_there_with_benchopt_s_value():
    out = score(FaultSpec(fault="none"), RunRecord())
    assert list(out) == [*COLUMNS, "value"]
    assert all(math.isnan(out[c]) for c in ("detected", "false_positive", "overhead_pct"))  # nothing recorded yet


def test_a_late_rank_named_with_its_rank_phase_and_delay():
    spec = FaultSpec(fault="late_rank", rank=1, phase="bwd", delay_ms=50)
    out = score(spec, record([row(**LATE)] * 6, injected=0.050))
    assert (out["detected"], out["named_right"], out["false_positive"], out["value"]) == (1.0, 1.0, 0.0, 0.0)
    # its own extra work in bwd (50.0 ms) against the injected; the delay the other rank waited (51 ms) apart
    assert out["reported"] == pytest.approx(0.050) and out["injected"] == pytest.approx(0.050)
    assert out["error_pct"] == pytest.approx(0.0, abs=1e-9) and out["delay_error_pct"] == pytest.approx(2.0)
    assert "late-rank" in out["findings"].split(",")


def test_a_late_rank_in_another_phase_or_rank_is_detected_but_not_named_right():
    for spec in (FaultSpec(fault="late_rank", rank=0, phase="bwd"), FaultSpec(fault="late_rank", phase="forward")):
        out = score(spec, record([row(**LATE)] * 6, injected=0.05))
        assert (out["detected"], out["named_right"], out["value"]) == (1.0, 0.0, 1.0)


def test_a_late_rank_the_ledger_does_not_find_is_not_detected():
    # late in half of the iterations: under late-rank's 75 %
    rows = [row(**{**LATE, "late_rank": i % 2}) for i in range(6)]
    out = score(FaultSpec(fault="late_rank"), record(rows, injected=0.05))
    assert (out["detected"], out["named_right"], out["value"]) == (0.0, 0.0, 1.0)
    assert math.isnan(out["error_pct"]) and math.isnan(out["steps_to_detect"])


def test_steps_to_detect_is_the_first_prefix_that_found_the_fault():
    spec = FaultSpec(fault="late_rank")
    rec = RunRecord(params=dict(PARAMS))
    seen = []
    for i in range(10):
        rec.add(row(**{**LATE, "late_rank": 0 if i < 2 else 1}), 0.05)  # rank 0 named first, twice
        seen.append(score(spec, rec)["steps_to_detect"])
    # rank 1 in 1 of 3, 2 of 4 ... 5 of 7 iterations (71 %), then 6 of 8: 75 %, late-rank's threshold
    assert all(math.isnan(x) for x in seen[:7]) and seen[7:] == [8.0, 8.0, 8.0]
    for _ in range(6):  # rank 0 again, until rank 1 is under 75 %: no finding, nothing detected
        rec.add(row(**{**LATE, "late_rank": 0}), 0.05)
    assert math.isnan(score(spec, rec)["steps_to_detect"]) and score(spec, rec)["detected"] == 0.0


def test_on_a_run_without_a_fault_any_finding_about_the_step_is_a_false_positive():
    spec = FaultSpec(fault="none")
    clean = score(spec, record([row()] * 6))
    assert (clean["false_positive"], clean["false_positive_rules"], clean["value"]) == (0.0, "", 0.0)
    assert math.isnan(clean["detected"])
    sync = score(spec, record([row(sync_gather_time_sec=0.01)] * 6))  # 7.6 % of the step
    assert (sync["false_positive"], sync["false_positive_rules"], sync["value"]) == (1.0, "host-sync-bound", 1.0)


def test_a_busy_machine_or_a_costly_profiler_is_no_false_positive():
    busy = dict(host_other_cpu_pct=70.0, host_steal_pct=0.0, profiler_overhead_sec=0.05)
    out = score(FaultSpec(fault="none"), record([row(**busy)] * 6))
    assert {"contended", "profiler-too-costly"} <= set(out["findings"].split(","))
    assert (out["false_positive"], out["contended"], out["value"]) == (0.0, 1.0, 0.0)


def test_contention_is_found_by_contended():
    out = score(FaultSpec(fault="contention", magnitude=1), record([row(host_other_cpu_pct=45.0)] * 6))
    assert (out["detected"], out["named_right"], out["false_positive"]) == (1.0, 1.0, 0.0)
    assert out["reported"] == pytest.approx(45.0)


def test_rank_imbalance_naming_the_late_rank_is_no_false_positive_of_a_late_rank():
    rows = [row(**LATE, forward_rank_skew_pct=40.0)] * 6
    out = score(FaultSpec(fault="late_rank"), record(rows, injected=0.05))
    assert "rank-imbalance" in out["findings"] and out["false_positive"] == 0.0


def test_slow_input_reports_the_input_s_time():
    rows = [row(dataload_wait_time_sec=0.0305)] * 6
    out = score(FaultSpec(fault="slow_input", delay_ms=30), record(rows, injected=0.030))
    assert (out["detected"], out["named_right"]) == (1.0, 1.0)
    assert out["error_pct"] == pytest.approx(100 * 0.0005 / 0.030)
    # under the torch profiler a region's wall time is its _cpu_sec
    whole = ("total_time_sec", "step_time_sec", "callback_time_sec")
    torch_rows = [{(k if k in whole else k.replace("_time_sec", "_cpu_sec")): v for k, v in r.items()} for r in rows]
    torch_out = score(FaultSpec(fault="slow_input", delay_ms=30), record(torch_rows, injected=0.030))
    assert torch_out["error_pct"] == pytest.approx(100 * 0.0005 / 0.030)


def test_memory_growth_reports_the_peak_s_slope():
    rows = [row(mem_peak_mb=100.0 + 4.0 * i) for i in range(8)]
    out = score(FaultSpec(fault="memory_growth", magnitude=4), record(rows))
    assert (out["detected"], out["named_right"]) == (1.0, 1.0)
    assert out["reported"] == pytest.approx(4.0) and out["error_pct"] == pytest.approx(0.0, abs=1e-9)


def test_a_nonfinite_stop_at_the_injected_step_and_rank_is_named_right():
    spec = FaultSpec(fault="nonfinite", rank=1, step=3)
    out = score(spec, record([row()] * 2, stopped_at=3, stopped_rank=1))
    assert (out["detected"], out["named_right"], out["stopped_at"], out["steps_to_detect"]) == (1.0, 1.0, 3.0, 1.0)
    late = score(spec, record([row()] * 2, stopped_at=4, stopped_rank=1))
    assert (late["detected"], late["named_right"], late["steps_to_detect"]) == (1.0, 0.0, 2.0)
    missed = score(spec, record([row()] * 6))
    assert (missed["detected"], missed["value"]) == (0.0, 1.0)


def test_the_overhead_is_the_profiled_step_over_the_unprofiled_one_with_its_interval():
    rec = record([row()] * 8)
    rec.pairs = [(0.100 + 0.001 * i, 0.110 + 0.001 * i, 0.005) for i in range(8)]
    out = score(FaultSpec(fault="none"), rec)
    assert out["overhead_pct"] == pytest.approx(100 * 0.1135 / 0.1035 - 100)
    assert out["overhead_low_pct"] <= out["overhead_pct"] <= out["overhead_high_pct"]
    assert out["overhead_total_pct"] == pytest.approx(100 * 0.1185 / 0.1035 - 100)


def test_a_rank_late_in_its_input_is_also_an_input_that_does_not_keep_up():
    late = {**LATE, "late_rank_region": "dataload_wait", "dataload_wait_time_sec": 0.05}
    out = score(FaultSpec(fault="late_rank", phase="dataload_wait"), record([row(**late)] * 6, injected=0.05))
    assert {"late-rank", "input-bound"} <= set(out["findings"].split(","))
    assert (out["named_right"], out["false_positive"]) == (1.0, 0.0)
    other = score(
        FaultSpec(fault="late_rank", phase="bwd"), record([row(**{**LATE, "dataload_wait_time_sec": 0.05})] * 6)
    )
    assert other["false_positive_rules"] == "input-bound"
