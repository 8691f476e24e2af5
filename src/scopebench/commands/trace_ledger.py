"""The ledger of a GPU job from its Kineto traces: where each rank's device time went, each
collective's transfer and waits, and the rank the others wait for (docs/profiler.md, "The ledger
on GPUs"; docs/tools.md, "trace-ledger").

What it measures: for any PyTorch job's ``torch.profiler`` traces (one rank per file: the suite's
cycle folders, ``tensorboard_trace_handler``'s output, any ``.json`` / ``.json.gz``), per rank over
a window and per ``ProfilerStep#N``: span, GPU idle (split into launch-bound and host-bound),
compute, communication (NCCL / RCCL kernels of every naming era), memory, hidden and exposed
communication (:mod:`scopebench.profiler.gpu_ledger`); per collective, matched across ranks, its
transfer, each rank's wait, the last-arriving rank and the bus bandwidth; the late rank: which,
the median per-step delay, in how many steps, at which collective and what it did before
(:mod:`scopebench.profiler.gpu_collectives`, the 75 % / 10 % rule of
:func:`scopebench.report.ledger.late_rank_summary`). The default window is Holistic Trace
Analysis's (work launched before the last ``ProfilerStep`` starts), so its figures can be checked
against HTA's. Files are read one at a time, streamed: memory holds one rank's events at a time,
and every rank's summaries and collectives.

How to run::

    scopebench trace-ledger traces/pi05_train_<run-id>/cycle0          # a cycle folder: its ranks
    scopebench trace-ledger traces/pi05_train_<run-id>                  # a run folder: its last cycle
    scopebench trace-ledger rank0.json.gz rank1.json.gz --json ledger.json --trace annotated/

A folder gives its ``*.pt.trace.json(.gz)`` files (else every ``*.json(.gz)``); one holding
``cycle<k>`` folders (a scheduled run's), its last cycle's. The rank is the file's
``distributedInfo`` rank, else a ``rank<N>`` in its name; a lone file without either is rank 0
(as HTA takes it), said in the output. ``--include-last-step`` keeps the last step.
``--trace OUT`` writes each file, with the ledger's lanes added (a ``scopebench ledger``
process: per step, the GPU's idle gaps, each collective's wait and transfer), into folder ``OUT``.

Output: per rank the window's figures, per step their median over the ranks, per collective op
its calls, bytes, transfer and bus bandwidth, then ``late rank: ...``. JSON (``--json FILE``):
``tool``, ``files``, ``window`` (``note``, ``include_last_step``), ``ranks`` (rank -> ``path``,
``rank_from``, ``info``, ``window`` (``span_ms``, ``idle_ms``, ``idle_launch_ms``,
``idle_host_ms``, ``compute_ms``, ``comm_ms``, ``memory_ms``, ``comm_hidden_ms``,
``comm_exposed_ms``, ``comm_wait_ms``; null without GPU work), ``window_info``, ``steps`` (per
step ``step``, the same keys and ``host_ms``), ``host`` (``steps``, ``cpu_ops``, ``span_ms``)),
``collectives`` (per collective ``label``, ``op``, ``group``, ``seq``, ``step``, ``index``,
``bytes``, ``group_size``, ``ranks_present``, ``matched``, ``transfer_ms``, ``last_rank``,
``busbw_gb_per_sec``, ``ranks``: rank -> ``start_ms``, ``dur_ms``, ``wait_ms``, ``region``),
``steps`` (per step ``step``, ``step_time_ms``, ``late_rank``, ``late_rank_delay_ms``,
``collective``, ``cause``, ``excess_ms``), ``late_rank`` (``rank``, null when no rank is late,
``delay_ms``, ``steps``, ``of_steps``, ``named_steps``, ``share_pct``, ``collective``, ``op``,
``region``, ``cause`` (``compute`` or ``gpu_idle``), ``excess_ms``, ``idle_host_ms`` (of an idle
excess, the part with nothing launched), ``line``).

Exit status: 0; 2 with one line naming the file for a refused input: not a trace, a truncated
file, two files claiming one rank, ranks of different runs (world sizes that differ, or, where the
traces' times are on the wall clock, events more than :data:`RUN_SLACK_SEC` apart), a rank that
cannot be told, no trace in a folder, ``--trace`` naming an input's folder. A trace without GPU events (a CPU-only run) gets one line on stderr naming it and
its host side in the output.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from scopebench.commands._common import finish, refuses

HELP = "the ledger of any PyTorch job's GPU Kineto traces: per-rank time, collectives' waits, the late rank"
_CYCLE = re.compile(r"^cycle(\d+)$")
#: Two ranks of one run overlap in time; runs further apart than this (seconds) are different.
RUN_SLACK_SEC = 60.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("paths", nargs="+", metavar="PATH", help="trace files or folders (.json, .json.gz)")
    parser.add_argument("--json", default=None, metavar="FILE", help="write the ledger as JSON")
    parser.add_argument(
        "--trace", default=None, metavar="OUT", help="write each trace with the ledger's lanes into folder OUT"
    )
    parser.add_argument(
        "--include-last-step", action="store_true", help="keep the last ProfilerStep (HTA's window drops it)"
    )


def trace_files(paths: list[str]) -> tuple[list[Path], list[str]]:
    """The files ``paths`` name (module docstring), and notes on how folders were read."""
    files: list[Path] = []
    notes: list[str] = []
    for given in paths:
        path = Path(given)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such file or folder")
        if path.is_file():
            files.append(path)
            continue
        found = _traces_in(path)
        if not found:
            cycles = sorted((int(m.group(1)), p) for p in path.iterdir() if p.is_dir() and (m := _CYCLE.match(p.name)))
            if cycles:
                last = cycles[-1][1]
                found = _traces_in(last)
                if len(cycles) > 1:
                    notes.append(
                        f"{path}: its last cycle, {last.name}, of {len(cycles)} (give a cycle folder for another)"
                    )
        if not found:
            raise ValueError(f"{path}: no Kineto trace files (*.json, *.json.gz) in this folder")
        files.extend(found)
    return files, notes


def _traces_in(folder: Path) -> list[Path]:
    names = [p for p in sorted(folder.iterdir()) if p.is_file() and p.name.endswith((".json", ".json.gz"))]
    torch_named = [p for p in names if ".pt.trace.json" in p.name]
    return torch_named or names


def load_ranks(files: list[Path], include_last_step: bool = False) -> tuple[list[Any], dict[int, str], list[str]]:
    """Every file's :class:`~scopebench.profiler.gpu_ledger.RankSummary`, read one at a time;
    how each rank was told; notes. Raises ``ValueError`` naming the file(s) (module docstring)."""
    from scopebench.profiler.gpu_ledger import summarise
    from scopebench.profiler.kineto import rank_of, read_trace

    summaries: list[Any] = []
    told: dict[int, str] = {}
    notes: list[str] = []
    for path in files:
        events = read_trace(path)
        rank = rank_of(events)
        how = "distributedInfo" if events.distributed.get("rank") is not None else "file name"
        if rank is None:
            if len(files) > 1:
                raise ValueError(
                    f"{path}: no rank (no distributedInfo, no rank<N> in its name): cannot tell its rank among {len(files)} files"
                )
            rank, how = 0, "assumed"
            notes.append(f"{path}: no distributedInfo and no rank in its name: taken as rank 0, as HTA does")
        other = next((s for s in summaries if s.rank == rank), None)
        if other is not None:
            raise ValueError(
                f"{other.path} and {path} both claim rank {rank} (several profiler cycles? give the files of one cycle)"
            )
        summary = summarise(events, rank, include_last_step)
        del events  # one rank's events at a time
        if summary.window is None:
            print(
                f"scopebench trace-ledger: {path}: no GPU events (kernels, memcpy, memset): a CPU-only trace; "
                "its host side follows",
                file=sys.stderr,
            )
        summaries.append(summary)
        told[rank] = how
    _same_run(summaries)
    return sorted(summaries, key=lambda s: s.rank), told, notes


def _same_run(summaries: list[Any]) -> None:
    """Refuse ranks of different runs: world sizes that differ, or traces that do not overlap in time."""
    sized = [s for s in summaries if isinstance(s.info.get("world_size"), int)]
    for s in sized[1:]:
        if s.info["world_size"] != sized[0].info["world_size"]:
            raise ValueError(
                f"{sized[0].path} (rank {sized[0].rank}) and {s.path} (rank {s.rank}) are not ranks of one run: "
                f"world size {sized[0].info['world_size']} and {s.info['world_size']}"
            )
    timed = [s for s in summaries if s.epoch_range is not None]
    for s in timed[1:]:
        a, b = timed[0].epoch_range, s.epoch_range
        apart = max(a[0], b[0]) - min(a[1], b[1])
        if apart > RUN_SLACK_SEC * 1e6:
            raise ValueError(
                f"{timed[0].path} (rank {timed[0].rank}) and {s.path} (rank {s.rank}) are not ranks of one run: "
                f"their events are {apart / 1e6:.0f} s apart"
            )


@refuses("trace-ledger")
def run(args: argparse.Namespace) -> int:
    if args.json:  # (policy.tools, the home of the check, imports torch: only when asked)
        from scopebench.policy.tools import check_json_path

        check_json_path("--json", args.json)
    out = None
    if args.trace:
        from scopebench.profiler.config import check_writable_dir

        out = Path(args.trace)
        if out.exists() and not out.is_dir():
            raise ValueError(f"--trace {out}: not a folder")
        if not out.exists():
            check_writable_dir("--trace", out.parent if str(out.parent) else Path("."))
    files, notes = trace_files(args.paths)
    if out is not None:
        names = [p.name for p in files]
        if len(set(names)) != len(names):
            raise ValueError(f"--trace {out}: two input files share a name; give files of distinct names")
        inside = next((p for p in files if p.parent.resolve() == out.resolve()), None)
        if inside is not None:
            raise ValueError(
                f"--trace {out}: the folder of {inside}; give another folder (the inputs stay as they are)"
            )
    summaries, told, more = load_ranks(files, args.include_last_step)
    report = build_report(summaries, told, notes + more, args.include_last_step)
    if out is not None:
        from scopebench.profiler.gpu_trace import write_annotated

        out.mkdir(parents=True, exist_ok=True)
        written = write_annotated(summaries, report, out, args.include_last_step)
        report["annotated"] = [str(p) for p in written]
    finish(format_report(report), report, args.json)
    return 0


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value / 1e3, 6)


def _figures_ms(figures: dict[str, Any]) -> dict[str, float | None]:
    return {f"{key}_ms": _ms(value) for key, value in figures.items()}


def build_report(summaries: list[Any], told: dict[int, str], notes: list[str], include_last_step: bool) -> dict:
    """The JSON (module docstring) from the ranks' summaries."""
    from scopebench.profiler.gpu_collectives import GpuLedger
    from scopebench.profiler.gpu_ledger import window_note
    from scopebench.report.ledger import late_rank_summary

    gpu = [s for s in summaries if s.window is not None]
    ledger = GpuLedger.build(gpu)
    world = next((s.info["world_size"] for s in summaries if isinstance(s.info.get("world_size"), int)), None)
    ranks = {}
    for s in summaries:
        waits = ledger.waits.get(s.rank, {})
        window = None if s.window is None else {**_figures_ms(s.window), "comm_wait_ms": _ms(sum(waits.values()))}
        steps = [
            {"step": n, **_figures_ms(fig), "comm_wait_ms": _ms(waits.get(n, 0.0))}
            for n, fig in sorted(s.steps.items())
        ]
        ranks[str(s.rank)] = {
            "path": s.path,
            "rank_from": told[s.rank],
            "info": s.info,
            "window": window,
            "window_info": s.window_info,
            "steps": steps,
            "host": {
                "steps": [{"step": n, "ms": _ms(d)} for n, d in s.host["steps"].items()],
                "cpu_ops": s.host["cpu_ops"],
                "span_ms": _ms(s.host["span"]),
            },
        }
    collectives = []
    for inst in ledger.instances:
        coll = inst.first.collective
        collectives.append(
            {
                "label": inst.label(),
                "op": coll.op,
                "group": coll.group,
                "seq": coll.seq,
                "step": inst.first.step,
                "index": inst.first.index,
                "bytes": coll.nbytes,
                "group_size": coll.group_size,
                "ranks_present": len(inst.parts),
                "matched": inst.matched,
                "transfer_ms": _ms(inst.transfer) if inst.matched else None,
                "last_rank": inst.last_rank if inst.matched else None,
                "busbw_gb_per_sec": inst.busbw_gb_per_sec(world),
                "ranks": {
                    str(r): {
                        "start_ms": _ms(p.start),
                        "dur_ms": _ms(p.dur),
                        "wait_ms": _ms(inst.wait(r)) if inst.matched else None,
                        "region": p.region,
                    }
                    for r, p in sorted(inst.parts.items())
                },
            }
        )
    rows = ledger.rows()
    steps = [
        {
            "step": row["step"],
            "step_time_ms": _ms(row["step_time_sec"] * 1e6),
            "late_rank": row.get("late_rank"),
            "late_rank_delay_ms": _ms(row["late_rank_delay_sec"] * 1e6) if "late_rank" in row else None,
            "collective": row.get("late_rank_wait_region"),
            "cause": row.get("late_rank_cause"),
            "excess_ms": _ms(row["late_rank_work_excess_sec"] * 1e6) if "late_rank" in row else None,
        }
        for row in rows
    ]
    late = late_rank_summary(rows) if len(gpu) > 1 else None
    window_notes = sorted({window_note(s.window_info, include_last_step) for s in gpu})
    return {
        "tool": "trace-ledger",
        "files": [s.path for s in summaries],
        "notes": notes,
        "window": {"note": "; ".join(window_notes) or None, "include_last_step": include_last_step},
        "world_size": world,
        "ranks": ranks,
        "collectives": collectives,
        "steps": steps,
        "late_rank": _late(late, ledger, rows, len(gpu)),
    }


def _late(late: Any, ledger: Any, rows: list[dict], ranks: int) -> dict[str, Any]:
    from scopebench import stats
    from scopebench.report.ledger import LATE_RANK_CONSISTENT_PCT, LATE_RANK_MIN_PCT

    if late is None:
        why = (
            "one rank: no one to wait for"
            if ranks < 2
            else f"no rank kept the others waiting in {LATE_RANK_CONSISTENT_PCT:g}% of the steps for "
            f"{LATE_RANK_MIN_PCT:g}% of the step or more"
        )
        empty = dict.fromkeys(("delay_ms", "named_steps", "share_pct", "collective", "op", "region", "cause"))
        empty.update(dict.fromkeys(("excess_ms", "idle_host_ms")))
        return {"rank": None, **empty, "steps": 0, "of_steps": len(rows), "line": f"late rank: none ({why})"}
    mine = [ledger.late[row["step"]] for row in rows if row.get("late_rank") == late.rank]
    inst = mine[0].instance
    collective = late.wait_region
    region = next((i.instance.parts[late.rank].region for i in mine if i.instance.parts[late.rank].region), None)
    excess = late.work_excess_sec
    line = (
        f"late rank: rank {late.rank} arrives {late.delay_sec * 1e3:.1f} ms late per step (median) at {collective}"
        + (f" (launched in {region})" if region else "")
        + f", in {late.iterations} of {len(rows)} steps"
    )
    host = stats.median([i.host_excess for i in mine]) * 1e-6
    if excess is not None and late.cause == "gpu_idle":
        line += f"; before it its GPU sat idle {excess * 1e3:.1f} ms longer than the others'"
        if host >= excess / 2:
            line += f" ({host * 1e3:.1f} ms with nothing launched: waiting for its host, the host or input side)"
        else:
            line += (
                f" ({(excess - host) * 1e3:.1f} ms with its work launched but not running: launch latency, "
                "or a wait on another stream)"
            )
    elif excess is not None:
        line += f"; before it its kernels took {excess * 1e3:.1f} ms longer than the others' (its compute)"
    return {
        "rank": late.rank,
        "delay_ms": late.delay_sec * 1e3,
        "steps": late.iterations,
        "of_steps": len(rows),
        "named_steps": late.counted,
        "share_pct": late.share_pct,
        "collective": collective,
        "op": inst.first.collective.op,
        "region": region,
        "cause": late.cause,
        "excess_ms": None if excess is None else excess * 1e3,
        "idle_host_ms": host * 1e3 if late.cause == "gpu_idle" else None,
        "line": line,
    }


#: The text's columns: (figure, heading).
_COLUMNS = (
    ("span", "span"),
    ("idle", "idle"),
    ("idle_host", "host"),
    ("idle_launch", "launch"),
    ("compute", "compute"),
    ("comm", "comm"),
    ("comm_hidden", "hidden"),
    ("comm_exposed", "exposed"),
    ("memory", "memory"),
    ("comm_wait", "waited"),
)
_WIDTH = 9
_LEGEND = (
    "  idle = host + launch (host: nothing launched yet; launch: launched, not running yet);\n"
    "  comm = hidden + exposed (hidden: under compute); waited: inside collectives, for a peer"
)


def _row(label: str, figures: dict[str, Any]) -> str:
    cells = []
    for key, _ in _COLUMNS:
        value = figures.get(f"{key}_ms")
        cells.append(f"{'-' if value is None else f'{value:.1f}':>{_WIDTH}}")
    return f"  {label:<8}" + "".join(cells)


def format_report(report: dict) -> str:
    """The text: where each rank's GPU time went, per step, the collectives, the late rank."""
    from scopebench import stats

    ranks = report["ranks"]
    first = next(iter(ranks.values()))["info"]
    about = [f"world of {report['world_size']}" if report["world_size"] else None, first.get("backend")]
    if first.get("nccl_version"):
        about.append(f"NCCL {first['nccl_version']}")
    if first.get("device"):
        about.append(first["device"])
    given = len(ranks)
    if report["world_size"] and report["world_size"] > given:
        about.append(f"{given} of its ranks given: waits and the late rank are among those")
    lines = [
        f"trace-ledger: {given} rank(s) ({', '.join(ranks)})" + f" ({', '.join(a for a in about if a)})",
        *[f"note: {n}" for n in report["notes"]],
    ]
    if report["window"]["note"]:
        lines.append(f"window: {report['window']['note']}")
    header = "".join(f"{heading:>{_WIDTH}}" for _, heading in _COLUMNS)
    if any(data["window"] is not None for data in ranks.values()):
        lines += ["", "GPU time per rank over the window (ms):", _LEGEND, f"  {'rank':<8}" + header]
        lines += [_row(rank, data["window"]) for rank, data in ranks.items() if data["window"] is not None]
    for rank, data in ranks.items():
        if data["window"] is None:
            host = data["host"]
            times = [s["ms"] for s in host["steps"]]
            steps = f"{len(times)} ProfilerStep ranges (median {stats.median(times):.3f} ms), " if times else ""
            span = "" if host["span_ms"] is None else f" over {host['span_ms']:.3f} ms"
            lines.append(f"rank {rank}: no GPU events: host side: {steps}{host['cpu_ops']} CPU operators{span}")
    numbers = sorted({s["step"] for data in ranks.values() for s in data["steps"]})
    if numbers:
        lines += ["", "per step (ms, median over the ranks):", f"  {'step':<8}" + header]
        for n in numbers:
            rows = [s for data in ranks.values() for s in data["steps"] if s["step"] == n]
            med = {
                f"{key}_ms": (
                    stats.median(v) if (v := [r[f"{key}_ms"] for r in rows if r[f"{key}_ms"] is not None]) else None
                )
                for key, _heading in _COLUMNS
            }
            lines.append(_row(f"#{n}", med))
    lines += _collective_lines(report["collectives"])
    lines.append(report["late_rank"]["line"])
    return "\n".join(lines)


def _collective_lines(collectives: list[dict]) -> list[str]:
    from scopebench import stats

    by_op: dict[str, list[dict]] = {}
    for c in collectives:
        by_op.setdefault(c["op"], []).append(c)
    if not by_op:
        return []
    lines = ["", "collectives (matched across the ranks given; transfer: the fastest rank's kernel):"]
    for op, calls in by_op.items():
        cells = [f"{len(calls)} calls"]
        sizes = [c["bytes"] for c in calls if c["bytes"] is not None]
        if sizes:
            cells.append(f"{stats.median(sizes) / 1e6:.2f} MB each (median)")
        matched = [c for c in calls if c["matched"]]
        if matched:
            cells.append(f"transfer {stats.median([c['transfer_ms'] for c in matched]):.3f} ms (median)")
            busbw = [c["busbw_gb_per_sec"] for c in matched if c["busbw_gb_per_sec"] is not None]
            if busbw:
                cells.append(f"busbw {stats.median(busbw):.2f} GB/s (median)")
            present = {c["ranks_present"] for c in matched}
            sizes = {c["group_size"] for c in matched if c["group_size"]}
            if sizes and max(sizes) > max(present):
                cells.append(f"{max(present)} of {max(sizes)} ranks given: waits are among those")
        else:
            cells.append("one rank given: no waits")
        lines.append(f"  {op:<15} " + ", ".join(cells))
    return lines
