"""Memory by category: the estimate against the tracked peak, and what tracking costs.

What it measures, per backend (``ddp``, ``zero2``, ``zero3``, ``fsdp2``) on 2 gloo ranks:

1. **Estimate vs measured.** ``scopebench.policy.memory.run_memory`` (before launch, no model
   allocated) against the step's peak that ``profiler_memory: true`` reports on rank 0, by
   category, with the relative error.
2. **Tracking overhead.** The same training step with ``profiler_memory`` off and on, in
   interleaved rounds (off, on, off, on...), ``--steps`` recorded steps each; the median
   ``step_time_sec`` of each, their ratio (on / off) with the spread over rounds (min-max of
   the per-round ratios), and the median ``profiler_memory_overhead_sec`` the run reports.
3. **``estimate-memory`` on pi05.** Wall time and peak RSS of the command for ``pi05`` at its
   real size (``zero2``, 8 ranks, batch 16), in a fresh process.

Run: ``.venv/bin/python perf/memory_tracking.py [--preset small] [--rounds 3] [--steps 3]
[--backends ddp,zero2,zero3,fsdp2] [--batch-size 4]``. It starts itself under
``torch.distributed.run`` for part 1 and 2. Output: human-readable lines, then one JSON object
on the last line: ``{"preset", "batch_size", "rounds", "steps", "backends": {backend:
{"estimate_mb": {cat: float}, "measured_mb": {cat: float}, "peak_error_pct": float,
"off_step_sec": float, "on_step_sec": float, "ratio": float, "ratio_min": float,
"ratio_max": float, "reported_overhead_sec": float}}, "pi05": {"wall_sec": float,
"maxrss_gb": float}}``.
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

REPO = Path(__file__).resolve().parents[1]
CATEGORIES = ("parameters", "gradients", "optimizer_state", "gather_buffers", "activations")


def _run(preset: str, backend: str, batch: int, steps: int, memory: bool, cache: str) -> dict:
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import load_run_config
    from scopebench.policy.tools import StepCounter
    from scopebench.profiler import ProfilerConfig

    overrides = [("backend", backend), ("batch_size", batch), ("find_unused_params", False), ("num_workers", 0)]
    config = load_run_config(REPO / "configs" / "policy" / f"{preset}.yml", [*overrides, ("dataset.cache_dir", cache)])
    run = PolicyTrainRun(
        config.train,
        dataset_root=config.dataset.materialize(),
        chunk_size=config.dataset.chunk_size,
        profiler=ProfilerConfig(mode="custom", warmup=2, memory=memory),
        keep_rows=True,
    )
    with run:
        run.loop(StepCounter(2 + steps))
        rows = list(run.profiler.rows)
        last = run.metrics()
    return {"step_sec": [r["step_time_sec"] for r in rows], "last": last}


def ranks_main(out: str, cache: str, preset: str, backends: str, batch: int, rounds: int, steps: int) -> None:
    import torch
    import torch.distributed as dist

    from scopebench.distributed.worker import exit_without_teardown
    from scopebench.stats import median

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = {}
    for backend in backends.split(","):
        off, on, ratios, overhead, last = [], [], [], [], {}
        for _ in range(rounds):
            a = _run(preset, backend, batch, steps, False, cache)
            b = _run(preset, backend, batch, steps, True, cache)
            off += a["step_sec"]
            on += b["step_sec"]
            ratios.append(median(b["step_sec"]) / median(a["step_sec"]))
            overhead.append(b["last"].get("profiler_memory_overhead_sec", 0.0))
            last = b["last"]
        result[backend] = {
            "off": off,
            "on": on,
            "ratios": ratios,
            "overhead": overhead,
            "measured_mb": {c: last.get(f"mem_{c}_mb") for c in (*CATEGORIES, "temporaries", "peak")},
        }
    if dist.get_rank() == 0:
        Path(out).write_text(json.dumps(result))
    dist.destroy_process_group()
    exit_without_teardown(0)


def _estimate(preset: str, backend: str, batch: int, cache: str) -> dict:
    from scopebench.policy.data.dataset import RobotDataset
    from scopebench.policy.memory import run_memory
    from scopebench.policy.pi05.policy import config_for_dataset
    from scopebench.policy.run.train import model_overrides
    from scopebench.policy.settings import load_run_config

    overrides = [("backend", backend), ("batch_size", batch), ("dataset.cache_dir", cache)]
    config = load_run_config(REPO / "configs" / "policy" / f"{preset}.yml", overrides)
    dataset = RobotDataset(config.dataset.materialize(), chunk_size=config.dataset.chunk_size)
    model = config_for_dataset(preset, dataset, **model_overrides(config.train))
    return run_memory(config.train, model, 2)


_PI05 = """
import resource, sys, time
start = time.perf_counter()
from scopebench.cli import main
code = main(sys.argv[1:])
print("WALL", time.perf_counter() - start, "RSS", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def main() -> None:
    from scopebench.stats import median

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--backends", default="ddp,zero2,zero3,fsdp2")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    mb = 1024.0 * 1024.0
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "ranks.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", __file__]
        cmd += ["--ranks", str(out), tmp, args.preset, args.backends, str(args.batch_size), str(args.rounds)]
        subprocess.run([*cmd, str(args.steps)], check=True, stdin=subprocess.DEVNULL, env={**os.environ})
        ranks = json.loads(out.read_text())
        estimates = {backend: _estimate(args.preset, backend, args.batch_size, tmp) for backend in ranks}
    report = {"preset": args.preset, "batch_size": args.batch_size, "rounds": args.rounds, "steps": args.steps}
    report["backends"] = {}
    for backend, seen in ranks.items():
        estimate = estimates[backend]
        measured = seen["measured_mb"]
        row = {
            "estimate_mb": {c: estimate[c] / mb for c in CATEGORIES} | {"peak": estimate["peak"] / mb},
            "measured_mb": measured,
            "peak_error_pct": (estimate["peak"] / mb / measured["peak"] - 1) * 100,
            "off_step_sec": median(seen["off"]),
            "on_step_sec": median(seen["on"]),
            "ratio": median(seen["on"]) / median(seen["off"]),
            "ratio_min": min(seen["ratios"]),
            "ratio_max": max(seen["ratios"]),
            "reported_overhead_sec": median(seen["overhead"]),
        }
        report["backends"][backend] = row
        print(f"{backend}: peak estimated {row['estimate_mb']['peak']:.1f} MiB, measured {measured['peak']:.1f} MiB "
              f"({row['peak_error_pct']:+.1f} %)")  # fmt: skip
        for c in CATEGORIES:
            print(f"    {c:<16} estimated {row['estimate_mb'][c]:10.2f}  measured {measured[c] or 0:10.2f} MiB")
        print(f"    step off {row['off_step_sec']:.3f} s, on {row['on_step_sec']:.3f} s: x{row['ratio']:.2f} "
              f"(rounds {row['ratio_min']:.2f}-{row['ratio_max']:.2f}); reported overhead "
              f"{row['reported_overhead_sec']:.3f} s")  # fmt: skip
    pi05 = [sys.executable, "-c", _PI05, "estimate-memory", "--config", str(REPO / "configs/policy/pi05.yml")]
    pi05 += ["--backend", "zero2", "--nproc-per-node", "8", "--batch-size", "16", "--memory-gb", "80"]
    text = subprocess.run(pi05, capture_output=True, text=True, check=True).stdout
    wall, rss = float(text.split("WALL")[1].split()[0]), float(text.split("RSS")[1].split()[0])
    report["pi05"] = {"wall_sec": wall, "maxrss_gb": rss * 1024 / 1e9}
    print(f"estimate-memory pi05: {wall:.1f} s, peak RSS {report['pi05']['maxrss_gb']:.2f} GB")
    print(json.dumps(report))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--ranks"]:
        out, cache, preset, backends, batch, rounds, steps = sys.argv[2:9]
        ranks_main(out, cache, preset, backends, int(batch), int(rounds), int(steps))
    else:
        start = time.perf_counter()
        main()
        print(f"# total {time.perf_counter() - start:.0f} s", file=sys.stderr)
