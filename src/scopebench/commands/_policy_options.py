"""Command-line options shared by the policy tools (light imports only: ``scopebench --help`` stays fast;
the training backends' registry imports no torch)."""

from __future__ import annotations

import argparse
from typing import Any

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


def add_backend_arguments(parser: argparse.ArgumentParser) -> None:
    """``--backend`` and ``--accelerate-config``: the training backend, by name or by the accelerate
    file that selects it (:func:`backend_flags` reads them); both listed from the registry
    (:mod:`scopebench.train.backends`), so a new backend is in every ``--help``."""
    from scopebench.train.backends import all_backends

    backends = all_backends()
    parser.add_argument(
        "--backend", default=None, metavar="NAME",
        help=f"the training backend: {', '.join(b.name for b in backends)} (default: the --accelerate-config "
        "file's, else the config's)",
    )  # fmt: skip
    parser.add_argument(
        "--accelerate-config", "--accelerate_config", dest="accelerate_config", default=None, metavar="FILE",
        help="accelerate config file, which selects the backend (configs/accelerate/: "
        f"{', '.join(b.accelerate_file for b in backends)})",
    )  # fmt: skip


def backend_flags(args: argparse.Namespace) -> tuple[dict[str, Any], Any]:
    """``--backend`` and ``--accelerate-config`` as settings (``backend``, ``accelerate_config``:
    the ``flags`` of :func:`scopebench.policy.tools.load_config`) and the accelerate file read
    (once), or None without ``--accelerate-config``.

    Raises:
        ValueError: an unknown ``--backend``; a ``--backend`` that the ``--accelerate-config``
            file does not select, in one line naming both (the file would otherwise win silently).
    """
    from pathlib import Path

    from scopebench.train.accelerate_file import load_accelerate_file
    from scopebench.train.backends import get_backend

    backend = None if args.backend is None else get_backend(args.backend, "--backend")
    if not args.accelerate_config:
        return {"backend": None if backend is None else backend.name}, None
    file = load_accelerate_file(args.accelerate_config)
    if backend is not None and backend != file.backend:
        raise ValueError(
            f"--backend {backend.name} and --accelerate-config {args.accelerate_config} disagree: the file selects "
            f"backend {file.backend.name}; drop one, or pass {backend.name}'s file "
            f"(configs/accelerate/{backend.accelerate_file})"
        )
    return {"backend": file.backend.name, "accelerate_config": str(Path(file.path).resolve())}, file


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
