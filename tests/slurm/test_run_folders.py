"""No result from another run: job ids that start again never hand a run an older run's result.

Submitit names result files by SLURM job id and takes a result file it finds as its job's.
In benchopt's fixed ``<benchmark>/benchopt_run/`` a run on a cluster whose job ids started
again (its state reset) read the result an earlier run's job of the same id had left. Each
run now has its own folder (:func:`scopebench.runs.job_folder`); this test replays the reset:
run A (a cell its solver skips, two tasks), the cluster restarted with the same first job
id, run B (a valid cell, one task) — B must report its own rows, not A's skip. In this
order the old result is there before B's job starts, so a shared folder hands it to B
every time (the other order only when A's second task ends before its first one writes).
"""

from __future__ import annotations

import pandas as pd
import pytest

from scopebench.runs import read_run_metadata, run_benchopt

from .cluster import local_slurm
from .conftest import REPO, SUBMITIT_TIMING, JobFolder, cluster_parallel_config

pytestmark = pytest.mark.slow

BENCHMARK = REPO / "benchmark_inference"
FRAMES = "multiframe_superres[image_size=32,num_operators=2,scale=2,noise_level=0.02,seed=0]"
#: The cell of run B: one PnP reconstruction. Run A: two ranks with nothing to split (skipped).
CELLS = {
    "B": "      nproc_per_node: 1\n",
    "A": "      nproc_per_node: 2\n      slurm_ntasks_per_node: 2\n",
}
FIRST_JOB_ID = 4242


def _config(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.yml"
    path.write_text(
        f"dataset:\n  - {FRAMES}\nsolver:\n  - PnP:\n      denoiser: tv\n{CELLS[name]}max-runs: 1\nn-repetitions: 1\n"
    )
    return str(path)


def test_a_reset_cluster_never_hands_a_run_an_older_runs_result(slurm_clusters, tmp_path):
    slurm_clusters.close()  # this test starts its own cluster twice, with the same job ids
    jobs = JobFolder(BENCHMARK)
    runs = {}
    try:
        for name in ("A", "B"):
            with local_slurm(1, first_job_id=FIRST_JOB_ID) as cluster:
                parallel = cluster_parallel_config("slurm.yml", cluster, tmp_path)
                runs[name] = run_benchopt(
                    BENCHMARK,
                    _config(tmp_path, name),
                    output=tmp_path / f"{name}.parquet",
                    extra_args=["--parallel-config", str(parallel)],
                    env=cluster.env,
                    timeout_sec=300,
                    check=name == "B",
                    **SUBMITIT_TIMING,
                )
        b, a = runs["B"], runs["A"]
        rows = pd.read_parquet(b.parquet)
        assert len(rows) == 2 and rows["objective_psnr"].notna().all(), rows
        # Run A's cell was skipped in its job, and B did not take A's skip for its own.
        if a.parquet.exists():
            assert pd.read_parquet(a.parquet).empty, pd.read_parquet(a.parquet)
        assert "would only repeat rank 0's work" in a.log, a.log[-3000:]
        assert "would only repeat rank 0's work" not in b.log, b.log[-3000:]
        # The ids did start again: both runs' only job is FIRST_JOB_ID, each in its own folder.
        assert a.job_folder != b.job_folder and a.job_folder.parent == b.job_folder.parent
        for run in (a, b):
            assert sorted(p.name for p in run.job_folder.glob("*_submission.sh")) == [f"{FIRST_JOB_ID}_submission.sh"]
        assert read_run_metadata(b.parquet)["job_folder"] == str(b.job_folder)
    finally:
        jobs.cleanup()
