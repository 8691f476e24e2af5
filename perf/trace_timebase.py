"""How far the ledger's events in a torch trace are from torch's own (docs/profiler.md, "Opening a
trace"): the error of mapping ``time.perf_counter`` onto kineto's ``ts``.

What it measures: the torch backend in scheduled mode with a trace folder (the path whose traces
carry the ledger), ``--iterations`` iterations of one region that runs ``--ops`` ``aten::neg``
calls, each bracketed by two ``time.perf_counter_ns`` reads ``a`` and ``b``, then sleeps
``--sleep-ms`` (a longer cycle: torch converts its TSC reads to the wall clock by a line through
the cycle's first and last pairs). After each iteration's region the wall clock's offset is read as
the profiler reads it (:func:`scopebench.profiler.trace_ledger.clock_offset_ns`), and each bracket
is mapped onto the trace's timebase as the ledger's events are (``(t + offset - baseTimeNanoseconds)
/ 1000`` µs). If the mapping is off by ``e`` (trace minus mapped), every operator satisfies
``start - a >= e`` and ``b - end >= -e``, so ``e`` lies in ``[-min(b - end), min(start - a)]``:
the bound printed, as tight as the tightest brackets (a profiled operator costs a few µs).

Why: the ledger's events must line up with the torch events of the same trace; the error of that
alignment is stated in the docs, measured here.

Run: ``.venv/bin/python perf/trace_timebase.py [--iterations 20 --ops 50 --sleep-ms 50]``.
Output: human-readable lines, then one JSON object on the last line::

    {"iterations": int, "ops": int, "cycle_sec": float, "error_us_low": float, "error_us_high": float,
     "bracket_us_median": float, "bracket_us_min": float, "consistent": bool}
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import tempfile
import time
from pathlib import Path


def measure(iterations: int, ops: int, sleep_ms: float) -> dict:
    import torch

    from scopebench.profiler import create_profiler
    from scopebench.profiler.trace_ledger import clock_offset_ns

    x = torch.ones(4)
    brackets: list[tuple[int, int]] = []
    with tempfile.TemporaryDirectory() as tmp:
        prof = create_profiler("torch", "cpu", "timebase", active=iterations, per_step=False, trace_dir=tmp)
        count = {"n": 0}

        def callback() -> bool:
            count["n"] += 1
            return count["n"] <= iterations

        start = time.perf_counter()
        for _ in prof.iterate(callback):
            mine = []
            with prof.track_step("ops"):
                for _ in range(ops):
                    a = time.perf_counter_ns()
                    torch.neg(x)
                    b = time.perf_counter_ns()
                    mine.append((a, b))
            offset = clock_offset_ns()  # as the ledger reads it, after the iteration's work
            brackets += [(a + offset, b + offset) for a, b in mine]
            time.sleep(sleep_ms / 1e3)
        cycle_sec = time.perf_counter() - start
        (path,) = prof.finalize()
        trace = json.loads(gzip.decompress(Path(path).read_bytes()))
    base = trace["baseTimeNanoseconds"]
    found = sorted((e for e in trace["traceEvents"] if e.get("name") == "aten::neg"), key=lambda e: e["ts"])
    if len(found) != len(brackets):
        raise RuntimeError(f"expected {len(brackets)} aten::neg events in the trace, found {len(found)}")
    after_a = [op["ts"] - (a - base) / 1e3 for op, (a, _b) in zip(found, brackets)]
    before_b = [(b - base) / 1e3 - (op["ts"] + op["dur"]) for op, (_a, b) in zip(found, brackets)]
    widths = [(b - a) / 1e3 for a, b in brackets]
    low, high = -min(before_b), min(after_a)
    return {
        "iterations": iterations,
        "ops": len(found),
        "cycle_sec": round(cycle_sec, 3),
        "error_us_low": round(low, 3),
        "error_us_high": round(high, 3),
        "bracket_us_median": round(statistics.median(widths), 3),
        "bracket_us_min": round(min(widths), 3),
        "consistent": low <= high,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--ops", type=int, default=50)
    parser.add_argument("--sleep-ms", type=float, default=50.0)
    args = parser.parse_args()
    result = measure(args.iterations, args.ops, args.sleep_ms)
    print(
        f"{result['ops']} bracketed aten::neg over a {result['cycle_sec']} s cycle: the mapping's error lies in "
        f"[{result['error_us_low']}, {result['error_us_high']}] µs (brackets: median {result['bracket_us_median']} µs, "
        f"min {result['bracket_us_min']} µs)"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
