"""The head and tail every command shares (stdlib only: ``scopebench --help`` stays fast).

Head: :func:`refuses` turns a refused input (``ValueError``, ``FileNotFoundError``) into
one line ``scopebench <command>: <reason>`` on stderr and exit status 2, the contract every
command's docstring states ("Exit status: 2 with one line for a refused input"). Tail:
:func:`finish` prints the report and writes ``--json`` atomically (``write_json``), and
:func:`print_json` prints a ``--json`` payload on stdout. One spelling of each, so a
message or a file cannot differ from one command to the next.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["REFUSED", "finish", "print_json", "refuses"]

#: Exit status of a refused input (a bad value, a missing file), before any work.
REFUSED = 2


def refuses(command: str, errors: tuple[type[BaseException], ...] = (ValueError, FileNotFoundError)):
    """Decorate a command's ``run(args)``: ``errors`` become one line on stderr and exit 2.

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
            try:
                return run(args)
            except errors as err:
                print(f"scopebench {command}: {err}", file=sys.stderr)
                return REFUSED

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
