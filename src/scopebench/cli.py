"""``scopebench``: command-line entry points.

What: small tools around the benchmarks' results.

* ``scopebench summary <results.parquet> [--json]`` prints the phase table of a benchopt
  result file: per solver run and timed phase (``objective_<region>_time_sec`` from the
  custom backend, ``objective_<region>_cpu_sec`` from the torch backend, and
  ``total_time_sec``), the count, mean, median and p95 in milliseconds (statistics of
  :mod:`scopebench.stats`) and the share of the mean total. ``--json`` prints the rows as
  a JSON list of objects with keys ``solver, phase, n, mean_ms, median_ms, p95_ms,
  share_pct``.
* ``scopebench info`` prints the versions and the device as JSON.

Run: ``.venv/bin/scopebench summary benchmark_inference/outputs/<file>.parquet``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys


def _info() -> dict:
    import torch

    from scopebench.environment import device_name, package_version

    versions = {name: package_version(name) for name in ("scopebench", "deepinv", "benchopt")}
    versions.update(torch=torch.__version__, python=platform.python_version())
    device = device_name("cuda" if torch.cuda.is_available() else "cpu")
    return {"versions": versions, "device": device, "cpu_count": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scopebench", description="scopebench result tools")
    sub = parser.add_subparsers(dest="command", required=True)
    summary = sub.add_parser("summary", help="phase table of a benchopt results parquet")
    summary.add_argument("results", help="path to a benchopt .parquet file")
    summary.add_argument("--json", action="store_true", help="print JSON rows instead of a table")
    sub.add_parser("info", help="versions and device, as JSON")
    args = parser.parse_args(argv)
    if args.command == "info":
        print(json.dumps(_info(), indent=2))
        return 0
    from scopebench.report.summary import format_phase_table, phase_table, read_results

    try:
        rows = phase_table(read_results(args.results))
    except ValueError as err:
        print(f"scopebench summary: {err}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else format_phase_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
