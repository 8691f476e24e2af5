"""Command-line options shared by the policy tools (stdlib only: ``scopebench --help`` stays fast)."""

from __future__ import annotations

import argparse

OVERRIDES_HELP = (
    "Any setting of the config can be overridden: --batch_size=12, --policy.num_steps=5, "
    "--dataset.image_size=64 (values are YAML scalars; unknown keys are refused). "
    # scopebench.policy.tools.PRECEDENCE, spelled out here so that --help imports nothing
    "Precedence: command-line flag or --key=value > environment variable > YAML file > default."
)


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config`` and free-form ``--key=value`` overrides (collected by ``scopebench.cli``)."""
    parser.add_argument("--config", required=True, help="policy run config (YAML), e.g. configs/policy/tiny.yml")
    parser.add_argument("--json", default=None, help="also write the JSON summary to this path")
    parser.add_argument(
        "--policy", default=None,
        help="the policy: pi05 (default) or a factory module:function (or path/to/file.py:function) "
        "returning a scopebench.policy.UserPolicy (docs/policies.md)",
    )  # fmt: skip
    parser.add_argument(
        "--policy-arg", "--policy_arg", dest="policy_arg", action="append", default=[], metavar="KEY=VALUE",
        help="a keyword argument of the policy factory (repeatable; values are YAML scalars)",
    )  # fmt: skip
    parser.set_defaults(overrides=[])
    parser.epilog = OVERRIDES_HELP


def add_control_arguments(parser: argparse.ArgumentParser) -> None:
    """``--control-hz`` and ``--n-action-steps``: the control-rate figures (``scopebench.policy.control.figures``)."""
    parser.add_argument(
        "--control-hz", type=float, default=None, metavar="HZ",
        help="the robot's control rate, for the control-rate figures (default: policy.control_hz; none: no figures)",
    )  # fmt: skip
    parser.add_argument(
        "--n-action-steps", type=int, default=None, metavar="N",
        help="actions executed per chunk, at most the chunk size (default: policy.n_action_steps, else the chunk)",
    )  # fmt: skip


def positive_ints(least: int, example: str):
    """An argparse type: comma-separated positive integers, sorted and without repeats, at least
    ``least`` of them (``example`` is shown in the error)."""

    def parse(text: str) -> list[int]:
        try:
            values = sorted({int(v) for v in text.split(",") if v.strip()})
        except ValueError:
            values = []
        if len(values) < least or values[0] < 1:
            many = {1: "one", 2: "two"}.get(least, str(least))
            raise argparse.ArgumentTypeError(f"expected {many} or more positive integers like {example}, got {text!r}")
        return values

    return parse
