"""Shared test fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: A worker target whose import fails on purpose (--doctest-modules would import it).
collect_ignore = ["distributed/broken_worker_module.py"]


#: Tests that share a session fixture or a file outside their own ``tmp_path``: under
#: pytest-xdist (``make test``) each unit runs whole on one worker, the units in this order
#: before every other file (the longest first). A unit is named by its first path.
#:
#: - the SLURM tests share one cluster a host, and write their per-rank files into
#:   ``benchmark_inference/outputs``, which ``tests/benchmark_inference`` checks is left as it was;
#: - the report tests share the quickstart runs; they, ``tests/benchmark_training`` and
#:   ``tests/test_runs.py`` run the training quickstart, which saves its denoiser in
#:   ``benchmark_training/outputs``, and each removes the files written there since it started.
SHARED_UNITS = (
    ("tests/slurm/", "tests/benchmark_inference/"),
    ("tests/report/", "tests/benchmark_training/", "tests/test_runs.py"),
)


def pytest_configure(config):
    """On an xdist worker, its share of the CPUs for the threads of every process it starts.

    Two workers on two cores each get one: a run that starts with as many OpenMP threads as
    the machine has cores, beside another worker's, waits on its own threads (a two-process
    test took 158 s instead of 44 s). Set before torch is imported here or in any rank.
    """
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // workers)))


def _work_unit(nodeid: str) -> str:
    """The tests that run together on one worker: a unit of :data:`SHARED_UNITS` (its first path), else the file.

    >>> _work_unit("tests/benchmark_inference/test_benchmark.py::test_x"), _work_unit("tests/test_stats.py::t")
    ('tests/slurm/', 'tests/test_stats.py')
    """
    file = nodeid.split("::", 1)[0]
    for unit in SHARED_UNITS:
        if any(file == path or (path.endswith("/") and file.startswith(path)) for path in unit):
            return unit[0]
    return file


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the units of :data:`SHARED_UNITS` whole, handed out in collection order.

    A file runs whole on one worker, so its module fixtures are built once. (xdist's own
    ``loadgroup`` names groups by rewriting node ids, which pytest 9.2 no longer allows.)
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FolderScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _work_unit(nodeid)

    config.option.loadscopereorder = False  # the order of pytest_collection_modifyitems below
    return FolderScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """On an xdist worker, the units of :data:`SHARED_UNITS` first; the ``gpu`` tests skipped without CUDA.

    Tests marked ``gpu`` need CUDA: on a machine without it they are skipped, with the reason.
    ``scripts/gpu_check.sh`` runs exactly these tests (``pytest -m gpu``) on a GPU machine.
    """
    if hasattr(config, "workerinput"):  # every worker sorts alike: xdist checks they agree
        order = {unit[0]: i for i, unit in enumerate(SHARED_UNITS)}
        items.sort(key=lambda item: order.get(_work_unit(item.nodeid), len(order)))
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA (marked gpu; run by scripts/gpu_check.sh on a GPU machine)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def scheduling_unchanged():
    """Fail the test that leaves the session's thread with another scheduling policy.

    A library that makes the thread real-time (SVT-AV1 does, as root) freezes the rest of the
    suite the moment a test runs a busy loop beside it; the policy is restored for the next test.
    """
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    yield
    after = (os.sched_getscheduler(0), os.sched_getparam(0))
    if after != before:
        os.sched_setscheduler(0, *before)
        pytest.fail(f"the test changed this thread's scheduling from {before} to {after} (restored)")


@pytest.fixture
def one_thread():
    """Run a test on one intra-op thread, then restore the setting.

    The models in tests are too small to gain from a second thread, and on a busy
    2-core machine two OpenMP threads wait on each other (a 200-step training test took
    50 s instead of 2 s).
    """
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def worker_path(monkeypatch):
    """Make ``tests/`` importable by spawned workers (they inherit the environment)."""
    tests_dir = str(Path(__file__).resolve().parent)
    current = os.environ.get("PYTHONPATH", "")
    monkeypatch.setenv("PYTHONPATH", tests_dir + (os.pathsep + current if current else ""))
    return tests_dir


def run_benchopt_test(benchmark: Path) -> str:
    """``benchopt test <benchmark> --skip-install`` with this venv's pytest; returns its log.

    benchopt starts ``pytest`` from PATH, so the venv's ``bin`` goes first.
    """
    import subprocess
    import sys

    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "benchopt", "test", str(benchmark), "--skip-install"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        stdin=subprocess.DEVNULL,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    assert " passed" in log and " failed" not in log, log[-4000:]
    return log


@pytest.fixture
def read_only_dir(tmp_path):
    """A folder nobody can write to, not even root: a read-only tmpfs (root) or mode 0500.

    chmod alone does not stop root, who runs CI here, so as root the folder is a
    read-only mount, unmounted at the end.
    """
    import subprocess

    path = tmp_path / "read_only"
    path.mkdir()
    mounted = False
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(path)], check=True)
        mounted = True
    else:
        path.chmod(0o500)
    assert not os.access(path, os.W_OK), f"could not make {path} read-only"
    yield path
    if mounted:
        subprocess.run(["umount", str(path)], check=True)
    else:
        path.chmod(0o700)


# --- contention: a busy-loop process on each core (tests/report/test_contention.py, the tools) ---


def machine_other_pct(seconds: float = 1.0) -> float:
    """Other processes' share of this process's CPUs over ``seconds`` (this test's group excluded)."""
    from scopebench.host_load import OwnTime, read_cpu_times, shares, usable_cpus

    own, cpus = OwnTime(), usable_cpus()
    a = (read_cpu_times(cpus), own.read())
    time.sleep(seconds)  # the measurement interval itself, not a synchronisation
    return shares(a, (read_cpu_times(cpus), own.read()))["host_other_cpu_pct"]


@pytest.fixture
def hogs():
    """A busy-loop process on each CPU this process may use, in its own session (not the run's group)."""
    from scopebench.host_load import usable_cpus

    procs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True) for _ in usable_cpus()
    ]
    try:
        for proc in procs:  # running, not just started: each has used CPU time
            while True:
                with open(f"/proc/{proc.pid}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                if int(fields[11]) + int(fields[12]) > 0:
                    break
                time.sleep(0.01)
        yield procs
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
