"""``benchopt run --parallel-config configs/parallel/slurm*.yml`` against the real test cluster.

Each benchopt run here is one submission: benchopt's start and the job's own (torch and
deepinv imports) take about 20 s whatever the run's size; results are collected every
second instead of every 10 s (:data:`.conftest.SUBMITIT_TIMING`). The configs are the
shipped ones with only what differs on the test cluster changed
(:func:`.conftest.cluster_parallel_config`).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scopebench.runs import run_benchopt

from .conftest import PARALLEL_CONFIGS, REPO, SUBMITIT_TIMING, JobFolder, cluster_parallel_config

pytestmark = pytest.mark.slow

BENCHMARK = REPO / "benchmark_inference"
FRAMES_SPEC = {"image_size": 32, "num_operators": 2, "scale": 2, "noise_level": 0.02, "seed": 0}
FRAMES = "multiframe_superres[" + ",".join(f"{k}={v}" for k, v in FRAMES_SPEC.items()) + "]"
TV = {"denoiser": "tv", "denoiser_sigma": 0.01}

#: The problem split over two SLURM tasks (its two operators across the ranks).
TWO_TASKS = f"""
dataset:
  - {FRAMES}
solver:
  - PnP:
      denoiser: {TV["denoiser"]}
      denoiser_sigma: {TV["denoiser_sigma"]}
      profiler_save_file: true
      "nproc_per_node, distribute_physics, slurm_ntasks_per_node":
        - [2, true, 2]
max-runs: 3
n-repetitions: 1
"""


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _one_process_mse(num_iterations: int) -> float:
    """MSE after ``num_iterations`` of the same reconstruction in one local process (the engine
    the solver runs, scored by the objective's metric)."""
    from scopebench.imaging import build_problem, quality_metrics
    from scopebench.imaging.inference.run import reconstruct

    spec = {"kind": "multiframe_superres", **FRAMES_SPEC}
    x, _ = reconstruct(spec, {**TV, "device": "cpu"}, num_iterations=num_iterations, nproc=1)
    return quality_metrics(x, build_problem(**spec).x_true)["mse"]


@pytest.fixture(scope="module")
def two_tasks(slurm_cluster, tmp_path_factory):
    """One benchopt run of :data:`TWO_TASKS` through ``configs/parallel/slurm.yml``."""
    tmp = tmp_path_factory.mktemp("slurm_run")
    jobs = JobFolder(BENCHMARK)
    outputs = BENCHMARK / "outputs"
    before = set(outputs.iterdir())
    try:
        run = run_benchopt(
            BENCHMARK,
            _write(tmp, "two_tasks.yml", TWO_TASKS),
            output=tmp / "slurm.parquet",
            extra_args=["--parallel-config", str(cluster_parallel_config("slurm.yml", slurm_cluster, tmp))],
            env=slurm_cluster.env,
            timeout_sec=300,
            **SUBMITIT_TIMING,
        )
        csvs = sorted(set(outputs.iterdir()) - before)
        df = pd.read_parquet(run.parquet).sort_values("stop_val").reset_index(drop=True)
        yield run, df, jobs, csvs
    finally:
        jobs.cleanup()
        for path in set(outputs.iterdir()) - before:
            path.unlink()


def test_slurm_run_writes_region_columns(two_tasks):
    _, df, jobs, _ = two_tasks
    for column in ("objective_psnr", "objective_gradient_time_sec", "objective_denoise_time_sec"):
        assert column in df.columns, column
    assert df["objective_gradient_time_sec"].notna().sum() >= 3, jobs.logs()


def test_the_job_log_shows_its_slurm_variables(two_tasks, slurm_cluster):
    _, _, jobs, _ = two_tasks
    (job_id,) = jobs.job_ids()
    log = jobs.read(f"{job_id}_0_log.out")
    expected = f"SLURM_JOB_ID={job_id} SLURM_JOB_NODELIST={slurm_cluster.host} SLURM_NTASKS=2 "
    assert expected + f"SLURM_JOB_PARTITION={slurm_cluster.partition}" in log, log


def test_two_slurm_tasks_are_the_two_ranks(two_tasks):
    """The cell ran as SLURM tasks 0 and 1 (not a local spawn), both to completion."""
    _, df, jobs, csvs = two_tasks
    jobs.assert_tasks_were_the_ranks(2)
    assert set(df["objective_world_size"]) == {2}
    names = sorted(p.name for p in csvs)
    runs = {re.fullmatch(r"pnp_(.+)_rank[01]_gpu_metrics\.csv", name).group(1) for name in names}
    assert len(runs) == 1 and len(names) == 2, names  # one run id, one file per rank
    (run,) = runs
    for rank in (0, 1):
        rows = pd.read_csv(BENCHMARK / "outputs" / f"pnp_{run}_rank{rank}_gpu_metrics.csv")
        assert set(rows["rank"]) == {rank} and len(rows) >= 3


def test_two_tasks_match_one_process(two_tasks):
    _, df, _, _ = two_tasks
    last = df.iloc[-1]
    assert last["stop_val"] >= 3
    reference = _one_process_mse(int(last["stop_val"]))
    rel = abs(last["objective_mse"] - reference) / reference
    assert rel < 1e-5, (last["objective_mse"], reference)  # the tolerance of tests/imaging/test_pnp_distributed.py
    assert last["objective_mse"] < df["objective_mse"].iloc[0]  # it did reconstruct


def _loaded_library(name: str) -> Path:
    """Path of a shared library this Python has loaded (``libm``: harmless to preload)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        path = line.split()[-1]
        if Path(path).name.startswith(name):
            return Path(path)
    raise AssertionError(f"{name} is not loaded")


def _nsys_on_path(tmp_path: Path) -> tuple[Path, Path]:
    """A ``bin/nsys`` that runs tests/slurm/nsys_standin.py; returns (bin, record folder)."""
    bin_dir = tmp_path / "nsys_bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name("nsys_standin.py")} "$@"\n')
    nsys.chmod(0o755)
    return bin_dir, tmp_path / "nsys_calls"


def test_nsys_wraps_each_rank_with_its_own_report(slurm_cluster, tmp_path, job_folder, new_outputs, request):
    bin_dir, record = _nsys_on_path(tmp_path)
    # What an `nsys profile benchopt run ...` around the submitting shell would leave behind
    # (sbatch copies the environment into the job): a harmless library under an nsys name.
    fake_proxy = tmp_path / "nsight" / "libToolsInjectionProxy64.so"
    fake_proxy.parent.mkdir()
    fake_proxy.write_bytes(_loaded_library("libm.so").read_bytes())
    config = f"""
dataset:
  - {FRAMES}
solver:
  - PnP:
      denoiser: tv
      profiler_mode: nvidia
      "nproc_per_node, distribute_physics, slurm_ntasks_per_node, slurm_nodes":
        - [2, true, 2, 1]
max-runs: 2
n-repetitions: 1
"""
    reports = Path.cwd() / "outputs" / "nsys"  # slurm_setup creates it where benchopt runs from
    created = not reports.exists()
    request.addfinalizer(lambda: created and reports.is_dir() and not any(reports.iterdir()) and reports.rmdir())
    env = dict(slurm_cluster.env)
    env["PATH"] = f"{bin_dir}:{env['PATH']}"
    env.update(
        NSYS_STANDIN_RECORD=str(record),
        CUDA_INJECTION64_PATH=str(fake_proxy),
        NVTX_INJECTION64_PATH=str(fake_proxy),
        LD_PRELOAD=str(fake_proxy),
    )
    run_benchopt(
        BENCHMARK,
        _write(tmp_path, "nsys.yml", config),
        output=tmp_path / "nsys.parquet",
        extra_args=["--parallel-config", str(cluster_parallel_config("slurm_nsys.yml", slurm_cluster, tmp_path))],
        env=env,
        timeout_sec=300,
        **SUBMITIT_TIMING,
    )
    (job_id,) = job_folder.job_ids()
    calls = sorted((json.loads(p.read_text()) for p in record.glob("*.json")), key=lambda c: c["env"]["SLURM_PROCID"])
    assert [c["env"]["SLURM_PROCID"] for c in calls] == ["0", "1"], job_folder.logs()
    prefix = yaml.safe_load((PARALLEL_CONFIGS / "slurm_nsys.yml").read_text())["slurm_srun_args"]
    for rank, call in enumerate(calls):
        assert ["nsys", *call["argv"]] == prefix + call["command"]
        assert call["report"] == f"outputs/nsys/{job_id}_{slurm_cluster.host}_rank{rank}"
        assert call["command"][:4] == [sys.executable, "-u", "-m", "submitit.core._submit"]
        assert call["env"]["SLURM_JOB_ID"] == job_id and call["env"]["SLURM_NTASKS"] == "2"
        # slurm_setup cleared the outer nsys's hooks before this rank's nsys started.
        assert call["env"]["CUDA_INJECTION64_PATH"] is None and call["env"]["NVTX_INJECTION64_PATH"] is None
        assert "ToolsInjection" not in (call["env"]["LD_PRELOAD"] or "")
    script = job_folder.read(f"{job_id}_submission.sh")
    for line in (
        "#SBATCH --ntasks-per-node=2",
        "#SBATCH --nodes=1",
        f"#SBATCH --partition={slurm_cluster.partition}",
        "#SBATCH --time=00:30:00",
        "#SBATCH --cpus-per-task=1",
    ):
        assert line in script.splitlines(), script
    assert "srun --unbuffered" in script and " nsys profile -o " in script, script


def test_a_job_that_fails_on_the_cluster_fails_the_run_with_its_error(slurm_cluster, tmp_path, job_folder):
    """A setup line that fails on the compute node (a venv it cannot see) fails the job: the
    run fails with the job's state and error stream, instead of waiting or passing empty."""
    config = f"""
dataset:
  - {FRAMES}
solver:
  - PnP:
      denoiser: tv
max-runs: 1
n-repetitions: 1
"""
    parallel = cluster_parallel_config(
        "slurm.yml", slurm_cluster, tmp_path, setup_extra=("source /nonexistent/scopebench-venv/bin/activate",)
    )
    with pytest.raises(RuntimeError) as err:
        run_benchopt(
            BENCHMARK,
            _write(tmp_path, "one.yml", config),
            output=tmp_path / "failed.parquet",
            extra_args=["--parallel-config", str(parallel)],
            env=slurm_cluster.env,
            timeout_sec=300,
            **SUBMITIT_TIMING,
        )
    message = str(err.value)
    assert "state: FAILED" in message, message
    assert "/nonexistent/scopebench-venv/bin/activate: No such file or directory" in message, message
    assert not (tmp_path / "failed.parquet").exists()


def test_a_refused_value_in_a_job_fails_the_run_quoting_the_job_log(slurm_cluster, tmp_path, job_folder):
    """benchopt, which exits 0 whatever a cell did, reports a cell that refused its value in its job
    as a skip with its one-line reason (since issue 44; it raised before) and writes the other
    cells' rows; the checked run fails on that line, naming it, and quotes the jobs' logs."""
    config = f"""
dataset:
  - {FRAMES}
solver:
  - PnP:
      denoiser: tv
      denoiser_sigma: [0.01, -1.0]
max-runs: 1
n-repetitions: 1
"""
    with pytest.raises(RuntimeError) as err:
        run_benchopt(
            BENCHMARK,
            _write(tmp_path, "bad_sigma.yml", config),
            output=tmp_path / "partial.parquet",
            extra_args=["--parallel-config", str(cluster_parallel_config("slurm.yml", slurm_cluster, tmp_path))],
            env=slurm_cluster.env,
            timeout_sec=300,
            **SUBMITIT_TIMING,
        )
    message = str(err.value)
    assert "failure line(s)" in message, message
    assert "Reason: refused: denoiser_sigma must be a finite number > 0, got -1" in message, message
    # its jobs' logs: quoted where a job wrote an error line (a warning may), else their folder named
    (folder,) = [entry for entry in job_folder.new_entries() if entry.is_dir()]
    assert "Submitit job logs:" in message and str(folder) in message, message
    # The empty success this guards against: benchopt itself wrote the good cell's rows.
    assert (tmp_path / "partial.parquet").exists()
