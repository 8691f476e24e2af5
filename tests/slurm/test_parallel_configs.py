"""The shipped parallel configs, and canaries for the benchopt 1.10 / Submitit seams they rest on."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import yaml

from scopebench.cluster import job_parameters, read_parallel_config
from scopebench.runs import run_benchopt

from .conftest import PARALLEL_CONFIGS, REPO, SUBMITIT_TIMING, JobFolder

SHIPPED = sorted(PARALLEL_CONFIGS.glob("*.yml"))
SLURM_TOOLS = {"srun", "sbatch", "squeue", "scancel", "scontrol", "sacct", "sinfo", "salloc", "sattach"}


class _Benchmark:
    """The one method of benchopt's Benchmark that its Submitit executor uses."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def get_slurm_folder(self) -> Path:
        return self.folder


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_benchopt_builds_a_submitit_executor_from_each_shipped_config(path, tmp_path):
    """benchopt's own reading and executor set-up accept every key of the file."""
    from benchopt.parallel_backends import check_parallel_config
    from benchopt.parallel_backends.slurm_executor import get_slurm_executor

    config = check_parallel_config(str(path), None)
    assert config.pop("backend") == "submitit"
    executor = get_slurm_executor(_Benchmark(tmp_path), dict(config), timeout=100)
    assert executor.cluster in ("slurm", "local")
    read_parallel_config(path)  # and check-config agrees


def test_slurm_configs_document_the_keys_people_edit():
    text = (PARALLEL_CONFIGS / "slurm.yml").read_text()
    config = yaml.safe_load(text)
    assert {"slurm_time", "slurm_partition", "slurm_additional_parameters", "slurm_setup"} <= set(config)
    assert "slurm_array_parallelism" in config
    for key in ("account", "qos", "constraint", "cpus-per-task", "module load", "activate", "slurm_python"):
        assert key in text, key
    nsys = yaml.safe_load((PARALLEL_CONFIGS / "slurm_nsys.yml").read_text())
    prefix = " ".join(nsys["slurm_srun_args"])
    assert prefix == (
        "nsys profile -o outputs/nsys/%q{SLURM_JOB_ID}_%q{SLURMD_NODENAME}_rank%q{SLURM_PROCID} --trace=cuda,nvtx "
        "--capture-range=cudaProfilerApi --capture-range-end=stop --cuda-memory-usage=true --sample=none "
        "--force-overwrite=true"
    )
    assert any("unset CUDA_INJECTION64_PATH NVTX_INJECTION64_PATH" in line for line in nsys["slurm_setup"])


@pytest.mark.parametrize("key, value", [("slurm_python", "nsys profile python"), ("n_jobs", 2)])
def test_canary_benchopt_fails_on_what_check_config_refuses(tmp_path, key, value):
    """If benchopt/Submitit start accepting these, check-config and the configs should use them."""
    from benchopt.parallel_backends.slurm_executor import get_slurm_executor

    with pytest.raises(NameError, match=key.split("_", 1)[1] if key == "slurm_python" else key):
        get_slurm_executor(_Benchmark(tmp_path), {key: value, "slurm_time": "00:30:00"}, timeout=100)


def test_canary_benchopt_makes_every_key_a_slurm_one():
    """So a parallel config cannot set Submitit's local executor (configs/parallel/local.yml says so)."""
    from benchopt.parallel_backends.slurm_executor import get_solver_slurm_config

    class Solver:
        _parameters = {}

    merged = get_solver_slurm_config(Solver(), {"local_timeout_min": 60, "timeout_min": 60})
    assert merged == {"slurm_local_timeout_min": 60, "slurm_time": 60}
    with pytest.raises(ValueError, match="local_timeout_min"):
        read_parallel_config_text("backend: submitit\nlocal_timeout_min: 60\n")


def read_parallel_config_text(text: str) -> dict:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yml") as fh:
        fh.write(text)
        fh.flush()
        return read_parallel_config(fh.name)


def test_canary_job_settings_merge_as_benchopt_merges_them():
    from benchopt.parallel_backends.slurm_executor import get_solver_slurm_config

    class Solver:
        slurm_params = {"slurm_time": "02:00:00", "slurm_tasks_per_node": 4, "slurm_partition": "big"}
        _parameters = {"slurm_ntasks_per_node": 2, "slurm_gres": "gpu:2", "denoiser": "tv"}

    parallel = {"slurm_time": "00:30:00", "slurm_partition": "gpu", "slurm_nodes": 1, "slurm_qos": "normal"}
    theirs = get_solver_slurm_config(Solver(), parallel)
    assert job_parameters({"backend": "submitit", **parallel}, Solver._parameters, Solver.slurm_params) == theirs


def _path_without_slurm(tmp_path: Path) -> str:
    """This PATH with every SLURM client left out (Submitit then runs jobs locally)."""
    farm = tmp_path / "bin_without_slurm"
    farm.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not Path(folder).is_dir():
            continue
        for tool in Path(folder).iterdir():
            target = farm / tool.name
            if tool.name not in SLURM_TOOLS and not target.exists() and os.access(tool, os.X_OK):
                target.symlink_to(tool)
    assert shutil.which("srun", path=str(farm)) is None
    return str(farm)


@pytest.mark.slow
def test_local_config_runs_cells_as_local_submitit_jobs(tmp_path):
    config = tmp_path / "local_run.yml"
    config.write_text(
        "dataset:\n  - simulated[image_size=32]\nsolver:\n  - PnP:\n      denoiser: tv\n"
        "max-runs: 2\nn-repetitions: 1\n"
    )
    jobs = JobFolder(REPO / "benchmark_inference")
    try:
        run = run_benchopt(
            REPO / "benchmark_inference",
            config,
            output=tmp_path / "local.parquet",
            extra_args=["--parallel-config", str(PARALLEL_CONFIGS / "local.yml")],
            env={"PATH": _path_without_slurm(tmp_path), "SLURM_CONF": "/nonexistent"},
            timeout_sec=300,
            **SUBMITIT_TIMING,
        )
        logs = [p for p in jobs.new_files() if p.name.endswith("_log.out")]
        assert len(logs) == 1, jobs.new_files()
        assert "Starting with JobEnvironment" in logs[0].read_text(), logs[0].read_text()
        assert "Distributed run with backend: submitit" in run.log and run.parquet.is_file()
        assert not any(p.name.endswith("_submission.sh") for p in jobs.new_files())  # no sbatch script
    finally:
        jobs.cleanup()


def test_check_config_submits_nothing(slurm_cluster, tmp_path):
    from scopebench.cli import main

    config = tmp_path / "run.yml"
    config.write_text("dataset:\n  - simulated[image_size=32]\nsolver:\n  - PnP[denoiser=tv]\n")
    jobs = JobFolder(REPO / "benchmark_inference")
    before = slurm_cluster.job_ids()
    env = slurm_cluster.env
    old = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        code = main(
            [
                "check-config",
                str(REPO / "benchmark_inference"),
                "--config",
                str(config),
                "--parallel-config",
                str(PARALLEL_CONFIGS / "slurm.yml"),
            ]
        )
    finally:
        for key, value in old.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    assert code == 0
    assert slurm_cluster.job_ids() == before and jobs.new_files() == []
