"""What the per-rank ledger costs a distributed step (docs/performance.md, "The ledger's cost").

What it measures: ``scopebench profile-step`` on ``--nproc`` local gloo ranks (2 by default; 1:
the one-rank ledger of a training step), DDP, the ``tiny`` pi05 config, with the ledger on and
off (``SCOPEBENCH_LEDGER=0``), alternating on, off, on, off over
``--rounds``, each run in its own processes. Per run: the median step (``phases.total``), the
median ``bwd``, and the profiler's reported cost per step (``profiler_cost.per_step_sec``: its
time inside the clock, the region bookkeeping and the collective wrappers, plus outside it, where
the ledger's one gather per iteration lands). Per round the ratio on / off of the step and the
difference of the profiler cost; then their medians and spread (min-max) over the rounds.

Why: the ledger wraps every collective and gathers every rank's record each iteration; the step
it measures must not change by more than the machine's noise, and its cost must be stated.

Run: ``.venv/bin/python perf/ledger_cost.py [--rounds 4 --steps 20 --backend ddp --nproc 2]``.
Output: human-readable lines, then one JSON object on the last line::

    {"rounds": int, "steps": int, "backend": str, "nproc": int,
     "on": {"step_ms": [...], "bwd_ms": [...], "profiler_cost_us": [...]}, "off": {...},
     "step_ratio_median": float, "step_ratio_min": float, "step_ratio_max": float,
     "cost_delta_us_median": float, "cost_delta_us_min": float, "cost_delta_us_max": float}
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def one_run(ledger: bool, steps: int, backend: str, nproc: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        env = {**os.environ, "SCOPEBENCH_LEDGER": "1" if ledger else "0"}
        cmd = [
            sys.executable,
            "-m",
            "scopebench.cli",
            "profile-step",
            "--config",
            str(REPO / "configs/policy/tiny.yml"),
        ]
        cmd += [
            "--nproc-per-node",
            str(nproc),
            "--steps",
            str(steps),
            "--warmup",
            "3",
            f"--backend={backend}",
            "--json",
            str(out),
        ]
        subprocess.run(cmd, check=True, env=env, capture_output=True, stdin=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    return {
        "step_ms": report["phases"]["total"]["median_sec"] * 1e3,
        "bwd_ms": report["phases"]["bwd"]["median_sec"] * 1e3,
        "profiler_cost_us": report["profiler_cost"]["per_step_sec"] * 1e6,
        "ledger_columns": "bwd_work_sec" in report["per_rank"][0]["samples"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--backend", default="ddp")
    parser.add_argument("--nproc", type=int, default=2, help="local ranks (1: the one-rank ledger)")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {"on": [], "off": []}
    for i in range(args.rounds):
        for mode in ("on", "off") if i % 2 == 0 else ("off", "on"):
            run = one_run(mode == "on", args.steps, args.backend, args.nproc)
            assert run["ledger_columns"] == (mode == "on"), "SCOPEBENCH_LEDGER did not switch the ledger"
            runs[mode].append(run)
            print(
                f"round {i} ledger {mode:>3}: step {run['step_ms']:.1f} ms, bwd {run['bwd_ms']:.1f} ms, "
                f"profiler cost {run['profiler_cost_us']:.0f} µs / step",
                flush=True,
            )
    ratios = [a["step_ms"] / b["step_ms"] for a, b in zip(runs["on"], runs["off"])]
    deltas = [a["profiler_cost_us"] - b["profiler_cost_us"] for a, b in zip(runs["on"], runs["off"])]
    result = {
        "rounds": args.rounds,
        "steps": args.steps,
        "backend": args.backend,
        "nproc": args.nproc,
        **{
            mode: {k: [r[k] for r in rs] for k in ("step_ms", "bwd_ms", "profiler_cost_us")}
            for mode, rs in runs.items()
        },
        "step_ratio_median": statistics.median(ratios),
        "step_ratio_min": min(ratios),
        "step_ratio_max": max(ratios),
        "cost_delta_us_median": statistics.median(deltas),
        "cost_delta_us_min": min(deltas),
        "cost_delta_us_max": max(deltas),
    }
    print(f"step on / off: median {result['step_ratio_median']:.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")
    print(
        f"profiler cost added by the ledger: median {result['cost_delta_us_median']:.0f} µs / step "
        f"(min {min(deltas):.0f}, max {max(deltas):.0f})"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
