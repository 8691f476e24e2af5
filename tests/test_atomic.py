"""Atomic writes: complete or absent, unpredictable temporaries, stale ones removed."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from scopebench.atomic import atomic_dir, atomic_write, remove_stale_temporaries


def test_failed_write_leaves_nothing(tmp_path):
    target = tmp_path / "out.csv"
    with pytest.raises(RuntimeError):
        with atomic_write(target) as fh:
            fh.write("half")
            raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_write_replaces_existing_file(tmp_path):
    target = tmp_path / "out.bin"
    target.write_bytes(b"old")
    with atomic_write(target, "wb") as fh:
        fh.write(b"new")
    assert target.read_bytes() == b"new"


def test_planted_symlink_at_predictable_name_is_not_followed(tmp_path):
    victim = tmp_path / "victim"
    victim.write_text("keep")
    target = tmp_path / "out.csv"
    # The old scheme's name: a symlink planted there must not receive the write.
    (tmp_path / f".out.csv.{os.getpid()}.tmp").symlink_to(victim)
    with atomic_write(target) as fh:
        fh.write("data")
    assert victim.read_text() == "keep" and target.read_text() == "data"


def test_atomic_dir_success_and_failure(tmp_path):
    final = tmp_path / "ckpt"
    with pytest.raises(ValueError):
        with atomic_dir(final) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x")
            raise ValueError("crash mid-write")
    assert list(tmp_path.iterdir()) == []
    with atomic_dir(final) as tmp:
        (tmp / "a").write_text("1")
    assert (final / "a").read_text() == "1"
    with pytest.raises(FileExistsError):
        with atomic_dir(final) as tmp:
            (tmp / "b").write_text("2")
    with atomic_dir(final, exist_ok=True) as tmp:
        (tmp / "b").write_text("2")
    assert sorted(p.name for p in final.iterdir()) == ["a"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_stale_temporaries_of_dead_processes_are_removed(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(dead.stdout)
    stale = tmp_path / f".data.{dead_pid}.abc.tmp"
    stale.mkdir()
    (stale / "frame.png").write_bytes(b"x" * 10)
    live = tmp_path / f".data.{os.getpid()}.def.tmp"
    live.mkdir()
    assert remove_stale_temporaries(tmp_path, "data") == [stale]
    assert not stale.exists() and live.exists()


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_written_files_and_folders_get_the_users_permissions(tmp_path, umask):
    # mkstemp / mkdtemp make 0600 / 0700: colleagues could not read a run's files.
    import stat

    from scopebench.atomic import atomic_dir, atomic_write, replace_dir, temporary_dir

    def mode(path):
        return stat.S_IMODE(os.stat(path).st_mode)

    old = os.umask(umask)
    try:
        with atomic_write(tmp_path / "a.csv") as fh:
            fh.write("x")
        with atomic_dir(tmp_path / "folder") as folder:
            (folder / "f").write_text("y")
        tmp = temporary_dir(tmp_path / "ckpt")
        replace_dir(tmp, tmp_path / "ckpt")
    finally:
        os.umask(old)
    assert mode(tmp_path / "a.csv") == 0o666 & ~umask
    assert mode(tmp_path / "folder") == 0o777 & ~umask
    assert mode(tmp_path / "ckpt") == 0o777 & ~umask


# -- one writer per output file ----------------------------------------------------------------------
#: A process that claims argv[1] as --json, says so, holds it until its stdin closes, then
#: releases it (as a command does when it ends).
CLAIM = (
    "import sys\n"
    "from scopebench.atomic import claim_output, release_outputs\n"
    "claim_output('--json', sys.argv[1])\n"
    "print('holding', flush=True)\n"
    "sys.stdin.read()\n"
    "release_outputs()\n"
)


@pytest.fixture
def holder(tmp_path):
    """Start a process holding ``tmp_path/out.json``; yields it once it holds the claim (it said so)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", CLAIM, str(tmp_path / "out.json")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout.readline() == "holding\n"  # the event: it holds the lock now
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.fixture
def released():
    """This process's claims are released after the test, as a command's end releases them."""
    from scopebench.atomic import release_outputs

    yield
    release_outputs()


def test_a_claimed_output_is_refused_to_a_second_process_naming_the_first(tmp_path, holder, released):
    import socket

    from scopebench.atomic import claim_output

    with pytest.raises(ValueError) as busy:
        claim_output("--png", tmp_path / "out.json")
    assert str(busy.value) == (
        f"--png {tmp_path / 'out.json'} is being written by another run (pid {holder.pid} on host "
        f"{socket.gethostname()}); choose another path or wait"
    )
    holder.stdin.close()  # the first run ends: its claim is released and its lock file removed
    assert holder.wait() == 0
    assert not (tmp_path / ".out.json.lock").exists()
    claim_output("--json", tmp_path / "out.json")


def test_a_lock_left_by_a_killed_process_does_not_block(tmp_path, holder, released):
    from scopebench.atomic import claim_output, read_lock_record, release_outputs

    holder.kill()  # SIGKILL: no clean-up ran; the kernel released the flock
    holder.wait()
    assert read_lock_record(tmp_path / ".out.json.lock")["pid"] == holder.pid  # left behind, unlocked
    claim_output("--json", tmp_path / "out.json")
    assert read_lock_record(tmp_path / ".out.json.lock")["pid"] == os.getpid()
    release_outputs()
    assert list(tmp_path.iterdir()) == []


def test_one_process_cannot_claim_a_file_under_two_keys_and_hands_its_claims_to_its_children(
    tmp_path, monkeypatch, released
):
    import json

    from scopebench.atomic import OUTPUTS_ENV, claim_output, claimed_outputs_env

    claim_output("--json", tmp_path / "out")
    with pytest.raises(ValueError, match=r"^--png '.*out' is also the --json path: give each output its own file$"):
        claim_output("--png", tmp_path / "sub" / ".." / "out")
    env = claimed_outputs_env()
    assert json.loads(env[OUTPUTS_ENV]) == {"pid": os.getpid(), "paths": [str(tmp_path.resolve() / "out")]}
    child = "import sys\nfrom scopebench.atomic import claim_output\nclaim_output('--json', sys.argv[1])\nprint('ok')"
    (tmp_path / "sub").mkdir()
    ran = subprocess.run(
        [sys.executable, "-c", child, str(tmp_path / "out")], env={**os.environ, **env}, capture_output=True, text=True
    )
    assert ran.returncode == 0 and ran.stdout == "ok\n", ran.stderr  # its parent holds it for it
    ran = subprocess.run(  # the same variable in a process its holder did not start: refused
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {child!r}, {str(tmp_path / 'out')!r}], check=True)",
        ],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    assert ran.returncode != 0 and "is being written by another run" in ran.stderr


# -- a lock file is never a link ---------------------------------------------------------------------
def _acquire(path):
    from scopebench.atomic import FileLock

    return FileLock.acquire(path, busy=lambda record: "busy", unprotected=lambda err: "unprotected")


@pytest.mark.parametrize("dangling", [False, True])
def test_a_lock_file_that_is_a_symlink_is_refused_and_its_target_left_as_it_was(tmp_path, dangling):
    """A lock followed through a link truncated and overwrote its target (``~/.bashrc``); a
    dangling link made ``O_CREAT`` create its target."""
    victim = tmp_path / "victim"
    if not dangling:
        victim.write_bytes(b"export PATH=...\n")
    lock = tmp_path / ".scopebench_run.lock"
    lock.symlink_to(victim)
    with pytest.raises(ValueError) as refused:
        _acquire(lock)
    assert str(refused.value) == (
        f"{lock} -> {victim}: a lock file is never a link; refused, nothing was written to it "
        "(remove it if you did not put it there)"
    )
    if dangling:
        assert not victim.exists()
    else:
        assert victim.read_bytes() == b"export PATH=...\n"
    assert lock.is_symlink()  # left for the user to look at


def test_a_lock_file_that_is_a_fifo_or_a_hard_link_is_refused_without_blocking_or_writing(tmp_path):
    fifo = tmp_path / ".a.lock"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match=rf"^{fifo} is a FIFO, not a regular file: a lock file is a regular file; "):
        _acquire(fifo)
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    linked = tmp_path / ".b.lock"
    os.link(victim, linked)
    with pytest.raises(ValueError, match=rf"^{linked} has 2 hard links \(it is another file's name too\)"):
        _acquire(linked)
    assert victim.read_bytes() == b"keep"
    folder = tmp_path / ".c.lock"
    folder.mkdir()
    with pytest.raises(ValueError, match=rf"^{folder} is a directory, not a regular file"):
        _acquire(folder)


def test_a_claimed_outputs_lock_that_is_a_link_is_refused(tmp_path, released):
    from scopebench.atomic import claim_output

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (tmp_path / ".res.json.lock").symlink_to(victim)
    with pytest.raises(ValueError, match=r"\.res\.json\.lock -> .*victim: a lock file is never a link"):
        claim_output("--json", tmp_path / "res.json")
    assert victim.read_bytes() == b"keep"


def test_reading_a_lock_record_never_reads_through_a_link_or_a_device(tmp_path):
    from scopebench.atomic import read_lock_record

    record = tmp_path / "record"
    record.write_text('{"pid": 1}')
    (tmp_path / "link").symlink_to(record)
    (tmp_path / "zero").symlink_to("/dev/zero")  # read_text would read for ever
    assert read_lock_record(record) == {"pid": 1}
    assert read_lock_record(tmp_path / "link") is None
    assert read_lock_record(tmp_path / "zero") is None
