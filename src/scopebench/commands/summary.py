"""Print the phase table of a benchopt results parquet.

Per solver run and timed phase (``objective_<region>_time_sec`` from the custom backend,
``objective_<region>_cpu_sec`` from the torch backend, and ``total_time_sec``): the
count, mean, median and p95 in milliseconds (statistics of :mod:`scopebench.stats`) and
the share of the mean total. ``--json`` prints the rows as a JSON list of objects with
keys ``solver, phase, n, mean_ms, median_ms, p95_ms, share_pct``.

Run: ``scopebench summary benchmark_inference/outputs/<file>.parquet [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys

HELP = "phase table of a benchopt results parquet"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", help="path to a benchopt .parquet file")
    parser.add_argument("--json", action="store_true", help="print JSON rows instead of a table")


def run(args: argparse.Namespace) -> int:
    from scopebench.report.summary import format_phase_table, phase_table, read_results

    try:
        rows = phase_table(read_results(args.results))
    except ValueError as err:
        print(f"scopebench summary: {err}", file=sys.stderr)
        return 2
    print(json.dumps(rows, indent=2) if args.json else format_phase_table(rows))
    return 0
