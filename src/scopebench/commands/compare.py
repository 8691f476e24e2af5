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
region, n_a, n_b, median_a_ms, median_b_ms, ratio, ci_low, ci_high, change, contention,
non_finite}], memory: [{benchmark, config, column, max_a_mb, max_b_mb, ratio}], contended:
{config: why}, unmatched_a, unmatched_b, not_compared: [{benchmark, config, what, reason}],
regions, pairs}`` (``ci_high`` null: an interval unbounded for want of iterations), and with
a threshold ``gate: {verdict, exit_status, rows: [{benchmark, config, what, limit, ratio,
ci_low, ci_high, verdict, reason}]}``.

As a CI gate (:func:`scopebench.report.compare.gate`): ``--fail-slower PCT`` gates every
region and the step at ``PCT`` percent, ``--fail-slower REGION=PCT`` (repeatable) one region
at its own threshold, ``--fail-memory PCT`` the peak memory columns. Exit status without a
threshold: 0 when configurations matched (flagged or not); with one: 0 pass, 1 regression,
3 inconclusive (a contended side, an interval straddling the limit or unbounded for want of
iterations, non-finite times left out, or anything the thresholds cover that was not
compared: a configuration on one side only or without a recorded iteration, a region one
side lacks or whose A median is 0); 2 on a refused input (a bad file, threshold or seed, a
region threshold naming a region neither side records, nothing matched) either way.
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
    parser.add_argument(
        "--fail-slower",
        action="append",
        default=[],
        metavar="[REGION=]PCT",
        help="gate: exit 1 when B is slower than A by more than PCT %% (every region and the step, or REGION), "
        "3 when the comparison is inconclusive; repeatable",
    )
    parser.add_argument(
        "--fail-memory",
        type=float,
        default=None,
        metavar="PCT",
        help="gate: exit 1 when a peak memory grew by > PCT %%",
    )


@refuses("compare")
def run(args: argparse.Namespace) -> int:
    from scopebench.report.build import read
    from scopebench.report.compare import compare, format_comparison, format_gate, gate
    from scopebench.validate import integer, number

    level = number("level", args.level, low=0.0, high=1.0, low_open=True, high_open=True)
    seed = integer("--seed", args.seed, low=0)
    slower, regions = _thresholds(args.fail_slower)
    memory = None if args.fail_memory is None else number("--fail-memory", args.fail_memory, low=0.0)
    gated = slower is not None or bool(regions) or memory is not None
    a, b = read([args.a]), read([args.b])
    result = compare(a.configs, b.configs, level=level, seed=seed)
    verdict = gate(result, slower_pct=slower, region_pct=regions, memory_pct=memory) if gated else None
    if args.json:
        print_json({**result.as_dict(), **({"gate": verdict.as_dict()} if verdict else {})})
    else:
        print(format_comparison(result) + (f"\n{format_gate(verdict)}" if verdict else ""))
    if not result.pairs:
        print("scopebench compare: no configuration of A matches one of B", file=sys.stderr)
        return REFUSED
    return verdict.exit_status if verdict else 0


def _thresholds(values: list[str]) -> tuple[float | None, dict[str, float]]:
    """``--fail-slower`` values: ``PCT`` for every row, ``REGION=PCT`` for one (refused in one line).

    :Examples:

    >>> _thresholds(["10", "bwd=5", "step=2.5"])
    (10.0, {'bwd': 5.0, 'step': 2.5})
    >>> _thresholds(["ten"])
    Traceback (most recent call last):
    ValueError: --fail-slower must be PCT or REGION=PCT with PCT a number >= 0, got 'ten'
    """
    every: float | None = None
    regions: dict[str, float] = {}
    for value in values:
        region, _, pct = value.rpartition("=")
        try:
            number = float(pct)
        except ValueError:
            number = float("nan")
        if not (number >= 0 and number != float("inf")) or (value.count("=") and not region):
            raise ValueError(f"--fail-slower must be PCT or REGION=PCT with PCT a number >= 0, got {value!r}")
        if region:
            regions[region] = number
        else:
            every = number
    return every, regions
