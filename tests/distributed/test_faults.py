"""Faults of a local multi-process run, injected by the tests on 2 real gloo ranks.

A killed worker fails the run quickly, naming the rank, its signal and its last
iteration; a stopped worker fails it at the group timeout, naming the rank, and so does
one that hangs in its own code (with its stack); a killed
rank 0 leaves no worker and no temporary folder behind; the local rendezvous listens on
the loopback interface only.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from scopebench.distributed import DistSession, RankFailure
from scopebench.distributed.faults import process_state

pytestmark = pytest.mark.slow

TESTS = Path(__file__).resolve().parents[1]
FRAMES = {"kind": "multiframe_superres", "image_size": 32, "num_operators": 4, "scale": 2, "noise_level": 0.02}


def gone(pid: int) -> bool:
    """No such process, or only its zombie (it ran to its end; nobody reaped it yet)."""
    return process_state(pid) in (None, "Z")


def listening_addresses(pid: int) -> list[str]:
    """Local ``address:port`` (hex, as in /proc/net/tcp*) of every TCP socket ``pid`` listens on."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                out.append(fields[1])
    return out


LOOPBACK = ("0100007F:", "00000000000000000000000001000000:")  # 127.0.0.1, ::1


def test_local_rendezvous_listens_on_loopback_only(worker_path):
    with DistSession(2, worker="distributed.workers:hold_until_released") as info:
        assert info.world_size == 2
        pids = [os.getpid(), *DistSession_worker_pids()]
        listening = {pid: listening_addresses(pid) for pid in pids}
        dist.barrier()
    assert all(listening.values()), listening  # gloo listens on every rank...
    for pid, addresses in listening.items():  # ...and only on the loopback interface
        assert all(a.startswith(LOOPBACK) for a in addresses), (pid, addresses)


def DistSession_worker_pids() -> list[int]:
    """Children of this process that run ``scopebench.distributed.worker``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == os.getpid() and b"scopebench.distributed.worker" in cmdline:
            pids.append(int(entry.name))
    return pids


def test_the_store_folder_is_private(worker_path):
    session = DistSession(2, worker="distributed.workers:hold_until_released")
    session.start()
    try:
        assert (session.run_dir.stat().st_mode & 0o777) == 0o700
        run_dir = session.run_dir
        dist.barrier()
    finally:
        session.close()
    assert not run_dir.exists()


def test_killed_worker_fails_the_run_naming_rank_signal_and_iteration(worker_path, tmp_path):
    from scopebench.imaging.inference.run import PnPRun

    run = PnPRun(
        FRAMES,
        {"denoiser": "tv", "denoiser_sigma": 0.01, "distribute_physics": True, "device": "cpu"},
        nproc=2,
        output_dir=tmp_path,
    )
    killed_at = []

    def callback() -> bool:
        if run.profiler.iteration == 5 and not killed_at:
            os.kill(run.session.worker_pids[0], signal.SIGKILL)
            killed_at.append(time.monotonic())
        return True

    with pytest.raises(RankFailure, match=r"^rank 1 died with SIGKILL after iteration 4($|\n)"):
        with run:
            run.loop(callback)
    assert time.monotonic() - killed_at[0] < 60
    assert not dist.is_initialized()


def test_stopped_worker_fails_at_the_group_timeout_naming_the_rank(worker_path):
    from distributed.workers import CountingRun

    timeout = 3.0
    run = CountingRun(nproc=2, device="cpu", group_timeout_sec=timeout)
    stopped_at = []

    def callback() -> bool:
        if run.profiler.iteration == 5 and not stopped_at:
            os.kill(run.session.worker_pids[0], signal.SIGSTOP)
            stopped_at.append(time.monotonic())
        return True

    with pytest.raises(RankFailure) as err:
        with run:
            worker = run.session.worker_pids[0]
            run_dir = run.session.run_dir
            run.loop(callback)
    waited = time.monotonic() - stopped_at[0]
    assert timeout <= waited < timeout + 20, waited
    assert str(err.value).startswith(
        "rank 1 is stopped (SIGSTOP or a debugger) after iteration 4; no progress within group_timeout_sec=3 s"
    ), err.value
    assert gone(worker) and not run_dir.exists()


def test_a_worker_hanging_in_its_own_code_is_named_with_its_stack(worker_path):
    """Both ranks finished iteration 4; rank 1 then waits in its own code, rank 0 in the
    all-reduce. Rank 0 times out; rank 1 neither fails nor leaves a note: named, with the
    stack it wrote into its log when asked (it was gloo's bare timeout traceback)."""
    from distributed.workers import HangingRun

    run = HangingRun(nproc=2, device="cpu", group_timeout_sec=3.0)
    with pytest.raises(RankFailure) as err:
        with run:
            worker = run.session.worker_pids[0]
            run.loop(lambda: True)
    text = str(err.value)
    assert text.startswith(
        "rank 1 hangs in its own code (or is too slow): it never reached the collective rank 0 waited for, "
        "after iteration 4; no progress within group_timeout_sec=3 s\n"
    ), text
    assert "Stack (most recent call first):" in text and "in hang_in_user_code" in text, text
    assert gone(worker) and not dist.is_initialized()


def test_group_timeout_reaches_the_workers_and_defaults_by_launcher(monkeypatch):
    # The documented defaults (launch.LOCAL_TIMEOUT_SEC, launch.LAUNCHER_TIMEOUT_SEC), written out.
    assert DistSession(1).timeout_sec == 60.0  # a local spawn
    assert DistSession(1, timeout_sec=7).timeout_sec == 7.0
    with pytest.raises(ValueError, match="group_timeout_sec must be a finite number > 0, got 0"):
        DistSession(1, timeout_sec=0)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert DistSession(2).timeout_sec == 600.0  # under torchrun / SLURM


def test_killed_rank_0_leaves_no_worker_and_no_temporary_folder(worker_path, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    driver = subprocess.Popen(
        [sys.executable, str(TESTS / "distributed" / "rank0_driver.py"), str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = driver.stdout.readline()
        assert line, driver.stderr.read()[-3000:]
        started = json.loads(line)
        (worker,) = started["workers"]
        assert not gone(worker) and Path(started["run_dir"]).is_dir()
        driver.kill()
        driver.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (gone(worker) and not Path(started["run_dir"]).exists()):
            time.sleep(0.1)
        assert gone(worker), f"worker {worker} outlived rank 0 by 10 s"
        assert not Path(started["run_dir"]).exists()
        assert list(tmp_path.iterdir()) == []  # no per-rank file of the broken run
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in locals().get("started", {}).get("workers", []):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
