"""Fixtures for tests that submit real SLURM jobs.

``slurm_cluster`` (module): a real single-node SLURM; ``slurm_two_nodes`` (module): two
nodes, each in its own network namespace (:mod:`.cluster`, one recipe, two layouts). One
cluster lives at a time (they share ports and :data:`.cluster.LOCK_PATH`): the session's
:class:`Clusters` keeps the last one up for the next module and switches layout when a
module needs the other (about 2 s). Skipped when a prerequisite is missing outside CI;
with ``CI`` set (``.ci/run``), a missing prerequisite fails the tests instead, since
``scripts/install_system_packages.sh`` should have installed it.

``job_folder``: the benchmark's Submitit folder, with the files a test's jobs add removed
afterwards (job ids restart with each cluster, so stale ``<id>_result.pkl`` files would be
taken for the results of a new job with the same id).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PARALLEL_CONFIGS = REPO / "configs" / "parallel"
#: Submitit's timing in these tests (see :func:`scopebench.runs.run_benchopt`): benchopt checks
#: for finished jobs every second, not every 10 s (5 s more per run on average), and a job
#: that failed without a result file counts as failed after 2 s, not 15 s (the file system
#: is local: a result file is there before its job ends).
SUBMITIT_TIMING = {"submitit_poll_sec": 1.0, "submitit_result_wait_sec": 2.0}


class Clusters:
    """The session's one running cluster, in the layout the current module asked for."""

    def __init__(self) -> None:
        self._stack: contextlib.ExitStack | None = None
        self.cluster = None

    def get(self, nodes: int):
        from .cluster import local_slurm, missing_prerequisites

        if self.cluster is not None and len(self.cluster.nodes) == nodes:
            return self.cluster
        self.close()
        missing = missing_prerequisites(nodes)
        if missing:
            message = (
                f"a local {nodes}-node SLURM needs {', '.join(missing)}; scripts/install_system_packages.sh "
                "installs the Debian packages (slurmctld slurmd slurm-client munge iproute2)"
            )
            if os.environ.get("CI"):
                pytest.fail(message)
            pytest.skip(message)
        self._stack = contextlib.ExitStack()
        self.cluster = self._stack.enter_context(local_slurm(nodes))
        return self.cluster

    def close(self) -> None:
        stack, self._stack, self.cluster = self._stack, None, None
        if stack is not None:
            stack.close()


@pytest.fixture(scope="session")
def slurm_clusters():
    clusters = Clusters()
    yield clusters
    clusters.close()


@pytest.fixture(scope="module")
def slurm_cluster(slurm_clusters):
    """A single-node cluster (this host on 127.0.0.1)."""
    return slurm_clusters.get(1)


@pytest.fixture(scope="module")
def slurm_two_nodes(slurm_clusters):
    """Two nodes ``sbslurm1``, ``sbslurm2``, each slurmd in its own network namespace."""
    return slurm_clusters.get(2)


class JobFolder:
    """``<benchmark>/benchopt_run``: what the runs since the snapshot wrote there (each run in
    its own ``<run id>/`` folder, :func:`scopebench.runs.job_folder`)."""

    def __init__(self, benchmark: Path) -> None:
        self.path = benchmark / "benchopt_run"
        self.before = set(self.path.iterdir()) if self.path.is_dir() else set()

    def new_entries(self) -> list[Path]:
        return sorted(set(self.path.iterdir()) - self.before) if self.path.is_dir() else []

    def new_files(self) -> list[Path]:
        files = []
        for entry in self.new_entries():
            files += sorted(p for p in entry.rglob("*") if p.is_file()) if entry.is_dir() else [entry]
        return files

    def job_ids(self) -> list[str]:
        """Ids of the jobs submitted since the snapshot (from their sbatch scripts)."""
        return sorted({p.name.split("_")[0] for p in self.new_files() if p.name.endswith("_submission.sh")}, key=int)

    def find(self, name: str) -> Path:
        """A file the new runs wrote, by name (``<job id>_<task>_log.out``...)."""
        found = [p for p in self.new_files() if p.name == name]
        return found[0] if found else self.path / name

    def read(self, name: str) -> str:
        path = self.find(name)
        return path.read_text(errors="replace") if path.exists() else ""

    def logs(self) -> str:
        """Every new job log, each under its file name (for assertion messages)."""
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in self.new_files() if "_log." in p.name
        )

    def assert_tasks_were_the_ranks(self, ntasks: int = 2) -> None:
        """The one job ran as SLURM tasks 0..ntasks-1 (not a local spawn), each to completion."""
        import pickle

        (job_id,) = self.job_ids()
        for task in range(ntasks):
            assert f"global_rank={task}({ntasks})" in self.read(f"{job_id}_{task}_log.out"), self.logs()
            # benchopt keeps task 0's rows; every task must still have finished its own run.
            with open(self.find(f"{job_id}_{task}_result.pkl"), "rb") as fh:
                outcome, (_, _, status, _) = pickle.load(fh)
            assert outcome == "success" and status in ("done", "max_runs"), (outcome, status, self.logs())
        assert "Traceback" not in self.logs(), self.logs()

    def cleanup(self) -> None:
        for path in self.new_entries():
            shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)


@pytest.fixture
def job_folder():
    folder = JobFolder(REPO / "benchmark_inference")
    yield folder
    folder.cleanup()


@pytest.fixture
def new_outputs():
    """Removes the per-rank files a test's runs add to ``benchmark_inference/outputs``."""
    outputs = REPO / "benchmark_inference" / "outputs"
    before = set(outputs.iterdir()) if outputs.is_dir() else set()

    def added() -> list[Path]:
        return sorted(set(outputs.iterdir()) - before) if outputs.is_dir() else []

    yield added
    for path in added():
        if path.is_file():
            path.unlink()


def cluster_parallel_config(name: str, cluster, tmp_path: Path, setup_extra: tuple[str, ...] = ()) -> Path:
    """A shipped parallel config with what differs on the test cluster: its partition, one
    core per rank (the node has only this machine's cores) and one thread per rank, and no
    account/qos/constraint (the other sbatch options, such as ``no-requeue``, stay).

    One thread: the ranks of a test share two cores, and each one's spare OpenMP threads
    spin beside the others' ranks (the two-node ``Pi05Train`` test, 18 ranks: 77-85 s with
    one thread, 92-107 s without, interleaved).
    """
    config = yaml.safe_load((PARALLEL_CONFIGS / name).read_text())
    config["slurm_partition"] = cluster.partition
    site = ("account", "qos", "constraint")
    extra = {k: v for k, v in config.get("slurm_additional_parameters", {}).items() if k not in site}
    config["slurm_additional_parameters"] = {**extra, "cpus-per-task": 1}
    config["slurm_setup"] = [*config.get("slurm_setup", []), "export OMP_NUM_THREADS=1", *setup_extra]
    path = tmp_path / f"test_cluster_{name}"
    path.write_text(yaml.safe_dump(config))
    return path
