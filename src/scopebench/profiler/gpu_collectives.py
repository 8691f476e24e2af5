"""The ledger on GPUs across ranks: each collective matched over the ranks' traces, its transfer,
each rank's wait, and per step the rank the others waited for (docs/profiler.md, "The ledger on
GPUs"); and the torch backend's ledger columns on CUDA, from the run's own events
(:func:`device_record`, :func:`device_columns`).

A collective's NCCL kernel starts on each rank when that rank's GPU reaches it and ends on every
rank together, once the last one has arrived and the data has moved. So, over the ranks' kernels
of one collective (matched by process group and sequence number where the trace records them,
else by their order among the step's collectives of the same group and op):

- ``transfer`` = the fastest rank's kernel duration (the rank that arrived last waited for no one);
- each rank's ``wait`` = its duration less the transfer: the time it sat inside the collective for
  a peer;
- the last-arriving rank = the one whose kernel was shortest. No clock is compared: ranks on
  different machines have different clocks, and a kernel's duration is read on one;
- bus bandwidth = ``bytes * factor / transfer`` (nccl-tests' convention,
  :func:`scopebench.profiler.ledger.busbw_factor`).

Per step, what each rank waited for each other rank adds up; the step's late rank is the one
waited for longest by any rank (the CPU ledger's rule, :func:`scopebench.profiler.ledger.ledger_metrics`),
its delay that wait, where: the collective the others waited most for it at, and what it did
before that collective against the other ranks' median (:class:`~scopebench.profiler.gpu_ledger.CollectiveRecord`'s
lead): ``compute`` when its GPU was busy longer (its kernels), ``gpu_idle`` when its GPU sat
idle longer, split as the idle figures are: with nothing launched (it waited for its host: the
host or input side), or with its work launched and not running (launch latency, a wait on another
stream). :func:`scopebench.report.ledger.late_rank_summary` reads the per-step rows
(:meth:`GpuLedger.rows`) as it reads the CPU ledger's.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scopebench import stats
from scopebench.profiler.gpu_ledger import CollectiveRecord, RankSummary, innermost
from scopebench.profiler.kineto import COMM, COMPUTE, RankEvents
from scopebench.profiler.ledger import busbw_factor, intersect, length, union

__all__ = [
    "DeviceRecord",
    "GpuLedger",
    "Instance",
    "device_columns",
    "device_record",
    "match",
]


@dataclass
class Instance:
    """One collective over the ranks whose traces hold it (times µs)."""

    key: tuple
    parts: dict[int, CollectiveRecord] = field(default_factory=dict)

    @property
    def first(self) -> CollectiveRecord:
        return self.parts[min(self.parts)]

    @property
    def matched(self) -> bool:
        """Seen on two ranks or more: waits and transfer mean something."""
        return len(self.parts) > 1

    @property
    def transfer(self) -> float:
        return min(p.dur for p in self.parts.values())

    @property
    def last_rank(self) -> int:
        """The rank whose kernel was shortest (the lowest such rank on a tie)."""
        return min(self.parts, key=lambda r: (self.parts[r].dur, r))

    def wait(self, rank: int) -> float:
        return self.parts[rank].dur - self.transfer

    def label(self) -> str:
        """``all_reduce #0 of group 0``: its op and place among the step's of its group and op."""
        p = self.first
        group = "" if p.collective.group == "?" else f" of group {p.collective.group}"
        where = f"#{p.collective.seq}" if p.collective.seq is not None else f"#{p.index}"
        return f"{p.collective.op} {where}{group}"

    def busbw_gb_per_sec(self, world_size: int | None) -> float | None:
        coll = self.first.collective
        size = coll.group_size or (world_size if coll.group == "?" else None)
        factor = None if size is None else busbw_factor(coll.op, size)
        if factor is None or coll.nbytes is None or self.transfer <= 0 or not self.matched:
            return None
        return coll.nbytes * factor / (self.transfer * 1e-6) / 1e9


def match(summaries: Iterable[RankSummary]) -> list[Instance]:
    """Every collective of every rank, grouped by its key (module docstring), in order of first appearance."""
    found: dict[tuple, Instance] = {}
    for summary in summaries:
        for record in summary.collectives:
            found.setdefault(record.key, Instance(record.key)).parts[summary.rank] = record
    return list(found.values())


class LateStep(NamedTuple):
    """A step's late rank (µs)."""

    rank: int
    delay: float
    instance: Instance
    #: ``compute`` or ``gpu_idle`` (:func:`_cause`).
    cause: str
    #: How much longer than the others' median it computed, or sat idle, before the collective.
    excess: float
    #: Of an idle excess, the part with nothing launched yet (its host's side; the rest: launched,
    #: not running).
    host_excess: float


@dataclass
class GpuLedger:
    """The cross-rank reading of :class:`~scopebench.profiler.gpu_ledger.RankSummary` records."""

    summaries: list[RankSummary]
    instances: list[Instance]
    #: rank -> step -> what it waited inside its collectives (µs).
    waits: dict[int, dict[int | None, float]]
    #: step -> its late rank (steps without one are absent).
    late: dict[int, LateStep]

    @classmethod
    def build(cls, summaries: list[RankSummary]) -> GpuLedger:
        instances = match(summaries)
        waits: dict[int, dict[int | None, float]] = {s.rank: defaultdict(float) for s in summaries}
        waited: dict[int | None, dict[tuple[int, int], float]] = defaultdict(lambda: defaultdict(float))
        where: dict[int | None, dict[int, tuple[float, Instance]]] = defaultdict(dict)
        for inst in instances:
            if not inst.matched:
                continue
            last = inst.last_rank
            step = inst.first.step
            for rank in inst.parts:
                wait = inst.wait(rank)
                waits[rank][step] += wait
                if rank != last and wait > 0:
                    waited[step][(rank, last)] += wait
                    if wait > where[step].get(last, (0.0, None))[0]:
                        where[step][last] = (wait, inst)
        late: dict[int, LateStep] = {}
        for step, pairs in waited.items():
            if step is None or not pairs:
                continue
            (_, who), delay = max(pairs.items(), key=lambda item: (item[1], -item[0][1]))
            inst = where[step][who][1]
            late[step] = LateStep(who, delay, inst, *_cause(inst, who))
        return cls(summaries, instances, waits, late)

    def steps(self) -> list[int]:
        """Every step in any rank's window, in order."""
        return sorted({n for s in self.summaries for n in s.steps})

    def rows(self) -> list[dict[str, Any]]:
        """One row per step as :func:`scopebench.report.ledger.late_rank_summary` reads them:
        ``step_time_sec`` (the longest host ``ProfilerStep#N`` over the ranks), ``late_rank``,
        ``late_rank_delay_sec``, ``late_rank_region`` / ``late_rank_wait_region`` (the collective),
        ``late_rank_cause``, ``late_rank_work_excess_sec`` and ``late_rank_idle_host_sec`` (its
        :class:`LateStep`'s ``excess`` and ``host_excess``, seconds)."""
        out = []
        for step in self.steps():
            hosts = [s.steps[step]["host"] for s in self.summaries if step in s.steps]
            row: dict[str, Any] = {"step": step, "step_time_sec": max(hosts) * 1e-6}
            late = self.late.get(step)
            if late is not None:
                label = late.instance.label()
                row.update(
                    late_rank=late.rank,
                    late_rank_delay_sec=late.delay * 1e-6,
                    late_rank_region=label,
                    late_rank_wait_region=label,
                    late_rank_cause=late.cause,
                    late_rank_work_excess_sec=late.excess * 1e-6,
                    late_rank_idle_host_sec=late.host_excess * 1e-6,
                )
            out.append(row)
        return out


def _cause(inst: Instance, who: int) -> tuple[str, float, float]:
    """``(cause, excess, host_excess)``: what rank ``who`` did longer than the others' median before
    ``inst`` (:class:`LateStep`)."""
    others = [p for r, p in inst.parts.items() if r != who]
    mine = inst.parts[who]
    busy = mine.lead_busy - stats.median([p.lead_busy for p in others])
    idle = mine.lead_idle - stats.median([p.lead_idle for p in others])
    host = mine.lead_idle_host - stats.median([p.lead_idle_host for p in others])
    return ("compute", busy, 0.0) if busy >= idle else ("gpu_idle", idle, host)


# -- the torch backend's columns on CUDA -----------------------------------------------------------
class DeviceRecord(NamedTuple):
    """One rank's recorded iteration on its GPU, per region (µs): what the ranks exchange."""

    rank: int
    #: region -> ``(compute, comm, comm_hidden)``.
    regions: dict[str, tuple[float, float, float]]
    #: ``(key, region, duration)`` per collective kernel launched inside a region.
    calls: list[tuple[tuple, str, float]]


def device_record(events: RankEvents, regions: Iterable[str], rank: int) -> DeviceRecord:
    """Rank ``rank``'s :class:`DeviceRecord` of one profiler cycle (``events``: its kineto events,
    :func:`scopebench.profiler.kineto.from_profiler`). A piece of GPU work belongs to the innermost
    region whose host range its launch began in; a region's ``compute`` is the union of its compute
    kernels, ``comm`` of its NCCL kernels, ``comm_hidden`` the part of that ``comm`` any compute
    kernel of the cycle overlapped."""
    names = set(regions)
    ops = sorted(events.gpu)
    launched = [events.launches.get(op.correlation, float("-inf")) for op in ops]
    owner = innermost(events.annotations, launched, names)
    compute_all = union([(op.start, op.end) for op in ops if op.kind == COMPUTE])
    out: dict[str, tuple[float, float, float]] = {}
    calls: list[tuple[tuple, str, float]] = []
    counts: dict[tuple[str, str], int] = defaultdict(int)
    for name in sorted({o for o in owner if o is not None}):
        mine = [op for op, o in zip(ops, owner) if o == name]
        compute = union([(op.start, op.end) for op in mine if op.kind == COMPUTE])
        comm = union([(op.start, op.end) for op in mine if op.kind == COMM])
        out[name] = (length(compute), length(comm), length(intersect(comm, compute_all)))
    for op, name in zip(ops, owner):
        if op.kind != COMM:
            continue
        coll = op.collective
        k = counts[(coll.group, coll.op)]
        counts[(coll.group, coll.op)] += 1
        key = ("seq", coll.group, coll.seq) if coll.seq is not None else ("order", coll.group, coll.op, k)
        if name is not None:
            calls.append((key, name, op.end - op.start))
    return DeviceRecord(rank, out, calls)


def device_columns(records: list[DeviceRecord], rank: int) -> dict[str, Any]:
    """Rank ``rank``'s ledger columns on CUDA from every rank's :class:`DeviceRecord` (seconds):
    per region ``<region>_compute_sec``, ``_comm_wait_peer_sec`` (its NCCL kernels' waits: each
    one's duration less the fastest rank's), ``_comm_transfer_sec`` (the rest of its NCCL kernels'
    time, the union's length less the waits) and ``_comm_hidden_sec``; with several ranks the
    iteration's ``late_rank`` (the rank waited for longest), ``late_rank_delay_sec`` and
    ``late_rank_wait_region`` / ``late_rank_region`` (the region of the collective waited at).

    :Examples:
        >>> a = DeviceRecord(0, {"bwd": (5.0, 4.0, 1.0)}, [(("order", "0", "all_reduce", 0), "bwd", 4.0)])
        >>> b = DeviceRecord(1, {"bwd": (8.0, 1.0, 1.0)}, [(("order", "0", "all_reduce", 0), "bwd", 1.0)])
        >>> cols = device_columns([a, b], 0)
        >>> cols["bwd_comm_wait_peer_sec"], cols["bwd_comm_transfer_sec"], cols["late_rank"]
        (3e-06, 1e-06, 1)
    """
    durations: dict[tuple, dict[int, float]] = defaultdict(dict)
    for rec in records:
        for key, _region, dur in rec.calls:
            durations[key][rec.rank] = dur
    mine = next(rec for rec in records if rec.rank == rank)
    waits: dict[str, float] = defaultdict(float)
    for key, region, dur in mine.calls:
        waits[region] += dur - min(durations[key].values())
    out: dict[str, Any] = {}
    for region, (compute, comm, hidden) in mine.regions.items():
        out[f"{region}_compute_sec"] = compute * 1e-6
        out[f"{region}_comm_wait_peer_sec"] = waits[region] * 1e-6
        out[f"{region}_comm_transfer_sec"] = max(comm - waits[region], 0.0) * 1e-6
        out[f"{region}_comm_hidden_sec"] = hidden * 1e-6
    waited: dict[tuple[int, int], float] = defaultdict(float)
    at: dict[int, tuple[float, str]] = {}
    regions = {(rec.rank, key): region for rec in records for key, region, _dur in rec.calls}
    for key, by_rank in durations.items():
        if len(by_rank) < 2:
            continue
        last = min(by_rank, key=lambda r: (by_rank[r], r))
        for r, dur in by_rank.items():
            wait = dur - by_rank[last]
            if r != last and wait > 0:
                waited[(r, last)] += wait
                if wait > at.get(last, (0.0, ""))[0]:
                    at[last] = (wait, regions[(last, key)])
    if waited:
        (_, who), delay = max(waited.items(), key=lambda item: (item[1], -item[0][1]))
        out.update(
            late_rank=who,
            late_rank_delay_sec=delay * 1e-6,
            late_rank_wait_region=at[who][1],
            late_rank_region=at[who][1],
        )
    return out
