"""Reading Kineto traces streamed (scopebench.profiler.kineto): the same events whatever the chunk
boundaries, every NCCL naming era, the rank, bad files refused naming the file, memory bounded by
one rank, and the seam with torch's own profiler events."""

from __future__ import annotations

import gzip
import json
import tracemalloc

import pytest

from profiler.gpu_traces import HTA_DATA
from profiler.kineto_synth import NCCL_NEW, JobSpec, TraceBuilder, ddp_job
from scopebench.profiler.kineto import (
    COMM,
    COMPUTE,
    MEMORY,
    Collective,
    RankEvents,
    TraceError,
    from_profiler,
    rank_of,
    read_trace,
)


def test_any_chunk_boundary_reads_the_same_events(tmp_path):
    b = TraceBuilder(1, 2, base_ns=1711964646000000000)
    b.step(7, 0.5, 100.25)
    b.nccl("all_reduce", 1.125, 30, seq=12345678901)
    b.memcpy(40, 2.5)
    small = b.write(tmp_path / "t.json")
    expected = read_trace(small)
    for chunk in range(1, 40):  # a boundary at every place of the numbers, strings and separators
        assert read_trace(small, chunk=chunk) == expected, chunk
    assert expected.meta["baseTimeNanoseconds"] == 1711964646000000000
    assert expected.gpu[0].collective.seq == 12345678901
    path = HTA_DATA / "sampled_rank-0.json.gz"
    whole = read_trace(path)
    assert read_trace(path, chunk=4093) == whole
    # and what a full parse holds
    trace = json.loads(gzip.decompress(path.read_bytes()))
    kernels = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    assert len(whole.gpu) == len(kernels) == 1204
    assert whole.meta["distributedInfo"] == {"backend": "nccl", "rank": 0, "world_size": 128}
    assert sorted(whole.steps) == [551, 552] and whole.cpu_ops == 2329


def test_collectives_of_every_naming_era_and_their_bytes(tmp_path):
    b = TraceBuilder(0, 4)
    b.nccl("all_reduce", 0, 10, nelems=100, dtype="BFloat16", seq=3)
    b.nccl("all_gather", 20, 10, nelems=100, new_names=True, group="7")
    b.nccl("broadcast", 40, 10, with_args=False)
    b.gpu("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 60, 5, stream=20)
    b.gpu("rcclKernel_Generic", 70, 5, stream=20)
    b.memcpy(80, 5)
    b.gpu("Memset (Device)", 90, 5, cat="gpu_memset")
    b.compute(100, 5)
    events = read_trace(b.write(tmp_path / "t.json"))
    kinds = [op.kind for op in events.gpu]
    assert kinds == [COMM] * 5 + [MEMORY, MEMORY, COMPUTE]
    colls = [op.collective for op in events.gpu[:5]]
    assert colls == [
        Collective("all_reduce", "0", 3, 200, 4),
        Collective("all_gather", "7", None, 400, 4),  # ncclDevKernel_Generic: the op from its args
        Collective("broadcast", "?", None, None, None),  # no args: the op from the name, no bytes
        Collective("all_reduce", "?", None, None, None),
        Collective("nccl", "?", None, None, None),  # a generic kernel without args: op unknown
    ]
    assert events.gpu[1].start == 20 and NCCL_NEW.startswith("ncclDevKernel_Generic")


def test_rank_from_distributed_info_then_the_file_name(tmp_path):
    named = TraceBuilder(None).write(tmp_path / "job_rank-5.json")
    assert rank_of(read_trace(named)) == 5
    assert rank_of(read_trace(TraceBuilder(3, 8).write(tmp_path / "rank1.json"))) == 3
    assert rank_of(read_trace(TraceBuilder(None).write(tmp_path / "worker.json"))) is None


def _gz_cut(path, keep):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


@pytest.mark.parametrize(
    "write, match",
    [
        (lambda p: p.write_text("[1, 2]"), r"t\.json: not a Kineto trace: expected '\{' at the start, got '\['"),
        (lambda p: p.write_text('{"schemaVersion": 1}'), r"t\.json: not a Kineto trace \(no traceEvents array\)"),
        (
            lambda p: p.write_text('{"traceEvents": [{"ph": "X"} {"ph": "X"}]}'),
            r"t\.json: not a Kineto trace: expected",
        ),
        (lambda p: p.write_text('{"traceEvents": [{"ph": "X", "ts": 1'), r"t\.json: ends before the JSON does"),
        (lambda p: p.write_bytes(b"{\xff\xfe binary"), r"t\.json: not a Kineto trace: not UTF-8 text"),
        (lambda p: p.write_text("hello"), r"t\.json: not a Kineto trace: expected '\{' at the start, got 'h'"),
    ],
    ids=["json-array", "no-events", "garbage-between", "truncated-json", "binary", "text"],
)
def test_a_file_that_is_not_a_whole_trace_is_refused_naming_it(tmp_path, write, match):
    path = tmp_path / "t.json"
    write(path)
    with pytest.raises(TraceError, match=match):
        read_trace(path)


def test_a_truncated_gzip_is_refused_naming_it(tmp_path):
    path = _gz_cut(ddp_job(JobSpec(), tmp_path)[0], 0.6)
    with pytest.raises(TraceError, match=r"rank0\.pt\.trace\.json\.gz: truncated: the gzip stream ends early"):
        read_trace(path)


def test_memory_holds_one_rank_not_the_file(tmp_path):
    """The reader keeps GPU work, launches, steps and annotations, never the parsed JSON: its peak
    is a fraction of the text's size, and of what ``json.load`` of the same file takes."""
    (path,) = ddp_job(JobSpec(world=1, extra=3000), tmp_path)
    text = gzip.decompress(path.read_bytes())
    tracemalloc.start()
    try:
        json.loads(text)
        _, full = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        events = read_trace(path)
        _, streamed = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(events.gpu) == 4 * (3000 + 5)  # each step: 3000 small kernels, fwd, bwd, overlap, all-reduce, memcpy
    assert streamed < full / 2, (streamed, full)


def test_torch_profiler_events_read_as_the_exported_trace(tmp_path):
    """The seam the torch backend's hook reads (``kineto_results.events()``): the same annotations
    and steps as the Chrome trace torch exports of the same cycle (a CPU run: no GPU work here)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for n in range(2):
            with record_function(f"ProfilerStep#{n}"), record_function("fwd"):
                torch.ones(8).sum()
    path = tmp_path / "cpu.json"
    prof.export_chrome_trace(str(path))
    live = from_profiler(prof.profiler.kineto_results.events())
    exported = read_trace(path)
    assert isinstance(live, RankEvents) and live.gpu == exported.gpu == []
    assert sorted(live.steps) == sorted(exported.steps) == [0, 1]
    assert [a[0] for a in live.annotations] == [a[0] for a in exported.annotations] == ["fwd", "fwd"]
    # the file's ts is after its baseTimeNanoseconds, the live events' on the epoch
    base = exported.base_us
    for (_, s1, e1), (_, s2, e2) in zip(live.annotations, exported.annotations):
        assert s1 == pytest.approx(s2 + base, abs=1.0) and e1 == pytest.approx(e2 + base, abs=1.0)
