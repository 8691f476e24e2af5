"""The ledger's arithmetic on crafted records, and the recorder on one real gloo rank."""

from __future__ import annotations

import random

import pytest
import torch
import torch.distributed as dist

from scopebench.profiler.collectives import CommRecorder
from scopebench.profiler.ledger import (
    RankRecord,
    busbw_factor,
    host_hooks,
    intersect,
    ledger_metrics,
    length,
    subtract,
    union,
)


def _two_ranks(late: float = 0.2) -> list[RankRecord]:
    """One all-reduce in ``bwd`` = [0, 0.3]; rank 1 arrives ``late`` after rank 0 (at 0.05)."""
    done = 0.07 + late
    return [
        RankRecord(0, [("bwd", 0.0, 0.3)], [("g", 0, "all_reduce", 2, 1000, 0.05, done)], [(0.05, done, [0])]),
        RankRecord(
            1, [("bwd", 0.0, 0.3)], [("g", 0, "all_reduce", 2, 1000, 0.05 + late, done)], [(0.05 + late, done, [0])]
        ),
    ]


def test_a_rank_that_arrives_late_is_waited_for_and_named():
    records = _two_ranks(0.2)
    r0, r1 = ledger_metrics(records, 0), ledger_metrics(records, 1)
    assert r0["bwd_comm_wait_peer_sec"] == pytest.approx(0.2)
    assert r0["bwd_comm_transfer_sec"] == pytest.approx(0.02)
    assert r0["bwd_work_sec"] == pytest.approx(0.08)
    assert r1["bwd_comm_wait_peer_sec"] == 0 and r1["bwd_comm_transfer_sec"] == pytest.approx(0.02)
    assert r1["bwd_work_sec"] == pytest.approx(0.28)
    for row in (r0, r1):  # the late rank is the same on every rank
        assert row["late_rank"] == 1 and row["late_rank_region"] == "bwd"
        assert row["late_rank_delay_sec"] == pytest.approx(0.2)
        assert row["late_rank_work_excess_sec"] == pytest.approx(0.2)


def test_ranks_that_arrive_together_have_no_late_rank():
    records = _two_ranks(0.0)
    row = ledger_metrics(records, 0)
    assert "late_rank" not in row and row["bwd_comm_wait_peer_sec"] == 0
    assert row["bwd_comm_transfer_sec"] == pytest.approx(0.02)


def test_hidden_communication_is_an_interval_union_outside_the_blocked_time():
    calls = [("g", 0, "all_reduce", 2, 8, 0.10, 0.20), ("g", 1, "all_reduce", 2, 8, 0.15, 0.25)]
    rec = RankRecord(0, [("bwd", 0.0, 0.3)], calls, [(0.22, 0.25, [1])])
    row = ledger_metrics([rec, RankRecord(1, [], calls, [])], 0)
    # in flight 0.10-0.25 (0.15, not 0.2 summed), blocked 0.22-0.25 of it
    assert row["bwd_comm_hidden_sec"] == pytest.approx(0.12)
    assert row["comm_all_reduce_sec"] == pytest.approx(0.15)
    assert row["comm_all_reduce_exposed_sec"] == pytest.approx(0.03)
    assert row["comm_all_reduce_calls"] == 2 and row["comm_all_reduce_bytes"] == 16
    assert row["bwd_comm_all_reduce_bytes"] == 16 and row["bwd_comm_all_reduce_calls"] == 2


def test_a_wait_across_two_regions_is_split_at_their_boundary():
    calls = [("g", 0, "all_gather", 2, 8, 0.1, 0.5)]
    rec0 = RankRecord(0, [("forward", 0.0, 0.3), ("bwd", 0.3, 0.6)], calls, [(0.1, 0.5, [0])])
    rec1 = RankRecord(1, [], [("g", 0, "all_gather", 2, 8, 0.4, 0.5)], [])
    row = ledger_metrics([rec0, rec1], 0)
    assert row["forward_comm_wait_peer_sec"] == pytest.approx(0.2) and row["forward_work_sec"] == pytest.approx(0.1)
    assert row["bwd_comm_wait_peer_sec"] == pytest.approx(0.1)
    assert row["bwd_comm_transfer_sec"] == pytest.approx(0.1) and row["bwd_work_sec"] == pytest.approx(0.1)
    assert row["late_rank"] == 1 and row["late_rank_region"] == "forward"


def test_the_columns_add_up_to_the_region_time_on_random_records():
    rng = random.Random(0)
    for _ in range(200):
        records = []
        for rank in range(3):
            regions, t = [], 0.0
            for name in ("forward", "bwd", "optim"):
                length = rng.uniform(0.01, 0.2)
                regions.append((name, t, t + length))
                t += length
            calls, waits = [], []
            for seq in range(4):
                issue = rng.uniform(0, t)
                done = issue + rng.uniform(0, 0.05)
                calls.append(("g", seq, "all_reduce", 3, 64, issue, done))
                if rng.random() < 0.7:
                    waits.append((issue + rng.uniform(0, done - issue), done, [seq]))
            records.append(RankRecord(rank, regions, calls, waits))
        for rank in range(3):
            row = ledger_metrics(records, rank)
            for name, s, e in records[rank].regions:
                parts = [row[f"{name}_{k}"] for k in ("work_sec", "comm_wait_peer_sec", "comm_transfer_sec")]
                assert min(parts) >= 0 and sum(parts) == pytest.approx(e - s, abs=1e-9)


def test_bus_bandwidth_follows_the_nccl_tests_convention():
    assert busbw_factor("all_reduce", 2) == 1.0 and busbw_factor("reduce_scatter", 8) == pytest.approx(7 / 8)
    assert busbw_factor("broadcast", 4) == 1.0 and busbw_factor("all_reduce", 1) is None
    calls = [("g", 0, "all_reduce", 4, 10**9, 0.0, 1.0)]
    row = ledger_metrics([RankRecord(0, [], calls, []), RankRecord(1, [], calls, [])], 0)
    assert row["comm_all_reduce_busbw_gb_per_sec"] == pytest.approx(1.5)  # 1 GB in 1 s x 2(n-1)/n


def test_union_merges_overlaps_and_drops_empty_intervals():
    assert union([(3, 4), (0, 2), (1, 2.5), (5, 5)]) == [(0, 2.5), (3, 4)]


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_subtract_keeps_exactly_the_points_outside_on_random_intervals():
    rng = random.Random(3)
    for _ in range(300):
        a = union([(x, x + rng.randint(1, 6)) for x in rng.sample(range(40), rng.randint(0, 6))])
        b = union([(x, x + rng.randint(1, 6)) for x in rng.sample(range(40), rng.randint(0, 6))])
        out = subtract(a, b)
        inside = {t for s, e in a for t in range(s, e)} - {t for s, e in b for t in range(s, e)}
        assert {t for s, e in out for t in range(s, e)} == inside, (a, b, out)
        assert out == union(out) and intersect(out, b) == []  # disjoint, sorted, nothing of b
        assert length(out) + length(intersect(a, b)) == length(a)


def test_framework_hooks_are_their_time_outside_blocked_waits_at_most_the_host_overhead():
    rec = RankRecord(0, [("fwd", 0.0, 1.0), ("bwd", 1.0, 2.0)], waits=[(1.2, 1.5, [0]), (1.4, 1.6, [0])])
    hooks = {"fwd": [(0.1, 0.3), (0.2, 0.4)], "bwd": [(1.1, 1.3), (1.55, 1.7)], "opt": [(2.1, 2.2)]}
    columns = {"fwd_host_overhead_sec": 0.25, "bwd_host_overhead_sec": 0.1}
    out = host_hooks(rec, hooks, columns)
    # fwd: the overlapping hooks count once (0.3); at most its host overhead (0.25). bwd: less the
    # two waits' union [1.2, 1.6] leaves 0.1 + 0.1, capped at 0.1; opt has no host overhead.
    assert out == {"fwd_host_hooks_sec": 0.25, "bwd_host_hooks_sec": 0.1}
    assert host_hooks(rec, hooks, {"fwd_host_overhead_sec": 1.0, "bwd_host_overhead_sec": 1.0}) == {
        "fwd_host_hooks_sec": pytest.approx(0.3),
        "bwd_host_hooks_sec": pytest.approx(0.2),
    }


def test_the_recorder_sees_blocking_and_asynchronous_calls_once_and_only_while_active(one_rank):
    rec = CommRecorder()
    rec.install()
    t = torch.ones(4)
    dist.all_reduce(t)  # not active: not recorded
    rec.start()
    dist.all_reduce(t)
    out = torch.empty(4)
    work = dist.all_gather_into_tensor(out, t, async_op=True)
    work.wait()
    dist.all_gather_single(torch.empty(4), t)  # calls the process group itself: one call
    rec.stop()
    dist.barrier()
    calls, waits = rec.take()
    assert [(c.op, c.seq, c.nbytes) for c in calls] == [
        ("all_reduce", 0, 16),
        ("all_gather", 1, 16),
        ("all_gather", 2, 16),
    ]
    assert all(c.done is not None and c.done >= c.issue for c in calls)
    assert len(waits) == 3 and [w.calls for w in waits] == [[0], [1], [2]]
    assert rec.take() == ([], [])


def test_ddp_buckets_are_seen_through_the_hook_and_the_wait_starts_when_the_graph_ends(one_rank):
    from torch.nn.parallel import DistributedDataParallel

    rec = CommRecorder()
    rec.install()
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)))
    model.register_comm_hook(None, rec.ddp_hook)
    reference = [p.detach().clone() for p in model.parameters()]
    rec.start()
    model(torch.randn(3, 8)).sum().backward()
    rec.stop()
    calls, waits = rec.take()
    grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert {c.op for c in calls} == {"all_reduce"} and sum(c.nbytes for c in calls) == grad_bytes
    assert len(waits) == 1 and sorted(waits[0].calls) == list(range(len(calls)))
    assert all(p.grad is not None for p in model.parameters())  # the hook still reduces
    assert all(torch.equal(a, b) for a, b in zip(reference, model.parameters()))


def test_a_rank_late_after_its_last_collective_is_waited_for_at_the_step_end():
    """PnP's case: rank 1 is slow in its last region, after every collective of the step; rank 0
    meets it at the next collective, outside this step: the wait counts at ``step_end`` and the
    cause is named where rank 1's work exceeded rank 0's."""
    rec0 = RankRecord(0, [("gradient", 0.0, 0.1), ("denoise", 0.1, 0.2)], end=0.2)
    rec1 = RankRecord(1, [("gradient", 0.0, 0.1), ("denoise", 0.1, 0.7)], end=0.7)
    row = ledger_metrics([rec0, rec1], 0)
    assert row["late_rank"] == 1 and row["late_rank_delay_sec"] == pytest.approx(0.5)
    assert row["late_rank_wait_region"] == "step_end" and row["late_rank_region"] == "denoise"
    assert row["late_rank_work_excess_sec"] == pytest.approx(0.5)


def test_sequence_numbers_restart_for_a_new_run_in_the_same_process(one_rank):
    rec = CommRecorder()
    rec.install()
    rec.start()
    dist.all_reduce(torch.ones(1))
    rec.stop()
    rec.take()
    rec.start()  # left on by a run that failed
    dist.all_reduce(torch.ones(1))
    rec.restart_sequences()  # a second run (a new group) in this process: numbered like its peers
    assert not rec.active
    dist.all_gather_object([None], 1)  # its start-up (align_clocks' gathers): not counted
    rec.start()
    dist.all_reduce(torch.ones(1))
    rec.stop()
    assert [c.seq for c in rec.take()[0]] == [0]


def test_with_operator_time_the_work_splits_into_compute_and_host_overhead_and_names_the_cause():
    records = _two_ranks(0.2)
    records[0].compute = {"bwd": 0.05}
    records[1].compute = {"bwd": 0.06}  # rank 1's 0.2 s more work is not operators: host overhead
    r0, r1 = ledger_metrics(records, 0), ledger_metrics(records, 1)
    assert r0["bwd_host_overhead_sec"] == pytest.approx(0.08 - 0.05)
    assert r1["bwd_host_overhead_sec"] == pytest.approx(0.28 - 0.06)
    assert r0["late_rank_cause"] == "host_overhead"
    records[1].compute = {"bwd": 0.26}  # now its operators took the time
    assert ledger_metrics(records, 0)["late_rank_cause"] == "compute"
    records[1].compute = {}
    assert ledger_metrics(records, 0)["late_rank_cause"] == "work"


def test_the_work_is_the_reported_region_time_less_the_blocked_time():
    """Under torch a region's time is its operator-event range, read on another clock than the
    ledger's spans: a thread descheduled between the reads (CI: 4 ms under two busy loops) left
    the columns short of it. The work is the reported time less the blocked time."""
    rec = RankRecord(0, [("bwd", 0.0, 0.0204)], [("g", 0, "all_reduce", 1, 8, 0.010, 0.013)], [(0.010, 0.013, [0])])
    rec.compute, rec.times = {"bwd": 0.010}, {"bwd": 0.0244}
    row = ledger_metrics([rec], 0)
    assert row["bwd_comm_transfer_sec"] == pytest.approx(0.003)
    assert row["bwd_work_sec"] == pytest.approx(0.0214)
    assert row["bwd_host_overhead_sec"] == pytest.approx(0.0114)
    parts = row["bwd_work_sec"] + row["bwd_comm_wait_peer_sec"] + row["bwd_comm_transfer_sec"]
    assert parts == pytest.approx(rec.times["bwd"])
    rec.times = {}  # no reported time: the spans' length
    assert ledger_metrics([rec], 0)["bwd_work_sec"] == pytest.approx(0.0174)
