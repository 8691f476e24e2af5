"""``scopebench trace-ledger``: its text, JSON and annotated traces; one line naming the file for
a refused input; a CPU-only trace's host side; many ranks in the memory of one."""

from __future__ import annotations

import gzip
import json
import shutil
import tracemalloc

import pytest
from profiler.gpu_traces import HTA_DATA
from profiler.kineto_synth import JobSpec, TraceBuilder, ddp_job

from scopebench.cli import main
from scopebench.commands.trace_ledger import load_ranks, trace_files
from scopebench.profiler.trace_ledger import LEDGER_PID

WINDOW_KEYS = {"span_ms", "idle_ms", "compute_ms", "comm_ms", "memory_ms", "comm_hidden_ms", "comm_exposed_ms"}


def _run(capsys, *args):
    status = main(["trace-ledger", *map(str, args)])
    out, err = capsys.readouterr()
    return status, out, err


def test_text_and_json_name_the_late_rank(tmp_path, capsys):
    spec = JobSpec(world=3, late=2, delay=4000.0)
    ddp_job(spec, tmp_path / "job")
    status, out, err = _run(capsys, tmp_path / "job", "--json", tmp_path / "l.json")
    assert status == 0 and err == ""
    assert "GPU time per rank over the window (ms):" in out
    assert (
        "window: GPU work launched from ProfilerStep#10 to the start of the last, ProfilerStep#13 (HTA's window" in out
    )
    assert (
        "late rank: rank 2 arrives 4.0 ms late per step (median) at all_reduce #0 of group 0 (launched in ## backward ##), "
        "in 3 of 3 steps; before it its kernels took 4.0 ms longer than the others' (its compute)"
    ) in out
    report = json.loads((tmp_path / "l.json").read_text())
    assert sorted(report["ranks"]) == ["0", "1", "2"]
    for rank, data in report["ranks"].items():
        assert WINDOW_KEYS <= set(data["window"])
        assert data["window"]["compute_ms"] == 3 * spec.compute(int(rank)) / 1e3
        assert [s["step"] for s in data["steps"]] == [10, 11, 12]
        assert all(WINDOW_KEYS | {"comm_wait_ms", "host_ms"} <= set(s) for s in data["steps"])
        assert data["steps"][0]["comm_wait_ms"] == (spec.comm(int(rank)) - spec.transfer) / 1e3
    assert report["late_rank"] == {
        **report["late_rank"],
        "rank": 2,
        "delay_ms": pytest.approx(4.0),
        "steps": 3,
        "of_steps": 3,
        "cause": "compute",
    }
    first, *_ = report["collectives"]
    assert first["label"] == "all_reduce #0 of group 0" and first["last_rank"] == 2 and first["transfer_ms"] == 0.5
    assert first["ranks"]["0"]["wait_ms"] == 4.0 and first["ranks"]["2"]["wait_ms"] == 0.0
    assert first["bytes"] == spec.nelems * 4 and first["busbw_gb_per_sec"] > 0


def test_a_late_rank_whose_gpu_waited_for_its_host(tmp_path, capsys):
    ddp_job(JobSpec(late=1, delay=3000.0, cause="gpu_idle"), tmp_path)
    status, out, _ = _run(capsys, tmp_path)
    assert status == 0
    assert out.splitlines()[-1].endswith(
        "before it its GPU sat idle 3.0 ms longer than the others' (3.0 ms with nothing launched: waiting for "
        "its host, the host or input side)"
    )


def test_no_late_rank_is_null_and_said(tmp_path, capsys):
    ddp_job(JobSpec(), tmp_path)
    status, out, _ = _run(capsys, tmp_path, "--json", tmp_path / "l.json")
    assert status == 0
    assert out.splitlines()[-2].startswith("late rank: none (no rank kept the others waiting in 75% of the steps")
    late = json.loads((tmp_path / "l.json").read_text())["late_rank"]
    assert late["rank"] is None and late["delay_ms"] is None and (late["steps"], late["of_steps"]) == (0, 3)


def test_annotated_traces_carry_the_ledgers_lanes(tmp_path, capsys):
    ddp_job(JobSpec(late=1, delay=3000.0), tmp_path / "job")
    status, _, _ = _run(capsys, tmp_path / "job", "--trace", tmp_path / "out", "--json", tmp_path / "l.json")
    assert status == 0
    report = json.loads((tmp_path / "l.json").read_text())
    for rank in (0, 1):
        name = f"rank{rank}.pt.trace.json.gz"
        before = json.loads(gzip.decompress((tmp_path / "job" / name).read_bytes()))
        after = json.loads(gzip.decompress((tmp_path / "out" / name).read_bytes()))
        ours = [e for e in after["traceEvents"] if e.get("pid") == LEDGER_PID]
        assert [e for e in after["traceEvents"] if e.get("pid") != LEDGER_PID] == before["traceEvents"]
        steps = [e for e in ours if e["name"].startswith("step ")]
        assert [e["name"] for e in steps] == [f"step {n}: late rank 1" for n in (10, 11, 12)]
        waits = [e for e in ours if e["name"] == "waiting for rank 1"]
        expected = [c["ranks"][str(rank)]["wait_ms"] for c in report["collectives"]]
        assert [e["dur"] / 1e3 for e in waits] == [w for w in expected if w]
        idle = sum(e["dur"] for e in ours if e["name"].startswith("idle"))
        assert idle / 1e3 == pytest.approx(report["ranks"][str(rank)]["window"]["idle_ms"])


def test_hta_pair_of_a_128_rank_job_and_a_lone_rocm_trace(capsys):
    status, out, _ = _run(capsys, HTA_DATA / "sampled_rank-0.json.gz", HTA_DATA / "sampled_rank-1.json.gz")
    assert status == 0 and "(world of 128, nccl, 2 of its ranks given: waits and the late rank are among those)" in out
    status, out, _ = _run(capsys, HTA_DATA / "mi250_minitoy_train_ROCm6_2_kineto.json.gz")
    assert status == 0
    assert "no distributedInfo and no rank in its name: taken as rank 0, as HTA does" in out
    assert "late rank: none (one rank: no one to wait for)" in out


def test_a_cpu_only_trace_says_so_and_gives_its_host_side(tmp_path, capsys):
    b = TraceBuilder(0, 1)
    for n in range(3):
        b.step(n, n * 1000.0, n * 1000.0 + 800.0)
        b.host("aten::mm", n * 1000.0 + 10, n * 1000.0 + 500, cat="cpu_op")
    path = b.write(tmp_path / "cpu.json")
    status, out, err = _run(capsys, path, "--json", tmp_path / "l.json")
    assert status == 0
    assert (
        err
        == f"scopebench trace-ledger: {path}: no GPU events (kernels, memcpy, memset): a CPU-only trace; its host side follows\n"
    )
    assert (
        "rank 0: no GPU events: host side: 3 ProfilerStep ranges (median 0.800 ms), 3 CPU operators over 2.800 ms"
        in out
    )
    assert "GPU time per rank" not in out
    data = json.loads((tmp_path / "l.json").read_text())["ranks"]["0"]
    assert data["window"] is None and [s["ms"] for s in data["host"]["steps"]] == [0.8, 0.8, 0.8]


def _refused(capsys, *args):
    status, out, err = _run(capsys, *args)
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("scopebench trace-ledger: ")
    return err.strip()


BASE_NS = 1_765_000_000 * 10**9  # the traces' baseTimeNanoseconds: their ts are after it


def test_bad_inputs_are_refused_in_one_line_naming_the_file(tmp_path, capsys):
    a, b = ddp_job(JobSpec(), tmp_path / "job", base_ns=BASE_NS)
    (tmp_path / "x.json").write_text('{"rows": []}')
    assert _refused(capsys, tmp_path / "x.json").endswith("x.json: not a Kineto trace (no traceEvents array)")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(a.read_bytes()[: a.stat().st_size // 2])
    assert "cut.json.gz: truncated: the gzip stream ends early" in _refused(capsys, cut)
    twin = tmp_path / "twin"
    twin.mkdir()
    shutil.copy(a, twin / "rank0.pt.trace.json.gz")
    err = _refused(capsys, a, twin / "rank0.pt.trace.json.gz")
    assert (
        err
        == f"scopebench trace-ledger: {a} and {twin / 'rank0.pt.trace.json.gz'} both claim rank 0 (several profiler cycles? give the files of one cycle)"
    )
    other = TraceBuilder(1, 4)
    other.step(0, 1_000_000.0, 1_000_100.0)
    other.compute(1_000_010.0, 5)
    four = other.write(tmp_path / "four.json")
    assert _refused(capsys, a, four).endswith(
        f"{a} (rank 0) and {four} (rank 1) are not ranks of one run: world size 2 and 4"
    )
    later = TraceBuilder(1, 2, base_ns=BASE_NS + 3600 * 10**9)
    later.step(0, 1_000_000.0, 1_000_100.0)
    later.compute(1_000_010.0, 5)
    hour = later.write(tmp_path / "later.json")
    assert _refused(capsys, a, hour).endswith(
        f"{a} (rank 0) and {hour} (rank 1) are not ranks of one run: their events are 3600 s apart"
    )
    nameless = TraceBuilder(None).write(tmp_path / "worker.json")
    assert f"{nameless}: no rank (no distributedInfo, no rank<N> in its name)" in _refused(capsys, a, nameless)
    (tmp_path / "empty").mkdir()
    assert _refused(capsys, tmp_path / "empty").endswith(
        "empty: no Kineto trace files (*.json, *.json.gz) in this folder"
    )
    assert _refused(capsys, tmp_path / "nothing").endswith("nothing: no such file or folder")
    err = _refused(capsys, a, "--trace", a.parent)
    assert err.endswith(f"--trace {a.parent}: the folder of {a}; give another folder (the inputs stay as they are)")


def test_a_run_folder_gives_its_last_cycle(tmp_path):
    for k in range(3):
        ddp_job(JobSpec(), tmp_path / "run" / f"cycle{k}")
    files, notes = trace_files([str(tmp_path / "run")])
    assert [p.parent.name for p in files] == ["cycle2", "cycle2"]
    assert notes == [f"{tmp_path / 'run'}: its last cycle, cycle2, of 3 (give a cycle folder for another)"]


@pytest.mark.slow
def test_many_ranks_are_read_in_the_memory_of_one(tmp_path):
    """12 ranks peak within a quarter of 2 ranks: one rank's events at a time, then only its
    summary and collectives (the 64-rank figures: docs/performance.md)."""
    spec = JobSpec(world=12, extra=400)
    files = ddp_job(spec, tmp_path)
    load_ranks(files[:1])  # first-time allocations (imports, compiled patterns) out of the peaks
    peaks = []
    for some in (files[:2], files):
        tracemalloc.start()
        try:
            summaries, _, _ = load_ranks(some)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert len(summaries) == len(some)
        peaks.append(peak)
    assert peaks[1] < 1.25 * peaks[0], peaks
