"""How long ``scopebench report`` takes on a 10 000-row results file (goal: under 10 s on 2 cores).

What: writes a synthetic benchopt parquet shaped like a policy-benchmark sweep (training
steps over 1/2/4/8 processes with and without fused AdamW, inference over several
``num_steps``, dataloader runs; per-phase times, rank skew, communication columns and
quality metrics), then runs the real command ``python -m scopebench.cli report <file> -o
<folder>`` in a fresh process ``--repeat`` times, pinned to ``--cores`` CPU cores, and
prints each wall time (imports, tables, diagnosis, PNGs and the HTML file included) with
their median.

Run: ``.venv/bin/python perf/report_speed.py [--rows 10000] [--repeat 3] [--cores 2]``.
Output: one line per run, then ``median <s> s (min <s>, max <s>) for <rows> rows, <n>
configurations, <cores> cores``; exit status 1 when the median exceeds ``--goal`` seconds.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from round_conditions import RoundConditions

TRAIN_PHASES = {"dataload_wait": 0.002, "forward": 0.20, "bwd": 0.40, "unscale_clip": 0.01, "optim_step": 0.03,
                "zero_grad_sched": 0.002, "sync_gather": 0.006}  # fmt: skip
INFER_PHASES = {"preprocess": 0.003, "prefill": 0.05, "denoise": 0.008, "postprocess": 0.001}


def _configs() -> list[tuple[str, dict, dict]]:
    """(solver, parameters, phase seconds) of the synthetic sweep."""
    out = []
    for nproc in (1, 2, 4, 8):
        for fused in (False, True):
            phases = dict(TRAIN_PHASES, bwd=TRAIN_PHASES["bwd"] * (1 + 0.1 * nproc))
            if fused:
                phases["optim_step"] /= 3
            out.append(("Pi05Train", {"nproc_per_node": nproc, "fused_adamw": fused, "batch_size": 8}, phases))
    for steps in (1, 2, 5, 10, 20):
        phases = dict(INFER_PHASES, denoise=INFER_PHASES["denoise"] * steps)
        out.append(("Pi05Inference", {"num_steps": steps, "compile": "default"}, phases))
    for workers in (0, 2, 4, 8, 16):
        out.append(
            ("Pi05Dataloader", {"num_workers": workers, "batch_size": 8}, {"fetch": 0.05 / (1 + workers), "h2d": 0.001})
        )
    return out


def build_frame(rows: int, seed: int = 0):
    """A benchopt-shaped DataFrame of about ``rows`` rows."""
    import numpy as np
    import pandas as pd

    rng = np.random.default_rng(seed)
    configs = _configs()
    per = max(2, rows // len(configs))
    frames = []
    for solver, params, phases in configs:
        name = solver + "[" + ",".join(f"{k}={v}" for k, v in sorted(params.items())) + "]"
        n = per
        stop = np.arange(n)
        frame = {
            "objective_name": "pi05 policy[eval_batch_size=4]",
            "dataset_name": "synthetic_robot[seed=0]",
            "solver_name": name,
            "idx_rep": 0,
            "stop_val": stop,
            "objective_value": 1.0 / (1 + stop) + rng.normal(0, 0.001, n),
            "p_solver_profiler_warmup": 2,
            **{f"p_solver_{k}": v for k, v in params.items()},
        }
        recorded = stop >= 3
        step = np.zeros(n)
        for phase, seconds in phases.items():
            values = seconds * rng.lognormal(0.0, 0.05, n)
            step += values
            frame[f"objective_{phase}_time_sec"] = np.where(recorded, values, np.nan)
        frame["objective_untracked_time_sec"] = np.where(recorded, 1e-4, np.nan)
        frame["objective_callback_time_sec"] = np.where(recorded, 0.01, np.nan)
        frame["objective_total_time_sec"] = np.where(recorded, step + 0.0101, np.nan)
        frame["time"] = np.cumsum(step)
        ranks = params.get("nproc_per_node", 1)
        frame["objective_world_size"] = ranks
        frame["objective_rank_skew_pct"] = np.where(recorded, rng.uniform(0, 15, n), np.nan)
        frame["objective_max_rss_mb"] = np.where(recorded, 2000.0, np.nan)
        frame["objective_max_gpu_mb"] = np.where(recorded, 0.0, np.nan)
        if solver == "Pi05Train":
            frame["objective_samples_per_sec"] = np.where(recorded, 8 * ranks / step, np.nan)
            frame["objective_val_loss"] = 2.0 / (1 + 0.01 * stop)
        elif solver == "Pi05Dataloader":
            frame["objective_samples_per_sec"] = np.where(recorded, 8 / step, np.nan)
            frame["objective_batches_per_sec"] = np.where(recorded, 1 / step, np.nan)
        else:
            frame["objective_first_call_ratio"] = 12.0
            frame["objective_action_mse"] = 0.4 + rng.normal(0, 0.01, n)
        frames.append(pd.DataFrame(frame))
    return pd.concat(frames, ignore_index=True), len(configs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cores", type=int, default=2, help="CPU cores the report process may use")
    parser.add_argument("--goal", type=float, default=10.0, help="seconds allowed for the median run")
    args = parser.parse_args(argv)

    from scopebench import stats

    cores = sorted(os.sched_getaffinity(0))[: args.cores]
    with tempfile.TemporaryDirectory() as tmp:
        frame, n_configs = build_frame(args.rows)
        parquet = Path(tmp) / "sweep.parquet"
        frame.to_parquet(parquet)
        walls = []
        conditions = RoundConditions()
        for k in range(args.repeat):
            start = time.perf_counter()
            with conditions.round():
                proc = subprocess.run(
                    [sys.executable, "-m", "scopebench.cli", "report", str(parquet), "-o", str(Path(tmp) / "out")],
                    capture_output=True,
                    text=True,
                    preexec_fn=lambda: os.sched_setaffinity(0, cores),
                    stdin=subprocess.DEVNULL,
                )
            walls.append(time.perf_counter() - start)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                return 1
            print(f"run {k + 1}: {walls[-1]:.2f} s {conditions.tag()}", flush=True)
        pngs = len(list((Path(tmp) / "out").glob("*.png")))
    median = stats.median(walls)
    print(
        f"median {median:.2f} s (min {min(walls):.2f}, max {max(walls):.2f}) for {len(frame)} rows, "
        f"{n_configs} configurations, {len(cores)} cores; {pngs} PNGs; goal < {args.goal:g} s"
    )
    print(conditions.summary_line())
    return 0 if median < args.goal else 1


if __name__ == "__main__":
    sys.exit(main())
