"""No result from another run: job ids that start again never hand a run an older run's result.

Submitit names result files by SLURM job id and takes a result file it finds as its job's.
In benchopt's fixed ``<benchmark>/benchopt_run/`` a run on a cluster whose job ids started
again (its state reset) read the result an earlier run's job of the same id had left. Each
run now has its own folder (:func:`scopebench.runs.job_folder`); this test replays the reset:
run A (a cell its solver skips, two tasks), the cluster restarted with the same first job
id, run B (a valid cell, one task) — B must report its own rows, not A's skip. In this
order the old result is there before B's job starts, so a shared folder hands it to B
every time (the other order only when A's second task ends before its first one writes).

Both interfaces: :func:`scopebench.runs.run_benchopt`, and a plain ``benchopt run`` as
users type it (the benchmark's ``objective.py`` installs the folder:
:func:`scopebench.runs.own_job_folder`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

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


def _plain_benchopt(config: str, parallel: Path, output: Path, env: dict) -> tuple[str, Path]:
    """``benchopt run`` as a user types it: its output, and the Submitit folder it named."""
    cmd = [sys.executable, "-m", "benchopt", "run", str(BENCHMARK), "--config", config, "--no-plot", "--no-display"]
    cmd += ["--no-cache"]  # benchopt would hand back its cached rows of an earlier run of the same cell
    cmd += ["--parallel-config", str(parallel), "--output", str(output)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300, stdin=subprocess.DEVNULL)
    log = proc.stdout + proc.stderr
    named = re.findall(r"this run's Submitit folder \(scripts, logs, results\): (\S+)", log)
    assert len(named) == 1, log[-3000:]
    return log, Path(named[0])


@pytest.mark.parametrize("interface", ["run_benchopt", "benchopt run"])
def test_a_reset_cluster_never_hands_a_run_an_older_runs_result(slurm_clusters, tmp_path, interface):
    slurm_clusters.close()  # this test starts its own cluster twice, with the same job ids
    jobs = JobFolder(BENCHMARK)
    logs, folders, outputs = {}, {}, {}
    try:
        for name in ("A", "B"):
            outputs[name] = tmp_path / f"{name}.parquet"
            with local_slurm(1, first_job_id=FIRST_JOB_ID) as cluster:
                parallel = cluster_parallel_config("slurm.yml", cluster, tmp_path)
                if interface == "benchopt run":
                    env = {**os.environ, **cluster.env}
                    logs[name], folders[name] = _plain_benchopt(_config(tmp_path, name), parallel, outputs[name], env)
                    continue
                run = run_benchopt(
                    BENCHMARK,
                    _config(tmp_path, name),
                    output=outputs[name],
                    extra_args=["--parallel-config", str(parallel)],
                    env=cluster.env,
                    timeout_sec=300,
                    check=name == "B",
                    **SUBMITIT_TIMING,
                )
                logs[name], folders[name] = run.log, run.job_folder
        rows = pd.read_parquet(outputs["B"])
        assert len(rows) == 2 and rows["objective_psnr"].notna().all(), (rows, logs["B"][-3000:])
        # Run A's cell was skipped in its job, and B did not take A's skip for its own.
        if outputs["A"].exists():
            assert pd.read_parquet(outputs["A"]).empty, pd.read_parquet(outputs["A"])
        assert "would only repeat rank 0's work" in logs["A"], logs["A"][-3000:]
        assert "would only repeat rank 0's work" not in logs["B"], logs["B"][-3000:]
        # The ids did start again: both runs' only job is FIRST_JOB_ID, each in its own folder.
        assert folders["A"] != folders["B"] and folders["A"].parent == folders["B"].parent == jobs.path
        for folder in folders.values():
            assert sorted(p.name for p in folder.glob("*_submission.sh")) == [f"{FIRST_JOB_ID}_submission.sh"]
        if interface == "run_benchopt":
            assert read_run_metadata(outputs["B"])["job_folder"] == str(folders["B"])
    finally:
        jobs.cleanup()
