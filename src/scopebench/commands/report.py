"""Write a report of benchopt results: phase tables, diagnosis, PNG plots and one offline HTML file.

For every benchmark and solver configuration in the given parquet files (or folders of
them): the phase tables and diagnosis lines of ``scopebench summary`` (same code), PNG
plots (stacked regions per configuration, step time and quality per iteration, and where
the results hold them: scaling against processes with the ideal line, latency histogram
and CDF, the ``L(N) = F + N·s`` fit over ``num_steps``, peak memory against batch or image
size; with ``profiler_memory`` columns: the step's peak by category stacked per configuration
and rank, and the step peak against batch size with its line, the ``--memory-gb`` limit and
the largest batch read off it; with the ledger's ``ledger_timeline``: each rank's regions,
blocked intervals and collectives over the first recorded iterations, one lane per rank, one
``<benchmark>_timeline_<configuration>.png`` per configuration), and ``report.html``: plotly figures with plotly.js inlined once, tables and
diagnosis, no CDN and no network access, so it opens on an air-gapped login node.

Run: ``scopebench report outputs/ [benchmark_inference/outputs/x.parquet ...] [-o DIR] [--memory-gb 80]``.

Output folder (default ``report/`` beside the first results file): ``report.html``,
``report.txt`` (the printed text), ``<benchmark>_<picture>.png`` and ``report.json``
(``sources, html, pngs, warnings, findings, phase_rows`` as in ``summary --json``, and
``memory_batch_fits``: per batch sweep the line, R² and the largest batch). The
command prints the text, then the paths of the HTML file and of each PNG. Exit status 2
with one line naming the file when a file is missing, unreadable, empty or not a
benchopt result, or a folder holds none, naming ``--memory-gb`` when it is not positive,
and naming ``-o/--output`` when that folder cannot be written (checked before anything is read). NaN and inf time values are left
out of the statistics with one warning line per column on stderr.
"""

from __future__ import annotations

import argparse

from scopebench.commands._common import add_memory_gb, memory_gb, refuses

HELP = "PNG plots, diagnosis and a self-contained HTML report of benchopt results"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="benchopt .parquet files or folders holding them")
    parser.add_argument("-o", "--output", default=None, help="output folder (default: report/ beside the first file)")
    add_memory_gb(
        parser,
        "one rank's device memory (GB): the limit line on memory against batch size, and the largest batch read off",
    )


@refuses("report")
def run(args: argparse.Namespace) -> int:
    from scopebench.profiler.config import check_writable_dir
    from scopebench.report.build import build_report

    limit_gb = memory_gb(args)
    if args.output is not None:  # before the results are read and the plots drawn
        check_writable_dir("-o/--output", args.output)
    report = build_report(args.results, args.output, limit_gb)
    print(report.text)
    print(f"\nhtml: {report.html}")
    for png in report.pngs:
        print(f"png: {png}")
    return 0
