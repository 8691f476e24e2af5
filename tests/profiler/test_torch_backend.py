"""torch backend on the CPU: per-step metrics, scheduled mode, Chrome trace."""

from __future__ import annotations

import csv
import gzip
import json

import pytest
import torch

from profiler.workloads import matmuls
from scopebench.profiler import create_profiler
from scopebench.profiler.ledger import length, union
from scopebench.profiler.torch_backend import KEPT_TRACES


def test_per_step_reports_region_cpu_time(tmp_path):
    prof = create_profiler("torch", "cpu", "ts", save_file=True, output_dir=tmp_path)
    seen = matmuls(prof)
    files = prof.finalize()
    assert len(seen) == 3
    for m in seen:
        assert m["forward_cpu_sec"] > 0 and m["update_cpu_sec"] > 0
        assert m["forward_cuda_sec"] == 0.0
        assert m["forward_comm_sec"] == 0.0 and m["comm_sync_sec"] == 0.0
        assert m["total_time_sec"] >= m["forward_cpu_sec"] + m["update_cpu_sec"]
        assert m["profiler_overhead_sec"] > 0
        assert 0 < m["profiler_inside_sec"] < m["total_time_sec"]  # record_function enter / exit
    ops_file = next(p for p in files if p.name.endswith("_torch_ops.csv"))
    with open(ops_file) as fh:
        rows = list(csv.DictReader(fh))
    assert {
        "iter",
        "region",
        "operator",
        "cpu_sec",
        "cuda_sec",
        "self_cuda_sec",
        "mem_mb",
        "self_mem_mb",
        "count",
    } <= set(rows[0])
    mm = [r for r in rows if r["operator"] in ("aten::mm", "aten::matmul") and r["region"] == "forward"]
    assert {r["iter"] for r in mm} == {"0", "1", "2"}


def test_scheduled_mode_writes_chrome_trace_with_regions(tmp_path):
    trace_dir = tmp_path / "traces"
    prof = create_profiler(
        "torch",
        "cpu",
        "sched",
        warmup=1,
        active=2,
        per_step=False,
        trace_dir=trace_dir,
        save_file=True,
        output_dir=tmp_path,
    )
    seen = matmuls(prof, n=5)
    prof.finalize()
    assert [bool(m) for m in seen] == [False, True, True, False, False]
    assert set(seen[1]) >= {"total_time_sec", "max_gpu_mb"}
    assert "forward_cpu_sec" not in seen[1]
    (trace_path,) = trace_dir.glob("sched_*/cycle0/sched_*_rank0.pt.trace.json.gz")
    assert trace_path in prof.files
    trace = json.loads(gzip.decompress(trace_path.read_bytes()))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"forward", "update"} <= names
    ops = next(tmp_path.glob("sched_*_torch_ops.csv"))
    with open(ops) as fh:
        assert {r["iter"] for r in csv.DictReader(fh)} == {"agg"}


def test_scheduled_repeat_makes_one_trace_per_cycle(tmp_path):
    prof = create_profiler("torch", "cpu", "rep", active=1, repeat=2, per_step=False, trace_dir=tmp_path)
    seen = matmuls(prof, n=4)
    prof.finalize()
    assert [bool(m) for m in seen] == [True, True, False, False]
    run = f"rep_{prof._run_id}"
    traces = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert traces == [f"{run}/cycle{k}/{run}_rank0.pt.trace.json.gz" for k in (0, 1)]


def test_traces_of_two_runs_started_together_do_not_overwrite_each_other(tmp_path):
    profs = [create_profiler("torch", "cpu", "same", active=1, per_step=False, trace_dir=tmp_path) for _ in range(2)]
    for prof in profs:
        matmuls(prof, n=1)
        prof.finalize()
    paths = set(tmp_path.glob("*/cycle0/*.pt.trace.json.gz"))
    assert len(paths) == 2 and {p.files[0] for p in profs} == paths
    assert len({p.parent.parent for p in paths}) == 2  # one folder per run


def test_unbounded_repeat_keeps_only_the_last_traces(tmp_path):
    prof = create_profiler("torch", "cpu", "forever", active=1, repeat=0, per_step=False, trace_dir=tmp_path)
    matmuls(prof, n=KEPT_TRACES + 3)
    files = prof.finalize()
    run = f"forever_{prof._run_id}"
    kept = [f"{run}/cycle{k}/{run}_rank0.pt.trace.json.gz" for k in range(3, KEPT_TRACES + 3)]
    # the older cycles' folders go with their traces
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == kept
    assert sorted(p.name for p in (tmp_path / run).iterdir()) == [f"cycle{k}" for k in range(3, KEPT_TRACES + 3)]
    assert sorted(p.relative_to(tmp_path).as_posix() for p in files) == kept


def test_trace_dir_with_per_step_is_refused(tmp_path):
    with pytest.raises(ValueError, match="profiler_trace_dir.*profiler_per_step"):
        create_profiler("torch", "cpu", "x", trace_dir=tmp_path, per_step=True)


def test_union_length_does_not_double_count_nested_events():
    assert length(union([(0, 10), (2, 5), (20, 25)])) == 15
    assert length(union([])) == 0


@pytest.mark.parametrize("save_file", [False, True])
def test_memory_and_operator_rows_only_when_they_will_be_written(save_file, tmp_path):
    prof = create_profiler("torch", "cpu", "mem", save_file=save_file, output_dir=tmp_path)
    memory = []
    calls = iter(range(3))
    for _ in prof.iterate(lambda: next(calls) < 2):
        memory.append(prof._prof.profile_memory)
        with prof.track_step("forward"):
            torch.randn(64, 64) @ torch.randn(64, 64)
    assert memory == [save_file, save_file]
    assert prof.get_current_metrics()["forward_cpu_sec"] > 0
    assert bool(prof.op_rows) is save_file
    prof.finalize()
