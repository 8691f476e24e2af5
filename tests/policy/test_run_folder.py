"""``scopebench train`` cannot lose or mix results: one run per output folder (a lock held for
the run's lifetime), no new run over finished checkpoints, an unwritable folder and a bad
``--nproc-per-node`` refused at set-up, before any step or process."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .helpers import train_tool as train

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")
#: A process that takes a folder's run lock, says so, and holds it until its stdin closes.
LOCK = ".scopebench_run.lock"
HOLD = (
    "import sys\n"
    "from scopebench.train.run_folder import RunFolderLock\n"
    "RunFolderLock.acquire(sys.argv[1])\n"
    "print('holding', flush=True)\n"
    "sys.stdin.read()\n"
)


def step_lines(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("step ")]


def read_until(proc: subprocess.Popen, start: str) -> list[str]:
    """``proc``'s output lines up to the first that begins with ``start`` (it must come)."""
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith(start):
            return lines
    raise AssertionError(f"{proc.args} ended (rc {proc.wait()}) without a line starting {start!r}:\n" + "".join(lines))


def snapshot(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under ``folder``: its content's hash and modification time."""
    return {
        str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


# -- the lock ------------------------------------------------------------------------------


def test_a_lock_left_by_a_killed_run_does_not_block_the_next_one(tmp_path):
    from scopebench.train.run_folder import LOCK_FILE, RunFolderLock

    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline() == "holding\n"
        expected = f"output_dir {tmp_path} is in use by another scopebench train run (pid {holder.pid} on host "
        with pytest.raises(ValueError, match="wait for it or choose another --output_dir") as busy:
            RunFolderLock.acquire(tmp_path)
        assert str(busy.value).startswith(expected), busy.value
        holder.kill()  # SIGKILL: no clean-up ran, the kernel released the lock
        holder.wait()
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == holder.pid  # left behind, unlocked
    lock = RunFolderLock.acquire(tmp_path)
    owner = json.loads((tmp_path / LOCK_FILE).read_text())
    assert owner["pid"] == os.getpid() and owner["host"] == socket.gethostname() and owner == lock.owner
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_ranks_started_by_the_owner_do_not_refuse_its_lock(tmp_path, monkeypatch):
    from scopebench.distributed import get_dist_info
    from scopebench.train.run_folder import LOCK_FILE, OWNER_ENV, own_run_folder

    single = get_dist_info({})
    rendezvous = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    rank0 = get_dist_info({**rendezvous, "RANK": "0", "LOCAL_RANK": "0"})
    rank1 = get_dist_info({**rendezvous, "RANK": "1", "LOCAL_RANK": "1"})
    monkeypatch.delenv(OWNER_ENV, raising=False)
    with own_run_folder(tmp_path, info=single) as env:  # the process the user started
        assert json.loads(env[OWNER_ENV]) == json.loads((tmp_path / LOCK_FILE).read_text())
        with own_run_folder(tmp_path, info=rank1) as inner:  # only rank 0 ever owns a folder
            assert inner == {}
        with pytest.raises(ValueError, match=f"in use by another scopebench train run \\(pid {os.getpid()} "):
            with own_run_folder(tmp_path, info=rank0):  # a rank 0 of another run (torchrun by hand)
                pass
        monkeypatch.setenv(OWNER_ENV, env[OWNER_ENV])  # what the owner hands to the ranks it launches
        with own_run_folder(tmp_path, info=rank0) as inner:
            assert inner == {}
        assert (tmp_path / LOCK_FILE).exists()  # still the owner's
    assert not (tmp_path / LOCK_FILE).exists()
    with own_run_folder(tmp_path, info=rank0):  # a stale variable: nobody holds the folder, rank 0 takes it
        assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    assert not (tmp_path / LOCK_FILE).exists()


@pytest.fixture
def holding(tmp_path):
    """Start a process holding an output folder's run lock; yields it once it holds it (it said so)."""
    procs = []

    def hold(folder: Path) -> subprocess.Popen:
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline() == "holding\n"  # the event: it holds both locks now
        return proc

    yield hold
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.parametrize("layout", ["both_linked", "second_linked_to_the_first"])
def test_two_output_folders_sharing_one_checkpoints_folder_are_refused(tmp_path, holding, layout):
    """Each run's checkpoints/ a link to one scratch folder: both ran and replaced each other's
    checkpoints (only the output folder's name was locked)."""
    from scopebench.train.run_folder import RunFolderLock

    first, second, scratch = tmp_path / "a", tmp_path / "b", tmp_path / "scratch" / "ckpt"
    first.mkdir()
    second.mkdir()
    if layout == "both_linked":
        scratch.mkdir(parents=True)
        (first / "checkpoints").symlink_to(scratch)
    (second / "checkpoints").symlink_to(scratch if layout == "both_linked" else first / "checkpoints")
    holder = holding(first)
    real = (second / "checkpoints").resolve()
    with pytest.raises(ValueError) as busy:
        RunFolderLock.acquire(second)
    assert str(busy.value).startswith(
        f"checkpoints folder {real} ({second / 'checkpoints'} -> {real}) is in use by another scopebench train run "
        f"(pid {holder.pid} on host {socket.gethostname()}, started "
    ), busy.value
    assert str(busy.value).endswith(
        f", output_dir {first.resolve()}): its checkpoints would replace each other's; wait for it, or give each run "
        "a checkpoints folder of its own"
    ), busy.value
    assert not (second / ".scopebench_run.lock").exists()  # the output folder's lock was given back
    holder.stdin.close()
    assert holder.wait() == 0
    RunFolderLock.acquire(second).release()  # the first run ended: the folder is free


def test_a_run_whose_checkpoints_folder_another_run_writes_is_refused_in_one_line(data_args, tmp_path, holding, capsys):
    first, second = tmp_path / "a", tmp_path / "b"
    (tmp_path / "scratch").mkdir()
    for run in (first, second):
        run.mkdir()
        (run / "checkpoints").symlink_to(tmp_path / "scratch")
    holder = holding(first)
    code, out, err = train([*data_args, "--output_dir", str(second), "--steps", "2"], capsys)
    assert code == 2, out + err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"scopebench train: checkpoints folder {(tmp_path / 'scratch').resolve()} "
    ), err
    assert f"(pid {holder.pid} on host " in lines[0] and f"output_dir {first.resolve()})" in lines[0], err
    assert not step_lines(out) and list((tmp_path / "scratch").iterdir()) == [tmp_path / "scratch" / LOCK]


def test_a_checkpoints_link_that_dangles_is_named(tmp_path):
    from scopebench.train.run_folder import RunFolderLock

    (tmp_path / "checkpoints").symlink_to(tmp_path / "unmounted")
    with pytest.raises(
        ValueError, match=r"checkpoints -> .*unmounted cannot be the checkpoints folder \(File exists\)"
    ):
        RunFolderLock.acquire(tmp_path)


@pytest.mark.slow
def test_a_second_run_into_a_busy_folder_is_refused_naming_the_first(data_args, tmp_path):
    from scopebench.train.run_folder import LOCK_FILE

    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-m", "scopebench.cli", "train", *data_args, "--output_dir", str(run)]
        + ["--steps", "1000000", "--log_freq", "1", "--save_freq", "25"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        lines = read_until(first, "step ")  # it takes the folder at set-up: it holds it now
        second = subprocess.run(
            [sys.executable, "-m", "scopebench.cli", "train", *data_args, "--output_dir", str(run)]
            + ["--steps", "4", "--save_freq", "2", "--seed=1"],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert second.returncode == 2, second.stdout + second.stderr
        assert (
            f"output_dir {run} is in use by another scopebench train run (pid {first.pid} on host "
            f"{socket.gethostname()}, started " in second.stderr
        ), second.stderr
        assert "wait for it or choose another --output_dir" in second.stderr
        assert not step_lines(second.stdout), second.stdout
        lines += read_until(first, "saved ")  # the first run still saves after the refusal
        first.send_signal(signal.SIGTERM)
        lines += first.communicate(timeout=300)[0]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 128 + signal.SIGTERM, "".join(lines)[-4000:]
    finished = sorted(p for p in (run / "checkpoints").iterdir() if (p / "training_step.json").is_file())
    assert finished, "".join(lines)[-4000:]
    for checkpoint in finished:  # every checkpoint is the first run's (the second had seed 1, 4 steps)
        config = yaml.safe_load((checkpoint / "train_config.yaml").read_text())
        assert (config["seed"], config["training"]["steps"]) == (0, 1000000), checkpoint
    assert not (run / LOCK_FILE).exists()  # removed when the first run ended


# -- finished checkpoints ------------------------------------------------------------------


def test_check_output_dir_refuses_any_finished_checkpoint(tmp_path):
    from scopebench.policy.run.trainer import check_output_dir

    checkpoints = tmp_path / "run" / "checkpoints"
    (checkpoints / ".000006.123.abc.tmp").mkdir(parents=True)  # a crashed save's debris: not finished
    (checkpoints / "000006").mkdir()  # no training_step.json: never finished
    check_output_dir(tmp_path / "run", resume=False)
    (checkpoints / "000004").mkdir()
    (checkpoints / "000004" / "training_step.json").write_text('{"step": 4}')
    with pytest.raises(ValueError) as refused:
        check_output_dir(tmp_path / "run", resume=False)
    message = str(refused.value)
    assert f"output_dir {tmp_path / 'run'} already holds checkpoints" in message and "000004" in message
    assert "--resume true" in message and "choose another --output_dir" in message
    check_output_dir(tmp_path / "run", resume=True)


@pytest.mark.slow
def test_a_new_run_refuses_finished_checkpoints_without_a_last_link(data_args, tmp_path, capsys):
    run = tmp_path / "run"
    code, _, err = train([*data_args, "--output_dir", str(run), "--steps", "2", "--save_freq", "1"], capsys)
    assert code == 0, err
    (run / "checkpoints" / "last").unlink()
    before = snapshot(run)
    assert "checkpoints/000002/model.safetensors" in before
    code, out, err = train([*data_args, "--output_dir", str(run), "--steps", "2", "--seed=1"], capsys)
    assert code == 2, out + err
    assert f"output_dir {run} already holds checkpoints" in err and "000002" in err and "--resume true" in err, err
    assert not step_lines(out), out
    assert snapshot(run) == before


# -- set-up checks -------------------------------------------------------------------------


def test_an_unwritable_output_dir_is_refused_before_any_step(data_args, read_only_dir, capsys, started):
    target = read_only_dir / "run"
    code, out, err = train([*data_args, "--output_dir", str(target), "--steps", "2", "--save_freq", "0"], capsys)
    assert code == 2, out + err
    assert f"training.output_dir={str(target)!r} is not a writable directory" in err, err
    assert not step_lines(out) and started == [], out


@pytest.mark.parametrize(
    ("nproc", "message"),
    [("0", "nproc_per_node must be an integer >= 1, got 0"), ("9999", "nproc_per_node=9999 exceeds the")],
)
def test_nproc_per_node_is_checked_before_any_process_starts(data_args, tmp_path, capsys, started, nproc, message):
    target = tmp_path / "run"
    code, out, err = train(
        [*data_args, "--device=cpu", "--nproc-per-node", nproc, "--output_dir", str(target), "--steps", "1"], capsys
    )
    assert code == 2 and message in err, out + err
    assert started == [] and not step_lines(out) and not target.exists(), out
