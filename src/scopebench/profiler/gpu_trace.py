"""The ledger on GPUs in the trace: ``scopebench trace-ledger --trace OUT`` writes each rank's
file again with the ledger's lanes (docs/profiler.md, "The ledger on GPUs"), as the CPU ledger
puts its own into the traces it exports (:mod:`scopebench.profiler.trace_ledger`: the same
process, ``scopebench ledger``, pid :data:`~scopebench.profiler.trace_ledger.LEDGER_PID`,
category :data:`~scopebench.profiler.trace_ledger.CATEGORY`), on the file's own ``ts``:

- ``gpu steps``: per step of the window, over its GPU work, ``step <N>: late rank <q>`` (or
  ``: no late rank``), args this rank's figures of the step (``span_ms``... as the JSON's) and the
  step's late rank, delay and collective;
- ``gpu idle``: each idle gap of the window, cut where the work that ends it was launched:
  ``idle (nothing launched)`` (host- or input-bound) then ``idle (launched)`` (launch-bound);
- ``gpu collectives`` (more lanes where collectives overlap): each collective kernel,
  ``<op> #<k> of group <g>``, args ``bytes``, ``transfer_ms``, ``wait_ms``, ``last_rank``,
  ``busbw_gb_per_sec``, with a nested ``waiting for rank <q>`` slice over its wait.

Each file is read again, one at a time (the first pass kept only summaries), and copied with the
events spliced in after ``"traceEvents": [`` (:func:`scopebench.profiler.trace_ledger.splice`),
gzipped when it was, written atomically.
"""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

from scopebench.profiler.gpu_ledger import idle_gaps, innermost, windowed
from scopebench.profiler.kineto import read_trace
from scopebench.profiler.trace_ledger import CATEGORY, LEDGER_PID, splice, with_header

__all__ = ["STEPS_TID", "IDLE_TID", "COLLECTIVES_TID", "device_ledger_events", "write_annotated"]

#: The tracks of the device ledger, beside the CPU ledger's (1-2 and 3 up) in the same process.
STEPS_TID, IDLE_TID, COLLECTIVES_TID = 101, 102, 103


def _event(name: str, tid: int, start: float, end: float, args: dict[str, Any]) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": CATEGORY,
        "name": name,
        "pid": LEDGER_PID,
        "tid": tid,
        "ts": round(start, 3),
        "dur": round(max(end - start, 0.0), 3),
        "args": args,
    }


def device_ledger_events(path: str | Path, rank: int, report: dict, include_last_step: bool) -> list[dict[str, Any]]:
    """Rank ``rank``'s ledger events for its file ``path`` (module docstring), from the report
    :func:`scopebench.commands.trace_ledger.build_report` made."""
    events = read_trace(path)
    ops, _info = windowed(events, include_last_step)
    if not ops:
        return []
    out: list[dict[str, Any]] = []
    mine = report["ranks"][str(rank)]
    late = {row["step"]: row for row in report["steps"]}
    launches = events.launches
    by_step: dict[int, list[float]] = {}
    spans = [(str(s["step"]), *events.steps[s["step"]]) for s in mine["steps"]]
    owners = innermost(spans, [launches.get(op.correlation, float("-inf")) for op in ops])
    for op, owner in zip(ops, owners):
        if owner is not None:
            span = by_step.setdefault(int(owner), [op.start, op.end])
            span[0], span[1] = min(span[0], op.start), max(span[1], op.end)
    for step in mine["steps"]:
        n = step["step"]
        if n not in by_step:
            continue
        row = late.get(n, {})
        who = row.get("late_rank")
        title = f"step {n}: " + ("no late rank" if who is None else f"late rank {who}")
        args = {"rank": rank, **step, "late_rank": who, "late_rank_delay_ms": row.get("late_rank_delay_ms")}
        args["collective"] = row.get("collective")
        out.append(_event(title, STEPS_TID, *by_step[n], args))
    for start, launch, end in idle_gaps(ops, launches):
        cut = end if launch is None else min(max(launch, start), end)
        if cut > start:
            name = "idle (nothing launched)" if launch is not None else "idle"
            out.append(_event(name, IDLE_TID, start, cut, {"rank": rank}))
        if end > cut:
            out.append(_event("idle (launched)", IDLE_TID, cut, end, {"rank": rank}))
    origin = ops[0].start
    lanes: list[float] = []
    mine_calls = sorted(
        ((c, r) for c in report["collectives"] if (r := c["ranks"].get(str(rank))) is not None),
        key=lambda item: item[1]["start_ms"],
    )
    for coll, part in mine_calls:
        start = origin + part["start_ms"] * 1e3
        end = start + part["dur_ms"] * 1e3
        lane = next((k for k, free in enumerate(lanes) if free <= start), len(lanes))
        if lane == len(lanes):
            lanes.append(end)
        lanes[lane] = end
        args = {
            "rank": rank,
            "bytes": coll["bytes"],
            "step": coll["step"],
            "transfer_ms": coll["transfer_ms"],
            "wait_ms": part["wait_ms"],
            "last_rank": coll["last_rank"],
            "busbw_gb_per_sec": coll["busbw_gb_per_sec"],
        }
        out.append(_event(coll["label"], COLLECTIVES_TID + lane, start, end, args))
        if part["wait_ms"]:
            wait_end = start + part["wait_ms"] * 1e3
            out.append(
                _event(f"waiting for rank {coll['last_rank']}", COLLECTIVES_TID + lane, start, wait_end, {"rank": rank})
            )
    return _header(rank, out, len(lanes))


def _header(rank: int, events: list[dict[str, Any]], lanes: int) -> list[dict[str, Any]]:
    threads = {STEPS_TID: "gpu steps", IDLE_TID: "gpu idle"}
    threads.update({COLLECTIVES_TID + k: "gpu collectives" + (f" {k + 1}" if k else "") for k in range(lanes)})
    return with_header(rank, events, threads)


def write_annotated(summaries: list[Any], report: dict, out: Path, include_last_step: bool) -> list[Path]:
    """Every file with GPU work, with its rank's ledger events, into folder ``out`` (same name)."""
    from scopebench.atomic import atomic_write
    from scopebench.profiler.files import TRACE_GZIP_LEVEL

    written = []
    for summary in summaries:
        if summary.window is None:
            continue
        source = Path(summary.path)
        events = device_ledger_events(source, summary.rank, report, include_last_step)
        target = out / source.name
        with open(source, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(source, "rb") as src, atomic_write(target, "wb") as fh:
            if gzipped:
                with gzip.GzipFile(fileobj=fh, mode="wb", compresslevel=TRACE_GZIP_LEVEL) as dst:
                    splice(src, dst, lambda _base: events, needs_base=False)
            else:
                splice(src, fh, lambda _base: events, needs_base=False)
        written.append(target)
    return written
