"""Write docs/validation.md, and its matrix as a PNG and an HTML file, from the validation benchmark's results.

What it does: reads every run of the validation benchmark in the parquet files given (a run of
``configs/full.yml``, and of ``configs/hsdp.yml`` under torchrun), scores them per fault x backend
x profiler mode, and fills ``page_template.md``'s tables (``scopebench.validation.page``).

How to run it (after the full config, on a quiet machine)::

    python benchmark_validation/make_page.py benchmark_validation/outputs/full.parquet \\
        benchmark_validation/outputs/hsdp.parquet --command "<the benchopt command you ran>"

Output: ``docs/validation.md`` (``--page``), ``matrix.png`` and ``matrix.html`` in ``--out``
(default ``benchmark_validation/outputs/report``); their paths as JSON on the last line.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

from scopebench.validation.page import write_page

HERE = Path(__file__).resolve().parent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="parquet files (or folders of them) of the validation benchmark")
    parser.add_argument("--page", default=str(HERE.parent / "docs" / "validation.md"))
    parser.add_argument("--out", default=str(HERE / "outputs" / "report"))
    parser.add_argument("--template", default=str(HERE / "page_template.md"))
    parser.add_argument(
        "--command",
        default="benchopt run benchmark_validation --config benchmark_validation/configs/full.yml --no-cache",
        help="the command that produced the results, quoted on the page",
    )
    parser.add_argument("--note", default="", help="a paragraph after the conditions (a preliminary run...)")
    args = parser.parse_args(argv)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    paths = write_page(
        args.results, args.template, args.page, args.out, command=args.command, date=date, note=args.note
    )
    print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
