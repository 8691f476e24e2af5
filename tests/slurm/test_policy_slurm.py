"""The policy benchmark's ``Pi05Train`` as two SLURM tasks, through ``configs/parallel/slurm.yml``.

One benchopt run (one submission, one job of two tasks): the tasks are the two ranks of
the training run (``nproc_per_node: 1``, so nothing is spawned and a world size of 2 can
only come from SLURM). The config is the shipped one with only what differs on the test
cluster changed (:func:`.conftest.cluster_parallel_config`).
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from scopebench.runs import run_benchopt

from .conftest import REPO, SUBMITIT_TIMING, JobFolder, cluster_parallel_config

pytestmark = pytest.mark.slow

MAX_RUNS = 3

#: Pi05Train on the tiny preset, its two ranks the two SLURM tasks of the cell's job.
TWO_TASKS = f"""
dataset:
  - synthetic_robot
solver:
  - Pi05Train:
      preset: tiny
      find_unused_params: false
      profiler_warmup: 1
      "nproc_per_node, slurm_ntasks_per_node": [[1, 2]]
max-runs: {MAX_RUNS}
n-repetitions: 1
"""


@pytest.fixture(scope="module")
def two_tasks(slurm_cluster, tmp_path_factory):
    """One benchopt run of :data:`TWO_TASKS` on the test cluster."""
    tmp = tmp_path_factory.mktemp("policy_slurm")
    config = tmp / "two_tasks.yml"
    config.write_text(TWO_TASKS)
    jobs = JobFolder(REPO)
    try:
        run = run_benchopt(
            REPO,
            config,
            output=tmp / "policy_slurm.parquet",
            extra_args=["--parallel-config", str(cluster_parallel_config("slurm.yml", slurm_cluster, tmp))],
            env=slurm_cluster.env,
            timeout_sec=600,
            **SUBMITIT_TIMING,
        )
        df = pd.read_parquet(run.parquet)
        yield df[df.solver_name.str.startswith("Pi05Train")].sort_values("stop_val").reset_index(drop=True), jobs
    finally:
        jobs.cleanup()


def test_two_task_training_records_every_iteration(two_tasks):
    df, jobs = two_tasks
    assert df["stop_val"].tolist() == list(range(MAX_RUNS + 1)), jobs.logs()
    assert set(df["objective_world_size"]) == {2}, jobs.logs()
    losses = df["objective_train_loss"].dropna()
    assert len(losses) >= MAX_RUNS - 1, df["objective_train_loss"].tolist()  # warm-up 1: rows 0 and 1 hold none
    assert all(math.isfinite(loss) for loss in losses), losses.tolist()
    assert df["objective_val_loss"].map(math.isfinite).all(), df["objective_val_loss"].tolist()


def test_the_job_log_shows_two_slurm_tasks(two_tasks, slurm_cluster):
    _, jobs = two_tasks
    (job_id,) = jobs.job_ids()
    log = jobs.read(f"{job_id}_0_log.out")
    expected = f"SLURM_JOB_ID={job_id} SLURM_JOB_NODELIST={slurm_cluster.host} SLURM_NTASKS=2 "
    assert expected + f"SLURM_JOB_PARTITION={slurm_cluster.partition}" in log, log
    assert "#SBATCH --ntasks-per-node=2" in jobs.read(f"{job_id}_submission.sh").splitlines()


def test_two_slurm_tasks_are_the_two_ranks(two_tasks):
    """The cell ran as SLURM tasks 0 and 1 (not a local spawn), both to completion."""
    _, jobs = two_tasks
    jobs.assert_tasks_were_the_ranks(2)
