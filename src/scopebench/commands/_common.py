"""The head and tail every command shares (stdlib only: ``scopebench --help`` stays fast).

Options: one spelling per quantity across the commands, ``--memory-gb`` (one device's
memory) and ``--nproc-per-node`` (ranks per node, the config key ``nproc_per_node``), added
by :func:`add_memory_gb` / :func:`add_nproc_per_node` and validated by :func:`memory_gb` /
:func:`nproc_per_node` through :mod:`scopebench.validate`; an older spelling still works
and prints one line on stderr saying it is deprecated (:class:`DeprecatedAlias`).

Head: :func:`refuses` turns a refused input (``ValueError``, ``FileNotFoundError``) into
one line ``scopebench <command>: <reason>`` on stderr and exit status 2, the contract every
command's docstring states ("Exit status: 2 with one line for a refused input"), and
releases the output files the command claimed when it validated them
(:func:`scopebench.atomic.claim_output`, through ``check_json_path``) once it has ended. Tail:
:func:`finish` prints the report and writes ``--json`` atomically (``write_json``), and
:func:`print_json` prints a ``--json`` payload on stdout. One spelling of each, so a
message or a file cannot differ from one command to the next.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

__all__ = [
    "REFUSED",
    "DeprecatedAlias",
    "add_memory_gb",
    "add_nproc_per_node",
    "finish",
    "memory_gb",
    "nproc_per_node",
    "print_json",
    "refuses",
]

#: Exit status of a refused input (a bad value, a missing file), before any work.
REFUSED = 2


def refuses(command: str, errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)):
    """Decorate a command's ``run(args)``: ``errors`` become one line on stderr and exit 2;
    the output files it claimed are released when it ends (:func:`scopebench.atomic.release_outputs`).

    Args:
        command: The command's name as typed (``estimate-memory``), the line's prefix.
        errors: What counts as a refused input (``check-config`` adds ``OSError``: an
            unreadable config or folder).

    :Examples:

    >>> @refuses("demo")
    ... def run(args):
    ...     raise ValueError("--steps must be >= 1, got 0")
    >>> import contextlib, io
    >>> with contextlib.redirect_stderr(io.StringIO()) as err:
    ...     status = run(None)
    >>> status, err.getvalue()
    (2, 'scopebench demo: --steps must be >= 1, got 0\\n')
    """

    def wrap(run: Callable[[Any], int]) -> Callable[[Any], int]:
        @functools.wraps(run)
        def guarded(args: Any) -> int:
            from scopebench.atomic import release_outputs

            try:
                return run(args)
            except errors as err:
                print(f"scopebench {command}: {err}", file=sys.stderr)
                return REFUSED
            finally:
                release_outputs()

        return guarded

    return wrap


def finish(text: str | None, payload: dict[str, Any], json_path: str | None) -> int:
    """Print ``text`` (unless ``None``: already printed line by line), write ``payload`` to
    ``json_path`` atomically when given and say so (``wrote <path>``); the exit status 0."""
    if text is not None:
        print(text)
    if json_path:
        from scopebench.policy.tools import write_json

        write_json(json_path, payload)
        print(f"wrote {json_path}")
    return 0


def print_json(payload: Any) -> None:
    """A ``--json`` payload on stdout, as :func:`~scopebench.policy.tools.write_json` writes
    it to a file (indent 2; a value JSON has no type for, a path, as its string)."""
    print(json.dumps(payload, indent=2, default=str))


class DeprecatedAlias(argparse.Action):
    """An old spelling of an option: stores like the new one and says so on stderr.

    The line reads ``scopebench <command>: --old is deprecated, use --new``; the value goes
    to the new option's ``dest``, so the command never sees which spelling was used.
    """

    def __init__(self, option_strings: Sequence[str], dest: str, *, use: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.use = use

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option=None):
        print(f"{parser.prog}: {option} is deprecated, use {self.use}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def _add(parser: argparse.ArgumentParser, names: tuple[str, ...], old: tuple[str, ...], **kwargs: Any) -> None:
    parser.add_argument(*names, default=None, **kwargs)
    for spelling in old:
        parser.add_argument(
            spelling, dest=kwargs["dest"], type=kwargs["type"], default=None,
            action=DeprecatedAlias, use=names[0], help=argparse.SUPPRESS,
        )  # fmt: skip


def add_memory_gb(parser: argparse.ArgumentParser, help: str, deprecated: tuple[str, ...] = ()) -> None:
    """``--memory-gb``: the memory of one device (rank), in GB of 1e9 bytes (None: not given)."""
    _add(parser, ("--memory-gb",), deprecated, dest="memory_gb", type=float, metavar="GB", help=help)


def add_nproc_per_node(parser: argparse.ArgumentParser, help: str, deprecated: tuple[str, ...] = ()) -> None:
    """``--nproc-per-node`` (also ``--nproc_per_node``, as the config key): ranks per node."""
    names = ("--nproc-per-node", "--nproc_per_node")
    _add(parser, names, deprecated, dest="nproc_per_node", type=int, metavar="N", help=help)


def memory_gb(args: argparse.Namespace) -> float | None:
    """``--memory-gb`` validated (a finite number > 0), or None when not given."""
    from scopebench.validate import number, optional

    return optional(number, "--memory-gb", args.memory_gb, low=0, low_open=True)


def nproc_per_node(args: argparse.Namespace) -> int | None:
    """``--nproc-per-node`` validated (an integer >= 1), or None when not given."""
    from scopebench.validate import integer, optional

    return optional(integer, "--nproc-per-node", args.nproc_per_node, low=1)
