"""CPU speed of the pi05 policy: training throughput, FLOP/s efficiency, inference latency.

What it measures, for one preset (default ``small``) on the CPU:

1. **Matmul peak**: the best rate of a large fp32 matrix product (``--peak-size``,
   default 2048) in this process, sampled before, between the timed training steps and
   after the workload; the highest sample is the peak. It is the denominator of the
   efficiency figure, so the figure says how close the model gets to what this machine
   can do. On a shared machine, sampling throughout the run keeps a burst of other work
   from lowering only one side of the ratio.
2. **Training**: forward + backward + AdamW step on a synthetic batch. After
   ``--warmup`` untimed steps, ``--train-steps`` timed steps; the median step time gives
   samples/s and achieved GFLOP/s (``model.estimate_flops(B, "train")`` / step time),
   and its share of the matmul peak (goal: >= 40 %).
3. **Inference**: ``sample_actions`` at batch 1 with the KV cache at ``num_steps`` 1 and
   10, and without it (the prefix recomputed at every step) at 10 steps, timed in
   interleaved rounds (one call of each per round) so that background load affects all
   of them alike. Reported: the median latencies, the KV-cache speedup at 10 steps
   (goal: >= 3x), and the affine decomposition ``L(N) = F + N * s`` fitted from the two cached points
   (``s = (L10 - L1) / 9``, ``F = L1 - s``), next to a directly timed prefill.

Why: the policy benchmark's solvers report time per region; these numbers say whether
the model code itself is efficient enough on a CPU for those regions to mean something,
and whether the KV cache does its job. Weights are random: latency and throughput
depend on shapes and dtype only.

How to run (single process, no launcher)::

    python benchmarks/policy_speed.py                # small preset, batch 8
    python benchmarks/policy_speed.py --threads 1    # stable on a shared machine
    python benchmarks/policy_speed.py --preset tiny --train-steps 3 --json-out out.json

Other work on the machine slows everything down; the load average at start and end is
part of the output so a noisy run can be recognised. On a shared machine prefer
``--threads 1``: with several OpenMP threads, every small operator waits for its
slowest thread, and a thread descheduled by another process stalls the whole step (on a
loaded 2-core machine a training step took 10 s with 2 threads and 2.6 s with 1), while
one large matmul barely notices, which would understate the efficiency.

Output: human-readable lines, then one JSON object on the last line::

    {"preset": str, "torch_version": str, "num_threads": int, "num_params": int,
     "load_average_start": [1m, 5m, 15m], "load_average_end": [...],
     "matmul_peak_gflop_per_sec": float, "matmul_peak_samples_gflop_per_sec": [float, ...],
     "train": {"batch_size": int, "warmup_steps": int, "step_time_sec": [float, ...],
               "step_time_sec_median": float, "samples_per_sec": float,
               "flops_per_step": int, "achieved_gflop_per_sec": float,
               "peak_fraction_pct": float},
     "inference": {"batch_size": 1, "repeats": int,
                   "latency_sec": {"kv_1": float, "kv_10": float, "recompute_10": float},
                   "latency_sec_min": {same keys},
                   "kv_cache_speedup": float, "fixed_cost_sec": float,
                   "per_step_sec": float, "prefill_sec": float,
                   "flops_per_call": {"1": int, "10": int}},
     "goals": {"peak_fraction_pct": 40.0, "kv_cache_speedup": 3.0,
               "peak_fraction_met": bool, "kv_cache_speedup_met": bool}}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from scopebench.policy import Pi05Policy, make_policy

PEAK_FRACTION_GOAL_PCT = 40.0
KV_SPEEDUP_GOAL = 3.0


def matmul_peak_gflops(size: int, repeats: int = 4) -> float:
    """Best GFLOP/s of one ``size x size`` fp32 matmul (``2 size^3`` FLOPs) over repeats."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    for _ in range(2):  # let the BLAS pick its kernels and threads settle
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


def synthetic_batch(model: Pi05Policy, batch_size: int, seed: int = 0) -> dict:
    """A training batch of random inputs with the model's shapes."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    s = cfg.vision.image_size
    return {
        "images": torch.rand(batch_size, cfg.num_cameras, 3, s, s, generator=g),
        "prompt_ids": torch.randint(2, cfg.text_vocab_size, (batch_size, cfg.prompt_max_length), generator=g),
        "prompt_mask": torch.ones(batch_size, cfg.prompt_max_length, dtype=torch.bool),
        "state": torch.rand(batch_size, cfg.state_dim, generator=g) * 2 - 1,
        "actions": torch.randn(batch_size, cfg.chunk_size, cfg.action_dim, generator=g),
        "action_is_pad": torch.zeros(batch_size, cfg.chunk_size, dtype=torch.bool),
    }


def time_calls(fn, repeats: int, warmup: int = 1) -> list[float]:
    """Wall times of ``repeats`` calls after ``warmup`` untimed calls (CPU: no sync)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def bench_training(
    model: Pi05Policy, batch_size: int, warmup: int, steps: int, peak_size: int
) -> tuple[dict, list[float]]:
    """Forward + backward + AdamW step; median of the timed steps.

    Returns:
        The training figures, and the matmul-peak samples taken before each timed step
        (outside its timing).
    """
    model.train()
    batch = synthetic_batch(model, batch_size)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step() -> None:
        loss, _ = model(batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(warmup):
        step()
    times, peaks = [], []
    for _ in range(steps):
        peaks.append(matmul_peak_gflops(peak_size))
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    median = statistics.median(times)
    flops = model.estimate_flops(batch_size, "train")
    result = {
        "batch_size": batch_size,
        "warmup_steps": warmup,
        "step_time_sec": times,
        "step_time_sec_median": median,
        "samples_per_sec": batch_size / median,
        "flops_per_step": flops,
        "achieved_gflop_per_sec": flops / median / 1e9,
    }
    return result, peaks


def bench_inference(model: Pi05Policy, repeats: int) -> dict:
    """``sample_actions`` latencies at batch 1, with and without the KV cache.

    Calls are interleaved round by round, after one untimed round of warm-up."""
    model.eval()
    obs = synthetic_batch(model, 1)
    noise = torch.randn(1, model.config.chunk_size, model.config.action_dim)
    calls = {
        "kv_1": lambda: model.sample_actions(obs, 1, noise),
        "kv_10": lambda: model.sample_actions(obs, 10, noise),
        "recompute_10": lambda: model.sample_actions(obs, 10, noise, use_kv_cache=False),
        "prefill": lambda: model.prefill(obs),
    }
    lat = {name: [] for name in calls}
    with torch.inference_mode():
        for _ in range(repeats):
            for name, fn in calls.items():
                lat[name] += time_calls(fn, repeats=1, warmup=1 if not lat[name] else 0)
    med = {k: statistics.median(v) for k, v in lat.items()}
    per_step = (med["kv_10"] - med["kv_1"]) / 9
    return {
        "batch_size": 1,
        "repeats": repeats,
        "latency_sec": {k: med[k] for k in ("kv_1", "kv_10", "recompute_10")},
        "latency_sec_min": {k: min(lat[k]) for k in ("kv_1", "kv_10", "recompute_10")},
        "kv_cache_speedup": med["recompute_10"] / med["kv_10"],
        "fixed_cost_sec": med["kv_1"] - per_step,
        "per_step_sec": per_step,
        "prefill_sec": med["prefill"],
        "flops_per_call": {str(n): model.estimate_flops(1, "inference", n) for n in (1, 10)},
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=2, help="untimed training steps")
    parser.add_argument("--train-steps", type=int, default=5, help="timed training steps")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per latency")
    parser.add_argument("--peak-size", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--json-out", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    load_start = list(os.getloadavg())
    model = make_policy(args.preset)
    print(
        f"preset={args.preset} params={model.num_params() / 1e6:.1f}M "
        f"threads={torch.get_num_threads()} torch={torch.__version__} load={load_start[0]:.2f}"
    )

    peaks = [matmul_peak_gflops(args.peak_size)]
    train, train_peaks = bench_training(model, args.batch_size, args.warmup, args.train_steps, args.peak_size)
    peaks += train_peaks
    infer = bench_inference(model, args.repeats)
    peaks.append(matmul_peak_gflops(args.peak_size))
    peak = max(peaks)
    print(
        f"matmul peak (fp32 {args.peak_size}^3): {peak:.1f} GFLOP/s "
        f"(samples {', '.join(f'{p:.0f}' for p in peaks)})"
    )
    train["peak_fraction_pct"] = 100 * train["achieved_gflop_per_sec"] / peak

    print(
        f"train  batch={args.batch_size}: step median {train['step_time_sec_median']:.3f} s "
        f"(steps {', '.join(f'{t:.2f}' for t in train['step_time_sec'])}), "
        f"{train['samples_per_sec']:.2f} samples/s, {train['achieved_gflop_per_sec']:.1f} GFLOP/s "
        f"= {train['peak_fraction_pct']:.1f}% of peak (goal >= {PEAK_FRACTION_GOAL_PCT:.0f}%)"
    )
    lat = infer["latency_sec"]
    print(
        f"sample_actions batch=1: N=1 {lat['kv_1'] * 1e3:.1f} ms, N=10 {lat['kv_10'] * 1e3:.1f} ms, "
        f"N=10 recomputing the prefix {lat['recompute_10'] * 1e3:.1f} ms"
    )
    print(f"KV-cache speedup at N=10: {infer['kv_cache_speedup']:.2f}x (goal >= {KV_SPEEDUP_GOAL:.0f}x)")
    print(
        f"L(N) = F + N*s: F = {infer['fixed_cost_sec'] * 1e3:.1f} ms, s = {infer['per_step_sec'] * 1e3:.2f} ms/step "
        f"(prefill timed alone: {infer['prefill_sec'] * 1e3:.1f} ms)"
    )
    result = {
        "preset": args.preset,
        "torch_version": torch.__version__,
        "num_threads": torch.get_num_threads(),
        "num_params": model.num_params(),
        "load_average_start": load_start,
        "load_average_end": list(os.getloadavg()),
        "matmul_peak_gflop_per_sec": peak,
        "matmul_peak_samples_gflop_per_sec": peaks,
        "train": train,
        "inference": infer,
        "goals": {
            "peak_fraction_pct": PEAK_FRACTION_GOAL_PCT,
            "kv_cache_speedup": KV_SPEEDUP_GOAL,
            "peak_fraction_met": train["peak_fraction_pct"] >= PEAK_FRACTION_GOAL_PCT,
            "kv_cache_speedup_met": infer["kv_cache_speedup"] >= KV_SPEEDUP_GOAL,
        },
    }
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh, indent=2)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
