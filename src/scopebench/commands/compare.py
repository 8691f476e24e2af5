"""Compare two result sets (A/B): per matched configuration and region, the ratio B/A of medians.

For A/B runs such as fused vs unfused AdamW or ddp vs zero2: configurations of A and B are
matched on benchmark, dataset, solver and parameters, leaving out the parameters whose
values differ between the two sets (the change under test, printed as the A/B
difference). For each shared region and the step (``total - callback``), the ratio
``median(B) / median(A)`` with a bootstrap confidence interval (iterations resampled,
seeded: the same files give the same interval); rows whose interval excludes 1 are
flagged ``slower`` or ``faster``.

Run: ``scopebench compare outputs/a.parquet outputs/b.parquet [--level 0.95] [--seed 0] [--json]``
(each side a file or a folder of parquet files).

``--json`` prints ``{level, differences: {param: {a, b}}, rows: [{benchmark, config,
region, n_a, n_b, median_a_ms, median_b_ms, ratio, ci_low, ci_high, change}],
unmatched_a, unmatched_b}``. Exit status 0 when configurations matched (flagged or not),
2 on a bad file or when nothing matched.
"""

from __future__ import annotations

import argparse
import sys

from scopebench.commands._common import REFUSED, print_json, refuses

HELP = "A/B comparison of two result sets: B/A ratio of median region times with a bootstrap CI"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("a", help="baseline: a .parquet file or a folder of them")
    parser.add_argument("b", help="candidate: a .parquet file or a folder of them")
    parser.add_argument("--level", type=float, default=0.95, help="confidence level of the interval (default 0.95)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


@refuses("compare")
def run(args: argparse.Namespace) -> int:
    from scopebench.report.build import read
    from scopebench.report.compare import compare, format_comparison
    from scopebench.validate import number

    level = number("level", args.level, low=0.0, high=1.0, low_open=True, high_open=True)
    a, b = read([args.a]), read([args.b])
    result = compare(a.configs, b.configs, level=level, seed=args.seed)
    if args.json:
        print_json(result.as_dict())
    else:
        print(format_comparison(result))
    if not result.rows:
        print("scopebench compare: no configuration of A matches one of B", file=sys.stderr)
        return REFUSED
    return 0
