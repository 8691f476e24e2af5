"""DDP vs DeepSpeed ZeRO-2 vs ZeRO-3 vs FSDP2 on this machine (2 gloo ranks), and the suite's own cost.

What it measures:

1. **Backends** (``--presets``, default ``tiny,small``): in each round, one run per backend
   (the order rotates from round to round, so background load hits each alike) of
   ``--warmup`` + ``--steps`` training steps of the same model and per-rank batch, through
   :class:`scopebench.policy.run.train.PolicyTrainRun` (the code of ``Pi05Train``,
   ``profile-step`` and ``scopebench train``) on 2 local ranks. Each run is a fresh process
   (its peak RSS is its own). Per run: the median step (``step_time_sec``: ``total - callback``, the slowest
   rank's), each phase's median, global samples/s, each rank's peak RSS. Reported: per
   backend the median over rounds and its ratio to the round's fastest backend (median,
   min-max over rounds); the ZeRO-3 / ZeRO-2, ZeRO-2 / DDP, FSDP2 / ZeRO-2 and FSDP2 / DDP
   step ratios (ratio of the two medians in each round, then the median with min-max over
   rounds); per phase the difference of medians that explains them (ZeRO-3 and FSDP2
   all-gather each layer's parameters in ``forward`` and ``bwd``; ZeRO-2 all-gathers the
   updated parameters in ``optim_step``: :data:`scopebench.policy.phases.PHASE_CONTENTS`).
2. **Suite cost** (``--overhead-preset``, default ``small``; ``--overhead-backends``, default
   ``ddp,fsdp2``): per round and backend, ``benchopt run`` of ``Pi05Train`` (2 ranks, custom
   profiler: ``step_time_sec`` per iteration) and a bare loop of the same step on 2 torchrun
   ranks (the same model, wrapping, data and AdamW; no profiler, no benchopt, no
   per-iteration decision broadcast), alternating which goes first. Ratio of median step
   times, with the min-max over rounds. Goal: <= 1.03.

How to run (2 cores; each run starts its ranks, DeepSpeed's first use builds a small op)::

    python perf/distributed_speed.py                              # both parts
    python perf/distributed_speed.py --presets tiny --rounds 2 --skip overhead
    python perf/distributed_speed.py --skip backends --overhead-preset tiny --overhead-backends fsdp2

Output: readable lines, then one JSON object on the last line::

    {"load_average_start", "load_average_end", "rounds",
     "backends": {preset: {"batch_size", "per_backend": {backend: {"step_sec", "samples_per_sec",
                  "phases_sec": {phase: s}, "peak_rss_mb_per_rank": [..],
                  "vs_fastest": {"median", "min", "max", "per_round"}}},
                  "ratios": {"zero3/zero2" | "zero2/ddp" | "fsdp2/zero2" | "fsdp2/ddp":
                             {"median", "min", "max", "per_round"}},
                  "phase_deltas_sec": {"zero3-zero2" | ...: {phase: s}}, "conditions"}},
     "overhead": {backend: {"preset", "benchopt_step_sec", "bare_step_sec", "ratio", "min", "max",
                  "per_round", "goal": 1.03, "met": bool, "conditions"}}}

``conditions`` (perf/round_conditions.py): other processes' CPU share and steal of each
round, contended rounds flagged (also printed after each round).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from round_conditions import RoundConditions

REPO = Path(__file__).resolve().parents[1]
BACKENDS = ("ddp", "zero2", "zero3", "fsdp2")
PAIRS = (("zero3", "zero2"), ("zero2", "ddp"), ("fsdp2", "zero2"), ("fsdp2", "ddp"))
OVERHEAD_GOAL = 1.03
#: Dataset shapes that match each preset's images and chunk, and a per-rank batch.
PRESETS = {
    "tiny": dict(image_size=32, chunk_size=8, batch_size=4),
    "small": dict(image_size=96, chunk_size=16, batch_size=2),
}


def _settings(preset: str, backend: str, nproc: int = 2):
    from scopebench.policy.settings import TrainSettings

    return TrainSettings(
        preset=preset,
        batch_size=PRESETS[preset]["batch_size"],
        nproc_per_node=nproc,
        backend=backend,
        find_unused_params=False,
        learning_rate=1e-4,
        fused_adamw=True,
    )


def _dataset(preset: str, cache: str):
    from scopebench.policy.settings import DatasetSettings

    shape = PRESETS[preset]
    return DatasetSettings(image_size=shape["image_size"], chunk_size=shape["chunk_size"], cache_dir=cache)


def one_run(preset: str, backend: str, warmup: int, steps: int, cache: str) -> dict:
    """Rank 0 of one run (this process) and its spawned rank 1: medians of the measured steps."""
    from scopebench.policy.phases import TRAIN_PHASES
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.tools import StepCounter
    from scopebench.profiler import ProfilerConfig
    from scopebench.stats import median

    data = _dataset(preset, cache)
    run = PolicyTrainRun(
        _settings(preset, backend),
        dataset_root=data.materialize(),
        chunk_size=data.chunk_size,
        profiler=ProfilerConfig(warmup=warmup),
        name="distributed_speed",
    )
    rows: list[dict] = []
    with run:
        run.loop(StepCounter(warmup + steps, lambda: rows.append(run.metrics())))
    rows = [m for m in rows if "total_time_sec" in m]
    return {
        "step_sec": median(m["step_time_sec"] for m in rows),
        "samples_per_sec": median(m["samples_per_sec"] for m in rows),
        "phases_sec": {p: median(m[f"{p}_time_sec"] for m in rows) for p in TRAIN_PHASES},
        "peak_rss_mb_per_rank": [rows[-1][f"max_rss_mb_rank{r}"] for r in range(run.world_size)],
    }


def bare_worker(preset: str, backend: str, warmup: int, steps: int, cache: str, out: str) -> None:
    """A torchrun rank: the same step as ``Pi05Train`` (DDP or FSDP2), looped without profiler or benchopt."""
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.profiler import create_profiler

    data = _dataset(preset, cache)
    run = PolicyTrainRun(
        _settings(preset, backend, nproc=1), dataset_root=data.materialize(), chunk_size=data.chunk_size
    )
    null = create_profiler(None)
    times = []
    with run:
        for _ in range(warmup + steps):
            start = time.perf_counter()
            run.work(null)
            times.append(time.perf_counter() - start)
        if run.rank == 0:
            Path(out).write_text(json.dumps(times[warmup:]))
    from scopebench.distributed.worker import exit_without_teardown

    exit_without_teardown(0)  # a launched rank's occasional abort at exit (scopebench.distributed.worker)


def _python(*args: str, timeout: int = 1800) -> str:
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    return proc.stdout


def bench_backends(preset: str, rounds: int, warmup: int, steps: int, cache: str) -> dict:
    from scopebench.stats import median

    runs: dict[str, list[dict]] = {b: [] for b in BACKENDS}
    conditions = RoundConditions()
    for r in range(rounds):
        order = BACKENDS[r % len(BACKENDS) :] + BACKENDS[: r % len(BACKENDS)]
        with conditions.round():
            for backend in order:
                text = _python(__file__, "--one-run", preset, backend, str(warmup), str(steps), cache)
                runs[backend].append(json.loads(text.strip().splitlines()[-1]))
                print(f"  {preset} round {r} {backend}: step {runs[backend][-1]['step_sec'] * 1e3:.1f} ms", flush=True)
        print(f"  {preset} round {r}: {conditions.tag()}", flush=True)
    per_backend = {
        b: {
            "step_sec": median(x["step_sec"] for x in rs),
            "samples_per_sec": median(x["samples_per_sec"] for x in rs),
            "phases_sec": {p: median(x["phases_sec"][p] for x in rs) for p in rs[0]["phases_sec"]},
            "peak_rss_mb_per_rank": [max(x["peak_rss_mb_per_rank"][i] for x in rs) for i in range(2)],
        }
        for b, rs in runs.items()
    }
    for b, rs in runs.items():  # each round's fastest backend is that round's reference
        per_round = [x["step_sec"] / min(runs[o][i]["step_sec"] for o in BACKENDS) for i, x in enumerate(rs)]
        per_backend[b]["vs_fastest"] = {
            "median": median(per_round),
            "min": min(per_round),
            "max": max(per_round),
            "per_round": per_round,
        }
    ratios, deltas = {}, {}
    for slow, fast in PAIRS:
        per_round = [a["step_sec"] / b["step_sec"] for a, b in zip(runs[slow], runs[fast])]
        ratios[f"{slow}/{fast}"] = {"median": median(per_round), "min": min(per_round), "max": max(per_round)}
        ratios[f"{slow}/{fast}"]["per_round"] = per_round
        slow_phases, fast_phases = per_backend[slow]["phases_sec"], per_backend[fast]["phases_sec"]
        deltas[f"{slow}-{fast}"] = {p: slow_phases[p] - fast_phases[p] for p in slow_phases}
    return {
        "batch_size": PRESETS[preset]["batch_size"],
        "per_backend": per_backend,
        "ratios": ratios,
        "phase_deltas_sec": deltas,
        "conditions": conditions.as_dict(),
    }


def bench_overhead(preset: str, backend: str, rounds: int, warmup: int, steps: int, cache: str) -> dict:
    import pandas as pd
    import yaml

    from scopebench.runs import run_benchopt
    from scopebench.stats import median

    solver = {**{k: v for k, v in PRESETS[preset].items() if k == "batch_size"}, "preset": preset}
    solver.update(nproc_per_node=2, find_unused_params=False, fused_adamw=True, learning_rate=1e-4, backend=backend)
    solver["profiler_warmup"] = warmup
    shape = {k: PRESETS[preset][k] for k in ("image_size", "chunk_size")}
    dataset = "synthetic_robot[" + ",".join(f"{k}={v}" for k, v in shape.items()) + "]"
    benchopt_runs, bare_runs = [], []
    conditions = RoundConditions()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp, "overhead.yml")
        config.write_text(
            yaml.safe_dump(
                {
                    "dataset": [dataset],
                    "solver": [{"Pi05Train": solver}],
                    "max-runs": warmup + steps,
                    "n-repetitions": 1,
                    "timeout": 3600,
                }
            )
        )
        for r in range(rounds):
            with conditions.round():
                for side in ("benchopt", "bare") if r % 2 == 0 else ("bare", "benchopt"):
                    if side == "benchopt":
                        run = run_benchopt(REPO, config, output=Path(tmp, f"r{r}.parquet"), timeout_sec=3600)
                        df = pd.read_parquet(run.parquet)
                        df = df[df["objective_total_time_sec"].notna()]
                        benchopt_runs.append(median(df["objective_step_time_sec"]))
                    else:
                        out = Path(tmp, f"bare{r}.json")
                        _python(
                            "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__,
                            "--bare-worker", preset, backend, str(warmup), str(steps), cache, str(out),
                        )  # fmt: skip
                        bare_runs.append(median(json.loads(out.read_text())))
                    print(f"  overhead {backend} round {r} {side}: done", flush=True)
            print(f"  overhead {backend} round {r}: {conditions.tag()}", flush=True)
    per_round = [a / b for a, b in zip(benchopt_runs, bare_runs)]
    ratio = median(per_round)
    return {
        "preset": preset,
        "benchopt_step_sec": median(benchopt_runs),
        "bare_step_sec": median(bare_runs),
        "ratio": ratio,
        "min": min(per_round),
        "max": max(per_round),
        "per_round": per_round,
        "goal": OVERHEAD_GOAL,
        "met": ratio <= OVERHEAD_GOAL,
        "conditions": conditions.as_dict(),
    }


def main() -> None:
    if sys.argv[1:2] == ["--one-run"]:
        preset, backend, warmup, steps, cache = sys.argv[2:7]
        print(json.dumps(one_run(preset, backend, int(warmup), int(steps), cache)))
        return
    if "--bare-worker" in sys.argv:
        i = sys.argv.index("--bare-worker")
        preset, backend, warmup, steps, cache, out = sys.argv[i + 1 : i + 7]
        bare_worker(preset, backend, int(warmup), int(steps), cache, out)
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", default="tiny,small")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--overhead-preset", default="small")
    parser.add_argument(
        "--overhead-backends", default="ddp,fsdp2", help="comma-separated backends of the suite-cost part"
    )
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: backends, overhead")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    cache = str(REPO / "outputs" / "datasets")
    result: dict = {"load_average_start": list(os.getloadavg()), "rounds": args.rounds}
    if "backends" not in skip:
        result["backends"] = {}
        for preset in args.presets.split(","):
            res = result["backends"][preset] = bench_backends(preset, args.rounds, args.warmup, args.steps, cache)
            for backend, b in res["per_backend"].items():
                rss = ", ".join(f"{x:.0f}" for x in b["peak_rss_mb_per_rank"])
                print(
                    f"{preset} {backend}: {b['step_sec'] * 1e3:.1f} ms/step, {b['samples_per_sec']:.1f} samples/s, "
                    f"peak RSS per rank {rss} MB; vs fastest {b['vs_fastest']['median']:.3f} "
                    f"[{b['vs_fastest']['min']:.3f}-{b['vs_fastest']['max']:.3f}]"
                )
            for pair, ratio in res["ratios"].items():
                delta = res["phase_deltas_sec"][pair.replace("/", "-")]
                top = sorted(delta.items(), key=lambda kv: -abs(kv[1]))[:3]
                text = ", ".join(f"{p} {d * 1e3:+.1f} ms" for p, d in top)
                print(f"{preset} {pair}: {ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]; {text}")
            print(f"{preset} {res['conditions']['summary']}")
    if "overhead" not in skip:
        result["overhead"] = {}
        for backend in args.overhead_backends.split(","):
            o = result["overhead"][backend] = bench_overhead(
                args.overhead_preset, backend, args.rounds, args.warmup, args.steps, cache
            )
            print(
                f"Pi05Train under benchopt / bare {backend} loop ({o['preset']}): {o['ratio']:.4f} "
                f"[{o['min']:.4f}-{o['max']:.4f}] ({o['benchopt_step_sec'] * 1e3:.1f} vs "
                f"{o['bare_step_sec'] * 1e3:.1f} ms; goal <= {OVERHEAD_GOAL}: {'met' if o['met'] else 'NOT met'})"
            )
            print(f"overhead {backend} {o['conditions']['summary']}")
    result["load_average_end"] = list(os.getloadavg())
    print(json.dumps(result))


if __name__ == "__main__":
    main()
