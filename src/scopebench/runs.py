"""Run a benchmark with ``benchopt run`` and fail loudly when any solver failed.

``benchopt run`` exits 0 even when a solver raised: the failure only shows as an
``error`` status line in its output and as missing rows in the parquet. Tests, the demo
and CI go through :func:`run_benchopt`, which checks both. With a submitit
``--parallel-config`` a solver's traceback is written to its job's log, not to benchopt's
output; a failed run's message then quotes the job logs written while it ran.

It also exits 0 when a solver stopped on benchopt's ``--timeout`` before ``max-runs``
(status ``done (timeout)``; the clock starts before ``pre_run_hook``, so worker start-up
and compilation count). :func:`run_benchopt` then warns (:class:`TruncatedRunWarning`,
naming the solver and its row count) and records the fact in the parquet's metadata
(:func:`read_run_metadata`), where ``scopebench summary`` and ``scopebench report`` find it.

With a submitit ``--parallel-config`` each run gets its own Submitit folder,
``<benchmark>/benchopt_run/<run id>/`` (:func:`job_folder`; benchopt's own is the fixed
``<benchmark>/benchopt_run/``). Submitit names result files by SLURM job id and takes a
result file it finds as its job's: when job ids start again (a cluster whose state was
reset, two clusters sharing a home) a run sharing the fixed folder reads an **older run's**
result. In a folder of its own a result can only come from a job this run submitted. The
suite's three benchmarks install the folder themselves (:func:`own_job_folder`, called by
their ``objective.py``), so a plain ``benchopt run`` gets one too and says where on stderr;
through :func:`run_benchopt` the run id is also in the parquet's metadata (``run_id``,
``job_folder``), next to the run's logs.
Jobs SLURM still holds when benchopt is done are cancelled; a failed run's error quotes
``scontrol show job`` of each, and its parquet (if any) is marked ``partial``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import subprocess
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from scopebench import cluster

__all__ = [
    "BenchoptRun",
    "FAILED_STATUSES",
    "METADATA_KEY",
    "REFUSED_SKIP",
    "StoppedOnTimeout",
    "TruncatedRunWarning",
    "job_folder",
    "new_run_id",
    "own_job_folder",
    "read_run_metadata",
    "run_benchopt",
    "timeout_messages",
]

FAILED_STATUSES = ("error", "diverged", "not installed", "interrupted")
#: How a skip reason starts when the cell refused a value (the solver's ``skip``,
#: :class:`scopebench.harness.solver.ProfiledSolverMixin`): benchopt prints it as a skip,
#: ``Reason: refused: ...``; a checked run counts it as a failure.
REFUSED_SKIP = "refused: "
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Key of scopebench's entry in the parquet's benchopt metadata (``_meta_json``).
METADATA_KEY = "scopebench_run"
_BENCHOPT_DEFAULT_MAX_RUNS = 100
_SOLVER_TIMEOUT = re.compile(r"^    \|--(?P<solver>.+): done \(timeout\)\s*$")
_OBJECTIVE_LINE = re.compile(r"^  \|--(?P<objective>.+?)\s*$")


class TruncatedRunWarning(UserWarning):
    """A solver stopped on benchopt's timeout before ``max-runs``: its later iterations are missing."""


@dataclass(frozen=True)
class StoppedOnTimeout:
    """One solver configuration that benchopt stopped on its timeout before ``max-runs``."""

    dataset: str
    objective: str
    solver: str
    rows: int
    """Rows it left in the parquet (``max-runs + 1`` when a run is complete)."""
    max_runs: int | None = None

    def message(self) -> str:
        limit = f"max-runs {self.max_runs}" if self.max_runs is not None else "max-runs"
        return (
            f"{self.solver} stopped on benchopt's timeout after {self.rows} rows, before {limit}: "
            "its later iterations are missing (raise `timeout` in the run config or pass --timeout)"
        )


@dataclass(frozen=True)
class BenchoptRun:
    """One finished ``benchopt run``."""

    parquet: Path
    """The results file."""
    log: str
    """Everything benchopt printed (colours removed)."""
    wall_sec: float
    """Wall-clock time of the whole command, imports included."""
    stopped_on_timeout: tuple[StoppedOnTimeout, ...] = ()
    """Solvers that benchopt stopped on its timeout before ``max-runs`` (checked runs only)."""
    returncode: int = 0
    """benchopt's exit code (0 even when a solver errored: a checked run reads the log too)."""
    run_id: str = ""
    """This run's id: its Submitit files are in :func:`job_folder` ``(benchmark, run_id)``."""
    job_folder: Path | None = None
    """This run's Submitit folder (sbatch scripts, pickles, job logs, results)."""


def _failed_lines(log: str) -> list[str]:
    bad = []
    for line in log.splitlines():
        stripped = line.strip()
        if "Traceback (most recent call last)" in stripped:
            bad.append(stripped)
        elif any(stripped.endswith(f": {status}") for status in FAILED_STATUSES):
            bad.append(stripped)
        elif stripped.startswith(f"Reason: {REFUSED_SKIP}"):  # a cell that refused a value: skipped, not run
            bad.append(stripped)
    return bad


def new_run_id() -> str:
    """A run id unique on this machine and across machines sharing a home: time, process, random.

    :Examples:
        >>> len(new_run_id().split("-"))
        4
    """
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}"


def job_folder(benchmark: str | Path, run_id: str) -> Path:
    """The Submitit folder of one run: ``<benchmark>/benchopt_run/<run id>``."""
    return Path(benchmark).resolve() / cluster.JOB_FOLDER / run_id


def own_job_folder(benchmark_class: Any, folder: str | Path | None = None) -> None:
    """Give this ``benchopt run`` process a Submitit folder of its own, under the benchmark's
    ``benchopt_run/``: ``folder``, else :func:`job_folder` of a new run id, chosen when
    benchopt first asks for it (``Benchmark.get_slurm_folder``, once per executor; the same
    folder for every executor of the run) and named on stderr.

    The suite's ``objective.py`` files call it when benchopt imports them, before any job is
    submitted, so a plain ``benchopt run`` never takes another run's result file for its
    job's (the module docstring); :func:`run_benchopt`'s program calls it first with its
    folder, and the objective's call then keeps that one. Harmless where no job is
    submitted (a local run, a job importing the objective).

    Args:
        benchmark_class: benchopt's ``benchopt.benchmark.Benchmark``, handed in by the caller
            (the library itself never imports benchopt).
        folder: This run's folder, else a new one under the benchmark's ``benchopt_run/``.
    """
    if folder is None and getattr(benchmark_class.get_slurm_folder, "scopebench_own", False):
        return  # installed already, by run_benchopt's program or an earlier import
    chosen: list[Path] = [Path(folder)] if folder is not None else []

    def get_slurm_folder(self) -> Path:
        if not chosen:
            chosen.append(job_folder(self.benchmark_dir, new_run_id()))
            print(f"scopebench: this run's Submitit folder (scripts, logs, results): {chosen[0]}", file=sys.stderr)
        return chosen[0]

    get_slurm_folder.scopebench_own = True
    benchmark_class.get_slurm_folder = get_slurm_folder  # benchopt's class, patched in place


def _job_errors(folder: Path, since: float, limit: int = 3, chars: int = 2000) -> list[str]:
    """Ends of the Submitit job error logs (``<run's job folder>/*_log.err``) written since ``since``.

    Logs holding a traceback come first; at most ``limit`` of them, ``chars`` characters each.
    """
    if not folder.is_dir():
        return []
    texts = []
    for log in sorted(folder.glob("*_log.err")):
        if log.stat().st_mtime >= since and (text := log.read_text(errors="replace").strip()):
            texts.append((("Traceback" not in text), f"--- {log}\n{_last_traceback(text, chars)}"))
    return [text for _, text in sorted(texts, key=lambda t: t[0])[:limit]]


def _last_traceback(text: str, chars: int) -> str:
    """The last traceback of a log (else its end), at most about ``chars`` characters: a long
    traceback keeps its ``Traceback`` header line and its end, where the error is.

    :Examples:

    >>> _last_traceback("noise\\nTraceback (most recent call last):\\n  f()\\nValueError: x", 200).splitlines()[0]
    'Traceback (most recent call last):'
    >>> _last_traceback("Traceback (most recent call last):\\n" + "  frame\\n" * 50 + "ValueError: x", 60)
    'Traceback (most recent call last):\\n[...]\\n  frame\\nValueError: x'
    """
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return text[-chars:]
    text = text[start:]
    if len(text) <= chars:
        return text
    head, _, _ = text.partition("\n")
    tail = text[-(chars - len(head)) :]
    tail = tail[tail.find("\n") + 1 :]  # from a line's start
    return f"{head}\n[...]\n{tail}"


#: With ``submitit_poll_sec``: Submitit's job-state queries (``sacct``) at least this often (its
#: own back-off reaches half the time since the last submission: a dead node's job seen late).
STATE_CHECK_MIN_SEC = 10.0
#: ``python -c`` program: benchopt's command line with this run's Submitit folder
#: (``argv[1]``, in place of benchopt's fixed ``<benchmark>/benchopt_run``) and Submitit's
#: collection timing set by ``argv[2]`` and ``argv[3]`` (an empty string keeps Submitit's own):
#:
#: - the period of benchopt's checks for finished jobs: benchopt 1.10 calls Submitit's
#:   ``as_completed(jobs)``, which checks every 10 s, so a 12 s job is collected at 20 s. A
#:   check reads the result files; Submitit's ``sacct`` calls keep their own back-off.
#: - how long a job that ended without a result file is given for it to appear before it
#:   counts as failed: 15 s, for shared file systems that show a file late.
_BENCHOPT_TIMED = "\n".join(
    [
        "import functools, sys",
        "import submitit.core.core, submitit.helpers",
        "from benchopt.benchmark import Benchmark",
        "from scopebench.runs import own_job_folder",
        "from benchopt.cli import benchopt",
        "from benchopt.parallel_backends import slurm_executor",
        "folder, poll, wait = sys.argv.pop(1), sys.argv.pop(1), sys.argv.pop(1)",
        "own_job_folder(Benchmark, folder)",
        "if poll:",
        "    slurm_executor.as_completed = functools.partial(",
        "        submitit.helpers.as_completed, poll_frequency=float(poll))",
        "    from submitit.slurm.slurm import SlurmJob",
        f"    SlurmJob.watcher._delay_s = max(float(poll), {STATE_CHECK_MIN_SEC})",
        "if wait:",
        "    submitit.core.core.Job._results_timeout_s = float(wait)",
        "benchopt(prog_name='benchopt')",
    ]
)


def _benchopt_program(folder: Path, poll_sec: float | None, result_wait_sec: float | None) -> list[str]:
    """``python`` arguments that start benchopt's command line with this run's Submitit folder and timing."""
    for key, value in (("submitit_poll_sec", poll_sec), ("submitit_result_wait_sec", result_wait_sec)):
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0):
            raise ValueError(f"{key} must be a number of seconds > 0, got {value!r}")
    return ["-c", _BENCHOPT_TIMED, str(folder), *("" if v is None else str(v) for v in (poll_sec, result_wait_sec))]


def _benchopt_command(
    benchmark: Path,
    config: str | Path | None,
    output: str | Path | None,
    extra_args: list[str] | None,
    timeout_sec: float,
    env: dict[str, str] | None,
    program: list[str],
) -> BenchoptRun:
    if output is None:
        output = benchmark / "outputs" / f"scopebench_{time.strftime('%Y%m%d-%H%M%S')}_{os.getpid()}.parquet"
    output = Path(output).resolve()
    cmd = [sys.executable, *program, "run", str(benchmark), "--no-cache", "--no-plot", "--no-display"]
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
    return BenchoptRun(parquet=output, log=log, wall_sec=wall, returncode=proc.returncode)


def run_benchopt(
    benchmark: str | Path,
    config: str | Path | None = None,
    *,
    output: str | Path | None = None,
    extra_args: list[str] | None = None,
    timeout_sec: float = 900.0,
    env: dict[str, str] | None = None,
    submitit_poll_sec: float | None = None,
    submitit_result_wait_sec: float | None = None,
    check: bool = True,
) -> BenchoptRun:
    """``benchopt run <benchmark> --config <config> --no-cache --no-plot``, checked by default.

    Args:
        benchmark: Benchmark folder.
        config: YAML run config (``configs/...``).
        output: Parquet path; default ``<benchmark>/outputs/scopebench_<time>.parquet``.
        extra_args: More ``benchopt run`` arguments.
        timeout_sec: Bound on the whole command.
        env: Extra environment variables.
        submitit_poll_sec: With a submitit ``--parallel-config``: seconds between benchopt's
            checks for finished jobs (None: benchopt's own 10 s). Short jobs (tests, trials
            on a test cluster) end up to 10 s sooner with 1 s. It also caps the back-off
            of Submitit's job-state queries at ``max(poll, STATE_CHECK_MIN_SEC)``.
        submitit_result_wait_sec: With a submitit ``--parallel-config``: seconds a job that
            ended without a result file is given for the file to appear before it counts
            as failed (None: Submitit's own 15 s, for slow shared file systems).
        check: Raise when the run failed, and record benchopt's timeouts (the default).
            ``False`` is for callers that expect a failure (tests of error messages): the
            run comes back as it is, with its ``returncode``; its ``parquet`` may not exist.

    Raises:
        RuntimeError: (``check``) benchopt failed, a solver errored, or no parquet was
            written; the message carries the end of benchopt's output and of the Submitit
            job error logs written during the run.
    """
    benchmark = Path(benchmark)
    if not (benchmark / "objective.py").is_file():
        raise ValueError(f"{benchmark} is not a benchmark folder (no objective.py)")
    run_id = new_run_id()
    folder = job_folder(benchmark, run_id)
    program = _benchopt_program(folder, submitit_poll_sec, submitit_result_wait_sec)
    since = time.time()
    try:
        run = _benchopt_command(benchmark, config, output, extra_args, timeout_sec, env, program)
    finally:  # no job of this run outlives it (a cut-off node's job waits on it in srun)
        states = cluster.job_states(cluster.job_ids(folder), env)
        cancelled = cluster.cancel_unfinished(states, env)
    run = dataclasses.replace(run, run_id=run_id, job_folder=folder)
    if not check:
        return run
    code = run.returncode
    problems = _failed_lines(run.log)
    if code != 0 or problems or not run.parquet.is_file():
        reason = (
            f"exit code {code}"
            if code != 0
            else f"{len(problems)} failure line(s): {problems[:3]}" if problems else f"no results file at {run.parquet}"
        )
        if run.parquet.is_file():  # the other cells' rows: kept, marked partial
            _write_run_metadata(run.parquet, {"run_id": run_id, "partial": True, "failures": problems[:20]})
        jobs, slurm = "\n".join(_job_errors(folder, since)), cluster.describe_jobs(states, cancelled)
        raise RuntimeError(
            f"benchopt run of {benchmark} failed ({reason}):\n{run.log[-4000:]}"
            + (
                f"\nSubmitit job logs:\n{jobs}"
                if jobs
                else f"\nSubmitit job logs: no job wrote an error line ({folder})" if folder.is_dir() else ""
            )
            + (f"\nSLURM's view of this run's jobs (scontrol show job):\n{slurm}" if slurm else "")
        )
    stopped = _stopped_on_timeout(run, _max_runs(config, extra_args))
    _write_run_metadata(
        run.parquet,
        {
            "max_runs": _max_runs(config, extra_args),
            "stopped_on_timeout": stopped,
            "run_id": run_id,
            # Only a submitit run writes one.
            **({"job_folder": str(folder)} if folder.is_dir() else {}),
        },
    )
    for entry in stopped:
        warnings.warn(entry.message(), TruncatedRunWarning, stacklevel=2)
    return dataclasses.replace(run, stopped_on_timeout=tuple(stopped))


def _max_runs(config: str | Path | None, extra_args: list[str] | None) -> int:
    """``max-runs`` of a run: the command line wins over the run config, else benchopt's default."""
    args = list(extra_args or [])
    for i, arg in enumerate(args):
        if arg in ("--max-runs", "-n") and i + 1 < len(args):
            return int(args[i + 1])
        if arg.startswith("--max-runs="):
            return int(arg.split("=", 1)[1])
    if config is not None:
        from scopebench.validate import load_yaml

        loaded = load_yaml(config) or {}
        for key in ("max-runs", "max_runs"):
            if isinstance(loaded, dict) and loaded.get(key) is not None:
                return int(loaded[key])
    return _BENCHOPT_DEFAULT_MAX_RUNS


def _stopped_on_timeout(run: BenchoptRun, max_runs: int | None) -> list[StoppedOnTimeout]:
    """Solver lines ``done (timeout)`` in the log, with their dataset, objective and row count."""
    import pandas as pd

    df = pd.read_parquet(run.parquet, columns=["dataset_name", "objective_name", "solver_name"])
    datasets, objectives = set(df["dataset_name"].astype(str)), set(df["objective_name"].astype(str))
    dataset = objective = None
    found = []
    for line in run.log.splitlines():
        if line.strip() in datasets and not line.startswith(" "):
            dataset = line.strip()
        elif (m := _OBJECTIVE_LINE.match(line)) and m["objective"] in objectives:
            objective = m["objective"]
        elif (m := _SOLVER_TIMEOUT.match(line)) and dataset is not None and objective is not None:
            rows = df[
                (df["dataset_name"] == dataset)
                & (df["objective_name"] == objective)
                & (df["solver_name"] == m["solver"])
            ]
            found.append(StoppedOnTimeout(dataset, objective, m["solver"], len(rows), max_runs))
    return found


def _write_run_metadata(parquet: Path, info: dict[str, Any]) -> None:
    """Merge ``info`` (JSON-able; dataclasses allowed) under :data:`METADATA_KEY` into the parquet's metadata."""
    import pyarrow.parquet as pq

    from scopebench.atomic import atomic_write

    table = pq.read_table(parquet)
    metadata = dict(table.schema.metadata or {})
    meta_json = json.loads(metadata.get(b"_meta_json", b"{}").decode("utf-8"))
    meta_json[METADATA_KEY] = json.loads(json.dumps(info, default=asdict))
    metadata[b"_meta_json"] = json.dumps(meta_json).encode("utf-8")
    with atomic_write(parquet, "wb") as fh:
        pq.write_table(table.replace_schema_metadata(metadata), fh)


def read_run_metadata(parquet: str | Path) -> dict[str, Any]:
    """What :func:`run_benchopt` recorded in a parquet (``{}`` for a file it did not write).

    Keys: ``max_runs``, ``stopped_on_timeout`` (a list of :class:`StoppedOnTimeout` as dicts),
    ``run_id`` and ``job_folder`` (where its Submitit files and job logs are); a failed run
    that still wrote rows: ``partial`` (true) and ``failures`` (benchopt's failure lines).
    """
    import pyarrow.parquet as pq

    metadata = pq.read_metadata(parquet).metadata or {}
    try:
        return json.loads(metadata.get(b"_meta_json", b"{}").decode("utf-8")).get(METADATA_KEY, {})
    except (ValueError, AttributeError):
        return {}


def timeout_messages(parquet: str | Path) -> list[str]:
    """One warning line per solver that stopped on benchopt's timeout in this file (see :func:`read_run_metadata`)."""
    entries = read_run_metadata(parquet).get("stopped_on_timeout", [])
    return [f"warning: {str(parquet)}: {StoppedOnTimeout(**entry).message()}" for entry in entries]
