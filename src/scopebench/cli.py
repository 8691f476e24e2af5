"""``scopebench``: the command-line entry point; one subcommand per module of :mod:`scopebench.commands`.

Each command module opens with a docstring (what it measures, how to run it, its output
schema) and defines ``HELP`` (one line), ``add_arguments(parser)`` and ``run(args) -> int``.
Modules import heavy packages inside ``run``, so ``scopebench --help`` stays fast.

Run ``scopebench <command> --help`` for a command's options; ``scopebench --help`` lists them.
"""

from __future__ import annotations

import argparse
import importlib
import sys

#: Subcommand name -> module under :mod:`scopebench.commands` (``-`` becomes ``_``).
COMMANDS = (
    "check-config",
    "info",
    "summary",
    "report",
    "compare",
    "profile-step",
    "trace-ledger",
    "profile-dataloader",
    "find-unused-params",
    "bench-inference",
    "decompose-latency",
    "train",
    "convert-checkpoint",
    "estimate-memory",
    "find-max-batch",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scopebench", description="scopebench: profile deep-learning solvers")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"scopebench.commands.{name.replace('-', '_')}")
        command = sub.add_parser(
            name,
            help=module.HELP,
            description=module.__doc__,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from scopebench.allocator import keep_freed_memory
    from scopebench.environment import check_environment

    try:  # every SCOPEBENCH_* setting, before any work (the allocator's is read next)
        check_environment()
    except ValueError as err:
        print(f"scopebench: {err}", file=sys.stderr)
        return 2
    keep_freed_memory()  # the tools run the same large convolutions and matmuls as the solvers
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    # A command that takes free-form ``--key=value`` overrides sets ``overrides=[]`` as a
    # default; every other command refuses unknown arguments as ``parse_args`` would.
    if extra and getattr(args, "overrides", None) is None:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.overrides = extra
    if args.command == "train":
        # a rank of a multi-rank train, started before its heavy imports: it must not
        # outlive its launcher (scopebench.distributed.orphans); a no-op in any other process
        from scopebench.distributed.orphans import watch_launcher

        watch_launcher()
    status = args._run(args)
    _leave_if_launched(status)
    return status


def _leave_if_launched(status: int) -> None:
    """A rank that torchrun, ``accelerate launch`` or a multi-rank ``scopebench train`` started
    (a spawned rank) leaves through ``os._exit`` once
    its command has returned (everything written, its group destroyed): about one such rank
    in fifteen aborted in a native destructor at interpreter exit after a successful run
    ("terminate called without an active exception"), which the launcher reports as a
    failed run. Callers in a plain process (tests, scripts) get ``status`` back as usual."""
    from scopebench.distributed import get_dist_info

    if get_dist_info().source in ("torchrun", "spawn"):
        from scopebench.distributed.worker import exit_without_teardown

        exit_without_teardown(status)


if __name__ == "__main__":
    sys.exit(main())
