"""scopebench.runs: checked benchopt runs say when benchopt stopped a solver on its timeout."""

from __future__ import annotations

import time
import warnings
from pathlib import Path

import pandas as pd
import pytest
from conftest import REPO

from scopebench.cli import main
from scopebench.runs import TruncatedRunWarning, _max_runs, read_run_metadata, run_benchopt

BENCH = REPO / "benchmark_training"
CONFIG = BENCH / "configs" / "quickstart.yml"
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


@pytest.fixture
def no_weights_left():
    """The quickstart saves its trained denoiser in outputs/: remove the ones these runs wrote."""
    start = time.time()
    yield
    for path in (BENCH / "outputs").glob("unrolled_pnp_*_denoiser.safetensors"):
        if path.stat().st_mtime >= start:
            path.unlink(missing_ok=True)


def test_max_runs_from_command_line_then_config_then_default(tmp_path):
    assert _max_runs(CONFIG, None) == 60
    assert _max_runs(CONFIG, ["--max-runs", "7"]) == 7 and _max_runs(CONFIG, ["-n", "8"]) == 8
    (tmp_path / "c.yml").write_text("solver: [x]\n")
    assert _max_runs(tmp_path / "c.yml", None) == 100 and _max_runs(None, None) == 100


@pytest.mark.slow
def test_run_stopped_on_timeout_is_reported_by_run_benchopt_and_summary(tmp_path, capsys, no_weights_left):
    out = tmp_path / "short.parquet"
    with pytest.warns(TruncatedRunWarning, match=r"after \d+ rows, before max-runs 1000"):
        run = run_benchopt(
            BENCH, CONFIG, output=out, extra_args=["--timeout", "3", "--max-runs", "1000"], env=ONE_THREAD
        )
    rows = len(pd.read_parquet(out))
    assert 0 < rows < 1001
    (stopped,) = run.stopped_on_timeout
    assert stopped.rows == rows and stopped.solver.startswith("UnrolledPnP[") and stopped.max_runs == 1000
    assert read_run_metadata(out)["stopped_on_timeout"][0]["rows"] == rows
    capsys.readouterr()
    assert main(["summary", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warning:")]
    assert len(lines) == 1, lines
    assert f"UnrolledPnP (unrolled_pnp_training) stopped on benchopt's timeout after {rows} rows" in lines[0]
    assert "before max-runs 1000" in lines[0]


@pytest.mark.slow
def test_complete_run_has_no_timeout_warning(tmp_path, capsys, no_weights_left):
    out = tmp_path / "complete.parquet"
    with warnings.catch_warnings():
        warnings.simplefilter("error", TruncatedRunWarning)
        run = run_benchopt(BENCH, CONFIG, output=out, extra_args=["--max-runs", "3"], env=ONE_THREAD)
    assert run.stopped_on_timeout == () and len(pd.read_parquet(out)) == 4
    assert read_run_metadata(out) == {"max_runs": 3, "stopped_on_timeout": [], "run_id": run.run_id}
    assert main(["summary", str(out)]) == 0
    assert "warning:" not in capsys.readouterr().out


def test_canary_benchopt_collects_submitit_jobs_as_submitit_timing_expects():
    """``submitit_poll_sec`` replaces ``as_completed`` in benchopt's Submitit module, and
    ``submitit_result_wait_sec`` sets Submitit's wait for a missing result file: that works
    only while benchopt looks the name up there and Submitit reads that attribute."""
    import inspect

    import submitit.core.core
    import submitit.helpers
    from benchopt.parallel_backends import slurm_executor

    assert slurm_executor.as_completed is submitit.helpers.as_completed
    assert "as_completed" in slurm_executor.run_on_slurm.__code__.co_names
    assert inspect.signature(submitit.helpers.as_completed).parameters["poll_frequency"].default == 10
    assert submitit.core.core.Job._results_timeout_s == 15
    assert "_results_timeout_s" in submitit.core.core.Job._get_outcome_and_result.__code__.co_names


@pytest.mark.parametrize(
    "poll, wait, expected",
    [("0.25", "", "{'poll_frequency': 0.25} 15"), ("", "2.5", "None 2.5"), ("1", "3", "{'poll_frequency': 1.0} 3.0")],
)
def test_submitit_timing_reaches_benchopt_and_submitit(poll, wait, expected):
    import subprocess
    import sys

    from scopebench import runs

    call = "benchopt(prog_name='benchopt')"
    report = "print(getattr(slurm_executor.as_completed, 'keywords', None), submitit.core.core.Job._results_timeout_s)"
    program = runs._BENCHOPT_TIMED.replace(call, report)
    assert program != runs._BENCHOPT_TIMED
    out = subprocess.run(
        [sys.executable, "-c", program, "/nonexistent/run", poll, wait], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == expected, out.stderr


def test_each_run_gets_its_own_submitit_folder():
    """benchopt asks ``Benchmark.get_slurm_folder`` for the executor's folder: the program replaces it."""
    import subprocess
    import sys

    from scopebench import runs

    call = "benchopt(prog_name='benchopt')"
    report = "from benchopt.benchmark import Benchmark; print(Benchmark.get_slurm_folder(None))"
    program = runs._BENCHOPT_TIMED.replace(call, report)
    out = subprocess.run([sys.executable, "-c", program, "/x/benchopt_run/r1", "", ""], capture_output=True, text=True)
    assert out.stdout.strip() == "/x/benchopt_run/r1", out.stderr
    from benchopt.parallel_backends import slurm_executor

    assert "get_slurm_folder" in slurm_executor.get_slurm_executor.__code__.co_names  # where benchopt asks
    folder = runs.job_folder(REPO / "benchmark_inference", runs.new_run_id())
    assert folder.parent == REPO / "benchmark_inference" / "benchopt_run"
    assert runs._benchopt_program(folder, 1, None)[2:] == [str(folder), "1", ""]
    assert runs.new_run_id() != runs.new_run_id()


OWN_FOLDER = """
import sys, types
from benchopt.benchmark import Benchmark
from scopebench.runs import own_job_folder
bench = types.SimpleNamespace(benchmark_dir=sys.argv[1])
own_job_folder(Benchmark)
first = Benchmark.get_slurm_folder(bench)
own_job_folder(Benchmark)  # a second import of an objective keeps the run's folder
print(first, Benchmark.get_slurm_folder(bench))
"""


def test_a_plain_benchopt_run_of_the_suite_gets_a_folder_of_its_own(tmp_path):
    """``own_job_folder(Benchmark)`` (each objective.py calls it) picks a new run folder once per
    process, keeps it for every executor, and says where; benchopt's own is the fixed one."""
    import subprocess
    import sys

    outs = [
        subprocess.run([sys.executable, "-c", OWN_FOLDER, str(tmp_path)], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    folders = [out.stdout.split() for out in outs]
    for (first, again), out in zip(folders, outs):
        assert first == again and Path(first).parent == tmp_path / "benchopt_run", out.stdout
        assert f"this run's Submitit folder (scripts, logs, results): {first}" in out.stderr
    assert folders[0][0] != folders[1][0]  # two runs, two folders
    for objective in ("objective.py", "benchmark_inference/objective.py", "benchmark_training/objective.py"):
        assert "\nown_job_folder(Benchmark)\n" in (REPO / objective).read_text(), objective


@pytest.mark.parametrize("key", ["submitit_poll_sec", "submitit_result_wait_sec"])
@pytest.mark.parametrize("value", [0, -1.0, "1", True])
def test_submitit_timing_must_be_positive_seconds(tmp_path, key, value):
    with pytest.raises(ValueError, match=f"{key} must be a number of seconds > 0, got {value!r}"):
        run_benchopt(REPO / "benchmark_inference", output=tmp_path / "x.parquet", **{key: value})
