"""The ledger's events in a Chrome trace: what they are, how they join the exported JSON, and the
timebase that puts them beside torch's own events (canary: kineto's clock is the wall clock)."""

from __future__ import annotations

import gzip
import io
import json
import time

import pytest

from scopebench.profiler.files import write_exported
from scopebench.profiler.ledger import RankRecord, blocked_intervals, last_arrivals, ledger_metrics
from scopebench.profiler.trace_ledger import (
    CATEGORY,
    COLLECTIVES_TID,
    LEDGER_PID,
    LedgerIteration,
    clock_offset_ns,
    ledger_events,
    ledger_iteration,
    ledger_rewriter,
    splice_events,
)


def _two_ranks():
    """Rank 1 arrives 0.3 s late at all-reduce #4; rank 0 blocks from 1.1 to 1.5."""
    r0 = RankRecord(0, [("sync", 1.0, 1.5)], [("g", 4, "all_reduce", 2, 64, 1.1, 1.5)], [(1.1, 1.5, [0])], 1.6, 1.0)
    r1 = RankRecord(1, [("sync", 1.3, 1.5)], [("g", 4, "all_reduce", 2, 64, 1.4, 1.5)], [(1.4, 1.5, [0])], 1.6, 1.0)
    return [r0, r1]


def _xs(events, prefix=""):
    return [e for e in events if e["ph"] == "X" and e["name"].startswith(prefix)]


def _item(records, rank, iteration=7):
    """``ledger_iteration`` with record times taken as ns since the epoch (``epoch_ns`` 0)."""
    item = ledger_iteration(iteration, records, rank, ledger_metrics(records, rank), 0.0)
    assert abs(item.epoch_ns - (time.time_ns() - time.perf_counter_ns())) < 10**6
    item.epoch_ns = 0
    return item


def test_a_collective_is_named_by_its_sequence_number_with_this_ranks_split():
    records = _two_ranks()
    item = _item(records, 0)
    events = ledger_events([item], 0)
    (call,) = _xs(events, "all_reduce")
    assert call["name"] == "all_reduce #4" and call["pid"] == LEDGER_PID and call["cat"] == CATEGORY
    assert call["tid"] == COLLECTIVES_TID
    args = call["args"]
    assert {k: args[k] for k in ("iteration", "rank", "group", "seq", "op", "bytes", "group_size", "completed")} == {
        "iteration": 7,
        "rank": 0,
        "group": "g",
        "seq": 4,
        "op": "all_reduce",
        "bytes": 64,
        "group_size": 2,
        "completed": True,
    }
    # The split is the ledger's: the metrics of the region it fell in.
    metrics = ledger_metrics(records, 0)
    assert args["wait_peer_ms"] == pytest.approx(metrics["sync_comm_wait_peer_sec"] * 1e3)
    assert args["transfer_ms"] == pytest.approx(metrics["sync_comm_transfer_sec"] * 1e3)
    assert (args["wait_peer_ms"], args["transfer_ms"]) == pytest.approx((300.0, 100.0))
    blocked = _xs(events, "blocked")
    assert [(e["name"], e["ts"], e["dur"]) for e in blocked] == [
        ("blocked (waiting for rank 1)", pytest.approx(1.1e6), pytest.approx(0.3e6)),
        ("blocked (transfer)", pytest.approx(1.4e6), pytest.approx(0.1e6)),
    ]
    assert blocked[0]["args"]["waiting_for_rank"] == 1 and blocked[0]["args"]["collectives"] == ["all_reduce #4"]
    (summary,) = _xs(events, "iteration")
    assert summary["name"] == "iteration 7: late rank 1"
    assert (summary["ts"], summary["dur"]) == (pytest.approx(1.0e6), pytest.approx(0.6e6))
    assert summary["args"]["late_rank"] == 1
    assert summary["args"]["late_rank_delay_ms"] == pytest.approx(metrics["late_rank_delay_sec"] * 1e3)
    assert summary["args"]["sync_comm_wait_peer_ms"] == pytest.approx(300.0)
    assert not [k for k in summary["args"] if k.endswith("_sec") or k.startswith("comm_all_reduce")]
    # The late rank itself waited for nobody: its blocked time is transfer only.
    late = ledger_events([_item(records, 1)], 0)
    assert [e["name"] for e in _xs(late, "blocked")] == ["blocked (transfer)"]
    assert _xs(late, "all_reduce")[0]["args"]["wait_peer_ms"] == 0.0


def test_the_tracks_are_named_and_the_times_follow_the_clock_offset():
    item = _item(_two_ranks(), 0)
    item.epoch_ns = 5_000  # record time 0 is 5 µs after the base
    events = ledger_events([item], 2_000)
    meta = {(e["name"], e["tid"]): e["args"] for e in events if e["ph"] == "M"}
    assert meta[("process_name", 0)] == {"name": "scopebench ledger"}
    assert meta[("process_labels", 0)] == {"labels": "rank 0"}
    assert {args["name"] for (name, _tid), args in meta.items() if name == "thread_name"} == {
        "iterations",
        "blocked",
        "collectives",
    }
    assert _xs(events, "all_reduce")[0]["ts"] == pytest.approx(1.1e6 + 3.0)


def test_overlapping_collectives_take_lanes_and_an_unfinished_one_ends_with_the_iteration():
    calls = [
        ("g", 0, "all_gather", 2, 8, 1.0, 1.4),
        ("g", 1, "reduce_scatter", 2, 8, 1.1, 1.2),
        ("g", 2, "all_gather", 2, 8, 1.3, None),
        ("g", 3, "broadcast", 2, 8, 1.45, 1.5),
    ]
    rec = RankRecord(0, [("step", 1.0, 2.0)], calls, [], 2.0, 1.0)
    events = ledger_events([LedgerIteration(0, rec, [], {}, 0)], 0)
    lanes = {e["name"]: e["tid"] - COLLECTIVES_TID for e in _xs(events) if e["tid"] >= COLLECTIVES_TID}
    assert lanes == {"all_gather #0": 0, "reduce_scatter #1": 1, "all_gather #2": 1, "broadcast #3": 0}
    (open_call,) = _xs(events, "all_gather #2")
    assert open_call["args"]["completed"] is False and open_call["dur"] == pytest.approx(0.7e6)
    names = {e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert {"collectives", "collectives 2"} <= names
    for lane in (0, 1):  # no two slices of a lane overlap (Perfetto draws nested slices only)
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in _xs(events) if e["tid"] == COLLECTIVES_TID + lane)
        assert all(end <= nxt for (_s, end), (nxt, _e) in zip(spans, spans[1:])), spans


def test_a_wait_on_several_calls_leaves_the_split_to_the_blocked_events():
    # DDP's bucket wait: one blocked interval for both buckets.
    calls0 = [("g", 0, "all_reduce", 2, 8, 1.0, 1.6), ("g", 1, "all_reduce", 2, 8, 1.1, 1.7)]
    calls1 = [("g", 0, "all_reduce", 2, 8, 1.0, 1.6), ("g", 1, "all_reduce", 2, 8, 1.5, 1.7)]
    r0 = RankRecord(0, [("bwd", 1.0, 1.7)], calls0, [(1.2, 1.7, [0, 1])], 1.7, 1.0)
    r1 = RankRecord(1, [("bwd", 1.0, 1.7)], calls1, [(1.5, 1.7, [0, 1])], 1.7, 1.0)
    events = ledger_events([_item([r0, r1], 0)], 0)
    assert not [e for e in _xs(events, "all_reduce") if "wait_peer_ms" in e["args"]]
    blocked = _xs(events, "blocked")
    assert [e["name"] for e in blocked] == ["blocked (waiting for rank 1)", "blocked (transfer)"]
    assert blocked[0]["args"]["collectives"] == ["all_reduce #0", "all_reduce #1"]
    assert blocked[0]["dur"] == pytest.approx(0.3e6)  # until rank 1 issued bucket 1
    assert blocked_intervals(r0, last_arrivals([r0, r1]))[0].cut == 1.5


def test_no_ledger_no_events():
    assert ledger_events([], 0) == []


TORCH_LAYOUT = b"""{
  "schemaVersion": 1,
  "baseTimeNanoseconds": 1000000000,
  "traceEvents": [
  {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2.0}
  ],"traceName": "t.json" }"""


def _item_at(epoch_ns):
    rec = RankRecord(0, [], [("g", 0, "barrier", 2, 0, 0.0, 1e-6)], [], 1e-6, 0.0)
    return LedgerIteration(0, rec, [], {}, epoch_ns)


@pytest.mark.parametrize(
    "exported",
    [
        TORCH_LAYOUT,
        TORCH_LAYOUT.replace(
            b'{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2.0}', b""
        ),
        # not torch's layout (events before the base): parsed whole
        b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 1.5, "dur": 2.0}],'
        b' "baseTimeNanoseconds": 1000000000}',
    ],
    ids=["torch", "no-events", "parsed"],
)
def test_the_events_join_the_gzipped_trace_in_one_write(tmp_path, exported):
    path = tmp_path / "rank0.pt.trace.json.gz"
    write_exported(path, lambda name: open(name, "wb").write(exported), ledger_rewriter([_item_at(1_000_010_000)]))
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary left
    trace = json.loads(gzip.decompress(path.read_bytes()))
    assert trace["baseTimeNanoseconds"] == 1000000000
    names = [e["name"] for e in trace["traceEvents"] if e["ph"] == "X"]
    torch_events = ["aten::mm"] if b"aten::mm" in exported else []
    assert sorted(names) == sorted(["barrier #0", "iteration 0: no late rank", *torch_events])
    (barrier,) = [e for e in trace["traceEvents"] if e["name"] == "barrier #0"]
    assert (barrier["ts"], barrier["dur"]) == (10.0, 1.0)  # µs after the base


def test_an_export_that_is_not_json_is_written_unchanged_with_a_warning():
    out = io.BytesIO()
    with pytest.warns(RuntimeWarning, match="not a JSON object"):
        splice_events(io.BytesIO(b"truncated {"), out, [_item_at(0)])
    assert out.getvalue() == b"truncated {"


def test_the_wall_clock_offset_maps_perf_counter_onto_kineto_timestamps(tmp_path):
    """Canary of the timebase: an operator bracketed by ``perf_counter`` reads lands inside its
    bracket in the exported trace, mapped by ``clock_offset_ns`` (10 µs of slack; measured
    within a few µs, docs/profiler.md "Opening a trace", ``perf/trace_timebase.py``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.ones(4)
    brackets = []
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(20):
            offset = clock_offset_ns()
            before = time.perf_counter_ns()
            torch.neg(x)
            after = time.perf_counter_ns()
            brackets.append((before + offset, after + offset))
    path = write_exported(tmp_path / "t.pt.trace.json.gz", prof.export_chrome_trace)
    trace = json.loads(gzip.decompress(path.read_bytes()))
    base = trace["baseTimeNanoseconds"]
    ops = sorted((e for e in trace["traceEvents"] if e.get("name") == "aten::neg"), key=lambda e: e["ts"])
    assert len(ops) == len(brackets)
    for op, (before, after) in zip(ops, brackets):
        low, high = (before - base) / 1e3, (after - base) / 1e3
        assert low - 10 <= op["ts"] and op["ts"] + op["dur"] <= high + 10, (op, low, high)
