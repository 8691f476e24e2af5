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
not counted twice). What names an event (communication, a framework's hooks) and the CPU
trace's short path are in :mod:`scopebench.profiler.torch_ranges`.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate
from typing import Any

from scopebench.profiler.device import MB
from scopebench.profiler.torch_ranges import NS, compute_cpu, is_comm_event, region_metrics_cpu, region_totals

__all__ = ["STEP_MARKER", "analyse_events", "kineto_events"]

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
#: The name of recorded iteration ``N``'s range in a scheduled-mode trace of the torch
#: backend: the name torch's own ``profile.step()`` gives its steps.
STEP_MARKER = "ProfilerStep#{}"
_STEP_PREFIX = STEP_MARKER.format("")


def kineto_events(prof: Any) -> list[Any]:
    """The raw events of a stopped ``torch.profiler.profile`` (the seam this module reads;
    its format is frozen by ``tests/profiler/test_torch_backend.py``)."""
    results = getattr(prof.profiler, "kineto_results", None) if prof.profiler is not None else None
    return results.events() if results is not None else []


def _display_name(name: str) -> str:
    """The operator name ``prof.events()`` shows (demangled)."""
    if name.startswith("_Z"):
        import torch

        return torch._C._demangle(name)
    return name


class _Trace:
    """One cycle's CPU ranges as parallel lists, and what the stages derive from them.

    Index ``i`` is one CPU range (an operator, a region, a communication call or an
    ``[OutOfMemory]`` record); device events and ``[memory]`` records are kept apart.
    """

    __slots__ = (
        "raw",
        "names",
        "starts",
        "ends",
        "threads",
        "sync",
        "linked",
        "fixed_mem",
        "kernel_ns",
        "device_comm",
        "memory",
        "own_dev",
        "parent",
        "order",
        "children",
        "alive",
        "is_region",
        "region_of",
        "spans",
    )

    def __init__(self) -> None:
        self.raw: list[Any] = []
        self.names: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.threads: list[int] = []
        self.sync: list[bool] = []
        self.linked: list[int] = []
        #: ``[OutOfMemory]`` records: zero-length events with their own bytes.
        self.fixed_mem: dict[int, int] = {}
        #: Correlation id of the launching operator -> device time.
        self.kernel_ns: dict[int, int] = {}
        #: Communication kernels: ``(start, end)``.
        self.device_comm: list[tuple[int, int]] = []
        #: ``[memory]`` records: ``(time, bytes of the profiled kind)``.
        self.memory: list[tuple[int, int]] = []
        #: Device time of the kernels each range launched itself.
        self.own_dev: list[int] = []
        #: Innermost enclosing range on the same thread (``-1``: none).
        self.parent: list[int] = []
        #: Synchronous ranges by (thread, start, -end): parents before children.
        self.order: list[int] = []
        self.children: list[list[int]] = []
        #: ``False`` for a range merged into its parent of the same name.
        self.alive: list[bool] = []
        self.is_region: list[bool] = []
        #: Index of the innermost enclosing region range (``-1``: none).
        self.region_of: list[int] = []
        #: ``(length, name, start, end)`` of every region range, shortest first.
        self.spans: list[tuple[int, str, int, int]] = []

    def __len__(self) -> int:
        return len(self.names)


def _read_events(events: Any, on_cuda: bool, with_ops: bool) -> _Trace:
    """Classify the raw events in one pass: CPU ranges, kernels, memory records.

    CPU ranges become the trace's rows; on CUDA, device events add their time to the
    operator that launched them (by correlation id) and communication kernels are kept
    as intervals; ``[memory]`` records (only ``with_ops``) keep the bytes of the profiled
    kind (device memory on CUDA, host memory otherwise). Filtered and hidden events are
    dropped, as ``prof.events()`` drops them, and so are the ``ProfilerStep#N`` step markers
    (the torch backend's, scheduled mode), which ``prof.events()`` keeps: they are not
    operators, and memory records inside them stay outside every operator.
    """
    from torch.autograd import DeviceType

    cpu_type = DeviceType.CPU
    cpu_kinds = (cpu_type, DeviceType.MKLDNN, DeviceType.IDEEP)
    device_kinds = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.HIP, DeviceType.XPU)
    kernel_kinds = (DeviceType.CUDA, DeviceType.PrivateUse1, DeviceType.XPU)
    trace = _Trace()
    raw, names, starts, ends = trace.raw, trace.names, trace.starts, trace.ends
    threads, sync, linked = trace.threads, trace.sync, trace.linked
    fixed_mem, kernel_ns, device_comm, memory = trace.fixed_mem, trace.kernel_ns, trace.device_comm, trace.memory
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
        elif name in _FILTERED or name.startswith(_STEP_PREFIX) or event.is_hidden_event():
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
    return trace


def _attach_launches(trace: _Trace, on_cuda: bool) -> None:
    """Tie device work to the operators that launched it (sets ``own_dev``; moves threads).

    Operators that launched device work ("frontend" events, linked id 0) get their
    kernels as their own device time, and runtime events (cudaLaunchKernel...) linked to
    them move to their thread, as ``prof.events()`` does.
    """
    n = len(trace)
    linked, sync, raw, threads = trace.linked, trace.sync, trace.raw, trace.threads
    own_dev = trace.own_dev = [0] * n
    if not (on_cuda or any(link > 0 for link in linked)):
        return
    launched: dict[int, list[int]] = {}
    for i in range(n):
        if linked[i] == 0 and sync[i] and i not in trace.fixed_mem and raw[i].activity_type() != "overhead":
            launched.setdefault(raw[i].correlation_id(), []).append(i)
    for i in range(n):
        for owner in launched.get(linked[i], ()) if linked[i] > 0 else ():
            threads[i] = threads[owner]
    if on_cuda:
        kernel_ns = trace.kernel_ns
        for corr_id, owners in launched.items():
            for i in owners:
                own_dev[i] = kernel_ns.get(corr_id, 0)


def _nest(trace: _Trace) -> None:
    """Nest the synchronous ranges: each one's innermost enclosing range on its thread.

    Sets ``parent``, ``order`` (parents before children) and ``children``.
    """
    n = len(trace)
    threads, starts, ends, sync = trace.threads, trace.starts, trace.ends, trace.sync
    parent = trace.parent = [-1] * n
    order = trace.order = sorted((i for i in range(n) if sync[i]), key=lambda i: (threads[i], starts[i], -ends[i], i))
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
    children = trace.children = [[] for _ in range(n)]
    for i in order:
        if parent[i] >= 0:
            children[parent[i]].append(i)


def _merge_duplicates(trace: _Trace) -> None:
    """Merge an only child with its parent's name into the parent (sets ``alive``).

    ``aten::mean`` calling ``aten::mean`` is one operator: the parent takes over the
    child's children and kernels (``EventList._remove_dup_nodes``), until no such pair is
    left.
    """
    n = len(trace)
    names, starts, ends = trace.names, trace.starts, trace.ends
    parent, children, own_dev = trace.parent, trace.children, trace.own_dev
    alive = trace.alive = [True] * n
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


def _attribute_regions(trace: _Trace, regions: set[str]) -> None:
    """Each range's innermost enclosing region, and the regions' time spans.

    Sets ``is_region``, ``region_of`` and ``spans`` (for communication that no region
    encloses on its own thread: see :func:`_span_region`).
    """
    n = len(trace)
    names, parent, alive = trace.names, trace.parent, trace.alive
    is_region = trace.is_region = [name in regions for name in names]
    region_of = trace.region_of = [-1] * n
    for i in trace.order:  # parents before children
        top = parent[i]
        if alive[i] and top >= 0:
            region_of[i] = top if is_region[top] else region_of[top]
    starts, ends = trace.starts, trace.ends
    trace.spans = sorted(
        (ends[i] - starts[i], names[i], starts[i], ends[i]) for i in range(n) if is_region[i] and alive[i]
    )


def _span_region(trace: _Trace, t: int) -> str | None:
    """The shortest region whose time range holds time ``t`` (any thread); ``None``: none."""
    for _, name, lo, hi in trace.spans:  # shortest first
        if lo <= t <= hi:
            return name
    return None


def _region_name(trace: _Trace, i: int) -> str | None:
    """Region of range ``i``: its enclosing region, or for communication outside every
    region of its thread (Gloo's own thread) the region whose span holds its start."""
    if trace.region_of[i] >= 0:
        return trace.names[trace.region_of[i]]
    return _span_region(trace, trace.starts[i]) if is_comm_event(trace.names[i]) else None


def _region_metrics_full(trace: _Trace) -> dict[str, float]:
    """Per-region CPU, device and communication time (see :func:`~scopebench.profiler.torch_ranges.region_totals`).

    A region's CPU time is the sum of its ranges; its device time the kernels of the
    operators inside it; communication inside a region counts in that region, and
    communication outside every region (CPU calls and device kernels alike) under
    ``comm_sync_sec``.
    """
    names, starts, ends = trace.names, trace.starts, trace.ends
    alive, is_region, region_of, own_dev = trace.alive, trace.is_region, trace.region_of, trace.own_dev
    cpu_ns: dict[str, int] = {}
    cuda_ns: dict[str, int] = {}
    comm: dict[str | None, list[tuple[int, int]]] = {}
    for i in range(len(trace)):
        if not alive[i]:
            continue
        name = names[i]
        if is_region[i]:
            cpu_ns[name] = cpu_ns.get(name, 0) + ends[i] - starts[i]
            continue
        comm_event = is_comm_event(name)
        if region_of[i] < 0 and not comm_event:
            continue
        region = _region_name(trace, i)
        if comm_event:
            comm.setdefault(region, []).append((starts[i], ends[i]))
        if region is not None and own_dev[i]:
            cuda_ns[region] = cuda_ns.get(region, 0) + own_dev[i]
    for lo, hi in trace.device_comm:
        comm.setdefault(_span_region(trace, lo), []).append((lo, hi))
    return region_totals(cpu_ns, cuda_ns, comm)


def _operator_memory(trace: _Trace) -> tuple[list[int], list[int], list[int]]:
    """Memory of every range from the ``[memory]`` records inside its time range.

    Returns:
        ``(mem, child_mem, covered)``: bytes per range (an ``[OutOfMemory]`` record its
        own), bytes of its direct children, and a difference array over the sorted
        records (its running sum is how many ranges hold each record; zero: outside
        every operator).
    """
    n = len(trace)
    starts, ends, fixed_mem = trace.starts, trace.ends, trace.fixed_mem
    memory = trace.memory
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
    alive, parent = trace.alive, trace.parent
    for i in trace.order:
        if alive[i] and parent[i] >= 0:
            child_mem[parent[i]] += mem[i]
    return mem, child_mem, covered


def _operator_rows(trace: _Trace, iteration: Any, rank: int) -> list[dict[str, Any]]:
    """One row per (region, operator): times, device times, memory and call count.

    Operators outside every region go to ``untracked``, and so do memory records outside
    every operator (as rows of their own, as in ``prof.events()``).
    """
    alive, parent, own_dev = trace.alive, trace.parent, trace.own_dev
    incl_dev = list(own_dev)
    for i in reversed(trace.order):  # children come after their parent in ``order``
        if alive[i] and parent[i] >= 0:
            incl_dev[parent[i]] += incl_dev[i]
    mem, child_mem, covered = _operator_memory(trace)
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
        row["cpu_sec"] += cpu * NS
        row["cuda_sec"] += dev * NS
        row["self_cuda_sec"] += self_dev * NS
        row["mem_mb"] += mem_bytes / MB
        row["self_mem_mb"] += self_mem / MB
        row["count"] += 1

    names, starts, ends, sync, is_region = trace.names, trace.starts, trace.ends, trace.sync, trace.is_region
    for i in range(len(trace)):
        if is_region[i] or not alive[i]:
            continue
        region = _region_name(trace, i) or "untracked"
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
    depth = 0
    for pos, (_, nbytes) in enumerate(trace.memory):
        depth += covered[pos]
        if depth == 0:
            add("untracked", _MEMORY, 0, 0, 0, nbytes, nbytes)
    return list(ops.values())


def analyse_events(
    events: Any,
    regions: set[str],
    *,
    iteration: Any = 0,
    rank: int = 0,
    on_cuda: bool = False,
    with_ops: bool = True,
    region_metrics: bool = True,
    hooks: dict[str, list[tuple[int, int]]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Per-region metrics and operator rows from one cycle's kineto events.

    A CPU-only trace that needs only region metrics takes the short path
    (:func:`~scopebench.profiler.torch_ranges.region_metrics_cpu`); otherwise the stages run
    in turn: classify the events (:func:`_read_events`), tie device work to its launching operator
    (:func:`_attach_launches`), nest the ranges (:func:`_nest`), merge duplicate nodes
    (:func:`_merge_duplicates`), attribute ranges to regions (:func:`_attribute_regions`),
    then the region metrics (:func:`_region_metrics_full`) and the operator rows
    (:func:`_operator_rows`).

    Args:
        events: ``prof.profiler.kineto_results.events()`` of a stopped ``torch.profiler.profile``.
        regions: Names of the ``record_function`` ranges that are regions.
        iteration: Value of the operator rows' ``iter`` column.
        rank: Value of their ``rank`` column.
        on_cuda: Whether CUDA activity was profiled (device times and memory then count).
        with_ops: Build the operator rows.
        region_metrics: Build the per-region metrics.
        hooks: Filled, on a CPU trace with region metrics that holds framework ranges
            (:data:`~scopebench.profiler.torch_ranges.HOOK_PREFIXES`), with each region's
            intervals inside them outside its operators (ns, kineto's clock: the Unix epoch's
            wall clock); the metrics then also hold ``<region>_hooks_compute_sec``, the
            operators inside them.

    Returns:
        ``(metrics, rows)``, with the values ``prof.events()`` would give: an operator's
        region is its innermost enclosing region on its thread (communication outside
        every region's range: the innermost region whose time range holds its start).
    """
    compute = compute_cpu(events, regions, hooks) if region_metrics and not on_cuda else {}
    if region_metrics and not with_ops and not on_cuda:
        metrics = region_metrics_cpu(events, regions)
        if metrics is not None:
            return {**metrics, **compute}, []
    trace = _read_events(events, on_cuda, with_ops)
    _attach_launches(trace, on_cuda)
    _nest(trace)
    _merge_duplicates(trace)
    _attribute_regions(trace, regions)
    metrics = {**_region_metrics_full(trace), **compute} if region_metrics else {}
    if not with_ops:
        return metrics, []
    return metrics, _operator_rows(trace, iteration, rank)
