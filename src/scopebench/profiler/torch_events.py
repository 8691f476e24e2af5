"""The torch backend's event analysis: region metrics and operator rows from one cycle.

Events are read straight from the profiler's kineto results rather than through
``prof.events()``, whose ``FunctionEvent`` objects cost about 30 µs per event to build
in Python (tens of ms per iteration of a few hundred operators). One pass gathers the CPU
ranges, kernels and memory records; one stack pass per thread nests the ranges; an only
child with its parent's name is merged into it; kernels are tied to the operator that
launched them through correlation ids, and memory records to operators by time — the
same rules as ``torch.autograd.profiler_util.EventList``, so the numbers are those
``prof.events()`` gives (``tests/profiler/test_torch_events.py`` checks both on a real
CPU trace and on synthetic CUDA events run through torch's own parser).

Communication is any NCCL, Gloo or c10d event (all_reduce, all_gather, reduce_scatter,
broadcast, send/recv, barrier). Gloo runs collectives on its own thread, so an event
outside every region's CPU range is attributed to the region whose time range contains
its start, and a region's communication time is the length of the union of its
communication intervals (nested ``c10d::allreduce_`` / ``gloo:all_reduce`` events are
not counted twice).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Any

from scopebench.profiler.device import MB

__all__ = ["analyse_events", "is_comm_event", "kineto_events"]

_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "ncclkernel", "nccldevkernel", "record_param_comms")
_COMM_INITIALS = frozenset("gGnNcCrR")  # a cheap first test: most names start "aten::"
_NS = 1e-9
#: Names ``torch.autograd.profiler_util._filter_name`` leaves out of ``prof.events()``.
_FILTERED = frozenset(
    (
        "[memory]",
        "[OutOfMemory]",
        "profiler::_record_function_enter",
        "profiler::_record_function_enter_new",
        "profiler::_record_function_exit",
        "aten::is_leaf",
        "aten::output_nr",
        "aten::_version",
    )
)
_MEMORY, _OOM = "[memory]", "[OutOfMemory]"


def _region_totals(
    cpu_ns: dict[str, int], cuda_ns: dict[str, int], comm: dict[str | None, list[tuple[int, int]]]
) -> dict[str, float]:
    """The per-region metrics from nanosecond totals and communication intervals."""
    metrics: dict[str, float] = {}
    for name in cpu_ns:
        metrics[f"{name}_cpu_sec"] = cpu_ns[name] * _NS
        metrics[f"{name}_cuda_sec"] = cuda_ns.get(name, 0) * _NS
        metrics[f"{name}_comm_sec"] = _union_length(comm.get(name, [])) * _NS
    metrics["comm_cuda_sec"] = sum(metrics[f"{name}_comm_sec"] for name in cpu_ns)
    metrics["comm_sync_sec"] = _union_length(comm.get(None, [])) * _NS
    return metrics


def _region_metrics_cpu(events: Any, regions: set[str]) -> dict[str, float] | None:
    """Region metrics of a CPU-only trace from its region and communication ranges alone.

    Without device time or operator rows, only those ranges matter: reading just their
    fields skips most of the per-event cost. A region directly inside a region of the same
    name (which ``prof.events()`` may merge) returns ``None``: the caller then runs the
    full analysis.
    """
    ranges = []  # (start, -end, index, thread, sync, name, is_region)
    for index, event in enumerate(events):
        name = event.name()
        is_region = name in regions
        if not (is_region or (name[:1] in _COMM_INITIALS and is_comm_event(name))) or event.is_hidden_event():
            continue
        thread = event.start_thread_id()
        is_sync = not event.is_async() and thread == event.end_thread_id()
        ranges.append((event.start_ns(), -event.end_ns(), index, thread, is_sync, name, is_region))
    ranges.sort()
    open_regions: dict[int, list[tuple]] = {}  # thread -> stack of enclosing regions
    cpu_ns: dict[str, int] = {}
    comm: dict[str | None, list[tuple[int, int]]] = {}
    loose = []  # communication outside every region of its thread
    for entry in ranges:
        start, neg_end, _, thread, is_sync, name, is_region = entry
        end = -neg_end
        enclosing = None
        if is_sync:
            stack = open_regions.setdefault(thread, [])
            while stack and (start >= -stack[-1][1] or end > -stack[-1][1]):
                stack.pop()
            enclosing = stack[-1] if stack else None
        if is_region:
            if enclosing is not None and enclosing[5] == name:
                return None
            cpu_ns[name] = cpu_ns.get(name, 0) + end - start
            if is_sync:
                stack.append(entry)
        elif enclosing is not None:
            comm.setdefault(enclosing[5], []).append((start, end))
        else:
            loose.append((start, end))
    spans = sorted((-r[1] - r[0], r[5], r[0], -r[1]) for r in ranges if r[6])
    for start, end in loose:
        region = next((name for _, name, lo, hi in spans if lo <= start <= hi), None)
        comm.setdefault(region, []).append((start, end))
    return _region_totals(cpu_ns, {}, comm)


def is_comm_event(name: str) -> bool:
    """Whether a profiler event name is a communication operator.

    :Examples:
        >>> is_comm_event("gloo:all_reduce"), is_comm_event("c10d::barrier"), is_comm_event("aten::mm")
        (True, True, False)
    """
    return name.lower().startswith(_COMM_PREFIXES)


def _union_length(intervals: list[tuple[float, float]]) -> float:
    """Total length covered by possibly overlapping intervals.

    :Examples:
        >>> _union_length([(0, 2), (1, 3), (5, 6)])
        4
    """
    total, end = 0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def kineto_events(prof: Any) -> list[Any]:
    """The raw events of a stopped ``torch.profiler.profile`` (the seam this module reads;
    its format is frozen by ``tests/profiler/test_torch_backend.py``)."""
    results = getattr(prof.profiler, "kineto_results", None) if prof.profiler is not None else None
    return results.events() if results is not None else []


def _display_name(name: str) -> str:
    """The operator name ``prof.events()`` shows (demangled; profiler steps merged)."""
    if name.startswith("ProfilerStep#"):
        return "ProfilerStep*"
    if name.startswith("_Z"):
        import torch

        return torch._C._demangle(name)
    return name


def analyse_events(
    events: Any,
    regions: set[str],
    *,
    iteration: Any = 0,
    rank: int = 0,
    on_cuda: bool = False,
    with_ops: bool = True,
    region_metrics: bool = True,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per-region metrics and operator rows from one cycle's kineto events.

    Args:
        events: ``prof.profiler.kineto_results.events()`` of a stopped ``torch.profiler.profile``.
        regions: Names of the ``record_function`` ranges that are regions.
        iteration: Value of the operator rows' ``iter`` column.
        rank: Value of their ``rank`` column.
        on_cuda: Whether CUDA activity was profiled (device times and memory then count).
        with_ops: Build the operator rows.
        region_metrics: Build the per-region metrics.

    Returns:
        ``(metrics, rows)``, with the values ``prof.events()`` would give: an operator's
        region is its innermost enclosing region on its thread (communication outside
        every region's range: the innermost region whose time range holds its start).
    """
    if region_metrics and not with_ops and not on_cuda:
        metrics = _region_metrics_cpu(events, regions)
        if metrics is not None:
            return metrics, []
    from torch.autograd import DeviceType

    cpu_type = DeviceType.CPU
    cpu_kinds = (cpu_type, DeviceType.MKLDNN, DeviceType.IDEEP)
    device_kinds = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.HIP, DeviceType.XPU)
    kernel_kinds = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.XPU)
    # -- one pass over the raw events: CPU ranges, kernels, memory records -------------------
    raw: list[Any] = []
    names: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    threads: list[int] = []
    sync: list[bool] = []
    linked: list[int] = []
    fixed_mem: dict[int, int] = {}  # "[OutOfMemory]" records: zero-length events with their own bytes
    kernel_ns: dict[int, int] = {}  # correlation id of the launching operator -> device time
    device_comm: list[tuple[int, int]] = []  # communication kernels: (start, end)
    memory: list[tuple[int, int]] = []  # "[memory]" records: (time, bytes of the profiled kind)
    for event in events:
        name = event.name()
        if name == _MEMORY or name == _OOM:
            if not with_ops:
                continue
            kind = event.device_type()
            nbytes = event.nbytes() if kind in (device_kinds if on_cuda else cpu_kinds) else 0
            if name == _MEMORY:
                memory.append((event.start_ns(), nbytes))
                continue
            fixed_mem[len(names)] = nbytes
            link, is_sync, thread = 0, True, event.start_thread_id()
            start = end = event.start_ns()
        elif name in _FILTERED or event.is_hidden_event():
            continue
        elif event.device_type() != cpu_type:
            if on_cuda:
                link = event.linked_correlation_id()
                if link > 0 and event.device_type() in kernel_kinds:
                    kernel_ns[link] = kernel_ns.get(link, 0) + event.end_ns() - event.start_ns()
                if is_comm_event(name):
                    device_comm.append((event.start_ns(), event.end_ns()))
            continue
        else:
            link = event.linked_correlation_id()
            thread = event.start_thread_id()
            is_sync = not event.is_async() and thread == event.end_thread_id()
            start, end = event.start_ns(), event.end_ns()
        raw.append(event)
        names.append(name)
        starts.append(start)
        ends.append(end)
        threads.append(thread)
        sync.append(is_sync)
        linked.append(link)
    n = len(names)
    # Operators that launched device work ("frontend" events, linked id 0): their kernels
    # are their own device time, and runtime events (cudaLaunchKernel...) linked to them
    # move to their thread, as prof.events() does.
    own_dev = [0] * n
    if on_cuda or any(link > 0 for link in linked):
        launched: dict[int, list[int]] = {}
        for i in range(n):
            if linked[i] == 0 and sync[i] and i not in fixed_mem and raw[i].activity_type() != "overhead":
                launched.setdefault(raw[i].correlation_id(), []).append(i)
        for i in range(n):
            for owner in launched.get(linked[i], ()) if linked[i] > 0 else ():
                threads[i] = threads[owner]
        if on_cuda:
            for corr_id, owners in launched.items():
                for i in owners:
                    own_dev[i] = kernel_ns.get(corr_id, 0)
    # -- nesting: the innermost enclosing range on the same thread ---------------------------
    parent = [-1] * n
    order = sorted((i for i in range(n) if sync[i]), key=lambda i: (threads[i], starts[i], -ends[i], i))
    stack: list[int] = []
    current = None
    for i in order:
        if threads[i] != current:
            current, stack = threads[i], []
        start, end = starts[i], ends[i]
        while stack:
            top = stack[-1]
            if start >= ends[top] or end > ends[top]:
                stack.pop()
            else:
                parent[i] = top
                break
        stack.append(i)
    children: list[list[int]] = [[] for _ in range(n)]
    for i in order:
        if parent[i] >= 0:
            children[parent[i]].append(i)
    # An only child with its parent's name (aten::mean calling aten::mean) is merged into
    # the parent, which takes over its children and kernels (EventList._remove_dup_nodes).
    alive = [True] * n
    by_time = sorted(range(n), key=lambda i: (starts[i], -ends[i], i))
    while True:
        merged = []
        for i in by_time:
            top = parent[i]
            if alive[i] and top >= 0 and names[top] == names[i] and len(children[top]) == 1:
                children[top] = children[i]
                own_dev[top] = own_dev[i]
                for child in children[i]:
                    parent[child] = top
                merged.append(i)
        if not merged:
            break
        for i in merged:
            alive[i] = False
    is_region = [name in regions for name in names]
    region_of = [-1] * n  # index of the innermost enclosing region event
    for i in order:  # parents before children
        top = parent[i]
        if alive[i] and top >= 0:
            region_of[i] = top if is_region[top] else region_of[top]
    # Region spans, for communication that no region encloses on its own thread.
    spans = sorted((ends[i] - starts[i], names[i], starts[i], ends[i]) for i in range(n) if is_region[i] and alive[i])

    def span_region(t: int) -> str | None:
        for _, name, lo, hi in spans:  # shortest first
            if lo <= t <= hi:
                return name
        return None

    def region_name(i: int) -> str | None:
        if region_of[i] >= 0:
            return names[region_of[i]]
        return span_region(starts[i]) if is_comm_event(names[i]) else None

    metrics: dict[str, Any] = {}
    if region_metrics:
        cpu_ns: dict[str, int] = {}
        cuda_ns: dict[str, int] = {}
        comm: dict[str | None, list[tuple[int, int]]] = {}
        for i in range(n):
            if not alive[i]:
                continue
            name = names[i]
            if is_region[i]:
                cpu_ns[name] = cpu_ns.get(name, 0) + ends[i] - starts[i]
                continue
            comm_event = is_comm_event(name)
            if region_of[i] < 0 and not comm_event:
                continue
            region = region_name(i)
            if comm_event:
                comm.setdefault(region, []).append((starts[i], ends[i]))
            if region is not None and own_dev[i]:
                cuda_ns[region] = cuda_ns.get(region, 0) + own_dev[i]
        for lo, hi in device_comm:
            comm.setdefault(span_region(lo), []).append((lo, hi))
        metrics = _region_totals(cpu_ns, cuda_ns, comm)
    if not with_ops:
        return metrics, []
    # -- operator rows --------------------------------------------------------------------------
    incl_dev = list(own_dev)
    for i in reversed(order):  # children come after their parent in ``order``
        if alive[i] and parent[i] >= 0:
            incl_dev[parent[i]] += incl_dev[i]
    memory.sort(key=lambda record: record[0])
    times = [t for t, _ in memory]
    prefix = [0, *accumulate(nbytes for _, nbytes in memory)]
    covered = [0] * (len(times) + 1)
    mem = [0] * n
    for i in range(n):
        if i in fixed_mem:
            mem[i] = fixed_mem[i]
            continue
        lo, hi = bisect_left(times, starts[i]), bisect_right(times, ends[i])
        if lo < hi:
            mem[i] = prefix[hi] - prefix[lo]
            covered[lo] += 1
            covered[hi] -= 1
    child_mem = [0] * n
    for i in order:
        if alive[i] and parent[i] >= 0:
            child_mem[parent[i]] += mem[i]
    ops: dict[tuple[str, str], dict[str, Any]] = {}

    def add(region: str, name: str, cpu: int, dev: int, self_dev: int, mem_bytes: int, self_mem: int) -> None:
        row = ops.get((region, name))
        if row is None:
            row = ops[(region, name)] = {
                "iter": iteration,
                "rank": rank,
                "region": region,
                "operator": name,
                "cpu_sec": 0.0,
                "cuda_sec": 0.0,
                "self_cuda_sec": 0.0,
                "mem_mb": 0.0,
                "self_mem_mb": 0.0,
                "count": 0,
            }
        row["cpu_sec"] += cpu * _NS
        row["cuda_sec"] += dev * _NS
        row["self_cuda_sec"] += self_dev * _NS
        row["mem_mb"] += mem_bytes / MB
        row["self_mem_mb"] += self_mem / MB
        row["count"] += 1

    for i in range(n):
        if is_region[i] or not alive[i]:
            continue
        region = region_name(i) or "untracked"
        if sync[i]:
            add(
                region,
                _display_name(names[i]),
                ends[i] - starts[i],
                incl_dev[i],
                own_dev[i],
                mem[i],
                mem[i] - child_mem[i],
            )
        else:  # ranges that start and end on different threads have no children and no device time
            add(region, _display_name(names[i]), ends[i] - starts[i], 0, 0, mem[i], 0)
    # Memory records outside every operator become rows of their own, as in prof.events().
    depth = 0
    for pos, (_, nbytes) in enumerate(memory):
        depth += covered[pos]
        if depth == 0:
            add("untracked", _MEMORY, 0, 0, 0, nbytes, nbytes)
    return metrics, list(ops.values())
