"""torch scheduled mode's traces: one gzipped Chrome trace per rank in one folder per run and
cycle, ``ProfilerStep#N`` per recorded iteration, loadable by Holistic Trace Analysis (HTA)."""

from __future__ import annotations

import csv
import gzip
import json

import pytest
import torch

from scopebench.distributed import DistSession
from scopebench.profiler import create_profiler
from scopebench.profiler.files import run_name, shared_run_name


def _matmuls(prof, n):
    """``n`` iterations of two regions; returns what each callback saw."""
    calls = {"n": 0}
    seen = []

    def callback():
        if calls["n"]:
            seen.append(prof.get_current_metrics())
        calls["n"] += 1
        return calls["n"] <= n

    a = torch.randn(64, 64)
    for _ in prof.iterate(callback):
        with prof.track_step("forward"):
            b = a @ a
        with prof.track_step("update"):
            a = torch.tanh(b)
    return seen


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
    seen = _matmuls(prof, n=6)
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
    _matmuls(prof, n=2)
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
    kwargs = dict(mode="torch", iterations=5, profiler_kwargs=profiler_kwargs)
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
        for rank, name in enumerate(names):
            trace = _load(folder / name)
            assert sorted(_steps(trace)) == iterations, (cycle, rank)
            # torch's own record of the rank, the world and the backend (canary for HTA's rank)
            info = trace["distributedInfo"]
            assert (info["rank"], info["world_size"], info["backend"]) == (rank, 2, "gloo"), info

    folder = str(run / "cycle1")
    # Our last step is complete (it closes when its iteration ends): keep it.
    analyzer = TraceAnalysis(trace_dir=folder, include_last_profiler_step=True)
    assert analyzer.t.get_ranks() == [0, 1]
    assert [int(s) for s in analyzer.get_profiler_steps()] == [3, 4]
    for rank in (0, 1):
        assert [int(i) for i in analyzer.t.get_iterations(rank)] == [3, 4], rank
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
    _matmuls(prof, n=5)
    prof.finalize()
    assert sorted(p.name for p in run.iterdir()) == ["cycle0", "cycle2", "cycle3", "cycle4"]
    assert list((run / "cycle0").iterdir()) == [other]
