"""The ledger in the trace: each rank's exported Chrome trace (torch scheduled mode with a trace
folder, several CPU ranks) also carries its own ledger of every recorded iteration of the cycle,
as events Perfetto draws and Holistic Trace Analysis reads (docs/profiler.md, "Opening a trace").

The events live in a process of their own, :data:`PROCESS_NAME` (pid :data:`LEDGER_PID`, above
Linux's highest pid, so it never meets the profiled process's), category :data:`CATEGORY`, one
thread per kind of event:

- ``iterations``: per recorded iteration ``i`` one complete event ``iteration <i>: late rank <q>``
  (or ``: no late rank``) over the iteration's clock (``RankRecord.start`` to ``.end``), its args
  the iteration's ledger summary on this rank (``late_rank``, ``late_rank_delay_ms`` and the other
  ``late_rank_*``, ``clock_align_error_ms``, per region ``<region>_work_ms``,
  ``_comm_wait_peer_ms``, ``_comm_transfer_ms``, ``_comm_hidden_ms``; the metrics' seconds in ms);
- ``blocked``: each interval the rank's thread was blocked, split where the last rank arrived
  (:func:`scopebench.profiler.ledger.blocked_intervals`, the split the ledger's metrics count):
  ``blocked (waiting for rank <q>)`` then ``blocked (transfer)``, args the collectives waited for;
- ``collectives`` (more lanes, ``collectives 2``..., where collectives overlap: Perfetto draws
  only nested slices on one track): each collective ``<op> #<seq>`` from issue to completion (to
  the iteration's end when it never completed, ``completed`` false), args ``group``, ``seq``,
  ``op``, ``bytes``, ``group_size`` and, where every blocked interval that waited for it waited
  for it alone, this rank's split of that blocked time, ``wait_peer_ms`` and ``transfer_ms``
  (absent where one interval waited for several calls at once, DDP's bucket wait: the blocked
  events carry that split). A group's sequence numbers are the same on every rank, so
  ``all_reduce #7`` names one collective in every rank's file.

Every event's args carry ``iteration`` and ``rank``.

Timebase: kineto's ``ts`` is microseconds since ``baseTimeNanoseconds`` (the file's own field) on
CLOCK_REALTIME (``c10::getTime``, read through the TSC and converted back by torch), while the
ledger's times are ``time.perf_counter`` (CLOCK_MONOTONIC) minus the rank's offset to rank 0's
clock. After each iteration :func:`ledger_iteration` reads ``time.time_ns() -
time.perf_counter_ns()`` (:func:`clock_offset_ns`: the pair read closest together of five), so
``ts = (t + offset + wall_minus_monotonic - baseTimeNanoseconds) / 1000``. Measured against
``aten`` operators bracketed by ``perf_counter`` reads (``perf/trace_timebase.py``), the mapping's
error lies within ±0.5 µs (docs/profiler.md, "Opening a trace").

The events join the trace as it is copied into its file (:func:`scopebench.profiler.files.write_exported`'s
``rewrite``): spliced in right after ``"traceEvents": [`` without parsing the rest of the JSON,
or, when the export is not laid out that way, through a full parse.
"""

from __future__ import annotations

import json
import re
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, BinaryIO

from scopebench.profiler.ledger import Blocked, RankRecord, blocked_intervals, last_arrivals

__all__ = [
    "CATEGORY",
    "LEDGER_PID",
    "PROCESS_NAME",
    "LedgerIteration",
    "clock_offset_ns",
    "ledger_events",
    "ledger_iteration",
    "ledger_rewriter",
    "record_epoch_ns",
    "splice",
    "splice_events",
    "with_header",
]

#: The pid of the ledger's tracks: Linux's pids stay below ``2**22`` (the highest ``pid_max``),
#: torch's devices are small numbers, its overhead track negative.
LEDGER_PID = 1 << 22
#: The ledger's process name in the trace, and its events' category.
PROCESS_NAME = "scopebench ledger"
CATEGORY = "scopebench_ledger"
#: The threads (tracks) of the ledger's process; collectives take lanes from :data:`COLLECTIVES_TID` up.
ITERATIONS_TID, BLOCKED_TID, COLLECTIVES_TID = 1, 2, 3
#: After the profiled process (torch sorts it by its pid), before the GPUs (``5000000 + device``).
SORT_INDEX = 4999999
#: How far into the exported JSON ``"traceEvents": [`` is looked for before a full parse.
HEAD_LIMIT = 1 << 20

#: The ledger metrics the ``iterations`` events carry (as ``_ms`` where the metric is ``_sec``).
_SUMMARY_SUFFIXES = ("_work_sec", "_comm_wait_peer_sec", "_comm_transfer_sec", "_comm_hidden_sec")
_EVENTS_ARRAY = re.compile(rb'"traceEvents"\s*:\s*\[')
_BASE_TIME = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def clock_offset_ns(tries: int = 5) -> int:
    """CLOCK_REALTIME (kineto's clock) minus CLOCK_MONOTONIC (``time.perf_counter``'s), in ns:
    of ``tries`` reads of the wall clock between two monotonic ones, the pair closest together
    (its error at most half that pair's distance, well under a microsecond)."""
    best: tuple[int, int] | None = None
    for _ in range(tries):
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, wall - (before + after) // 2)
    return best[1]


def record_epoch_ns(offset_sec: float) -> int:
    """What, added to a ledger record's time in ns (``perf_counter`` less this rank's offset to
    rank 0's clock, ``offset_sec``), gives kineto's: ns since the Unix epoch on the wall clock.
    Reads the wall clock's offset now (:func:`clock_offset_ns`)."""
    return round(offset_sec * 1e9) + clock_offset_ns()


@dataclass
class LedgerIteration:
    """One recorded iteration's ledger on this rank, ready for the trace."""

    iteration: int
    #: This rank's record (times: seconds on rank 0's clock).
    record: RankRecord
    #: Its blocked intervals, split where the last rank arrived.
    blocked: list[Blocked]
    #: The iteration's ledger summary on this rank (metric names, seconds).
    summary: dict[str, Any]
    #: Added to a record time in ns, gives ns since the Unix epoch on the wall clock (kineto's).
    epoch_ns: int


def ledger_iteration(
    iteration: int, records: list[RankRecord], rank: int, metrics: dict[str, Any], offset_sec: float
) -> LedgerIteration:
    """Rank ``rank``'s part of iteration ``iteration`` for its trace, from every rank's records
    (``Profiler.ledger_records``), the iteration's ledger ``metrics`` and this rank's clock offset
    to rank 0's (``offset_sec``, subtracted from ``perf_counter`` in the records); reads the wall
    clock's offset now (:func:`record_epoch_ns`)."""
    record = next(rec for rec in records if rec.rank == rank)
    summary = {
        key: value
        for key, value in metrics.items()
        if key.startswith("late_rank")
        or key in ("clock_align_error_sec", "comm_hidden_sec")
        or key.endswith(_SUMMARY_SUFFIXES)
    }
    blocked = blocked_intervals(record, last_arrivals(records))
    return LedgerIteration(iteration, record, blocked, summary, record_epoch_ns(offset_sec))


def _ms(seconds: float) -> float:
    return round(seconds * 1e3, 6)


def _summary_args(summary: dict[str, Any]) -> dict[str, Any]:
    """The metrics with seconds as milliseconds (``late_rank_delay_sec`` -> ``late_rank_delay_ms``)."""
    out: dict[str, Any] = {}
    for key, value in summary.items():
        if key.endswith("_sec") and isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key[: -len("_sec")] + "_ms"] = _ms(value)
        else:
            out[key] = value
    return out


def _call_splits(item: LedgerIteration) -> dict[int, tuple[float, float]]:
    """Per call index, ``(wait_peer, transfer)`` seconds of the blocked intervals that waited for
    that call alone; calls that shared a blocked interval with others are left out."""
    shared = {i for b in item.blocked if len(b.calls) > 1 for i in b.calls}
    splits = {i: (0.0, 0.0) for i in range(len(item.record.calls)) if i not in shared}
    for b in item.blocked:
        if len(b.calls) == 1 and b.calls[0] in splits:
            peer, transfer = splits[b.calls[0]]
            splits[b.calls[0]] = (peer + b.cut - b.start, transfer + b.end - b.cut)
    return splits


def ledger_events(iterations: list[LedgerIteration], base_ns: int) -> list[dict[str, Any]]:
    """The trace events of ``iterations`` (module docstring), ``ts`` in µs after ``base_ns``.

    :Examples:
        >>> rec = RankRecord(0, [("sync", 1.0, 1.5)], [("g", 7, "all_reduce", 2, 8, 1.2, 1.4)], [(1.2, 1.4, [0])], 1.5, 1.0)
        >>> item = LedgerIteration(3, rec, [Blocked(1.2, 1.3, 1.4, 1, [0])], {"late_rank": 1}, 0)
        >>> for e in ledger_events([item], 0):
        ...     if e["ph"] == "X":
        ...         print(e["tid"], e["name"], e["ts"], e["dur"])
        1 iteration 3: late rank 1 1000000.0 500000.0
        2 blocked (waiting for rank 1) 1200000.0 100000.0
        2 blocked (transfer) 1300000.0 100000.0
        3 all_reduce #7 1200000.0 200000.0
    """
    events: list[dict[str, Any]] = []
    lanes: list[float] = []  # per collectives lane, when its last event ends
    rank = None
    for item in iterations:
        rec = item.record
        rank = rec.rank

        def us(t: float, epoch: int = item.epoch_ns) -> float:
            return round((round(t * 1e9) + epoch - base_ns) / 1e3, 3)

        def event(name: str, tid: int, start: float, end: float, args: dict[str, Any]) -> None:
            ts = us(start)
            events.append(
                {
                    "ph": "X",
                    "cat": CATEGORY,
                    "name": name,
                    "pid": LEDGER_PID,
                    "tid": tid,
                    "ts": ts,
                    "dur": max(round(us(end) - ts, 3), 0.0),
                    "args": {"iteration": item.iteration, "rank": rank, **args},
                }
            )

        names = [f"{op} #{seq}" for _g, seq, op, *_rest in rec.calls]
        starts = [s for _n, s, _e in rec.regions]
        begin = rec.start if rec.start is not None else min(starts, default=None)
        end = rec.end if rec.end is not None else max((e for _n, _s, e in rec.regions), default=None)
        if begin is not None and end is not None:
            late = item.summary.get("late_rank")
            title = f"iteration {item.iteration}: " + ("no late rank" if late is None else f"late rank {late}")
            event(title, ITERATIONS_TID, begin, end, _summary_args(item.summary))
        for b in item.blocked:
            waited = [names[i] for i in b.calls if i < len(names)]
            if b.peer is not None:
                event(
                    f"blocked (waiting for rank {b.peer})",
                    BLOCKED_TID,
                    b.start,
                    b.cut,
                    {"waiting_for_rank": b.peer, "collectives": waited},
                )
            if b.end > b.cut:
                event("blocked (transfer)", BLOCKED_TID, b.cut, b.end, {"collectives": waited})
        splits = _call_splits(item)
        for index in sorted(range(len(rec.calls)), key=lambda i: rec.calls[i][5]):
            group, seq, op, size, nbytes, issue, done = rec.calls[index]
            stop = done if done is not None else max(end if end is not None else issue, issue)
            lane = next((k for k, free in enumerate(lanes) if free <= issue), len(lanes))
            if lane == len(lanes):
                lanes.append(stop)
            lanes[lane] = stop
            args: dict[str, Any] = {"group": group, "seq": seq, "op": op, "bytes": nbytes, "group_size": size}
            args["completed"] = done is not None
            if index in splits:
                args["wait_peer_ms"], args["transfer_ms"] = (_ms(v) for v in splits[index])
            event(names[index], COLLECTIVES_TID + lane, issue, stop, args)
    threads = {ITERATIONS_TID: "iterations", BLOCKED_TID: "blocked"}
    threads.update({COLLECTIVES_TID + k: "collectives" + (f" {k + 1}" if k else "") for k in range(len(lanes))})
    return with_header(rank, events, threads)


def with_header(rank: int, events: list[dict[str, Any]], threads: dict[int, str]) -> list[dict[str, Any]]:
    """``events`` after the metadata events Perfetto names and orders the ledger's process (rank
    ``rank``) and its ``threads`` (tid -> name) by, at the first event's time; ``[]`` without
    events (the CPU ledger's and the GPU ledger's, :mod:`scopebench.profiler.gpu_trace`)."""
    if not events:
        return []
    first = min(e["ts"] for e in events)

    def meta(name: str, tid: int, key: str, value: Any) -> dict[str, Any]:
        return {"ph": "M", "name": name, "ts": first, "pid": LEDGER_PID, "tid": tid, "args": {key: value}}

    header = [
        meta("process_name", 0, "name", PROCESS_NAME),
        meta("process_labels", 0, "labels", f"rank {rank}"),
        meta("process_sort_index", 0, "sort_index", SORT_INDEX),
    ]
    for tid, name in threads.items():
        header += [meta("thread_name", tid, "name", name), meta("thread_sort_index", tid, "sort_index", tid)]
    return header + events


def splice_events(src: BinaryIO, dst: BinaryIO, iterations: list[LedgerIteration]) -> None:
    """Copy an exported Chrome trace from ``src`` to ``dst`` with the ledger's events of
    ``iterations`` first in its ``traceEvents`` (:func:`splice`).

    :Examples:
        >>> import io
        >>> rec = RankRecord(0, [], [("g", 0, "barrier", 2, 0, 1.0, 2.0)], [], 2.0, 1.0)
        >>> item = LedgerIteration(0, rec, [], {}, 0)
        >>> out = io.BytesIO()
        >>> splice_events(io.BytesIO(b'{"baseTimeNanoseconds": 0, "traceEvents": [\\n]}'), out, [item])
        >>> [e["name"] for e in json.loads(out.getvalue())["traceEvents"] if e["ph"] == "X"]
        ['iteration 0: no late rank', 'barrier #0']
    """
    splice(src, dst, partial(ledger_events, iterations))


def splice(
    src: BinaryIO, dst: BinaryIO, make_events: Callable[[int], list[dict[str, Any]]], needs_base: bool = True
) -> None:
    """Copy a Chrome trace from ``src`` to ``dst`` with the events ``make_events(base)`` gives first
    in its ``traceEvents`` (``base``: the file's ``baseTimeNanoseconds``, 0 without one; the device
    ledger's events, on the file's own ``ts``, do not need it: ``needs_base=False``).

    torch writes ``"baseTimeNanoseconds"`` and then ``"traceEvents": [`` in the first lines: the
    events go right after the bracket and the rest is copied as it is, never parsed. A file laid
    out otherwise (no ``baseTimeNanoseconds`` before the events where ``needs_base``) is parsed
    whole; one that is not JSON is copied unchanged, with a warning.
    """
    head = b""
    while True:
        chunk = src.read(1 << 16)
        head += chunk
        found = _EVENTS_ARRAY.search(head)
        after = head[found.end() :].lstrip() if found else b""
        if (found and after) or not chunk or len(head) > HEAD_LIMIT:
            break
    base = _BASE_TIME.search(head, 0, found.start()) if found else None
    if found is None or not after or (needs_base and base is None):
        _rewrite_parsed(head + src.read(), dst, make_events)
        return
    events = make_events(int(base.group(1)) if base else 0)
    dst.write(head[: found.end()])
    if events:
        text = ",\n".join(json.dumps(e, separators=(",", ":")) for e in events)
        dst.write(b"\n" + text.encode() + (b"\n" if after.startswith(b"]") else b",\n"))
    dst.write(head[found.end() :])
    shutil.copyfileobj(src, dst, 1 << 20)


def _rewrite_parsed(data: bytes, dst: BinaryIO, make_events: Callable[[int], list[dict[str, Any]]]) -> None:
    try:
        trace = json.loads(data)
        if not isinstance(trace, dict):
            raise ValueError(f"expected a JSON object, got {type(trace).__name__}")
    except ValueError as exc:
        warnings.warn(
            f"the exported trace is not a JSON object ({exc}): written without the ledger's events",
            RuntimeWarning,
            stacklevel=2,
        )
        dst.write(data)
        return
    events = make_events(int(trace.get("baseTimeNanoseconds", 0)))
    trace["traceEvents"] = events + list(trace.get("traceEvents", []))
    dst.write(json.dumps(trace).encode())


def ledger_rewriter(iterations: list[LedgerIteration]):
    """The ``rewrite`` of :func:`scopebench.profiler.files.write_exported` that adds
    ``iterations``' events to the trace (:func:`splice_events`)."""
    return partial(splice_events, iterations=iterations)
