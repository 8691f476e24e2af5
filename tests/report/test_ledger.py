"""The ledger's readings: the late rank, where a region's time went, the collectives."""

from __future__ import annotations

import json
import math

import pytest

from scopebench.report.ledger import (
    LATE_RANK_CONSISTENT_PCT,
    LATE_RANK_MIN_PCT,
    LATE_RANK_MIN_SEC,
    collective_table,
    config_late_rank,
    late_rank_summary,
    ledger_rows,
    ledger_table,
)
from scopebench.report.results import configurations, load_results

from .helpers import config_rows, write


def rows(ranks, delay=0.2, step=0.4, region="bwd", **extra):
    """One row per entry of ``ranks`` (``None``: no rank waited in that iteration)."""
    out = []
    for rank in ranks:
        row = {"step_time_sec": step, **extra}
        if rank is not None:
            row.update(late_rank=rank, late_rank_delay_sec=delay, late_rank_region=region)
        out.append(row)
    return out


def test_a_rank_late_by_200_ms_in_every_step_is_found():
    found = late_rank_summary(rows([1] * 10, late_rank_work_excess_sec=0.199, late_rank_cause="work"))
    assert (found.rank, found.delay_sec, found.region, found.cause) == (1, 0.2, "bwd", "work")
    assert (found.iterations, found.counted, found.share_pct) == (10, 10, 100.0)
    assert found.work_excess_sec == pytest.approx(0.199) and found.delay_pct == pytest.approx(50.0)


def test_the_line_names_the_rank_its_delay_the_region_and_its_own_work():
    found = late_rank_summary(rows([1] * 10, delay=0.2013, late_rank_work_excess_sec=0.2008, late_rank_cause="work"))
    assert found.line == (
        "late rank: rank 1 arrives 201.3 ms late per step in bwd (its own work there took 200.8 ms more than the "
        "other ranks'); the others wait for it"
    )
    compute = late_rank_summary(rows([1] * 4, late_rank_work_excess_sec=0.19, late_rank_cause="compute"))
    assert "more than the other ranks', mostly compute (operators))" in compute.line
    early = late_rank_summary(rows([1] * 4, late_rank_work_excess_sec=0.01))
    assert "less than half the delay: it enters bwd late" in early.line


def test_as_dict_is_json_with_the_line():
    found = late_rank_summary(rows([0] * 4))
    back = json.loads(json.dumps(found.as_dict()))
    assert back["rank"] == 0 and back["line"] == found.line and back["delay_pct"] == 50.0


def test_noise_that_alternates_between_ranks_is_no_late_rank():
    # d = 0: every iteration some rank arrives last by a few hundred µs, never the same one
    assert late_rank_summary(rows([0, 1] * 5, delay=3e-4)) is None
    assert late_rank_summary(rows([0, 1] * 5, delay=0.2)) is None  # even large: not consistent


def test_a_consistent_rank_whose_delay_is_small_against_the_step_is_not_reported():
    assert late_rank_summary(rows([1] * 10, delay=0.019, step=0.4)) is None  # 4.75% of the step


@pytest.mark.parametrize(
    "ranks, found",
    [
        ([1, 1, 1, 0], True),  # exactly 75%
        ([1, 1, 0], False),  # 67%
        ([1, 1, 1, 0, None, None, None], True),  # iterations without a late rank do not count
    ],
)
def test_the_consistency_boundary(ranks, found):
    assert LATE_RANK_CONSISTENT_PCT == 75.0
    assert (late_rank_summary(rows(ranks)) is not None) is found


@pytest.mark.parametrize(
    "delay, step, found",
    [
        (0.02, 0.2, True),  # exactly 10% of the step
        (0.0199, 0.2, False),
        (1e-3, 0.005, True),  # exactly 1 ms (20% of the step)
        (0.9e-3, 0.005, False),  # 18% of the step, under 1 ms
    ],
)
def test_the_delay_boundaries(delay, step, found):
    assert (LATE_RANK_MIN_PCT, LATE_RANK_MIN_SEC) == (10.0, 1e-3)
    assert (late_rank_summary(rows([1] * 4, delay=delay, step=step)) is not None) is found


def test_the_delay_is_the_median_over_the_late_rank_s_iterations():
    late = rows([1], delay=0.1) + rows([1], delay=0.9) + rows([1], delay=0.3) + rows([0], delay=5.0)
    assert late_rank_summary(late).delay_sec == 0.3  # rank 0's iteration is not rank 1's delay


def test_no_late_rank_without_a_step_time_or_without_any_late_iteration():
    assert late_rank_summary([{k: v for k, v in r.items() if k != "step_time_sec"} for r in rows([1] * 4)]) is None
    assert late_rank_summary(rows([None] * 4)) is None
    assert late_rank_summary([]) is None
    nan = rows([1] * 4)
    for row in nan:
        row["late_rank"] = math.nan
    assert late_rank_summary(nan) is None


def test_the_ledger_table_says_where_each_region_s_time_went():
    row = {
        "bwd_cpu_sec": 0.020,
        "bwd_work_sec": 0.012,
        "bwd_comm_wait_peer_sec": 0.005,
        "bwd_comm_transfer_sec": 0.003,
        "bwd_comm_hidden_sec": 0.002,
        "bwd_compute_sec": 0.009,
        "bwd_host_overhead_sec": 0.003,
        "forward_time_sec": 0.010,
        "forward_work_sec": 0.010,
        "forward_comm_wait_peer_sec": 0.0,
        "forward_comm_transfer_sec": 0.0,
        "optim_step_time_sec": 0.001,  # no ledger: left out
    }
    table = ledger_table([row, row])
    assert [r.region for r in table.regions] == ["bwd", "forward"]
    assert table.lines()[0] == (
        "bwd 20.0 ms: work 12.0 ms (60%), waiting for peers 5.0 ms (25%), transfer 3.0 ms (15%), hidden 2.0 ms "
        "(10%), compute 9.0 ms (45%), host overhead 3.0 ms (15%)"
    )
    (bwd,) = ledger_table([row], ["bwd", "optim_step"]).regions
    assert (bwd.iterations, bwd.pct(bwd.wait_peer_sec)) == (1, 25.0)
    assert table.as_dict()["forward"]["pct"] == {"work": 100.0, "waiting for peers": 0.0, "transfer": 0.0}


def test_a_region_without_a_time_column_is_its_parts():
    row = {"gradient_work_sec": 0.006, "gradient_comm_wait_peer_sec": 0.002, "gradient_comm_transfer_sec": 0.002}
    (gradient,) = ledger_table([row], ["gradient"]).regions
    assert gradient.time_sec == pytest.approx(0.010) and gradient.hidden_sec is None


def test_the_collective_table_takes_medians_per_op():
    def op(name, mb, sec, exposed):
        return {
            f"comm_{name}_bytes": mb * 1e6,
            f"comm_{name}_calls": 3,
            f"comm_{name}_sec": sec,
            f"comm_{name}_exposed_sec": exposed,
            f"comm_{name}_busbw_gb_per_sec": mb / 1e3 / sec,
        }

    steps = [{**op("all_reduce", 12.0, 0.004, 0.001), "comm_cuda_sec": 0.1} for _ in range(3)]
    steps.append({**op("all_reduce", 12.0, 0.040, 0.030), **op("broadcast", 0.001, 0.0001, 0.0001)})
    table = collective_table(steps)
    assert [o.op for o in table.ops] == ["all_reduce", "broadcast"]  # comm_cuda_sec is no op
    reduce, broadcast = table.ops
    assert (reduce.bytes, reduce.calls, reduce.sec, reduce.iterations) == (12e6, 3, 0.004, 4)
    assert reduce.exposed_pct == 25.0 and broadcast.iterations == 1
    assert table.lines()[0] == (
        "all_reduce: 12.0 MB in 3 calls, 4.0 ms in flight, 25% exposed, busbw 3.00 GB/s per iteration (medians)"
    )
    assert json.loads(json.dumps(table.as_dict()))["broadcast"]["exposed_pct"] == 100.0


def test_a_configuration_s_rows_read_the_same_way(tmp_path):
    extra = {
        "world_size": 2,
        "late_rank": lambda i: 1 if i % 5 else None,  # no rank waited in every fifth iteration
        "late_rank_delay_sec": 0.015,
        "late_rank_region": "bwd",
        "late_rank_cause": "compute",
        "bwd_work_sec": 0.012,
        "bwd_comm_wait_peer_sec": 0.006,
        "bwd_comm_transfer_sec": 0.002,
    }
    regions = {"dataload_wait": 0.0005, "forward": 0.010, "bwd": 0.020}
    path = write(tmp_path / "ledger.parquet", config_rows("Pi05Train", regions, noise=0.0, extra=extra))
    (config,) = configurations(load_results([path]))
    rows = ledger_rows(config)
    assert len(rows) == len(config.recorded) and all("objective_" not in k for k in rows[0])
    assert rows[0]["step_time_sec"] == pytest.approx(0.0306) and "late_rank" not in rows[4]
    found = config_late_rank(config)
    assert (found.rank, found.region, found.cause, found.counted) == (1, "bwd", "compute", 16)
    assert ledger_table(rows, config.regions).lines() == [
        "bwd 20.0 ms: work 12.0 ms (60%), waiting for peers 6.0 ms (30%), transfer 2.0 ms (10%)"
    ]


def test_lateness_brought_from_before_the_step_is_not_counted():
    """A rank whose clock started 30 ms after the others' and that arrives 32 ms late added 2 ms
    in its step: below 10 % of a 100 ms step, no late rank; started on time, it is one."""
    late = rows([1] * 4, delay=0.032, step=0.1)
    for row in late:
        row["late_rank_start_lag_sec"] = 0.030
    assert late_rank_summary(late) is None
    for row in late:
        row["late_rank_start_lag_sec"] = -0.001  # started first: nothing to take off
    found = late_rank_summary(late)
    assert found is not None and found.delay_sec == pytest.approx(0.032)


def test_a_delay_within_the_clock_alignment_error_is_not_a_late_rank():
    late = rows([1] * 4, delay=0.005, step=0.02)
    assert late_rank_summary(late) is not None
    for row in late:
        row["clock_align_error_sec"] = 0.006  # ranks on two machines, clocks known to 6 ms
    assert late_rank_summary(late) is None
