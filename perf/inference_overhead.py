"""Inference overhead: what does scopebench add to a plug-and-play iteration?

What it measures: the same TV (or random-weight DRUNet) PnP iteration on the same
blurred image, run two ways:

* ``bare``: a plain Python loop over deepinv objects built by hand (``Blur``, ``L2``,
  the denoiser), ``x = D(x - gamma * grad f(x))``, no benchopt, no profiler;
* ``scopebench``: the engine the benchopt ``PnP`` solver uses
  (:func:`scopebench.imaging.inference.engine.build_engine`) inside ``profiler.iterate`` with the
  ``custom`` backend (regions ``gradient`` and ``denoise`` timed every iteration);
* ``inside benchopt``: the real ``PnP`` solver under ``benchopt run`` on the same problem
  (same thread count), its per-iteration time read from the parquet as
  ``step_time_sec`` (the profiler's ``total_time_sec - callback_time_sec``; benchopt's
  PSNR/SSIM scoring between iterations is reported apart, as the median with the
  callback included);
* ``bare_scored``: the bare loop with the same PSNR/SSIM/MSE scoring between steps,
  untimed. This is the control for the ratio inside benchopt: scoring between
  iterations leaves caches and the allocator colder, which slows the next iteration
  by a few percent whoever runs the loop.

A step is the interval between two consecutive iterations (between two callback calls
for scopebench), so profiler bookkeeping is included. The two loops alternate in rounds
so that drift on a shared machine hits both alike; the ratio is median(scopebench) /
median(bare). Goal: at most 1.05.

With ``--quickstart`` it also times ``benchopt run benchmark_inference/. --config
benchmark_inference/configs/quickstart.yml`` end to end in a fresh process (imports
included; goal: under 20 s on 2 CPU cores).

With ``--case denoiser`` it measures the ``Denoiser`` solver instead (issue 13): one
DnCNN pass (random weights) per iteration on the ``simulated`` dataset's image, run

* ``bare``: a plain loop in this process over ``deepinv.models.DnCNN``, with the
  allocator set to keep its freed memory (:func:`scopebench.allocator.keep_freed_memory`,
  called before any large allocation);
* ``benchopt``: the real ``Denoiser`` solver under ``benchopt run`` (``denoise_time_sec``
  and ``minor_faults_count`` from the parquet), as users get it by default;
* ``benchopt_allocator_off`` (with ``--allocator-ab``): the same with
  ``SCOPEBENCH_KEEP_FREED_MEMORY=0``, i.e. glibc's default thresholds — the state before
  the fix, where every pass maps, faults in and unmaps its large temporaries.

The three alternate in rounds (order reversed every other round); the ratio of medians
``benchopt / bare`` is reported with its spread (min-max of the per-round ratios), with
minor page faults per pass and, per whole ``benchopt run`` process, minor faults and
system time (``getrusage(RUSAGE_CHILDREN)``). Goal: ratio at most 1.05.

Why: the benchmark is only useful if measuring does not change what is measured.

Run: ``.venv/bin/python perf/inference_overhead.py [--image-size 128]
[--denoiser tv|drunet] [--rounds 5 --steps 10] [--quickstart]`` (one process; one
intra-op thread unless ``--threads``), or
``.venv/bin/python perf/inference_overhead.py --case denoiser --threads 2
[--rounds 4 --steps 8] [--allocator-ab]``.

Output: human-readable lines, then one JSON object on the last line::

    {"image_size": int, "denoiser": str, "rounds": int, "steps_per_round": int,
     "threads": int, "bare" | "scopebench" | "bare_scored": {"median_ms": float, "p95_ms": float},
     "ratio": float,
     "inside_benchopt": {"iteration_median_ms": float, "with_callback_median_ms": float,
                         "ratio": float, "ratio_to_bare_scored": float},
     "quickstart_sec": float | null, "conditions"}

  with ``--case denoiser``::

    {"case": "denoiser", "image_size": int, "rounds": int, "steps_per_round": int, "threads": int,
     "modes": {"bare" | "benchopt" | "benchopt_allocator_off":
               {"median_ms": float, "p95_ms": float, "minor_faults_median": float,
                "ratio_to_bare": float | null, "round_ratio_min": float | null,
                "round_ratio_max": float | null,
                "process_minor_faults_median": float | null, "process_system_sec_median": float | null}},
     "conditions"}

``conditions`` (perf/round_conditions.py): other processes' CPU share and steal of each
round, contended rounds flagged (also printed after each round).
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from pathlib import Path

import torch
from round_conditions import RoundConditions

from scopebench.stats import summarize

REPO = Path(__file__).resolve().parents[1]


def bare_loop(image_size: int, denoiser: str, sigma: float, gamma: float):
    """A generator of step times (s) for a loop over hand-built deepinv objects."""
    import deepinv as dinv
    from deepinv.physics.functional import gaussian_blur

    from scopebench.imaging.common.images import natural_image

    x_true = natural_image(image_size)
    physics = dinv.physics.Blur(filter=gaussian_blur(sigma=(2.0, 2.0)), padding="circular")
    gen = torch.Generator().manual_seed(10_000)
    with torch.no_grad():
        clean = physics.A(x_true)
        y = clean + 0.03 * torch.randn(clean.shape, generator=gen)
    fidelity = dinv.optim.L2()
    if denoiser == "tv":
        den = dinv.models.TVDenoiser(n_it_max=50, crit=1e-6)
    else:
        torch.manual_seed(0)
        den = dinv.models.DRUNet(3, 3, pretrained=None).eval()
    x = physics.A_adjoint(y)

    def steps(n: int, score: bool = False) -> list[float]:
        """``n`` step times; with ``score``, PSNR/SSIM/MSE run between steps, untimed."""
        from scopebench.imaging.common.metrics import quality_metrics

        nonlocal x
        out = []
        with torch.no_grad():
            last = time.perf_counter()
            for _ in range(n):
                z = x - gamma * fidelity.grad(x, y, physics)
                x = den(z, sigma)
                out.append(time.perf_counter() - last)
                if score:
                    quality_metrics(x, x_true)
                last = time.perf_counter()
        return out

    return steps


def scopebench_loop(image_size: int, denoiser: str, sigma: float):
    """Step times (s) of the benchopt solver's engine inside the custom profiler's loop."""
    from scopebench.imaging.inference.engine import ReconstructionConfig, build_engine, run_loop
    from scopebench.profiler import create_profiler

    config = {"denoiser": denoiser, "denoiser_sigma": sigma, "device": "cpu"}
    if denoiser != "tv":
        config["pretrained"] = "none"
    spec = {"kind": "simulated", "image_size": image_size, "operator": "blur", "noise_level": 0.03}
    engine = build_engine(spec, ReconstructionConfig(**config))

    def steps(n: int) -> list[float]:
        stamps: list[float] = []

        def callback() -> bool:
            stamps.append(time.perf_counter())
            return len(stamps) <= n

        with create_profiler(
            "custom", "cpu", "inference_overhead", output_dir=REPO / "benchmark_inference/outputs"
        ) as prof:
            run_loop(engine, prof, callback)
        return [b - a for a, b in zip(stamps, stamps[1:])]

    return steps, engine.gamma


def time_quickstart() -> float:
    """Wall time of the quickstart in a fresh process (imports included)."""
    from scopebench.runs import run_benchopt

    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"inference_quickstart_{os.getpid()}.parquet"
    try:
        run = run_benchopt(
            REPO / "benchmark_inference", REPO / "benchmark_inference/configs/quickstart.yml", output=out
        )
    finally:
        out.unlink(missing_ok=True)
    return run.wall_sec


def inside_benchopt(image_size: int, denoiser: str, sigma: float, steps: int, threads: int) -> dict[str, list[float]]:
    """Per-iteration times of the real ``PnP`` solver run by ``benchopt run`` on the same problem.

    Returns ``total`` (the profiler's ``total_time_sec``, benchopt's scoring callback
    included) and ``iteration`` (``step_time_sec`` = total - callback: gradient,
    denoiser and loop bookkeeping, without the PSNR/SSIM scoring) in seconds.
    """
    import tempfile

    import pandas as pd
    import yaml

    from scopebench.runs import run_benchopt

    solver = {"denoiser": denoiser, "denoiser_sigma": sigma, "profiler_mode": "custom", "profiler_warmup": 2}
    if denoiser != "tv":
        solver["pretrained"] = "none"
    config = {
        "dataset": [f"simulated[image_size={image_size},operator=blur,noise_level=0.03]"],
        "solver": [{"PnP": solver}],
        "max-runs": steps + 3,
        "n-repetitions": 1,
    }
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "overhead.yml"
        path.write_text(yaml.safe_dump(config))
        run = run_benchopt(
            REPO / "benchmark_inference",
            path,
            output=Path(tmp) / "overhead.parquet",
            env={"OMP_NUM_THREADS": str(threads)},
        )
        df = pd.read_parquet(run.parquet)
    df = df[df["objective_total_time_sec"].notna()]
    total = df["objective_total_time_sec"].tolist()
    iteration = df["objective_step_time_sec"].tolist()
    return {"total": total, "iteration": iteration}


def denoiser_bare(image_size: int, sigma: float, threads: int):
    """Pass times (s) and minor faults of DnCNN on the ``simulated`` image, allocator kept."""
    import resource

    from scopebench.allocator import keep_freed_memory

    keep_freed_memory()  # before the model and its activations exist
    import deepinv as dinv

    from scopebench.imaging.inference import build_problem

    torch.set_num_threads(threads)
    problem = build_problem("simulated", image_size=image_size, operator="blur", noise_level=0.03)
    torch.manual_seed(0)
    model = dinv.models.DnCNN(3, 3, pretrained=None).eval()
    noisy = problem.physics.A_adjoint(problem.y).reshape(problem.x_true.shape).contiguous()

    def passes(n: int) -> tuple[list[float], list[int]]:
        times, faults = [], []
        with torch.no_grad():
            for _ in range(n):
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                model(noisy, sigma)
                times.append(time.perf_counter() - start)
                faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
        return times, faults

    return passes


def denoiser_benchopt(image_size: int, sigma: float, steps: int, threads: int, allocator: bool) -> dict[str, list]:
    """One ``benchopt run`` of the ``Denoiser`` solver (DnCNN, random weights).

    Returns per-iteration ``time`` (``denoise_time_sec``) and ``faults``
    (``minor_faults_count``), and the whole process's minor faults and system time.
    """
    import resource
    import tempfile

    import pandas as pd
    import yaml

    from scopebench.runs import run_benchopt

    solver = {
        "denoiser": "dncnn",
        "pretrained": "none",
        "denoiser_sigma": sigma,
        "profiler_mode": "custom",
        "profiler_warmup": 2,
    }
    config = {
        "dataset": [f"simulated[image_size={image_size},operator=blur,noise_level=0.03]"],
        "solver": [{"Denoiser": solver}],
        "max-runs": steps + 3,
        "n-repetitions": 1,
    }
    env = {"OMP_NUM_THREADS": str(threads)}
    if not allocator:
        env["SCOPEBENCH_KEEP_FREED_MEMORY"] = "0"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "denoiser.yml"
        path.write_text(yaml.safe_dump(config))
        run = run_benchopt(REPO / "benchmark_inference", path, output=Path(tmp) / "denoiser.parquet", env=env)
        df = pd.read_parquet(run.parquet)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    df = df[df["objective_denoise_time_sec"].notna()]
    return {
        "time": df["objective_denoise_time_sec"].tolist(),
        "faults": df["objective_minor_faults_count"].tolist(),
        "process_faults": [after.ru_minflt - before.ru_minflt],
        "process_system_sec": [after.ru_stime - before.ru_stime],
    }


def denoiser_case(args) -> None:
    """``--case denoiser``: the ``Denoiser`` solver in ``benchopt run`` vs a bare loop."""
    from scopebench.stats import median

    bare = denoiser_bare(args.image_size, args.sigma, args.threads)
    bare(2)  # warm-up, never reported
    modes = ["bare", "benchopt"] + (["benchopt_allocator_off"] if args.allocator_ab else [])
    data: dict[str, dict[str, list]] = {m: {"time": [], "faults": []} for m in modes}
    per_round: dict[str, list[float]] = {m: [] for m in modes}
    conditions = RoundConditions()
    for r in range(args.rounds):
        with conditions.round():
            for mode in modes if r % 2 == 0 else modes[::-1]:
                if mode == "bare":
                    times, faults = bare(args.steps)
                    got = {"time": times, "faults": faults}
                else:
                    got = denoiser_benchopt(
                        args.image_size, args.sigma, args.steps, args.threads, allocator=mode == "benchopt"
                    )
                for key, values in got.items():
                    data[mode].setdefault(key, []).extend(values)
                per_round[mode].append(median(got["time"]))
                print(f"round {r}: {mode:24s} median {median(got['time']) * 1e3:8.1f} ms", flush=True)
        print(f"round {r}: {conditions.tag()}", flush=True)
    result = {
        "case": "denoiser",
        "image_size": args.image_size,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "threads": args.threads,
        "modes": {},
    }
    bare_median = median(data["bare"]["time"])
    for mode in modes:
        s = summarize(data[mode]["time"])
        ratios = [a / b for a, b in zip(per_round[mode], per_round["bare"])]
        process = data[mode].get("process_faults")
        result["modes"][mode] = {
            "median_ms": s.median * 1e3,
            "p95_ms": s.p95 * 1e3,
            "minor_faults_median": median(data[mode]["faults"]),
            "ratio_to_bare": s.median / bare_median if mode != "bare" else None,
            "round_ratio_min": min(ratios) if mode != "bare" else None,
            "round_ratio_max": max(ratios) if mode != "bare" else None,
            "process_minor_faults_median": median(process) if process else None,
            "process_system_sec_median": median(data[mode]["process_system_sec"]) if process else None,
        }
        line = f"{mode:24s} median {s.median * 1e3:8.1f} ms  p95 {s.p95 * 1e3:8.1f} ms"
        line += f"  minor faults/pass {median(data[mode]['faults']):9.0f}"
        if mode != "bare":
            line += f"  ratio {s.median / bare_median:.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
            line += f"  process: {median(process):,.0f} faults, {median(data[mode]['process_system_sec']):.1f} s sys"
        print(line)
    print("goal: benchopt / bare <= 1.05")
    result["conditions"] = conditions.as_dict()
    print(result["conditions"]["summary"])
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--image-size", type=int, default=128)
    parser.add_argument("--denoiser", choices=("tv", "drunet"), default="tv")
    parser.add_argument("--sigma", type=float, default=0.01)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per round and loop (>= 20 in all)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quickstart", action="store_true", help="also time the benchopt quickstart end to end")
    parser.add_argument("--case", choices=("pnp", "denoiser"), default="pnp", help="denoiser: the Denoiser solver")
    parser.add_argument(
        "--allocator-ab", action="store_true", help="denoiser case: also run benchopt with the allocator fix off"
    )
    args = parser.parse_args()
    from scopebench.allocator import keep_freed_memory

    keep_freed_memory()  # as the solvers do: the in-process loops get the same allocator as benchopt's
    if args.case == "denoiser":
        warnings.simplefilter("ignore")
        return denoiser_case(args)
    if args.rounds * args.steps < 20:
        parser.error("need at least 20 measured steps per loop (rounds x steps)")
    warnings.simplefilter("ignore")
    torch.set_num_threads(args.threads)

    ours, gamma = scopebench_loop(args.image_size, args.denoiser, args.sigma)
    bare = bare_loop(args.image_size, args.denoiser, args.sigma, gamma)
    bare(2), ours(2)  # warm-up, never reported
    times: dict[str, list[float]] = {"bare": [], "scopebench": [], "bare_scored": []}
    conditions = RoundConditions()
    for r in range(args.rounds):
        with conditions.round():
            times["bare"] += bare(args.steps)
            times["scopebench"] += ours(args.steps)
            times["bare_scored"] += bare(args.steps, score=True)
        print(f"round {r}: {conditions.tag()}", flush=True)
    stats = {mode: summarize(values) for mode, values in times.items()}
    ratio = stats["scopebench"].median / stats["bare"].median
    for mode, s in stats.items():
        print(f"{mode:10s} median {s.median * 1e3:8.3f} ms   p95 {s.p95 * 1e3:8.3f} ms   n={len(times[mode])}")
    print(f"ratio scopebench / bare = {ratio:.4f} (goal <= 1.05)")
    print(conditions.summary_line())
    inside = inside_benchopt(args.image_size, args.denoiser, args.sigma, args.rounds * args.steps, args.threads)
    inside_iter = summarize(inside["iteration"]).median
    inside_total = summarize(inside["total"]).median
    inside_ratio = inside_iter / stats["bare"].median
    scored_ratio = inside_iter / stats["bare_scored"].median
    print(
        f"inside benchopt: iteration median {inside_iter * 1e3:8.3f} ms (n={len(inside['iteration'])}), "
        f"ratio to bare = {inside_ratio:.4f} (goal <= 1.05), to bare_scored = {scored_ratio:.4f}; "
        f"with benchopt's scoring callback {inside_total * 1e3:8.3f} ms"
    )
    quickstart = time_quickstart() if args.quickstart else None
    if quickstart is not None:
        print(f"benchopt quickstart end to end: {quickstart:.1f} s (goal < 20 s)")
    print(
        json.dumps(
            {
                "image_size": args.image_size,
                "denoiser": args.denoiser,
                "rounds": args.rounds,
                "steps_per_round": args.steps,
                "threads": args.threads,
                **{m: {"median_ms": s.median * 1e3, "p95_ms": s.p95 * 1e3} for m, s in stats.items()},
                "ratio": ratio,
                "inside_benchopt": {
                    "iteration_median_ms": inside_iter * 1e3,
                    "with_callback_median_ms": inside_total * 1e3,
                    "ratio": inside_ratio,
                    "ratio_to_bare_scored": scored_ratio,
                },
                "quickstart_sec": quickstart,
                "conditions": conditions.as_dict(),
            }
        )
    )


if __name__ == "__main__":
    main()
