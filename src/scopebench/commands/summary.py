"""Print the phase tables of benchopt results, with warnings and diagnosis.

Per benchmark and solver configuration: the recorded window (warm-up, measured iterations,
ranks), then per phase the mean, median and p95 in milliseconds (statistics of
:mod:`scopebench.stats`) and the share of the step, where the step is one iteration
without the benchopt scoring callback (``step_time_sec``: ``total_time_sec -
callback_time_sec``, of the slowest rank); the
callback and ``total_time_sec`` get their own lines, outside the step. Regions come from
the ``objective_<region>_time_sec`` / ``_cpu_sec`` columns, whatever the solver. Below the
table: steps/s and global samples/s for a training step, mean / p50 / p95 / p99 latency
for an inference call, the input ceiling for a dataloader. Then one warning line per
solver that benchopt stopped on its timeout before ``max-runs`` (with its row count;
recorded by ``scopebench.runs.run_benchopt``) and the diagnosis lines
(``docs/diagnosis.md``). ``scopebench report`` prints the same text.

Run: ``scopebench summary benchmark_inference/outputs/<file>.parquet [more files or folders] [--json]``.

``--json`` prints an object: ``rows`` (one per configuration and phase: ``benchmark,
dataset, solver, solver_name, phase, kind, n, mean_ms, median_ms, p95_ms, p99_ms,
share_pct``; ``kind`` is region / composite / untracked / step / callback / total and
``share_pct`` is null outside the step), ``warnings`` (lines) and ``findings`` (``rule,
config, message, advice``). Exit status 2 with one line naming the file when a file is
missing, unreadable, empty or not a benchopt result, or a folder holds none.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import print_json, refuses

HELP = "phase tables, warnings and diagnosis of benchopt results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="benchopt .parquet files or folders holding them")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


@refuses("summary")
def run(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from scopebench.report.build import diagnose_groups, read, summarize_results
    from scopebench.report.tables import phase_rows

    results = read(args.results)
    findings = [f for group in diagnose_groups(results).values() for f in group]
    if args.json:
        payload = {
            "rows": [row for c in results.configs for row in phase_rows(c)],
            "warnings": results.warnings,
            "findings": [asdict(f) for f in findings],
        }
        print_json(payload)
    else:
        print(summarize_results(results, findings))
    return 0
