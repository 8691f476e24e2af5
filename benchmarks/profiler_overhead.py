"""Profiler overhead: how much does each backend add to one solver iteration?

What it measures: the same 5-10 ms CPU workload (matrix products in two regions) is run
by a bare loop and by ``profiler.iterate`` under the ``null``, ``custom`` and ``torch``
backends. The step time is the interval between two consecutive callback calls, which
is what a solver pays per iteration, profiler bookkeeping included. Modes are
interleaved in rounds so that drift on a shared machine hits all of them alike, and each
mode's median step time is divided by the bare loop's.

Why: the suite is only useful if measuring does not change what is measured. Goals:
``custom`` within 1 % of the bare loop, ``null`` within 0.2 %. The ``torch`` backend is
expected to cost more (it reports its own processing as ``profiler_overhead_sec``).

The ratio of medians carries the machine's noise (a few tenths of a percent on a shared
machine); the script therefore also measures each backend's own bookkeeping: the mean
cost of an iteration with two empty regions over many iterations, minus the bare loop's,
in microseconds. That figure divided by the workload is the overhead without the noise.

Run: ``.venv/bin/python benchmarks/profiler_overhead.py [--rounds 10 --steps 30]``
(single process, one intra-op thread for stable timings).

Output: human-readable lines, then one JSON object on the last line::

    {"workload_ms": float, "rounds": int, "steps_per_round": int,
     "modes": {"bare"|"null"|"custom"|"torch":
               {"median_ms": float, "p95_ms": float, "ratio_to_bare": float,
                "bookkeeping_us": float, "bookkeeping_pct": float}}}
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from scopebench.profiler import create_profiler
from scopebench.stats import summarize

MODES = ("bare", "null", "custom", "torch")


def make_workload(target_ms: float):
    """Two regions of matrix products, sized to take about ``target_ms`` in total."""
    a = torch.randn(256, 256)
    reps = 1

    def region():
        y = a
        for _ in range(reps):
            y = a @ y
            y = y / y.norm()
        return y

    region()
    start = time.perf_counter()
    for _ in range(20):
        region()
    per_rep = (time.perf_counter() - start) / 20
    reps = max(1, round(target_ms / 1e3 / 2 / per_rep))
    return region, reps


def run_mode(mode: str, region, steps: int) -> list[float]:
    """Step times (s) of ``steps`` iterations: intervals between callback calls."""
    stamps: list[float] = []

    def callback():
        stamps.append(time.perf_counter())
        return len(stamps) <= steps

    if mode == "bare":
        while callback():
            region()
            region()
    else:
        prof = create_profiler(None if mode == "null" else mode, "cpu", f"overhead_{mode}")
        for _ in prof.iterate(callback):
            with prof.track_step("first"):
                region()
            with prof.track_step("second"):
                region()
        prof.finalize()
    return [b - a for a, b in zip(stamps, stamps[1:])][1:]  # drop the first (cold) step


def bookkeeping_sec(mode: str, iterations: int) -> float:
    """Mean time of one iteration with two empty regions (``bare``: an empty loop)."""
    left = iter(range(iterations + 1))

    def callback():
        return next(left) < iterations

    start = time.perf_counter()
    if mode == "bare":
        while callback():
            pass
    else:
        prof = create_profiler(None if mode == "null" else mode, "cpu", f"bookkeeping_{mode}")
        for _ in prof.iterate(callback):
            with prof.track_step("first"):
                pass
            with prof.track_step("second"):
                pass
        prof.finalize()
    return (time.perf_counter() - start) / iterations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workload-ms", type=float, default=7.0)
    args = parser.parse_args()
    torch.set_num_threads(1)
    region, _ = make_workload(args.workload_ms)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    run_mode("torch", region, 3)  # load torch.profiler once, outside the measurement
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            samples[mode] += run_mode(mode, region, args.steps)
    bare = summarize(samples["bare"]).median
    result = {"workload_ms": bare * 1e3, "rounds": args.rounds, "steps_per_round": args.steps, "modes": {}}
    print(f"workload: {bare * 1e3:.2f} ms per bare step; {args.rounds} rounds x {args.steps} steps per mode")
    empty = bookkeeping_sec("bare", 20000)
    for mode in MODES:
        s = summarize(samples[mode])
        ratio = s.median / bare
        iterations = 200 if mode == "torch" else 20000
        own = max(0.0, bookkeeping_sec(mode, iterations) - empty) if mode != "bare" else 0.0
        result["modes"][mode] = {
            "median_ms": s.median * 1e3,
            "p95_ms": s.p95 * 1e3,
            "ratio_to_bare": ratio,
            "bookkeeping_us": own * 1e6,
            "bookkeeping_pct": own / bare * 100.0,
        }
        print(
            f"{mode:>7}: median {s.median * 1e3:8.3f} ms  p95 {s.p95 * 1e3:8.3f} ms  ratio {ratio:.4f}"
            f"  bookkeeping {own * 1e6:9.1f} us/iter = {own / bare * 100.0:6.3f} % of the workload"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
