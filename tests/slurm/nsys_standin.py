"""A stand-in ``nsys`` for machines without Nsight Systems (no CUDA here).

``nsys profile [options] <program> [arguments]``: records how it was called — its
arguments, the report name with ``%q{VAR}`` expanded from this process's environment as
nsys does, the SLURM rank variables and the injection variables an outer nsys would
leave behind — as one JSON file in ``$NSYS_STANDIN_RECORD``, then replaces itself with
``<program> [arguments]``. Options are ``--name=value`` or ``-x value`` (the forms
``configs/parallel/slurm_nsys.yml`` uses).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

_RANK_VARS = (
    "SLURM_JOB_ID",
    "SLURMD_NODENAME",
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NTASKS",
    "CUDA_VISIBLE_DEVICES",
)
_INJECTION_VARS = ("CUDA_INJECTION64_PATH", "NVTX_INJECTION64_PATH", "LD_PRELOAD")


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(nsys options, program and its arguments)`` of ``profile <options> <program> ...``.

    :Examples:
        >>> split_command(["profile", "-o", "r", "--trace=cuda", "python", "-u", "x.py"])
        (['-o', 'r', '--trace=cuda'], ['python', '-u', 'x.py'])
    """
    if not argv or argv[0] != "profile":
        raise SystemExit(f"nsys stand-in: only `nsys profile ...` is understood, got {argv!r}")
    i = 1
    while i < len(argv) and argv[i].startswith("-"):
        i += 1 if ("=" in argv[i] or argv[i].startswith("--")) else 2
    return argv[1:i], argv[i:]


def report_name(options: list[str], env: dict[str, str]) -> str | None:
    """The ``-o``/``--output`` value with ``%q{VAR}`` replaced from ``env``."""
    name = None
    for k, option in enumerate(options):
        if option in ("-o", "--output") and k + 1 < len(options):
            name = options[k + 1]
        elif option.startswith("--output="):
            name = option.split("=", 1)[1]
    if name is None:
        return None
    return re.sub(r"%q\{(\w+)\}", lambda m: env.get(m.group(1), ""), name)


def main() -> None:
    options, command = split_command(sys.argv[1:])
    if not command:
        raise SystemExit("nsys stand-in: no program to profile")
    env = dict(os.environ)
    record = {
        "argv": sys.argv[1:],
        "options": options,
        "command": command,
        "report": report_name(options, env),
        "env": {key: env.get(key) for key in _RANK_VARS + _INJECTION_VARS},
    }
    folder = Path(env["NSYS_STANDIN_RECORD"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"call_{os.getpid()}.json").write_text(json.dumps(record))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
