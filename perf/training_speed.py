"""Training speed of the unrolled PnP network, and what the scopebench loop adds to it.

What it measures: on the quickstart problem of ``benchmark_training`` (32 px colour
deblurring crops, DnCNN 16 channels x 6 layers, 3 unrolled iterations), at batch sizes
1, 2, 4 and 8 on the CPU:

* ``samples_per_sec`` of a training step run inside the scopebench loop
  (``profiler.iterate`` + ``custom`` profiler regions ``forward``, ``backward``,
  ``optimizer_step``) and the share of each region in the step (``untracked`` is batch
  indexing and loop bookkeeping);
* the same step written as a bare PyTorch loop (batch, forward, MSE, zero_grad,
  backward, clip_grad_norm_, Adam step, projection), and the ratio of the two median step
  times. Goal: at most 1.05 (the profiler may cost no more than 5 %).

A step time is the interval between two consecutive callback calls, what a solver pays
per iteration. The two modes alternate in short rounds (a few steps each, the first step
of each round dropped) so that load from other processes on a shared machine hits both
alike; ``ratio`` is the median over rounds of the per-round ratio of median step times
(a paired comparison, robust to drifting load), the other times are medians over all
steps.

With ``--quickstart`` it also times ``benchopt run benchmark_training/. --config
benchmark_training/configs/quickstart.yml`` end to end in a fresh process (imports and
60 steps included; goal: under 60 s on 2 CPU cores). This is a timing on the machine at
hand, so it lives here and not in the test suite.

Why: the benchmark is only useful if measuring does not change what is measured, and the
batch-size sweep says where a CPU run spends its time.

Run: ``.venv/bin/python perf/training_speed.py [--rounds 30 --steps 6 --threads 1]
[--quickstart]`` (one process; ``--threads`` intra-op threads, 1 by default for stable
timings).

Output: human-readable lines, then one JSON object on the last line::

    {"problem": {...}, "threads": int, "rounds": int, "steps_per_round": int,
     "goal_ratio": 1.05, "max_ratio": float, "within_goal": bool,
     "quickstart_sec": float | null, "quickstart_goal_sec": 60,
     "batch_sizes": {"<b>": {"bare_ms": float, "scopebench_ms": float, "ratio": float,
                             "samples_per_sec": float, "bare_samples_per_sec": float,
                             "share_pct": {"forward"|"backward"|"optimizer_step"|"untracked": float},
                             "conditions": {...}}}}   # perf/round_conditions.py, per round
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from round_conditions import RoundConditions

from scopebench.imaging.common.denoisers import DenoiserSpec
from scopebench.imaging.training import REGIONS, TrainConfig, UnrolledConfig, UnrolledTrainer, build_training_data
from scopebench.profiler import create_profiler
from scopebench.stats import summarize

PROBLEM = dict(image_size=32, operator="blur", noise_level=0.03, n_train=64, n_val=8, seed=0)
ARCH = UnrolledConfig(n_unrolled=3, denoiser=DenoiserSpec(denoiser="dncnn", channels=16, in_channels=3, out_channels=3))
GOAL_RATIO = 1.05
QUICKSTART_GOAL_SEC = 60.0
REPO = Path(__file__).resolve().parents[1]


def bare_step(trainer: UnrolledTrainer) -> None:
    """The training step written out, no regions, no profiler."""
    x, y = trainer.next_batch()
    loss = torch.nn.functional.mse_loss(trainer.model(y, trainer.physics), x)
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(trainer.params, trainer.train.grad_clip)
    trainer.optimizer.step()
    with torch.no_grad():
        for p in trainer.optimizer.param_groups[0]["params"]:
            p.clamp_(min=1e-4)


def run_bare(trainer: UnrolledTrainer, steps: int) -> list[float]:
    stamps: list[float] = []
    while True:
        stamps.append(time.perf_counter())
        if len(stamps) > steps:
            break
        bare_step(trainer)
    return [b - a for a, b in zip(stamps, stamps[1:])][1:]


def run_scopebench(trainer: UnrolledTrainer, steps: int) -> tuple[list[float], list[dict]]:
    stamps: list[float] = []
    rows: list[dict] = []
    prof = create_profiler("custom", "cpu", "training_speed")

    def callback():
        stamps.append(time.perf_counter())
        if len(stamps) > 1:
            rows.append(prof.get_current_metrics())
        return len(stamps) <= steps

    for _ in prof.iterate(callback):
        trainer.step(prof)
    prof.finalize()
    return [b - a for a, b in zip(stamps, stamps[1:])][1:], rows[1:]


def region_shares(rows: list[dict]) -> dict[str, float]:
    """Median share (%) of each region in the step time (``step_time_sec`` = total - callback)."""
    shares: dict[str, list[float]] = {name: [] for name in (*REGIONS, "untracked")}
    for row in rows:
        step = row["step_time_sec"]
        for name in REGIONS:
            shares[name].append(100.0 * row[f"{name}_time_sec"] / step)
        shares["untracked"].append(100.0 * row["untracked_time_sec"] / step)
    return {name: summarize(values).median for name, values in shares.items()}


def time_quickstart() -> float:
    """Wall time of the training quickstart under ``benchopt run`` in a fresh process."""
    from scopebench.runs import run_benchopt

    bench = REPO / "benchmark_training"
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"training_quickstart_{os.getpid()}.parquet"
    start = time.time()
    try:
        run = run_benchopt(bench, bench / "configs" / "quickstart.yml", output=out, env={"OMP_NUM_THREADS": "1"})
    finally:
        out.unlink(missing_ok=True)
        for path in (bench / "outputs").glob("unrolled_pnp_*_denoiser.safetensors"):
            if path.stat().st_mtime >= start:
                path.unlink()
    return run.wall_sec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--quickstart", action="store_true", help="also time the benchopt quickstart end to end")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = build_training_data(**PROBLEM)
    result = {
        "problem": {**PROBLEM, "denoiser": "dncnn", "denoiser_channels": 16, "n_unrolled": ARCH.n_unrolled},
        "threads": args.threads,
        "rounds": args.rounds,
        "steps_per_round": args.steps,
        "goal_ratio": GOAL_RATIO,
        "batch_sizes": {},
    }
    print(f"quickstart problem, {args.threads} thread(s), {args.rounds} rounds x {args.steps} steps per mode")
    for batch in args.batch_sizes:
        train = TrainConfig(batch_size=batch)
        trainers = {mode: UnrolledTrainer(data, ARCH, train) for mode in ("bare", "scopebench")}
        bare_step(trainers["bare"])  # first-call allocations, outside the measurement
        trainers["scopebench"].step()
        bare: list[float] = []
        scoped: list[float] = []
        rows: list[dict] = []
        ratios: list[float] = []
        conditions = RoundConditions()
        for r in range(args.rounds):
            with conditions.round():
                for mode in ("bare", "scopebench") if r % 2 == 0 else ("scopebench", "bare"):
                    if mode == "bare":
                        bare_round = run_bare(trainers[mode], args.steps)
                    else:
                        scoped_round, metrics = run_scopebench(trainers[mode], args.steps)
                        rows += metrics
            bare += bare_round
            scoped += scoped_round
            ratios.append(summarize(scoped_round).median / summarize(bare_round).median)
            print(f"  batch {batch} round {r}: ratio {ratios[-1]:.3f} {conditions.tag()}", flush=True)
        bare_s, scoped_s = summarize(bare).median, summarize(scoped).median
        shares = region_shares(rows)
        entry = {
            "bare_ms": bare_s * 1e3,
            "scopebench_ms": scoped_s * 1e3,
            "ratio": summarize(ratios).median,
            "samples_per_sec": batch / scoped_s,
            "bare_samples_per_sec": batch / bare_s,
            "share_pct": shares,
            "conditions": conditions.as_dict(),
        }
        result["batch_sizes"][str(batch)] = entry
        share_text = "  ".join(f"{name} {value:4.1f}%" for name, value in shares.items())
        print(
            f"batch {batch:>2}: {entry['samples_per_sec']:7.1f} samples/s  step {scoped_s * 1e3:7.2f} ms"
            f"  bare {bare_s * 1e3:7.2f} ms  ratio {entry['ratio']:.3f}  | {share_text}"
        )
        print(f"batch {batch:>2} {entry['conditions']['summary']}")
    result["max_ratio"] = max(e["ratio"] for e in result["batch_sizes"].values())
    result["within_goal"] = result["max_ratio"] <= GOAL_RATIO
    print(f"scopebench loop / bare loop: max ratio {result['max_ratio']:.3f} (goal <= {GOAL_RATIO})")
    result["quickstart_goal_sec"] = QUICKSTART_GOAL_SEC
    result["quickstart_sec"] = time_quickstart() if args.quickstart else None
    if result["quickstart_sec"] is not None:
        print(f"quickstart end to end: {result['quickstart_sec']:.1f} s (goal < {QUICKSTART_GOAL_SEC:.0f} s)")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
