"""The torch backend's range-level reading of a trace: what names an event, and a CPU trace's figures.

Which events are communication (:func:`is_comm_event`: any NCCL, Gloo or c10d event) and which
time a training framework's own hooks (:data:`HOOK_PREFIXES`); and what a CPU trace gives from
those ranges alone, without nesting every operator: the per-region CPU and communication time
(:func:`region_metrics_cpu`, the short path of
:func:`scopebench.profiler.torch_events.analyse_events` when no operator row is asked for) and
the time each region's thread ran operators (:func:`compute_cpu`, the ledger's
``<region>_compute_sec`` and ``<region>_hooks_compute_sec``). The full analysis, operator rows
and device time included, is :mod:`scopebench.profiler.torch_events`.
"""

from __future__ import annotations

from typing import Any

from scopebench.profiler.ledger import intersect, length, subtract, union

__all__ = [
    "DEEPSPEED_RANGE",
    "HOOK_PREFIXES",
    "NS",
    "compute_cpu",
    "is_comm_event",
    "region_metrics_cpu",
    "region_totals",
]

_COMM_PREFIXES = ("gloo:", "nccl:", "c10d::", "ncclkernel", "nccldevkernel", "record_param_comms")
_COMM_INITIALS = frozenset("gGnNcCrR")  # a cheap first test: most names start "aten::"
#: Seconds per nanosecond (kineto's clock).
NS = 1e-9
#: The prefix of the ranges :func:`scopebench.train.accelerator.build_accelerator` opens where DeepSpeed
#: marks a function of its own on CPU (its ``instrument_w_nvtx``: NVTX on CUDA, nothing on CPU).
DEEPSPEED_RANGE = "DeepSpeed::"
#: Ranges that time a training framework's own host-side work on CPU, by name prefix (the
#: ledger's ``<region>_host_hooks_sec``): FSDP2's hooks mark themselves (``FSDP::pre_forward``,
#: ``FSDP::post_backward_reduce``...), DDP's reducer marks the copy of its buckets into the
#: gradients (its per-parameter autograd hooks run unmarked), DeepSpeed's ZeRO functions through
#: :data:`DEEPSPEED_RANGE`. None wraps user code (DDP's ``DistributedDataParallel.forward`` and
#: DeepSpeed's engine ``forward`` / ``backward`` would).
HOOK_PREFIXES = ("FSDP::", "torch.distributed.ddp.reducer::", "torch::distributed::reducer::", DEEPSPEED_RANGE)


def region_totals(
    cpu_ns: dict[str, int], cuda_ns: dict[str, int], comm: dict[str | None, list[tuple[int, int]]]
) -> dict[str, float]:
    """The per-region metrics from nanosecond totals and communication intervals."""
    metrics: dict[str, float] = {}
    for name in cpu_ns:
        metrics[f"{name}_cpu_sec"] = cpu_ns[name] * NS
        metrics[f"{name}_cuda_sec"] = cuda_ns.get(name, 0) * NS
        metrics[f"{name}_comm_sec"] = length(union(comm.get(name, []))) * NS
    metrics["comm_cuda_sec"] = sum(metrics[f"{name}_comm_sec"] for name in cpu_ns)
    metrics["comm_sync_sec"] = length(union(comm.get(None, []))) * NS
    return metrics


def region_metrics_cpu(events: Any, regions: set[str]) -> dict[str, float] | None:
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
    return region_totals(cpu_ns, {}, comm)


def compute_cpu(
    events: Any, regions: set[str], hooks: dict[str, list[tuple[int, int]]] | None = None
) -> dict[str, float]:
    """``<region>_compute_sec`` of a CPU trace: the time the region's thread ran operators.

    The union of the ``aten::`` ranges on each region range's thread, clipped to the region,
    less the part that overlaps a communication range (the copies and allocations a
    collective makes are its own). Python, autograd's engine between nodes and framework
    hooks are not operators: the ledger's ``<region>_host_overhead_sec`` is the region's work
    minus this (:mod:`scopebench.profiler.ledger`).

    When the trace holds a range of :data:`HOOK_PREFIXES` (a framework's marked hooks), also
    ``<region>_hooks_compute_sec``: the part of that compute inside those ranges (the operators
    the hooks ran: ZeRO-2's gradient copies into its partitions...); and ``hooks``, when given,
    is filled per region with the intervals (ns, kineto's clock) its thread spent inside them
    outside that compute, the hooks' part of the host overhead (blocked time still in).
    """
    spans: dict[int, list[tuple[int, int, str]]] = {}
    ops: dict[int, list[tuple[int, int]]] = {}
    marked: dict[int, list[tuple[int, int]]] = {}
    comm: list[tuple[int, int]] = []
    for event in events:
        name = event.name()
        if name in regions:
            spans.setdefault(event.start_thread_id(), []).append((event.start_ns(), event.end_ns(), name))
        elif name.startswith("aten::"):
            ops.setdefault(event.start_thread_id(), []).append((event.start_ns(), event.end_ns()))
        elif name[:1] in _COMM_INITIALS and is_comm_event(name):
            comm.append((event.start_ns(), event.end_ns()))
        elif name.startswith(HOOK_PREFIXES):
            marked.setdefault(event.start_thread_id(), []).append((event.start_ns(), event.end_ns()))
    comm_union = union(comm)
    out: dict[str, float] = {name: 0.0 for ranges in spans.values() for _, _, name in ranges}
    in_hooks = dict.fromkeys(out, 0.0)
    for thread, ranges in spans.items():
        busy = union(ops.get(thread, []))
        framework = union(marked.get(thread, []))
        for lo, hi, name in ranges:
            computing = subtract(intersect(busy, [(lo, hi)]), comm_union)
            out[name] += length(computing) * NS
            if marked:
                inside = intersect(framework, [(lo, hi)])
                in_hooks[name] += length(intersect(computing, inside)) * NS
                if hooks is not None:
                    hooks.setdefault(name, []).extend(subtract(inside, computing))
    metrics = {f"{name}_compute_sec": sec for name, sec in out.items()}
    if marked:
        metrics.update({f"{name}_hooks_compute_sec": sec for name, sec in in_hooks.items()})
    return metrics


def is_comm_event(name: str) -> bool:
    """Whether a profiler event name is a communication operator.

    :Examples:
        >>> is_comm_event("gloo:all_reduce"), is_comm_event("c10d::barrier"), is_comm_event("aten::mm")
        (True, True, False)
    """
    return name.lower().startswith(_COMM_PREFIXES)
