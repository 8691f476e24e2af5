"""Run a benchmark with ``benchopt run`` and fail loudly when any solver failed.

``benchopt run`` exits 0 even when a solver raised: the failure only shows as an
``error`` status line in its output and as missing rows in the parquet. Tests, the demo
and CI go through :func:`run_benchopt`, which checks both. With a submitit
``--parallel-config`` a solver's traceback is written to its job's log, not to benchopt's
output; a failed run's message then quotes the job logs written while it ran.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["BenchoptRun", "benchopt_run", "run_benchopt", "FAILED_STATUSES"]

FAILED_STATUSES = ("error", "diverged", "not installed", "interrupted")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class BenchoptRun:
    """One finished ``benchopt run``."""

    parquet: Path
    """The results file."""
    log: str
    """Everything benchopt printed (colours removed)."""
    wall_sec: float
    """Wall-clock time of the whole command, imports included."""


def _failed_lines(log: str) -> list[str]:
    bad = []
    for line in log.splitlines():
        stripped = line.strip()
        if "Traceback (most recent call last)" in stripped:
            bad.append(stripped)
        elif any(stripped.endswith(f": {status}") for status in FAILED_STATUSES):
            bad.append(stripped)
    return bad


def _job_errors(benchmark: Path, since: float, limit: int = 3, chars: int = 2000) -> list[str]:
    """Ends of the Submitit job error logs (``<benchmark>/benchopt_run/*_log.err``) written since ``since``.

    Logs holding a traceback come first; at most ``limit`` of them, ``chars`` characters each.
    """
    folder = benchmark / "benchopt_run"  # benchopt's Submitit folder (benchopt.benchmark.SLURM_JOB_NAME)
    if not folder.is_dir():
        return []
    texts = []
    for log in sorted(folder.glob("*_log.err")):
        if log.stat().st_mtime >= since and (text := log.read_text(errors="replace").strip()):
            texts.append((("Traceback" not in text), f"--- {log}\n{text[-chars:]}"))
    return [text for _, text in sorted(texts, key=lambda t: t[0])[:limit]]


def benchopt_run(
    benchmark: str | Path,
    config: str | Path | None = None,
    *,
    output: str | Path | None = None,
    extra_args: list[str] | None = None,
    timeout_sec: float = 900.0,
    env: dict[str, str] | None = None,
) -> tuple[int, BenchoptRun]:
    """``benchopt run <benchmark> --config <config> --no-cache --no-plot``, unchecked.

    For callers that expect failures (tests of error messages); everyone else wants
    :func:`run_benchopt`. Arguments as there.

    Returns:
        benchopt's exit code and the run (``parquet`` may not exist).
    """
    benchmark = Path(benchmark)
    if not (benchmark / "objective.py").is_file():
        raise ValueError(f"{benchmark} is not a benchmark folder (no objective.py)")
    if output is None:
        output = benchmark / "outputs" / f"scopebench_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.parquet"
    output = Path(output).resolve()
    cmd = [sys.executable, "-m", "benchopt", "run", str(benchmark), "--no-cache", "--no-plot", "--no-display"]
    if config is not None:
        cmd += ["--config", str(config)]
    cmd += ["--output", str(output), *(extra_args or [])]
    start = time.perf_counter()
    proc = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_sec,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
    )
    wall = time.perf_counter() - start
    # Progress lines end in carriage returns; make each its own line.
    log = _ANSI.sub("", proc.stdout + proc.stderr).replace("\r", "\n")
    return proc.returncode, BenchoptRun(parquet=output, log=log, wall_sec=wall)


def run_benchopt(
    benchmark: str | Path,
    config: str | Path | None = None,
    *,
    output: str | Path | None = None,
    extra_args: list[str] | None = None,
    timeout_sec: float = 900.0,
    env: dict[str, str] | None = None,
) -> BenchoptRun:
    """``benchopt run <benchmark> --config <config> --no-cache --no-plot``, checked.

    Args:
        benchmark: Benchmark folder.
        config: YAML run config (``configs/...``).
        output: Parquet path; default ``<benchmark>/outputs/scopebench_<time>.parquet``.
        extra_args: More ``benchopt run`` arguments.
        timeout_sec: Bound on the whole command.
        env: Extra environment variables.

    Raises:
        RuntimeError: benchopt failed, a solver errored, or no parquet was written; the
            message carries the end of benchopt's output and of the Submitit job error logs
            written during the run.
    """
    since = time.time()
    code, run = benchopt_run(benchmark, config, output=output, extra_args=extra_args, timeout_sec=timeout_sec, env=env)
    problems = _failed_lines(run.log)
    if code != 0 or problems or not run.parquet.is_file():
        reason = (
            f"exit code {code}"
            if code != 0
            else f"{len(problems)} failure line(s): {problems[:3]}" if problems else f"no results file at {run.parquet}"
        )
        jobs = "\n".join(_job_errors(Path(benchmark), since))
        raise RuntimeError(
            f"benchopt run of {benchmark} failed ({reason}):\n{run.log[-4000:]}"
            + (f"\nSubmitit job logs:\n{jobs}" if jobs else "")
        )
    return run
