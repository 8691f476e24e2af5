"""The test cluster itself: starts fast, runs multi-task jobs, reports states, holds its lock."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .cluster import LOCK_PATH
from .sacct_standin import _job_id


def _wait_state(cluster, job_id: str, timeout: float = 60.0) -> str:
    """The job's state from ``sacct`` (the stand-in on the cluster's PATH) once it has ended."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = cluster.run("sacct", "-o", "JobID,State,NodeList", "--parsable2", "-j", job_id).stdout.splitlines()
        states = [line.split("|")[1] for line in lines[1:] if line.split("|")[0] == job_id]
        if states and states[0] not in ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING"):
            return states[0]
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout} s:\n{cluster.log_tail()}")


def test_cluster_starts_in_under_10_s_and_runs_two_tasks(slurm_cluster, tmp_path):
    assert slurm_cluster.start_sec < 10.0, slurm_cluster.start_sec
    out = tmp_path / "job.out"
    submitted = slurm_cluster.run(
        "sbatch", "--ntasks=2", f"--output={out}", "--wrap", "srun sh -c 'echo rank=$SLURM_PROCID of $SLURM_NTASKS'"
    )
    job_id = submitted.stdout.split()[-1]
    assert _wait_state(slurm_cluster, job_id) == "COMPLETED", out.read_text()
    assert sorted(out.read_text().split()) == sorted("rank=0 of 2 rank=1 of 2".split())


def test_sacct_standin_reports_a_failed_job(slurm_cluster):
    job_id = slurm_cluster.run("sbatch", "--output=/dev/null", "--wrap", "exit 3").stdout.split()[-1]
    assert _wait_state(slurm_cluster, job_id) == "FAILED"


def test_the_lock_is_held_while_the_cluster_runs(slurm_cluster):
    with open(LOCK_PATH) as other:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_sacct_standin_names_array_tasks_as_sacct_does():
    assert _job_id({"JobId": "12"}) == "12"
    assert _job_id({"JobId": "13", "ArrayJobId": "12", "ArrayTaskId": "1"}) == "12_1"
    assert _job_id({"JobId": "12", "ArrayJobId": "12", "ArrayTaskId": "2-3%2"}) == "12_[2-3%2]"


@pytest.mark.slow
@pytest.mark.parametrize(
    "test, nodes",
    [
        ("test_cluster.py::test_the_lock_is_held_while_the_cluster_runs", 1),
        ("test_two_nodes.py::test_two_nodes_start_in_under_10_s_each_in_its_own_network", 2),
    ],
)
@pytest.mark.parametrize("ci, outcome", [("true", "1 error"), ("", "1 skipped")])
def test_missing_slurm_fails_in_ci_and_skips_elsewhere(ci, outcome, test, nodes):
    """Without sbatch on the PATH either layout's fixture errors when CI is set and skips otherwise."""
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv only: no sbatch, srun...
    if ci:
        env["CI"] = ci
    test = str(Path(__file__).resolve().parent / test)
    # --confcutdir: only tests/slurm/conftest.py (the fixture under test), not tests/conftest.py,
    # whose collection hook imports torch (4 of the 5 s this subprocess took).
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            test,
            "-q",
            "-p",
            "no:cacheprovider",
            "--confcutdir",
            str(Path(__file__).parent),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert outcome in proc.stdout, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert f"a local {nodes}-node SLURM needs sbatch" in proc.stdout, proc.stdout[-3000:]
