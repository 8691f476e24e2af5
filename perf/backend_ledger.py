"""Where ZeRO-2's extra backward time goes against DDP's: the reference's case, measured by the ledger.

The reference found a ZeRO-2 backward of 3442 ms against 705 ms on one GPU and wrote that the
difference was host-side work (DeepSpeed's per-parameter hooks), found by hand. This script
measures the same split on this machine: ``scopebench profile-step`` of the policy on two
local gloo ranks (``--preset``, default ``small``), DDP and ZeRO-2, each under the ``custom``
profiler (the phase times without instrumentation) and the ``torch`` profiler (which also splits
work into operators and host overhead, at the price of its per-operator recording), rounds
alternating the order. Per run and phase: each rank's mean of the ledger's columns (work,
waiting for peers, transfer, hidden; compute, host overhead and the part of it the framework's
marked hooks took under torch, and the operators inside those hooks), averaged over the
two ranks; per backend and mode the median over rounds; then for each phase the ZeRO-2 minus
DDP difference of the phase time and of each column, so that ``d(time) = d(work) + d(waiting) +
d(transfer)`` and, under torch, ``d(work) = d(compute) + d(host overhead)``.

Run: ``.venv/bin/python perf/backend_ledger.py [--preset small --rounds 2 --steps 5 --modes custom,torch]``.
Output: readable lines, then one JSON object on the last line::

    {"preset", "modes", "rounds", "steps", "load_average_start", "load_average_end",
     "runs": {"<backend>/<mode>": {phase: {column: [per-round seconds]}}},
     "medians": {"<backend>/<mode>": {phase: {column: s}}},
     "deltas": {"<mode>": {phase: {column: s}}}}   # zero2 - ddp
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
PHASES = ("forward", "bwd", "optim_step")
COLUMNS = (
    "time_sec",
    "work_sec",
    "wait_peer_sec",
    "transfer_sec",
    "hidden_sec",
    "compute_sec",
    "hooks_compute_sec",
    "host_overhead_sec",
    "host_hooks_sec",
)
MODES = ("custom", "torch")


def one_run(preset: str, backend: str, mode: str, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "step.json"
        cmd = [
            sys.executable,
            "-m",
            "scopebench.cli",
            "profile-step",
            "--config",
            str(REPO / f"configs/policy/{preset}.yml"),
        ]
        cmd += ["--nproc-per-node", "2", "--steps", str(steps), "--warmup", "2", f"--backend={backend}"]
        cmd += ["--profiler-mode", mode, "--json", str(out)]
        subprocess.run(cmd, check=True, capture_output=True, stdin=subprocess.DEVNULL)
        report = json.loads(out.read_text())
    per_rank = [rank["phases"] for rank in report["ledger"]["per_rank"]]
    return {
        phase: {
            col: statistics.mean(ranks[phase][col] for ranks in per_rank)
            for col in COLUMNS
            if all(phase in ranks and ranks[phase].get(col) is not None for ranks in per_rank)
        }
        for phase in PHASES
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES), help="profiler modes, comma-separated")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes: expected a comma-separated subset of {', '.join(MODES)}, got {args.modes!r}")
    load_start = os.getloadavg()[0]
    cells = [(b, m) for m in modes for b in ("ddp", "zero2")]
    runs: dict[str, dict] = {f"{b}/{m}": {} for b, m in cells}
    for i in range(args.rounds):
        for backend, mode in cells if i % 2 == 0 else cells[::-1]:
            result = one_run(args.preset, backend, mode, args.steps)
            for phase, cols in result.items():
                for col, value in cols.items():
                    runs[f"{backend}/{mode}"].setdefault(phase, {}).setdefault(col, []).append(value)
            bwd = result["bwd"]
            print(
                f"round {i} {backend:>5} {mode:>6}: bwd "
                + ", ".join(f"{k[:-4]} {v * 1e3:.0f} ms" for k, v in bwd.items()),
                flush=True,
            )
    medians = {
        cell: {p: {c: statistics.median(v) for c, v in cols.items()} for p, cols in phases.items()}
        for cell, phases in runs.items()
    }
    deltas = {
        mode: {
            phase: {
                col: medians[f"zero2/{mode}"][phase][col] - medians[f"ddp/{mode}"][phase][col]
                for col in medians[f"zero2/{mode}"][phase]
                if col in medians[f"ddp/{mode}"][phase]
            }
            for phase in PHASES
        }
        for mode in modes
    }
    for mode, phases in deltas.items():
        for phase, cols in phases.items():
            print(
                f"zero2 - ddp, {mode:>6}, {phase:<10}: "
                + ", ".join(f"{k[:-4]} {v * 1e3:+.0f} ms" for k, v in cols.items())
            )
    for cell, phases in medians.items():  # the marked hooks themselves, not only their difference
        hooks = {p: cols for p, cols in phases.items() if "host_hooks_sec" in cols}
        if hooks:
            print(
                f"{cell} marked hooks, host / operators: "
                + ", ".join(
                    f"{p} {c['host_hooks_sec'] * 1e3:.0f} / {c.get('hooks_compute_sec', 0.0) * 1e3:.0f} ms"
                    for p, c in hooks.items()
                )
            )
    print(json.dumps({
        "preset": args.preset, "modes": modes, "rounds": args.rounds, "steps": args.steps,
        "load_average_start": load_start, "load_average_end": os.getloadavg()[0],
        "runs": runs, "medians": medians, "deltas": deltas,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
