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
