"""``make demo``: run each benchmark's quickstart config on the CPU and show the results.

What: ``benchopt run <benchmark> --config <benchmark>/configs/quickstart.yml`` for the
policy benchmark (repository root), ``benchmark_inference``, ``benchmark_training`` and
``benchmark_validation`` (a run without a fault and a late rank, scored: docs/validation.md);
each run is checked for solver errors (``benchopt run`` itself exits 0 on them), then its
phase table is printed with the path of its parquet file. At the end, the report of the
quickstart runs (``scopebench report``: PNG plots, diagnosis and a self-contained HTML
file) is written to ``outputs/demo_report/``.

Run: ``make demo`` (or ``.venv/bin/python scripts/demo.py [benchmark ...]``).
Output: per benchmark, the results path, the wall time and the phase table; then the
paths of the report's HTML file and of one PNG; exit status 1 if any quickstart failed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from scopebench.report.build import build_report, read
from scopebench.report.tables import format_tables
from scopebench.runs import run_benchopt

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = (".", "benchmark_inference", "benchmark_training", "benchmark_validation")
REPORT_DIR = ROOT / "outputs" / "demo_report"


def main(names: list[str]) -> int:
    failed = []
    parquets = []
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
        print(format_tables(read([run.parquet]).configs))
        print(f"results: {run.parquet}  ({run.wall_sec:.1f} s)\n", flush=True)
        parquets.append(run.parquet)
    if parquets:
        report = build_report(parquets, REPORT_DIR)
        print("\n".join(report.warnings + ["diagnosis:"] + [f.text() for f in report.findings]))
        print(f"\nreport (opens offline): {report.html}")
        print(f"one of its {len(report.pngs)} PNG plots: {report.pngs[0]}", flush=True)
    if failed:
        print(f"quickstart failed for: {', '.join(failed)}")
        return 1
    print("all quickstarts done; per-run results are in each benchmark's outputs/ folder")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
