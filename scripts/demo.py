"""``make demo``: run each benchmark's quickstart config on the CPU and show the results.

What: ``benchopt run <benchmark> --config <benchmark>/configs/quickstart.yml`` for the
policy benchmark (repository root), ``benchmark_inference`` and ``benchmark_training``;
each run is checked for solver errors (``benchopt run`` itself exits 0 on them), then its
phase table is printed with the path of its parquet file.

Run: ``make demo`` (or ``.venv/bin/python scripts/demo.py [benchmark ...]``).
Output: per benchmark, the results path, the wall time and the phase table; exit status 1
if any quickstart failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scopebench.report.summary import format_phase_table, phase_table, read_results
from scopebench.runs import run_benchopt

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = (".", "benchmark_inference", "benchmark_training")


def main(names: list[str]) -> int:
    failed = []
    for name in names or BENCHMARKS:
        bench = (ROOT / name).resolve()
        config = bench / "configs" / "quickstart.yml"
        label = "policy (repository root)" if bench == ROOT else name
        print(
            f"== {label}: benchopt run {bench.relative_to(ROOT) if bench != ROOT else '.'} --config {config.relative_to(ROOT)}",
            flush=True,
        )
        try:
            run = run_benchopt(bench, config)
        except (RuntimeError, ValueError) as err:
            print(f"FAILED: {err}", flush=True)
            failed.append(label)
            continue
        print(format_phase_table(phase_table(read_results(run.parquet))))
        print(f"results: {run.parquet}  ({run.wall_sec:.1f} s)\n", flush=True)
    if failed:
        print(f"quickstart failed for: {', '.join(failed)}")
        return 1
    print("all quickstarts done; per-run results are in each benchmark's outputs/ folder")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
