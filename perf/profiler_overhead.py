"""Profiler overhead: how much does each backend add to one solver iteration?

What it measures, in one process, one intra-op thread:

1. **Ratio to a bare loop.** The same 5-10 ms CPU workload (matrix products in two
   regions) run by a bare loop and by ``profiler.iterate`` under the ``null``, ``custom``
   and ``torch`` backends. The step time is the interval between two consecutive
   callback calls (what a solver pays per iteration, profiler included). Modes are
   interleaved in rounds so that drift on a shared machine hits all of them alike; each
   mode's median is divided by the bare loop's.
2. **Bookkeeping.** The ratio carries the machine's noise (a few tenths of a percent), so
   each backend's own cost is also measured as the mean time of an iteration with two
   empty regions over many iterations, minus an empty loop's, in microseconds.
3. **After the clock** (``custom``). After real work, ``end_iteration()`` plus
   ``get_current_metrics()`` — time outside ``total_time_sec``; the backend reports its
   share as ``profiler_overhead_sec`` (median shown beside it).
4. **torch per step on tiny operators.** 200 small matrix products (about 2 ms bare) per
   iteration, bare vs ``profiler_mode: torch`` per-step mode, interleaved; the per-step
   overhead is the difference of medians. Then where it goes, phase by phase on one
   such step: profiler construction and start, stop (with and without
   ``profile_memory``), reading the raw events, the backend's analysis (region metrics
   only; with operator rows as with ``save_file``), and ``prof.events()`` (the
   ``FunctionEvent`` path the backend used before).
5. **In-run cost against this measurement** (``custom`` and ``torch``). What a run reports of
   its own profiler (:func:`scopebench.report.cost.cost_of`: the median of
   ``profiler_inside_sec + profiler_overhead_sec``, as ``scopebench summary`` and every tool
   print it) next to item 2's measurement of the same backend (an iteration with two empty
   regions, minus an empty loop's), both in the same round, rounds interleaved; per round
   the ratio reported / measured, then its median and spread (min-max) over the rounds. The
   goal: within 2x either way.
6. **Against a minimal timer** (``custom``, thread CPU time). Per iteration with two empty
   regions, the ``custom`` backend's bookkeeping against a minimal wall-clock timer doing the
   least any wall-clock profiler must (``perf_counter`` at the iteration's start and end and
   around each region, the region times stored in a dict), both minus an empty loop, timed by
   ``time.thread_time()`` (the loop thread's CPU: on a shared machine wall clock is mostly
   other processes' time slices); loops interleaved in rounds (their order rotating), each
   timing ``--minimal-iterations`` iterations after 200 untimed ones. ``custom`` with the
   defaults (host sampler on) and with the sampler off; per round the ratio to the minimal
   timer, then its median and spread (min-max) over rounds. Goal: at most 8x (issue 47).
   ``--minimal-timer-only`` runs this item alone.
7. With ``--baseline SRC`` (a ``src/`` folder of another version, e.g. extracted with
   ``git archive <commit> src | tar -x -C /tmp/base``): items 2-4 and 6 (two rounds of it per
   subprocess: ``custom_vs_minimal_timer``, ``..._no_sampler``) for both versions in
   subprocesses, alternating A, B, A, B over ``--rounds``; medians per version, the
   spread over rounds (min-max), and the ratio of medians new / baseline.

Why: the suite is only useful if measuring does not change what is measured. Goals:
``custom`` bookkeeping at most 12 µs per iteration and within 1 % of the workload, and at
most 8x a minimal timer's in thread CPU time,
``null`` within 0.2 %, ``custom`` time after the clock at most 30 µs or accounted for,
torch per-step overhead on tiny operators at most a third of the former code path's.

Run: ``.venv/bin/python perf/profiler_overhead.py [--rounds 10 --steps 30]
[--baseline /tmp/base/src]``; item 6 alone:
``.venv/bin/python perf/profiler_overhead.py --minimal-timer-only --rounds 15``.

Output: human-readable lines, then one JSON object on the last line::

    {"workload_ms": float, "rounds": int, "steps_per_round": int,
     "modes": {"bare"|"null"|"custom"|"torch":
               {"median_ms": float, "p95_ms": float, "ratio_to_bare": float,
                "bookkeeping_us": float, "bookkeeping_pct": float}},
     "custom_after_clock": {"median_us": float, "reported_overhead_median_us": float},
     "custom_without_sampler": {"bookkeeping_us": float, "sampler_thread_pct_of_a_core": float},
     "conditions": {...},   # perf/round_conditions.py: other processes' CPU share per round
     "in_run": {"custom"|"torch": {"reported_us": float, "measured_us": float,
                                    "ratio_median": float, "ratio_min": float, "ratio_max": float,
                                    "rounds": [{"reported_us", "measured_us", "ratio"}]}},
     "minimal_timer": {"iterations": int, "rounds": [{"empty_us", "minimal_us", "custom_us",
                       "custom_no_sampler_us", "ratio", "ratio_no_sampler"}],
                       "minimal_us"|"custom_us"|"custom_no_sampler_us"|"ratio"|"ratio_no_sampler":
                           {"median": float, "min": float, "max": float}},
     "torch_tiny": {"bare_ms": float, "torch_ms": float, "overhead_ms": float,
                    "reported_overhead_ms": float, "phases_ms": {phase: float}},
     "baseline": null | {"src": str, "rounds": int,
                         "versions": {"new"|"baseline": {metric: {"median": float,
                                                                   "min": float, "max": float}}},
                         "ratio_new_to_baseline": {metric: float | null}}}
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from round_conditions import RoundConditions

from scopebench.profiler import create_profiler
from scopebench.stats import median, summarize

MODES = ("bare", "null", "custom", "torch")
TINY_OPS = 200
TINY_SIZE = 64


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


def tiny_ops():
    """About 2 ms of tiny operators: 200 products of 64 x 64 matrices."""
    a = torch.randn(TINY_SIZE, TINY_SIZE)

    def step():
        y = a
        for _ in range(TINY_OPS):
            y = a @ y
        return y

    return step


def run_mode(mode: str, body, steps: int, regions=("first", "second")) -> tuple[list[float], list[dict]]:
    """Step times (s) of ``steps`` iterations (intervals between callback calls) and the
    metrics each callback saw."""
    stamps: list[float] = []
    seen: list[dict] = []
    prof = None

    def callback():
        stamps.append(time.perf_counter())
        if prof is not None:
            seen.append(prof.get_current_metrics())
        return len(stamps) <= steps

    if mode == "bare":
        while callback():
            for _ in regions:
                body()
    else:
        prof = create_profiler(None if mode == "null" else mode, "cpu", f"overhead_{mode}")
        for _ in prof.iterate(callback):
            for name in regions:
                with prof.track_step(name):
                    body()
        prof.finalize()
    return [b - a for a, b in zip(stamps, stamps[1:])][1:], seen[2:]  # drop the first (cold) step


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
        _two_empty_regions(create_profiler(None if mode == "null" else mode, "cpu", f"bookkeeping_{mode}"), callback)
    return (time.perf_counter() - start) / iterations


def _two_empty_regions(prof, callback) -> None:
    """Iterations of two empty regions until ``callback`` says stop, then ``finalize``."""
    for _ in prof.iterate(callback):
        with prof.track_step("first"):
            pass
        with prof.track_step("second"):
            pass
    prof.finalize()


def reported_cost_sec(mode: str, iterations: int) -> float:
    """The per-step cost a run of :func:`bookkeeping_sec`'s loop reports of its own profiler
    (the steady state of :func:`scopebench.report.cost.cost_of`, what tools print)."""
    from scopebench.report.cost import cost_of

    left = iter(range(iterations + 1))
    prof = create_profiler(mode, "cpu", f"reported_{mode}")
    seen: list[dict] = []

    def callback():
        seen.append(prof.get_current_metrics())
        return next(left) < iterations

    _two_empty_regions(prof, callback)
    return cost_of([m for m in seen if m]).per_step_sec


def in_run_against_measured(rounds: int) -> dict[str, dict]:
    """Item 5: per backend and round, the reported per-step cost, the measured one (s -> µs)
    and their ratio; then the ratio's median and spread."""
    out: dict[str, dict] = {}
    iterations = {"custom": 5000, "torch": 200}
    per_round: dict[str, list[dict[str, float]]] = {mode: [] for mode in iterations}
    for r in range(rounds):
        for mode in iterations if r % 2 == 0 else list(iterations)[::-1]:
            n = iterations[mode]
            measured = bookkeeping_sec(mode, n) - bookkeeping_sec("bare", n)
            reported = reported_cost_sec(mode, n)
            per_round[mode].append(
                {"reported_us": reported * 1e6, "measured_us": measured * 1e6, "ratio": reported / measured}
            )
    for mode, rows in per_round.items():
        ratios = [row["ratio"] for row in rows]
        out[mode] = {
            "reported_us": median([row["reported_us"] for row in rows]),
            "measured_us": median([row["measured_us"] for row in rows]),
            "ratio_median": median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
            "rounds": rows,
        }
    return out


def sampler_cost() -> dict[str, float]:
    """The custom backend's bookkeeping with the host sampler off, and the sampler thread's
    own CPU time (read inside it) over 5 s, as a share of one core."""
    from scopebench.profiler.sampler import HostSampler

    empty = bookkeeping_sec("bare", 20000)
    os.environ["SCOPEBENCH_SAMPLER_PERIOD_SEC"] = "0"
    try:
        off = max(0.0, bookkeeping_sec("custom", 20000) - empty)
    finally:
        del os.environ["SCOPEBENCH_SAMPLER_PERIOD_SEC"]
    sampler = HostSampler("cpu")
    start = time.perf_counter()
    sampler.start()
    while sampler.samples_taken < 51:
        time.sleep(0.05)
    sampler.stop()
    share = sampler.thread_cpu_sec / (time.perf_counter() - start) * 100.0
    return {"bookkeeping_us": off * 1e6, "sampler_thread_pct_of_a_core": share}


#: Untimed iterations before item 6's timed ones (the sampler's start, first-seen regions).
MINIMAL_WARMUP = 200


def _thread_clocked_callback(iterations: int, marks: list[float]):
    """A loop's callback for item 6: :data:`MINIMAL_WARMUP` untimed iterations, then
    ``iterations`` timed ones, the loop thread's CPU clock read into ``marks`` where they begin
    and end (the same callback in every loop, so the empty loop takes its cost out)."""
    count = iter(range(MINIMAL_WARMUP + iterations + 1))
    first, last = MINIMAL_WARMUP, MINIMAL_WARMUP + iterations

    def callback():
        k = next(count)
        if k == first or k == last:
            marks.append(time.thread_time())
        return k < last

    return callback


def _empty_loop(callback) -> None:
    while callback():
        pass


def _minimal_timer_loop(callback) -> None:
    """The least a wall-clock profiler must do per iteration: the clock at the iteration's start
    and end and around each region, the region times stored in a dict."""
    clock = time.perf_counter
    times: dict[str, float] = {}
    while callback():
        start = clock()
        begin = clock()
        times["first"] = clock() - begin
        begin = clock()
        times["second"] = clock() - begin
        times["total"] = clock() - start


def _custom_loop(callback) -> None:
    _two_empty_regions(create_profiler("custom", "cpu", "minimal_timer"), callback)


def _custom_no_sampler_loop(callback) -> None:
    os.environ["SCOPEBENCH_SAMPLER_PERIOD_SEC"] = "0"
    try:
        _custom_loop(callback)
    finally:
        del os.environ["SCOPEBENCH_SAMPLER_PERIOD_SEC"]


MINIMAL_LOOPS = {
    "empty": _empty_loop,
    "minimal": _minimal_timer_loop,
    "custom": _custom_loop,
    "custom_no_sampler": _custom_no_sampler_loop,
}


def against_minimal_timer(rounds: int, iterations: int, conditions: RoundConditions) -> dict:
    """Item 6: per round, each loop's thread CPU time per iteration (µs; the loops' order
    rotating by round) and the custom backend's bookkeeping over the minimal timer's, both
    minus the empty loop's; then medians and spreads over rounds."""
    names = list(MINIMAL_LOOPS)
    per_round = []
    for r in range(rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        row: dict[str, float] = {}
        with conditions.round():
            for name in order:
                marks: list[float] = []
                MINIMAL_LOOPS[name](_thread_clocked_callback(iterations, marks))
                row[f"{name}_us"] = (marks[1] - marks[0]) / iterations * 1e6
        empty = row.pop("empty_us")
        row = {key: value - empty for key, value in row.items()}
        row["empty_us"] = empty
        row["ratio"] = row["custom_us"] / row["minimal_us"]
        row["ratio_no_sampler"] = row["custom_no_sampler_us"] / row["minimal_us"]
        per_round.append(row)
        print(
            f"minimal timer round {r}: minimal {row['minimal_us']:.3f} us, custom {row['custom_us']:.3f} us "
            f"(x{row['ratio']:.2f}), sampler off {row['custom_no_sampler_us']:.3f} us "
            f"(x{row['ratio_no_sampler']:.2f}) {conditions.tag()}",
            flush=True,
        )
    out: dict = {"iterations": iterations, "rounds": per_round}
    for key in ("minimal_us", "custom_us", "custom_no_sampler_us", "ratio", "ratio_no_sampler"):
        values = [row[key] for row in per_round]
        out[key] = {"median": median(values), "min": min(values), "max": max(values)}
    return out


def print_minimal_timer(result: dict) -> None:
    m = result
    print(
        f"custom against a minimal timer (thread CPU per iteration, two empty regions, minus an empty loop; "
        f"{len(m['rounds'])} rounds x {m['iterations']} iterations; median [min-max]): minimal "
        f"{m['minimal_us']['median']:.3f} us, custom {m['custom_us']['median']:.3f} us "
        f"[{m['custom_us']['min']:.3f}-{m['custom_us']['max']:.3f}] = x{m['ratio']['median']:.2f} "
        f"[{m['ratio']['min']:.2f}-{m['ratio']['max']:.2f}] (goal <= 8); sampler off "
        f"{m['custom_no_sampler_us']['median']:.3f} us = x{m['ratio_no_sampler']['median']:.2f} "
        f"[{m['ratio_no_sampler']['min']:.2f}-{m['ratio_no_sampler']['max']:.2f}]"
    )


def after_clock(region, steps: int) -> tuple[list[float], list[float]]:
    """``custom`` after real work: time of ``end_iteration() + get_current_metrics()`` and
    the ``profiler_overhead_sec`` each iteration reports (s)."""
    prof = create_profiler("custom", "cpu", "after_clock")
    spent, reported = [], []
    for _ in range(steps):
        with prof.track_step("first"):
            region()
        with prof.track_step("second"):
            region()
        start = time.perf_counter()
        prof.end_iteration()
        metrics = prof.get_current_metrics()
        spent.append(time.perf_counter() - start)
        reported.append(metrics.get("profiler_overhead_sec", 0.0))
    prof.finalize()
    return spent[2:], reported[2:]


def torch_tiny(rounds: int, steps: int) -> dict[str, float]:
    """Per-step torch overhead on tiny operators: bare and torch interleaved (ms)."""
    step = tiny_ops()
    run_mode("torch", step, 2, regions=("step",))  # load torch.profiler once
    bare, prof, reported = [], [], []
    for _ in range(rounds):
        bare += run_mode("bare", step, steps, regions=("step",))[0]
        times, seen = run_mode("torch", step, steps, regions=("step",))
        prof += times
        reported += [m["profiler_overhead_sec"] for m in seen if "profiler_overhead_sec" in m]
    out = {"bare_ms": median(bare) * 1e3, "torch_ms": median(prof) * 1e3}
    out["overhead_ms"] = out["torch_ms"] - out["bare_ms"]
    out["reported_overhead_ms"] = median(reported) * 1e3 if reported else float("nan")
    return out


def torch_phases(repeats: int) -> dict[str, float]:
    """Median cost (ms) of each phase of one per-step profiler cycle on the tiny step."""
    from torch.profiler import ProfilerActivity, profile, record_function

    from scopebench.profiler.torch_events import analyse_events, kineto_events

    step = tiny_ops()
    phases: dict[str, list[float]] = {}

    def timed(name, fn):
        start = time.perf_counter()
        out = fn()
        phases.setdefault(name, []).append(time.perf_counter() - start)
        return out

    for _ in range(repeats):
        for memory in (False, True):
            suffix = " (profile_memory)" if memory else ""
            prof = timed(
                "construct + start" + suffix,
                lambda: profile(activities=[ProfilerActivity.CPU], profile_memory=memory).__enter__(),
            )
            with record_function("step"):
                timed("body under the profiler" + suffix, step)
            timed("stop" + suffix, lambda: prof.__exit__(None, None, None))
            events = timed("read raw events" + suffix, lambda: kineto_events(prof))
            timed("analysis: region metrics" + suffix, lambda: analyse_events(events, {"step"}, with_ops=False))
            timed("analysis: + operator rows" + suffix, lambda: analyse_events(events, {"step"}, with_ops=True))
            timed("prof.events() (former path)" + suffix, prof.events)
    timed("bare step", step)
    return {name: median(values) * 1e3 for name, values in phases.items()}


def measure_version(steps: int, workload_ms: float, minimal_iterations: int) -> dict[str, float]:
    """Items 2-4 and 6 (two rounds) with whichever ``scopebench`` this interpreter imports (public
    API only)."""
    region, _ = make_workload(workload_ms)
    empty = bookkeeping_sec("bare", 20000)
    spent, reported = after_clock(region, steps)
    tiny = torch_tiny(1, steps)
    minimal = against_minimal_timer(2, minimal_iterations, RoundConditions())
    return {
        "custom_vs_minimal_timer": minimal["ratio"]["median"],
        "custom_vs_minimal_timer_no_sampler": minimal["ratio_no_sampler"]["median"],
        "custom_bookkeeping_us": (bookkeeping_sec("custom", 20000) - empty) * 1e6,
        "null_bookkeeping_us": (bookkeeping_sec("null", 20000) - empty) * 1e6,
        "custom_after_clock_us": median(spent) * 1e6,
        "custom_reported_overhead_us": median(reported) * 1e6,
        "torch_tiny_bare_ms": tiny["bare_ms"],
        "torch_tiny_overhead_ms": tiny["overhead_ms"],
    }


def compare_with(baseline: Path, rounds: int, steps: int, workload_ms: float, minimal_iterations: int) -> dict:
    """Items 2-4 and 6 for this tree and ``baseline`` in alternating subprocesses."""
    here = Path(__file__).resolve()
    trees = {"new": here.parents[1] / "src", "baseline": baseline.resolve()}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    conditions = RoundConditions()
    for r in range(rounds):
        with conditions.round():
            for name in list(trees) if r % 2 == 0 else list(trees)[::-1]:
                env = dict(os.environ, PYTHONPATH=str(trees[name]) + os.pathsep + os.environ.get("PYTHONPATH", ""))
                out = subprocess.run(
                    [
                        *(sys.executable, str(here), "--worker", "--steps", str(steps)),
                        *("--workload-ms", str(workload_ms), "--minimal-iterations", str(minimal_iterations)),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    check=True,
                )
                results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(f"baseline round {r}: {conditions.tag()}", flush=True)
    versions = {
        name: {
            key: {
                "median": median([row[key] for row in rows]),
                "min": min(row[key] for row in rows),
                "max": max(row[key] for row in rows),
            }
            for key in rows[0]
        }
        for name, rows in results.items()
    }
    ratio = {
        key: (
            versions["new"][key]["median"] / versions["baseline"][key]["median"]
            if versions["baseline"][key]["median"]
            else None
        )
        for key in versions["new"]
    }
    return {
        "src": str(baseline),
        "rounds": rounds,
        "versions": versions,
        "ratio_new_to_baseline": ratio,
        "conditions": conditions.as_dict(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--workload-ms", type=float, default=7.0)
    parser.add_argument("--baseline", type=Path, help="src/ folder of the version to compare with")
    parser.add_argument("--minimal-iterations", type=int, default=50000, help="timed iterations per loop, item 6")
    parser.add_argument("--minimal-timer-only", action="store_true", help="run item 6 alone")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.worker:
        print(json.dumps(measure_version(args.steps, args.workload_ms, args.minimal_iterations)))
        return
    if args.minimal_timer_only:
        conditions = RoundConditions()
        result = {"minimal_timer": against_minimal_timer(args.rounds, args.minimal_iterations, conditions)}
        result["conditions"] = conditions.as_dict()
        print(conditions.summary_line())
        print_minimal_timer(result["minimal_timer"])
        print(json.dumps(result))
        return
    region, _ = make_workload(args.workload_ms)
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    run_mode("torch", region, 3)  # load torch.profiler once, outside the measurement
    conditions = RoundConditions()
    for r in range(args.rounds):
        order = MODES if r % 2 == 0 else MODES[::-1]
        with conditions.round():
            for mode in order:
                samples[mode] += run_mode(mode, region, args.steps)[0]
        print(f"round {r}: {conditions.tag()}", flush=True)
    bare = summarize(samples["bare"]).median
    result = {"workload_ms": bare * 1e3, "rounds": args.rounds, "steps_per_round": args.steps, "modes": {}}
    result["conditions"] = conditions.as_dict()
    print(conditions.summary_line())
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
    result["custom_without_sampler"] = without = sampler_cost()
    print(
        f"custom bookkeeping without the host sampler (SCOPEBENCH_SAMPLER_PERIOD_SEC=0): "
        f"{without['bookkeeping_us']:.1f} us/iter; the sampler thread's own CPU over 5 s: "
        f"{without['sampler_thread_pct_of_a_core']:.2f} % of a core"
    )
    spent, reported = after_clock(region, max(args.steps, 50))
    result["custom_after_clock"] = {
        "median_us": median(spent) * 1e6,
        "reported_overhead_median_us": median(reported) * 1e6,
    }
    print(
        f"custom after the clock: end_iteration + get_current_metrics {median(spent) * 1e6:.1f} us median; "
        f"reported profiler_overhead_sec {median(reported) * 1e6:.1f} us median"
    )
    result["in_run"] = in_run = in_run_against_measured(args.rounds)
    for mode, row in in_run.items():
        print(
            f"{mode} in-run reported cost {row['reported_us']:.1f} us/step vs measured {row['measured_us']:.1f} us/step "
            f"(medians over {args.rounds} rounds); ratio reported/measured {row['ratio_median']:.2f} "
            f"[{row['ratio_min']:.2f}-{row['ratio_max']:.2f}]"
        )
    minimal_conditions = RoundConditions()
    result["minimal_timer"] = against_minimal_timer(args.rounds, args.minimal_iterations, minimal_conditions)
    result["minimal_timer"]["conditions"] = minimal_conditions.as_dict()
    print_minimal_timer(result["minimal_timer"])
    tiny = torch_tiny(args.rounds, max(5, args.steps // 3))
    tiny["phases_ms"] = torch_phases(15)
    result["torch_tiny"] = tiny
    print(
        f"torch per step, {TINY_OPS} products of {TINY_SIZE}x{TINY_SIZE}: bare {tiny['bare_ms']:.2f} ms, torch "
        f"{tiny['torch_ms']:.2f} ms -> overhead {tiny['overhead_ms']:.2f} ms per iteration "
        f"(reported profiler_overhead_sec {tiny['reported_overhead_ms']:.2f} ms)"
    )
    for phase, ms in tiny["phases_ms"].items():
        print(f"    {phase:<45s} {ms:8.3f} ms")
    result["baseline"] = None
    if args.baseline is not None:
        result["baseline"] = cmp = compare_with(
            args.baseline, args.rounds, args.steps, args.workload_ms, args.minimal_iterations
        )
        print(f"against {args.baseline} ({args.rounds} alternating rounds; median [min-max] over rounds):")
        for key, ratio in cmp["ratio_new_to_baseline"].items():
            new, old = cmp["versions"]["new"][key], cmp["versions"]["baseline"][key]
            print(
                f"    {key:<30s} new {new['median']:9.2f} [{new['min']:.2f}-{new['max']:.2f}]"
                f"  baseline {old['median']:9.2f} [{old['min']:.2f}-{old['max']:.2f}]"
                f"  ratio {'-' if ratio is None else f'{ratio:.3f}'}"
            )
        print(f"baseline {cmp['conditions']['summary']}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
