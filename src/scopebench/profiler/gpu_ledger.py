"""The ledger on GPUs: where each rank's device time went, from its Kineto trace (docs/profiler.md,
"The ledger on GPUs"). One rank at a time (:func:`summarise`), then across ranks
(:mod:`scopebench.profiler.gpu_collectives`).

Over a set of GPU work (:class:`~scopebench.profiler.kineto.GpuOp`: kernels, memcpy, memset), with
``U(x)`` the union of intervals (:func:`scopebench.profiler.ledger.union`) and ``|x|`` its length
(:func:`figures`, microseconds):

- ``span``: from the first piece of work's start to the last one's end;
- ``compute`` = ``|U(compute kernels)|``, ``comm`` = ``|U(NCCL/RCCL kernels)|``,
  ``memory`` = ``|U(memcpy, memset)|``;
- ``idle`` = ``span - |U(all work)|``, split at each idle gap by when the work that ends it was
  launched (its ``cudaLaunchKernel`` / ``cudaMemcpyAsync``... call, on the host's clock, the GPU's
  in a Kineto trace): ``idle_host`` the part before the launch began (nothing was launched: the
  host was elsewhere, in Python, input, a synchronisation: host- or input-bound), ``idle_launch``
  the rest (the work was launched and not running yet: launch latency, a wait on another stream:
  launch-bound); ``None`` where a launch is not in the trace;
- ``comm_hidden`` = ``|U(comm) ∩ U(compute)|`` (an interval intersection), ``comm_exposed`` =
  ``comm - comm_hidden``.

The window (HTA's, so a user can cross-check): the GPU work launched before the last
``ProfilerStep#N`` starts (HTA drops the last step, a loop of ``prof.step()`` leaving it open;
``include_last_step``: launched until it ends); work without a launch in the trace is left out.
With fewer than two steps every piece of GPU work counts, as in HTA. Step ``N``'s work: launched
inside its host range. Each of the rank's collectives (one NCCL kernel each) keeps its step, its
place among the step's collectives of its group and op, its start (from the window's start, this
rank's clock), duration, the annotation its launch ran in (innermost ``record_function``), and
what the rank's GPU did before it since its previous collective of the step (or the step's first
work): ``lead_busy`` (compute and memory), ``lead_idle`` and of it ``lead_idle_host`` (nothing
launched yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scopebench.profiler.kineto import COMM, COMPUTE, MEMORY, Collective, GpuOp, RankEvents
from scopebench.profiler.ledger import intersect, length, union

__all__ = [
    "FIGURES",
    "CollectiveRecord",
    "RankSummary",
    "figures",
    "idle_gaps",
    "innermost",
    "summarise",
    "windowed",
    "window_note",
]

#: The figures of a window or a step, in the order outputs show them (µs inside, ``_ms`` out).
FIGURES = (
    "span",
    "idle",
    "idle_launch",
    "idle_host",
    "compute",
    "comm",
    "memory",
    "comm_hidden",
    "comm_exposed",
)


def _cut(ops: list[GpuOp], kind: int) -> list[tuple[float, float]]:
    return union([(op.start, op.end) for op in ops if op.kind == kind])


def figures(ops: list[GpuOp], launches: dict[int, float]) -> dict[str, float | None]:
    """The figures (module docstring) of ``ops``, µs; ``launches`` maps correlation ids to launch
    times. Empty ``ops``: every figure 0.

    :Examples:
        >>> from scopebench.profiler.kineto import GpuOp
        >>> ops = [GpuOp(0, 10, 0, 7, 1, None), GpuOp(5, 15, 1, 9, 2, None), GpuOp(20, 30, 0, 7, 3, None)]
        >>> f = figures(ops, {1: -5.0, 2: 1.0, 3: 17.0})
        >>> f["span"], f["idle"], f["idle_host"], f["idle_launch"], f["comm_hidden"], f["comm_exposed"]
        (30, 5, 2.0, 3.0, 5, 5)
    """
    if not ops:
        return {name: 0.0 for name in FIGURES}
    compute, comm, memory = _cut(ops, COMPUTE), _cut(ops, COMM), _cut(ops, MEMORY)
    busy = union([(op.start, op.end) for op in ops])
    host: float | None = 0.0
    for start, launch, end in idle_gaps(ops, launches, busy):
        if launch is None:
            host = None
            break
        host += min(max(launch - start, 0.0), end - start)
    span = busy[-1][1] - busy[0][0]
    idle = span - length(busy)
    hidden = length(intersect(comm, compute))
    return {
        "span": span,
        "idle": idle,
        "idle_launch": None if host is None else idle - host,
        "idle_host": host,
        "compute": length(compute),
        "comm": length(comm),
        "memory": length(memory),
        "comm_hidden": hidden,
        "comm_exposed": length(comm) - hidden,
    }


def idle_gaps(
    ops: list[GpuOp], launches: dict[int, float], busy: list[tuple[float, float]] | None = None
) -> list[tuple[float, float | None, float]]:
    """The GPU's idle gaps between the first and the last of ``ops``: ``(start, launch, end)``,
    ``launch`` the earliest launch of the work that ends the gap (``None``: not in the trace).
    ``busy``: ``ops``' union, when already at hand.

    :Examples:
        >>> from scopebench.profiler.kineto import GpuOp
        >>> idle_gaps([GpuOp(0, 10, 0, 7, 1, None), GpuOp(30, 40, 0, 7, 2, None)], {2: 25.0})
        [(10, 25.0, 30)]
    """
    busy = union([(op.start, op.end) for op in ops]) if busy is None else busy
    opener: dict[float, float | None] = {}
    for op in ops:
        launch = launches.get(op.correlation)
        known = opener.get(op.start)
        if op.start not in opener or (launch is not None and (known is None or launch < known)):
            opener[op.start] = launch
    return [(gap_start, opener.get(gap_end), gap_end) for (_, gap_start), (gap_end, _) in zip(busy, busy[1:])]


def innermost(
    spans: list[tuple[str, float, float]], times: list[float], names: set[str] | None = None
) -> list[str | None]:
    """For each of ``times``, the name of the latest-starting range of ``spans`` (``(name, start,
    end)``, any order) that holds it (``start <= t < end``): the innermost ``record_function`` a
    launch ran in (``None``: none holds it). ``names``: only ranges of these names.

    :Examples:
        >>> innermost([("fwd", 0, 10), ("attn", 2, 4), ("bwd", 10, 20)], [3, 5, 12, 25])
        ['attn', 'fwd', 'bwd', None]
        >>> innermost([("b", 0, 10), ("a", 5, 20)], [7, 12])
        ['a', 'a']
    """
    spans = sorted((s for s in spans if names is None or s[0] in names), key=lambda s: (s[1], -s[2]))
    order = sorted(range(len(times)), key=times.__getitem__)
    out: list[str | None] = [None] * len(times)
    active: list[tuple[str, float, float]] = []
    j = 0
    for i in order:
        t = times[i]
        while j < len(spans) and spans[j][1] <= t:
            active.append(spans[j])
            j += 1
        while active and active[-1][2] <= t:
            active.pop()
        found, skipped = None, 0
        for span in reversed(active):
            if span[2] > t:
                found = span
                break
            skipped += 1
        if skipped > 64:  # ranges of other threads that ended beneath an open one
            active = [span for span in active if span[2] > t]
        out[i] = None if found is None else found[0]
    return out


class CollectiveRecord(NamedTuple):
    """One rank's kernel of one collective (µs; ``start`` from the rank's window start)."""

    key: tuple
    step: int | None
    index: int
    collective: Collective
    start: float
    dur: float
    lead_busy: float
    lead_idle: float
    #: The part of ``lead_idle`` with nothing launched yet (the host's side).
    lead_idle_host: float
    region: str | None


@dataclass
class RankSummary:
    """What is kept of one rank once its events are gone (:func:`summarise`)."""

    rank: int
    path: str
    #: The window's figures (µs), ``None`` for a trace without GPU work.
    window: dict[str, float | None] | None
    #: Per step ``N`` in the window: its figures (µs) and ``host`` (the ``ProfilerStep#N`` range's length).
    steps: dict[int, dict[str, float | None]]
    collectives: list[CollectiveRecord]
    #: The host side: ``steps`` (``N`` -> host range length, µs, every step of the trace),
    #: ``cpu_ops``, ``span`` (first to last host event, µs).
    host: dict[str, Any]
    #: ``last_step`` (the ``N`` the window drops, or ``None``), ``first_step``, ``all_work``
    #: (fewer than two steps: every piece of work counted), ``gpu_ops`` (in the window),
    #: ``unlaunched`` (left out: no launch in the trace).
    window_info: dict[str, Any] = field(default_factory=dict)
    #: ``world_size``, ``backend``, ``nccl_version`` from ``distributedInfo``; ``device``'s name.
    info: dict[str, Any] = field(default_factory=dict)
    #: When the trace's host events begin and end, µs since the epoch (the run check), ``None``
    #: where the trace's clock is not the epoch's (:meth:`~scopebench.profiler.kineto.RankEvents.epoch_us`).
    epoch_range: tuple[float, float] | None = None


def windowed(events: RankEvents, include_last_step: bool) -> tuple[list[GpuOp], dict[str, Any]]:
    steps = events.steps
    info: dict[str, Any] = {"first_step": min(steps, default=None), "last_step": None, "all_work": len(steps) < 2}
    if len(steps) < 2:
        return sorted(events.gpu), {**info, "unlaunched": 0, "gpu_ops": len(events.gpu)}
    last = max(steps, key=lambda n: steps[n][0])
    launches = events.launches
    if include_last_step:
        bound = max(end for _s, end in steps.values())
        keep = [op for op in events.gpu if (t := launches.get(op.correlation)) is not None and t <= bound]
    else:
        info["last_step"] = last
        bound = steps[last][0]
        keep = [op for op in events.gpu if (t := launches.get(op.correlation)) is not None and t < bound]
    unlaunched = sum(1 for op in events.gpu if op.correlation not in launches)
    return sorted(keep), {**info, "unlaunched": unlaunched, "gpu_ops": len(keep)}


def _step_of(events: RankEvents, ops: list[GpuOp], step_numbers: list[int]) -> list[int | None]:
    """Each op's step: the ``ProfilerStep#N`` host range its launch began in (``None``: none)."""
    spans = [(str(n), *events.steps[n]) for n in step_numbers]
    times = [events.launches.get(op.correlation, float("-inf")) for op in ops]
    return [None if name is None else int(name) for name in innermost(spans, times)]


def _host_part(gaps: list[tuple[float, float | None, float]], lo: float, hi: float) -> float:
    """Of the idle ``gaps`` (:func:`idle_gaps`) inside ``[lo, hi]``, the part before the work that
    ends each was launched (a gap without a launch in the trace counts whole)."""
    out = 0.0
    for start, launch, end in gaps:
        start, end = max(start, lo), min(end, hi)
        if end > start:
            out += end - start if launch is None else min(max(launch - start, 0.0), end - start)
    return out


def _collectives(
    ops: list[GpuOp], steps: list[int | None], regions: list[str | None], origin: float, launches: dict[int, float]
) -> list[CollectiveRecord]:
    by_step: dict[int | None, list[int]] = {}
    for i, op in enumerate(ops):
        by_step.setdefault(steps[i], []).append(i)
    out = []
    for step, members in by_step.items():
        work = [ops[i] for i in members]
        busy_all = union([(op.start, op.end) for op in work])
        busy_other = union([(op.start, op.end) for op in work if op.kind != COMM])
        gaps = idle_gaps(work, launches, busy_all)
        counts: dict[tuple[str, str], int] = {}
        since = work[0].start
        for i in members:
            op = ops[i]
            if op.kind != COMM:
                continue
            coll = op.collective
            k = counts.get((coll.group, coll.op), 0)
            counts[(coll.group, coll.op)] = k + 1
            lead = [(since, op.start)] if op.start > since else []
            busy = length(intersect(busy_other, lead))
            idle = length(lead) - length(intersect(busy_all, lead))
            host = _host_part(gaps, since, op.start)
            key = ("seq", coll.group, coll.seq) if coll.seq is not None else ("order", step, coll.group, coll.op, k)
            out.append(
                CollectiveRecord(key, step, k, coll, op.start - origin, op.end - op.start, busy, idle, host, regions[i])
            )
            since = max(since, op.end)
    return out


def summarise(events: RankEvents, rank: int, include_last_step: bool = False) -> RankSummary:
    """One rank's :class:`RankSummary` (module docstring): the window's and each step's figures,
    its collectives and its host side; ``events`` may be dropped afterwards."""
    ops, info = windowed(events, include_last_step)
    dist = events.distributed
    host_steps = {n: end - start for n, (start, end) in sorted(events.steps.items())}
    host = {
        "steps": host_steps,
        "cpu_ops": events.cpu_ops,
        "span": None if events.host_first is None else events.host_last - events.host_first,
    }
    epoch = None
    if events.host_first is not None:
        first, last = events.epoch_us(events.host_first), events.epoch_us(events.host_last)
        epoch = None if first is None or last is None else (first, last)
    devices = events.meta.get("deviceProperties")
    summary = RankSummary(
        rank,
        events.path,
        None,
        {},
        [],
        host,
        info,
        {
            "world_size": dist.get("world_size"),
            "backend": dist.get("backend"),
            "nccl_version": dist.get("nccl_version"),
            "device": (
                devices[0].get("name")
                if isinstance(devices, list) and devices and isinstance(devices[0], dict)
                else None
            ),
        },
        epoch,
    )
    if not ops:
        return summary
    summary.window = figures(ops, events.launches)
    in_window = sorted(n for n in events.steps if n != info["last_step"]) if not info["all_work"] else []
    steps = _step_of(events, ops, in_window)
    grouped: dict[int, list[GpuOp]] = {}
    for op, step in zip(ops, steps):
        if step is not None:
            grouped.setdefault(step, []).append(op)
    for n in in_window:
        summary.steps[n] = {**figures(grouped.get(n, []), events.launches), "host": host_steps[n]}
    comm = [i for i, op in enumerate(ops) if op.kind == COMM]
    regions = innermost(events.annotations, [events.launches.get(ops[i].correlation, ops[i].start) for i in comm])
    region_of = dict(zip(comm, regions))
    summary.collectives = _collectives(
        ops, steps, [region_of.get(i) for i in range(len(ops))], ops[0].start, events.launches
    )
    return summary


def window_note(info: dict[str, Any], include_last_step: bool) -> str:
    """How a rank's window was taken, in words (the text output's and the JSON's ``window``)."""
    if info["all_work"]:
        return "every GPU event (fewer than two ProfilerStep ranges: HTA keeps them all too)"
    if include_last_step:
        return f"GPU work launched until the last ProfilerStep ends, from ProfilerStep#{info['first_step']} (--include-last-step)"
    return (
        f"GPU work launched from ProfilerStep#{info['first_step']} to the start of the last, "
        f"ProfilerStep#{info['last_step']} (HTA's window: it drops the last step; --include-last-step keeps it)"
    )
