"""The ledger of one distributed iteration: every rank's region time split into its own work,
waiting for a peer and transfer, with the communication it hid beside them (design.md,
"Profiler contract").

Input: each rank's :class:`RankRecord` (its regions' intervals, its collectives and the
intervals it was blocked, on rank 0's clock), the same list on every rank. For a blocked
interval ``[s, e]`` on rank ``r`` waiting for collectives whose last arrival over every rank
is ``A`` (by rank ``q``):

- ``comm_wait_peer`` = ``clamp(A - s, 0, e - s)``: blocked before the last rank arrived,
  counted as waiting *for* ``q`` (never for itself);
- ``comm_transfer`` = the rest of ``[s, e]``: the collective's own cost once all arrived;
- ``work`` = the region's time minus both: its compute and host overhead;
- ``comm_hidden`` = the time any collective was in flight (issue to completion) while the
  rank was not blocked: the union of the in-flight intervals minus the union of the
  blocked ones, never a sum of overlapping intervals.

So ``work + comm_wait_peer + comm_transfer`` is the region's time by construction, and the
check the tests make is of the inputs (a blocked interval inside its region). Intervals are
clipped to each region's spans. The late rank of an iteration is the rank the others waited
for longest (the maximum over waiting ranks of what each waited for it), with the region
where that wait fell and how much more work it did there than the other ranks' median.

Per collective operation: bytes, calls (also per region, where each was issued:
``<region>_comm_<op>_bytes`` / ``_calls``), time in flight (union), its blocked share and the
bus bandwidth of NCCL's tests (``busbw = bytes / t * factor``: all-reduce ``2(n-1)/n``,
all-gather, reduce-scatter and all-to-all ``(n-1)/n``, broadcast and reduce 1), with ``t``
each call's completion minus the last rank's arrival (the transfer, without the wait).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from scopebench import stats

__all__ = [
    "TIMELINE_ITERATIONS",
    "Blocked",
    "RankRecord",
    "blocked_intervals",
    "busbw_factor",
    "host_hooks",
    "intersect",
    "last_arrivals",
    "ledger_metrics",
    "ledger_timeline",
    "length",
    "subtract",
    "union",
]


@dataclass
class RankRecord:
    """One rank's iteration, times on rank 0's clock (seconds)."""

    rank: int
    #: ``(region, start, end)`` per region span.
    regions: list[tuple[str, float, float]] = field(default_factory=list)
    #: ``(group, seq, op, group_size, nbytes, issue, done)`` per collective (``done`` may be ``None``).
    calls: list[tuple[str, int, str, int, int, float, float | None]] = field(default_factory=list)
    #: ``(start, end, [indices into calls])`` per blocked interval.
    waits: list[tuple[float, float, list[int]]] = field(default_factory=list)
    #: When its step's clock stopped (``None``: not known).
    end: float | None = None
    #: When its step's clock started (``None``: not known).
    start: float | None = None
    #: Its regions' operator time (``<region>_compute_sec``, torch backend), else empty.
    compute: dict[str, float] = field(default_factory=dict)
    #: Its regions' time as the run reports it, where that is not the spans' length (the torch
    #: backend's operator-event ranges, read on another clock: a thread descheduled between the
    #: two reads loses the difference); a region's work is this less its blocked time.
    times: dict[str, float] = field(default_factory=dict)


def union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Disjoint sorted intervals covering ``intervals``.

    :Examples:
        >>> union([(0, 2), (1, 3), (5, 6)])
        [(0, 3), (5, 6)]
    """
    out: list[tuple[float, float]] = []
    for s, e in sorted(i for i in intervals if i[1] > i[0]):
        if out and s <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], e))
        else:
            out.append((s, e))
    return out


def length(intervals: list[tuple[float, float]]) -> float:
    """Total length of disjoint intervals."""
    return sum(e - s for s, e in intervals)


def intersect(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Intersection of two disjoint sorted interval lists."""
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        s, e = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if e > s:
            out.append((s, e))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def subtract(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The parts of disjoint sorted intervals ``a`` outside disjoint sorted intervals ``b``.

    :Examples:
        >>> subtract([(0, 10), (12, 14)], [(2, 3), (9, 13)])
        [(0, 2), (3, 9), (13, 14)]
    """
    out, j = [], 0
    for s, e in a:
        while j < len(b) and b[j][1] <= s:
            j += 1
        k = j
        while k < len(b) and b[k][0] < e:
            if b[k][0] > s:
                out.append((s, b[k][0]))
            s = max(s, b[k][1])
            k += 1
        if e > s:
            out.append((s, e))
    return out


def busbw_factor(op: str, size: int) -> float | None:
    """NCCL tests' bus-bandwidth factor of ``op`` over ``size`` ranks (``None``: no bandwidth).

    :Examples:
        >>> busbw_factor("all_reduce", 4), busbw_factor("all_gather", 4), busbw_factor("barrier", 4)
        (1.5, 0.75, None)
    """
    if size < 2:
        return None
    if op == "all_reduce":
        return 2.0 * (size - 1) / size
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (size - 1) / size
    if op in ("broadcast", "reduce"):
        return 1.0
    return None


def last_arrivals(records: list[RankRecord]) -> dict[tuple[str, int], tuple[float, int]]:
    """Each collective's last arrival over every rank: ``(time, rank)`` by ``(group, seq)``.

    :Examples:
        >>> a = RankRecord(0, calls=[("g", 0, "all_reduce", 2, 8, 1.0, 1.5)])
        >>> b = RankRecord(1, calls=[("g", 0, "all_reduce", 2, 8, 1.2, 1.5)])
        >>> last_arrivals([a, b])
        {('g', 0): (1.2, 1)}
    """
    latest: dict[tuple[str, int], tuple[float, int]] = {}
    for rec in records:
        for group, seq, _op, _size, _nbytes, issue, _done in rec.calls:
            key = (group, seq)
            if key not in latest or issue > latest[key][0]:
                latest[key] = (issue, rec.rank)
    return latest


class Blocked(NamedTuple):
    """One interval a rank was blocked, split at the last arrival of what it waited for:
    ``[start, cut]`` waiting for rank ``peer``, ``[cut, end]`` the transfer."""

    start: float
    #: The last arrival over every rank of the collectives it waited for, inside ``[start, end]``;
    #: ``start`` when it waited for no peer (``peer`` is ``None``).
    cut: float
    end: float
    #: The rank that arrived last (never the blocked rank itself), ``None``: none waited for.
    peer: int | None
    #: Indices into the rank's ``calls`` of the collectives it waited for.
    calls: list[int]


def blocked_intervals(rec: RankRecord, latest: dict[tuple[str, int], tuple[float, int]]) -> list[Blocked]:
    """Rank ``rec``'s blocked intervals in time order, each split at the last arrival ``A`` (by
    rank ``q``, from :func:`last_arrivals`) of the collectives it waited for: ``comm_wait_peer`` is
    ``[s, clamp(A, s, e)]`` when ``q`` is another rank, ``comm_transfer`` the rest. Waits that
    overlap (one thread blocks once) are cut so that each instant counts once.

    :Examples:
        >>> a = RankRecord(0, calls=[("g", 0, "all_reduce", 2, 8, 1.0, 1.5)], waits=[(1.0, 1.5, [0])])
        >>> b = RankRecord(1, calls=[("g", 0, "all_reduce", 2, 8, 1.2, 1.5)], waits=[(1.2, 1.5, [0])])
        >>> blocked_intervals(a, last_arrivals([a, b]))
        [Blocked(start=1.0, cut=1.2, end=1.5, peer=1, calls=[0])]
    """
    out: list[Blocked] = []
    covered = float("-inf")
    for s, e, members in sorted(rec.waits, key=lambda w: w[0]):
        s = max(s, covered)
        if e <= s:
            continue
        covered = e
        arrivals = [latest[(rec.calls[i][0], rec.calls[i][1])] for i in members if i < len(rec.calls)]
        peer, cut = None, s
        if arrivals:
            last, who = max(arrivals)
            at = min(max(last, s), e)
            if at > s and who != rec.rank:
                peer, cut = who, at
        out.append(Blocked(s, cut, e, peer, list(members)))
    return out


def _rank_ledger(rec: RankRecord, latest: dict) -> tuple[dict[str, Any], dict[int, dict[str, float]]]:
    """One rank's columns, and what it waited for each other rank, per region."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for name, s, e in rec.regions:
        spans[name].append((s, e))
    spans = {name: union(v) for name, v in spans.items()}
    peer: list[tuple[float, float, int | None]] = []  # blocked before the last arrival, and for whom
    blocked: list[tuple[float, float]] = []
    for interval in blocked_intervals(rec, latest):
        blocked.append((interval.start, interval.end))
        if interval.peer is not None:
            peer.append((interval.start, interval.cut, interval.peer))
    blocked = union(blocked)
    inflight = union([(c[5], c[6]) for c in rec.calls if c[6] is not None])
    hidden_all = length(inflight) - length(intersect(inflight, blocked))
    out: dict[str, Any] = {}
    waited: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for name, region in spans.items():
        total = rec.times.get(name, length(region))
        in_blocked = length(intersect(region, blocked))
        wait_peer = 0.0
        for s, e, who in peer:
            part = length(intersect(region, [(s, e)]))
            wait_peer += part
            waited[who][name] += part
        flight = intersect(region, inflight)
        hidden = length(flight) - length(intersect(flight, blocked))
        out[f"{name}_comm_wait_peer_sec"] = wait_peer
        out[f"{name}_comm_transfer_sec"] = max(in_blocked - wait_peer, 0.0)
        out[f"{name}_comm_hidden_sec"] = hidden
        out[f"{name}_work_sec"] = max(total - in_blocked, 0.0)
        if name in rec.compute:
            out[f"{name}_host_overhead_sec"] = max(out[f"{name}_work_sec"] - rec.compute[name], 0.0)
    out["comm_hidden_sec"] = hidden_all
    out.update(_operations(rec, latest, blocked))
    for call in rec.calls:  # where each collective was issued: per region and operation
        region = next((name for name, ivs in spans.items() if any(s <= call[5] < e for s, e in ivs)), None)
        if region is not None:
            stem = f"{region}_comm_{call[2]}"
            out[f"{stem}_bytes"] = out.get(f"{stem}_bytes", 0) + call[4]
            out[f"{stem}_calls"] = out.get(f"{stem}_calls", 0) + 1
    return out, waited


def _operations(rec: RankRecord, latest: dict, blocked: list[tuple[float, float]]) -> dict[str, Any]:
    by_op: dict[str, list[tuple]] = defaultdict(list)
    for call in rec.calls:
        by_op[call[2]].append(call)
    out: dict[str, Any] = {}
    for op, calls in by_op.items():
        flight = union([(c[5], c[6]) for c in calls if c[6] is not None])
        out[f"comm_{op}_bytes"] = sum(c[4] for c in calls)
        out[f"comm_{op}_calls"] = len(calls)
        out[f"comm_{op}_sec"] = length(flight)
        out[f"comm_{op}_exposed_sec"] = length(intersect(flight, blocked))
        moved, transfer = 0.0, 0.0
        for group, seq, _op, size, nbytes, _issue, done in calls:
            factor = busbw_factor(op, size)
            if factor is None or done is None:
                continue
            moved += nbytes * factor
            transfer += max(done - latest[(group, seq)][0], 0.0)
        if moved and transfer > 0:
            out[f"comm_{op}_busbw_gb_per_sec"] = moved / transfer / 1e9
    return out


def host_hooks(
    rec: RankRecord, hooks: dict[str, list[tuple[float, float]]], columns: dict[str, Any]
) -> dict[str, float]:
    """``<region>_host_hooks_sec``: per region, the time the training framework's own hooks ran on
    its thread outside operators (``hooks``: intervals on rank 0's clock, from
    :func:`scopebench.profiler.torch_events.analyse_events`) less the time ``rec``'s rank was
    blocked, at most the region's ``<region>_host_overhead_sec`` in ``columns``: the part of the
    host overhead a framework's events name. Regions without a host overhead are left out.

    :Examples:
        >>> rec = RankRecord(0, [("bwd", 0.0, 1.0)], waits=[(0.5, 0.7, [])])
        >>> host_hooks(rec, {"bwd": [(0.1, 0.2), (0.4, 0.8)]}, {"bwd_host_overhead_sec": 0.5})
        {'bwd_host_hooks_sec': 0.3}
    """
    blocked = union([(s, e) for s, e, _calls in rec.waits])
    out: dict[str, float] = {}
    for region, intervals in hooks.items():
        host = columns.get(f"{region}_host_overhead_sec")
        if host is None:
            continue
        ran = subtract(union(intervals), blocked)
        out[f"{region}_host_hooks_sec"] = round(min(length(ran), host), 9)
    return out


#: The first recorded iterations whose rows carry ``ledger_timeline`` (the report's per-rank
#: swimlanes: a few steps are enough to see the pattern, and the column stays small).
TIMELINE_ITERATIONS = 3


def ledger_timeline(records: list[RankRecord]) -> str:
    """Every rank's iteration as a JSON string (the ``ledger_timeline`` column): times in seconds
    from the earliest step start over the ranks, on rank 0's clock.

    ``{"ranks": [{"rank", "start", "end", "regions": [[name, start, end], ...],
    "collectives": [[op, group, seq, nbytes, issue, done], ...], "waits": [[start, end], ...]}]}``
    (``done``, ``start``, ``end`` may be null).

    :Examples:
        >>> import json
        >>> rec = RankRecord(0, [("bwd", 1.0, 1.5)], [("g", 0, "all_reduce", 2, 8, 1.2, 1.4)], [(1.3, 1.4, [0])], 1.5, 1.0)
        >>> json.loads(ledger_timeline([rec]))["ranks"][0]["collectives"]
        [['all_reduce', 'g', 0, 8, 0.2, 0.4]]
    """
    import json

    starts = [t for rec in records for t in ([rec.start] if rec.start is not None else [s for _, s, _ in rec.regions])]
    zero = min(starts) if starts else 0.0

    def at(t: float | None) -> float | None:
        return None if t is None else round(t - zero, 7)

    ranks = [
        {
            "rank": rec.rank,
            "start": at(rec.start),
            "end": at(rec.end),
            "regions": [[name, at(s), at(e)] for name, s, e in rec.regions],
            "collectives": [
                [op, group, seq, nbytes, at(issue), at(done)] for group, seq, op, _n, nbytes, issue, done in rec.calls
            ],
            "waits": [[at(s), at(e)] for s, e, _calls in rec.waits],
        }
        for rec in records
    ]
    return json.dumps({"ranks": ranks}, separators=(",", ":"))


def _cause(records: list[RankRecord], ledgers: list, late: int, region: str) -> str:
    """``compute`` or ``host_overhead``: which of the late rank's two parts of its work in ``region``
    exceeds the other ranks' median more (torch backend); ``work`` when they are not separated."""
    if not all(region in rec.compute for rec in records):
        return "work"
    others = [i for i in range(len(records)) if i != late]
    key = f"{region}_host_overhead_sec"
    compute = records[late].compute[region] - stats.median([records[i].compute[region] for i in others])
    host = ledgers[late][0].get(key, 0.0) - stats.median([ledgers[i][0].get(key, 0.0) for i in others])
    return "compute" if compute >= host else "host_overhead"


#: ``late_rank_wait_region`` when the others waited for the late rank after their step ended
#: (its delay fell after its last collective: they meet it at the next one, outside this step).
STEP_END = "step_end"


def ledger_metrics(records: list[RankRecord], rank: int) -> dict[str, Any]:
    """Rank ``rank``'s ledger columns and the iteration's late rank (the same on every rank).

    What each rank waited for each other rank: inside its regions (the columns), and at the
    end of the step (``RankRecord.end``: a rank that finished its step before the last one
    waits for it at the next collective, which the next step or the loop's own holds). The
    late rank is the one waited for longest by any rank; its ``late_rank_region`` is the region
    where its own work exceeded the other ranks' median most (where its time went), and
    ``late_rank_wait_region`` where the others waited (``step_end``: after their step);
    ``late_rank_start_lag_sec`` how much later than the others' median its step's clock started
    (lateness it brought from before the step: the loop's own synchronisation, the previous
    step's end), which :func:`scopebench.report.ledger.late_rank_summary` takes off the delay.
    """
    latest = last_arrivals(records)
    ledgers = [_rank_ledger(rec, latest) for rec in records]
    ranks = [r.rank for r in records]
    out = dict(ledgers[ranks.index(rank)][0])
    ends = [(rec.end, rec.rank) for rec in records if rec.end is not None]
    if len(ends) == len(records) > 1:
        last, who = max(ends)
        for (end, r), (_cols, waited) in zip(ends, ledgers):
            if r != who and last > end:
                waited[who][STEP_END] += last - end
    best: tuple[float, int, str] | None = None
    for _cols, waited in ledgers:
        for who, regions in waited.items():
            delay = sum(regions.values())
            if delay > 0 and (best is None or delay > best[0]):
                best = (delay, who, max(regions, key=regions.__getitem__))
    if best is None:
        return out
    delay, who, wait_region = best
    excess: dict[str, float] = {}
    for key in ledgers[ranks.index(who)][0]:
        if key.endswith("_work_sec"):
            others = [cols.get(key, 0.0) for r, (cols, _w) in zip(ranks, ledgers) if r != who]
            excess[key[: -len("_work_sec")]] = ledgers[ranks.index(who)][0][key] - stats.median(others)
    region = max(excess, key=excess.__getitem__) if excess else wait_region
    out["late_rank"] = who
    out["late_rank_delay_sec"] = delay
    out["late_rank_region"] = region if excess.get(region, 0.0) > 0 else wait_region
    out["late_rank_wait_region"] = wait_region
    out["late_rank_work_excess_sec"] = excess.get(out["late_rank_region"], 0.0)
    out["late_rank_cause"] = _cause(records, ledgers, ranks.index(who), out["late_rank_region"])
    starts = {rec.rank: rec.start for rec in records if rec.start is not None}
    if len(starts) == len(records) and who in starts:
        others = [t for r, t in starts.items() if r != who]
        out["late_rank_start_lag_sec"] = starts[who] - stats.median(others)
    return out
