"""The torch backend's event analysis against ``prof.events()`` on the same trace.

``analyse_events`` reads the profiler's raw kineto events instead of building
``FunctionEvent`` objects (tens of ms per iteration). These tests freeze that seam: on a
real CPU trace, and on synthetic CUDA events run through torch's own parser (CUDA cannot
run here), its region metrics and operator rows equal those of ``reference_analysis``,
the backend's former implementation over ``prof.events()``.
"""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from scopebench.profiler.device import MB
from scopebench.profiler.ledger import length, union
from scopebench.profiler.torch_events import analyse_events, kineto_events
from scopebench.profiler.torch_ranges import is_comm_event

_US = 1e-6


def reference_analysis(events, regions, iteration, rank=0, on_cuda=False):
    """Per-region metrics and operator rows from ``prof.events()`` (the former backend code)."""

    def is_cpu(event):
        return "CPU" in str(getattr(event, "device_type", "CPU"))

    region_events = [e for e in events if e.name in regions and is_cpu(e)]
    spans = [(e.time_range.start, e.time_range.end, e.name) for e in region_events]
    region_ids = {id(e) for e in region_events}

    def region_of(event):
        parent = event.cpu_parent
        while parent is not None:
            if id(parent) in region_ids:
                return parent.name
            parent = parent.cpu_parent
        if is_comm_event(event.name):
            start = event.time_range.start
            inside = [(hi - lo, name) for lo, hi, name in spans if lo <= start <= hi]
            if inside:
                return min(inside)[1]
        return None

    cpu_sec, cuda_sec, comm, ops = {}, {}, {}, {}
    for event in events:
        if id(event) in region_ids:
            cpu_sec[event.name] = cpu_sec.get(event.name, 0.0) + event.cpu_time_total * _US
            continue
        region = region_of(event)
        if is_comm_event(event.name):
            comm.setdefault(region, []).append((event.time_range.start, event.time_range.end))
        if not is_cpu(event):
            continue
        if region is not None:
            cuda_sec[region] = cuda_sec.get(region, 0.0) + event.self_device_time_total * _US
        row = ops.setdefault(
            (region or "untracked", event.name),
            {"iter": iteration, "rank": rank, "region": region or "untracked", "operator": event.name}
            | dict.fromkeys(("cpu_sec", "cuda_sec", "self_cuda_sec", "mem_mb", "self_mem_mb"), 0.0)
            | {"count": 0},
        )
        row["cpu_sec"] += event.cpu_time_total * _US
        row["cuda_sec"] += event.device_time_total * _US
        row["self_cuda_sec"] += event.self_device_time_total * _US
        row["mem_mb"] += (event.device_memory_usage if on_cuda else event.cpu_memory_usage) / MB
        row["self_mem_mb"] += (event.self_device_memory_usage if on_cuda else event.self_cpu_memory_usage) / MB
        row["count"] += 1
    metrics = {}
    for name in cpu_sec:
        metrics[f"{name}_cpu_sec"] = cpu_sec[name]
        metrics[f"{name}_cuda_sec"] = cuda_sec.get(name, 0.0)
        metrics[f"{name}_comm_sec"] = length(union(comm.get(name, []))) * _US
    metrics["comm_cuda_sec"] = sum(metrics[f"{n}_comm_sec"] for n in cpu_sec)
    metrics["comm_sync_sec"] = length(union(comm.get(None, []))) * _US
    return metrics, list(ops.values())


def _assert_same(ours, reference):
    (metrics, rows), (ref_metrics, ref_rows) = ours, reference
    # <region>_compute_sec has no prof.events() counterpart: test_compute_is_the_operators_time checks it
    metrics = {k: v for k, v in metrics.items() if not k.endswith("_compute_sec")}
    assert metrics.keys() == ref_metrics.keys()
    for key, value in ref_metrics.items():
        assert metrics[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
    by_key = {(r["region"], r["operator"]): r for r in rows}
    ref_by_key = {(r["region"], r["operator"]): r for r in ref_rows}
    assert by_key.keys() == ref_by_key.keys()
    for key, ref in ref_by_key.items():
        assert by_key[key].keys() == ref.keys()
        for column, value in ref.items():
            expected = value if isinstance(value, str) else pytest.approx(value, rel=1e-9, abs=1e-12)
            assert by_key[key][column] == expected, (key, column)


def test_cpu_trace_matches_prof_events():
    torch.manual_seed(0)
    a = torch.randn(64, 64)

    def side_thread():
        with record_function("outer"):  # a region's name on another thread: its own range
            torch.relu(a @ a)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        b = a @ a  # outside every region
        with record_function("outer"):
            c = torch.tanh(b)
            with record_function("inner"):
                d = torch.cat([c, c]) + 1
                with record_function("not_a_region"):
                    e = d.sum(0)
            thread = threading.Thread(target=side_thread)
            thread.start()
            thread.join()
        with record_function("inner"):  # the same region twice in one iteration
            f = torch.zeros(1000) + e.mean()
        del b, c, d, f
    regions = {"outer", "inner"}
    ours = analyse_events(kineto_events(prof), regions, iteration=3, rank=1)
    reference = reference_analysis(prof.events(), regions, iteration=3, rank=1)
    _assert_same(ours, reference)
    rows = {(r["region"], r["operator"]): r for r in ours[1]}
    assert rows[("inner", "aten::cat")]["mem_mb"] > 0  # memory was profiled and attributed
    assert ("untracked", "aten::mm") in rows and ("outer", "aten::tanh") in rows
    assert ours[0]["outer_cpu_sec"] > ours[0]["inner_cpu_sec"] > 0


def test_without_operator_rows_the_region_metrics_are_unchanged():
    a = torch.randn(32, 32)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("work"):
            a @ a
    metrics, rows = analyse_events(kineto_events(prof), {"work"}, with_ops=False)
    assert rows == [] and metrics == analyse_events(kineto_events(prof), {"work"})[0]
    assert metrics["work_cpu_sec"] > 0


class FakeKinetoEvent:
    """A kineto event as torch's parser reads it (CUDA events cannot be recorded here)."""

    def __init__(self, name, start, end, *, device=DeviceType.CPU, thread=1, corr=0, linked=0, nbytes=0, **kw):
        self._v = dict(
            name=name,
            start_ns=start,
            end_ns=end,
            duration_ns=end - start,
            device_type=device,
            start_thread_id=thread,
            end_thread_id=kw.pop("end_thread", thread),
            fwd_thread_id=thread,
            correlation_id=corr,
            linked_correlation_id=linked,
            nbytes=nbytes,
            is_async=kw.pop("is_async", False),
            activity_type=kw.pop("activity", "cpu_op"),
        )
        assert not kw, kw

    def __getattr__(self, method):
        value = self._v.get(method)
        if value is None:
            value = {
                "shapes": [],
                "stack": [],
                "concrete_inputs": [],
                "kwinputs": {},
                "dtypes": [],
                "structured_input_shapes": [],
                "structured_input_strides": [],
                "overload_name": "",
                "metadata_json": "",
                "extra_meta": {},
                "typed_metadata": {},
                "flow_type": 0,
                "flow_start": False,
                "is_hidden_event": False,
                "is_user_annotation": False,
                "is_python_function": False,
            }.get(method, 0)
        return lambda: value


def _synthetic_cuda_trace():
    """Two regions on thread 1, kernels linked to their launching ops, an NCCL kernel,
    a gloo event on another thread, CUDA and CPU memory records, an async range."""
    cuda = DeviceType.CUDA
    ev = FakeKinetoEvent
    return [
        ev("fwd", 1_000, 50_000, corr=1),
        ev("aten::linear", 2_000, 20_000, corr=2),
        ev("aten::addmm", 3_000, 19_000, corr=3),
        ev("cudaLaunchKernel", 4_000, 5_000, corr=100, linked=3, thread=7, activity="cuda_runtime"),
        ev("gemm_kernel", 6_000, 30_000, device=cuda, corr=100, linked=3, activity="kernel"),
        ev("aten::relu", 21_000, 25_000, corr=4),
        ev("relu_kernel", 31_000, 33_000, device=cuda, corr=101, linked=4, activity="kernel"),
        ev("[memory]", 3_500, 3_500, device=cuda, nbytes=4 * 2**20),
        ev("[memory]", 21_500, 21_500, device=cuda, nbytes=2**20),
        ev("[memory]", 22_000, 22_000, nbytes=512),  # CPU bytes: not counted on CUDA
        ev("[memory]", 92_000, 92_000, device=cuda, nbytes=-(2**20)),  # outside every op
        ev("sync", 55_000, 90_000, corr=5),
        ev("c10d::allreduce_", 56_000, 58_000, corr=6),
        ev("cudaLaunchKernel", 57_000, 57_500, corr=102, linked=6, activity="cuda_runtime"),
        ev("ncclDevKernel_AllReduce", 59_000, 80_000, device=cuda, corr=102, linked=6, activity="kernel"),
        ev("gloo:all_reduce", 60_500, 70_000, thread=9, corr=7),
        ev("aten::copy_", 85_000, 86_000, corr=8, end_thread=3),  # async: no parent, no device time
        ev("aten::add", 95_000, 96_000, corr=9),  # outside every region
        ev("add_kernel", 97_000, 98_000, device=cuda, corr=103, linked=9, activity="kernel"),
        ev("profiler::_record_function_exit", 49_000, 49_100, corr=10),  # filtered by torch
    ]


def test_synthetic_cuda_trace_matches_torchs_parser():
    from torch.autograd.profiler import profile as autograd_profile
    from torch.autograd.profiler_util import EventList

    events = _synthetic_cuda_trace()
    result = SimpleNamespace(events=lambda: events, trace_start_ns=lambda: 0)
    parsed = autograd_profile._parse_kineto_results(SimpleNamespace(use_device="cuda"), result)
    function_events = EventList(parsed, use_device="cuda", profile_memory=True)
    function_events._build_tree()
    regions = {"fwd", "sync"}
    ours = analyse_events(events, regions, iteration=0, on_cuda=True)
    _assert_same(ours, reference_analysis(function_events, regions, iteration=0, on_cuda=True))
    metrics, rows = ours
    assert metrics["fwd_cuda_sec"] == pytest.approx(26_000e-9)  # gemm + relu kernels
    assert metrics["sync_comm_sec"] == pytest.approx((58_000 - 56_000 + 80_000 - 59_000) * 1e-9)
    rows = {(r["region"], r["operator"]): r for r in rows}
    assert rows[("fwd", "aten::linear")]["cuda_sec"] == pytest.approx(24_000e-9)
    assert rows[("fwd", "aten::linear")]["self_cuda_sec"] == 0.0
    assert rows[("fwd", "aten::linear")]["mem_mb"] == pytest.approx(4.0)
    assert rows[("untracked", "[memory]")]["mem_mb"] == pytest.approx(-1.0)


def test_compute_is_the_operators_time_not_the_python_around_them():
    """A region that runs matrix products, then busy-waits in Python: its compute is the
    operators' time (within the region's), and the busy-wait is not in it."""
    import time

    from torch.profiler import ProfilerActivity, profile, record_function

    a = torch.randn(200, 200)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("work"):
            begin = time.perf_counter()
            for _ in range(20):
                a = torch.tanh(a @ a)
            ops_sec = time.perf_counter() - begin
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:
                pass
    metrics, _ = analyse_events(kineto_events(prof), {"work"}, with_ops=False)
    assert 0 < metrics["work_compute_sec"] <= ops_sec * 1.05
    assert metrics["work_cpu_sec"] - metrics["work_compute_sec"] >= 0.03 * 0.95


def test_framework_hooks_are_their_marked_ranges_outside_operators_and_only_those():
    """A region whose ``FSDP::`` range (a framework's mark) busy-waits in Python around matrix
    products, then busy-waits outside any mark: the hooks' intervals hold the marked busy-wait,
    not its operators and not the unmarked busy-wait; a trace without marks names none."""
    import time

    from scopebench.profiler.trace_ledger import clock_offset_ns

    def spin(seconds):  # its real time: on a busy machine a busy-wait that loses the CPU ends late
        begin = time.perf_counter()
        while time.perf_counter() < begin + seconds:
            pass
        return time.perf_counter() - begin

    a = torch.randn(200, 200)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("bwd"):
            with record_function("FSDP::post_backward_reduce (0)"):
                marked = time.perf_counter()
                spun = spin(0.02)
                ops = time.perf_counter()
                for _ in range(10):
                    a = torch.tanh(a @ a)
                ops = time.perf_counter() - ops
                spun += spin(0.01)
                marked = (marked, time.perf_counter())
            spin(0.03)  # the user's own Python: host overhead, no framework's
    hooks: dict = {}
    metrics, _ = analyse_events(kineto_events(prof), {"bwd"}, with_ops=False, hooks=hooks)
    assert list(hooks) == ["bwd"]
    ran = union(hooks["bwd"])
    # The marked busy-waits and the Python between its operators; the operators and the rest not.
    took = length(ran) * 1e-9
    assert spun * 0.95 <= took <= marked[1] - marked[0] - metrics["bwd_compute_sec"] + 1e-3, (spun, took, ran)
    assert took <= metrics["bwd_cpu_sec"] - 0.03 - metrics["bwd_compute_sec"] + 1e-3
    assert metrics["bwd_compute_sec"] <= ops * 1.05
    assert metrics["bwd_hooks_compute_sec"] == pytest.approx(metrics["bwd_compute_sec"])  # every op in the mark
    # On perf_counter's clock (the ledger's), the intervals lie inside the mark's own reads.
    shift = clock_offset_ns()
    assert marked[0] - 1e-3 <= (ran[0][0] - shift) * 1e-9 and (ran[-1][1] - shift) * 1e-9 <= marked[1] + 1e-3
    with profile(activities=[ProfilerActivity.CPU]) as plain:
        with record_function("bwd"):
            spin(0.005)
    none: dict = {}
    metrics, _ = analyse_events(kineto_events(plain), {"bwd"}, with_ops=False, hooks=none)
    assert none == {} and "bwd_hooks_compute_sec" not in metrics
