"""torch scheduled mode's traces: one gzipped Chrome trace per rank in one folder per run and
cycle, ``ProfilerStep#N`` per recorded iteration, loadable by Holistic Trace Analysis (HTA); with
several ranks each trace carries its rank's ledger (collectives, blocked intervals, late rank)."""

from __future__ import annotations

import csv
import gzip
import json

import pytest

from profiler.workloads import matmuls
from scopebench.distributed import DistSession
from scopebench.profiler import create_profiler
from scopebench.profiler.files import run_name, shared_run_name
from scopebench.profiler.trace_ledger import CATEGORY, LEDGER_PID, PROCESS_NAME


def _load(path):
    """The trace at ``path``: gzip (checked by its magic number), then JSON."""
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b", f"{path} is not gzip"
    return json.loads(gzip.decompress(data))


def _steps(trace):
    """``{N: event}`` of the trace's ``ProfilerStep#N`` ranges."""
    steps = {}
    for event in trace["traceEvents"]:
        name = event.get("name", "")
        if name.startswith("ProfilerStep#"):
            number = int(name.removeprefix("ProfilerStep#"))
            assert number not in steps, f"two ranges for {name}"
            steps[number] = event
    return steps


def _ledger(trace):
    """The trace's ledger events (:mod:`scopebench.profiler.trace_ledger`), metadata and ``X``."""
    return [e for e in trace["traceEvents"] if e.get("pid") == LEDGER_PID or e.get("cat") == CATEGORY]


def _inside(event, step):
    """Whether ``event`` lies within the ``ProfilerStep`` range ``step`` (µs)."""
    return step["ts"] <= event["ts"] and event["ts"] + event["dur"] <= step["ts"] + step["dur"]


def _check_ledger(trace, rank, iterations, seen):
    """Rank ``rank``'s ledger events in its trace (``comm_loop``: one all-reduce per iteration in
    region ``sync``), against the metrics rank 0 reported (``seen[i]``); returns
    ``{iteration: (name, seq, waited for the other rank)}`` of its collectives, to compare across
    ranks."""
    ledger = _ledger(trace)
    names = {e["name"]: e["args"] for e in ledger if e["ph"] == "M"}
    assert names["process_name"] == {"name": PROCESS_NAME}, names
    events = [e for e in ledger if e["ph"] == "X"]
    assert {e["cat"] for e in events} == {CATEGORY} and {e["args"]["rank"] for e in events} == {rank}
    steps = _steps(trace)
    for e in events:  # the timebase: every event inside its iteration's ProfilerStep
        step = steps[e["args"]["iteration"]]
        assert _inside(e, step), (e, step)
    calls = {}
    for i in iterations:
        mine = [e for e in events if e["args"]["iteration"] == i]
        (summary,) = [e for e in mine if e["name"].startswith(f"iteration {i}:")]
        # The iteration's ledger summary is the metrics' (the same on every rank).
        assert summary["args"].get("late_rank") == seen[i].get("late_rank"), (summary, seen[i])
        if "late_rank" in seen[i]:
            assert summary["args"]["late_rank_delay_ms"] == pytest.approx(seen[i]["late_rank_delay_sec"] * 1e3)
        (call,) = [e for e in mine if e["name"].startswith("all_reduce #")]
        args = call["args"]
        assert call["name"] == f"all_reduce #{args['seq']}" and args["op"] == "all_reduce", call
        assert (args["bytes"], args["group_size"], args["completed"]) == (4000, 2, True), call
        blocked = [e for e in mine if e["name"].startswith("blocked (")]
        assert blocked and all(e["args"]["collectives"] == [call["name"]] for e in blocked), blocked
        # The call's split is that of its blocked events, and the region's metrics (µs, rounding).
        peer = sum(e["dur"] for e in blocked if e["name"] == f"blocked (waiting for rank {1 - rank})")
        transfer = sum(e["dur"] for e in blocked if e["name"] == "blocked (transfer)")
        assert 1 <= len(blocked) <= 2, blocked
        assert abs(args["wait_peer_ms"] * 1e3 - peer) < 0.01 and abs(args["transfer_ms"] * 1e3 - transfer) < 0.01
        assert abs(summary["args"]["sync_comm_wait_peer_ms"] * 1e3 - peer) < 0.01, (summary, blocked)
        calls[i] = (call["name"], args["seq"], peer > 0)
    return calls


def test_two_cycles_make_two_cycle_folders_each_with_its_steps(tmp_path):
    trace_dir = tmp_path / "traces"
    prof = create_profiler(
        "torch",
        "cpu",
        "sched",
        warmup=1,
        active=2,
        repeat=2,
        per_step=False,
        trace_dir=trace_dir,
        save_file=True,
        output_dir=tmp_path,
    )
    seen = matmuls(prof, size=64, n=6)
    files = prof.finalize()
    assert [bool(m) for m in seen] == [False, True, True, True, True, False]
    run = shared_run_name("sched", prof._run_id)
    name = f"{run_name('sched', prof._run_id, 0)}.pt.trace.json.gz"
    assert sorted(p.relative_to(trace_dir).as_posix() for p in trace_dir.rglob("*") if p.is_file()) == [
        f"{run}/cycle0/{name}",
        f"{run}/cycle1/{name}",
    ]
    assert [p for p in files if p.name.endswith(".gz")] == [trace_dir / run / f"cycle{k}" / name for k in (0, 1)]
    for cycle, iterations in ((0, [1, 2]), (1, [3, 4])):
        trace = _load(trace_dir / run / f"cycle{cycle}" / name)
        steps = _steps(trace)
        assert sorted(steps) == iterations, (cycle, sorted(steps))
        assert _ledger(trace) == []  # one rank: the ledger is off
        regions = [e for e in trace["traceEvents"] if e.get("name") in ("forward", "update")]
        assert len(regions) == 2 * len(iterations)
        for i in iterations:
            step = steps[i]
            assert step["ph"] == "X" and step["cat"] == "user_annotation"
            # The step holds its iteration's regions and at least its clock (it opens before
            # the clock starts and closes after it stops; 50 µs of slack for the two clocks).
            inside = [e for e in regions if step["ts"] <= e["ts"] and e["ts"] + e["dur"] <= step["ts"] + step["dur"]]
            assert sorted(e["name"] for e in inside) == ["forward", "update"], (i, inside)
            assert step["dur"] >= seen[i]["step_time_sec"] * 1e6 - 50, (i, step["dur"], seen[i])
    # The markers are not operators: the operator rows are those of the operators alone.
    (ops,) = tmp_path.glob("sched_*_torch_ops.csv")
    with open(ops) as fh:
        assert not [r for r in csv.DictReader(fh) if r["operator"].startswith("ProfilerStep")]


def test_per_step_mode_has_no_step_markers(tmp_path):
    prof = create_profiler("torch", "cpu", "ps", save_file=True, output_dir=tmp_path)
    matmuls(prof, size=64, n=2)
    assert prof._step_marker is None
    prof.finalize()


@pytest.mark.slow
def test_two_gloo_ranks_share_a_cycle_folder_that_hta_loads(tmp_path, worker_path):
    from hta.analyzers.straggler import extract_iteration_info
    from hta.common.types import DeviceType
    from hta.trace_analysis import TraceAnalysis
    from hta.trace_diff import LabeledTrace, TraceDiff

    from profiler.workloads import comm_loop

    trace_dir = tmp_path / "traces"
    profiler_kwargs = dict(warmup=1, active=2, repeat=2, per_step=False, trace_dir=str(trace_dir))
    # Rank 1 computes 30 ms longer: rank 0 waits for it in the all-reduce (the ledger's events).
    kwargs = dict(mode="torch", iterations=5, profiler_kwargs=profiler_kwargs, slow_rank=1, extra_sec=0.03)
    seen = []
    with DistSession(2, worker="profiler.workloads:comm_loop", worker_kwargs=kwargs, timeout_sec=120):
        prof = comm_loop(seen=seen, **kwargs)
    # Leaving the session waited for the worker to exit: every rank's files are written.
    run = trace_dir / shared_run_name("comm_test", prof._run_id)
    assert sorted(p.name for p in trace_dir.iterdir()) == [run.name]
    assert sorted(p.name for p in run.iterdir()) == ["cycle0", "cycle1"]
    for cycle, iterations in (("cycle0", [1, 2]), ("cycle1", [3, 4])):
        folder = run / cycle
        names = sorted(p.name for p in folder.iterdir())
        assert names == [f"{run_name('comm_test', prof._run_id, r)}.pt.trace.json.gz" for r in (0, 1)]
        calls = []
        for rank, name in enumerate(names):
            trace = _load(folder / name)
            assert sorted(_steps(trace)) == iterations, (cycle, rank)
            # torch's own record of the rank, the world and the backend (canary for HTA's rank)
            info = trace["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo"), info
            calls.append(_check_ledger(trace, rank, iterations, seen))
        # One collective per iteration, the same sequence numbers in both ranks' files; the rank
        # that arrived first waited for the other (mostly rank 0 for rank 1, but a loaded machine
        # may start one rank's step later).
        assert sorted(calls[0]) == sorted(calls[1]) == iterations, calls
        for i in iterations:
            assert calls[0][i][:2] == calls[1][i][:2], (i, calls)
            assert calls[0][i][2] or calls[1][i][2], (i, calls)
        seqs = [calls[0][i][1] for i in iterations]
        assert seqs == sorted(set(seqs)), seqs

    folder = str(run / "cycle1")
    # Our last step is complete (it closes when its iteration ends): keep it.
    analyzer = TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
    assert analyzer.t.get_ranks() == [0, 1]
    assert [int(s) for s in analyzer.get_profiler_steps()] == [3, 4]
    for rank in (0, 1):
        assert [int(i) for i in analyzer.t.get_iterations(rank)] == [3, 4], rank
    # HTA reads the ledger's events and puts each in its step.
    analyzer.t.decode_symbol_ids()
    for rank in (0, 1):
        events = analyzer.t.get_trace(rank)
        ledger = events[events["pid"] == LEDGER_PID]
        calls = ledger[ledger["s_name"].str.startswith("all_reduce #")]
        assert sorted(int(i) for i in calls["iteration"]) == [3, 4], ledger
        assert (ledger["iteration"] >= 3).all(), ledger[["s_name", "iteration"]]
    steps = extract_iteration_info(analyzer.t)
    assert sorted(zip(steps["rank"], steps["iter"])) == [(0, 3), (0, 4), (1, 3), (1, 4)]
    assert (steps["dur"] > 0).all()
    # A step-against-step comparison of the CPU operators (HTA's TraceDiff) finds each
    # region once per step.
    diff = TraceDiff.compare_traces(
        LabeledTrace("step3", trace_dir=folder),
        LabeledTrace("step4", trace_dir=folder),
        control_iteration=3,
        test_iteration=4,
        device_type=DeviceType.CPU,
    )
    for region in ("compute", "sync"):
        assert (diff.at[region, "step3_counts"], diff.at[region, "step4_counts"]) == (1, 1), diff.loc[region]
    assert diff.at["compute", "step3_total_duration"] > 0


def test_unbounded_repeat_leaves_a_cycle_folder_to_the_rank_still_in_it(tmp_path):
    prof = create_profiler("torch", "cpu", "forever", active=1, repeat=0, per_step=False, trace_dir=tmp_path)
    run = tmp_path / shared_run_name("forever", prof._run_id)
    other = run / "cycle0" / f"{run_name('forever', prof._run_id, 1)}.pt.trace.json.gz"
    other.parent.mkdir(parents=True)
    other.write_bytes(b"")  # another rank's trace of cycle 0, not yet pruned by that rank
    matmuls(prof, size=64, n=5)
    prof.finalize()
    assert sorted(p.name for p in run.iterdir()) == ["cycle0", "cycle2", "cycle3", "cycle4"]
    assert list((run / "cycle0").iterdir()) == [other]
