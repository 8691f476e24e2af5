"""A full disk while a checkpoint is saved: one line naming the folder, ``last`` intact.

The run's output folder is on a real small file system: a tmpfs of a few megabytes mounted
in a mount namespace of the test's own (``unshare --mount``; without root, also a user
namespace), so nothing is mounted outside it and it vanishes with the process. The tiny
policy's checkpoint is about 2.9 MB: the first save (step 2) fits, the second (step 4)
does not. At 4 MB torch's zip writer fails first (it says only ``unexpected pos ...``), at
3.5 MB safetensors' (``os error 28``).
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"


def _namespace() -> list[str]:
    """The ``unshare`` command that gives a process its own mounts (root, or a user namespace)."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare(1) here: a small file system cannot be mounted for the test")
    command = [unshare, "--mount"] + ([] if os.geteuid() == 0 else ["--map-root-user"])
    probe = subprocess.run([*command, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here ({probe.stderr.strip()}): no small file system to fill")
    return command


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """The tiny config's dataset, outside the small file system."""
    from scopebench.policy.settings import DatasetSettings

    settings = DatasetSettings(cache_dir=str(tmp_path_factory.mktemp("datasets")))
    settings.materialize()
    return settings.cache_dir


@pytest.mark.parametrize("size", ["4m", "3500k"])
def test_a_full_disk_at_a_save_is_named_in_one_line_and_last_is_kept(tmp_path, cache, size):
    from scopebench.train.checkpoint import verify_files

    disk, copy = tmp_path / "disk", tmp_path / "after"
    disk.mkdir()
    run = disk / "run"
    train = [sys.executable, "-m", "scopebench.cli", "train", "--config", str(TINY), f"--dataset.cache_dir={cache}"]
    train += ["--output_dir", str(run), "--steps", "4", "--save_freq", "2"]
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(disk))} || exit 90\n"
        f"{shlex.join(train)} > {shlex.quote(str(tmp_path / 'out'))} 2> {shlex.quote(str(tmp_path / 'err'))}\n"
        f"echo $? > {shlex.quote(str(tmp_path / 'rc'))}\n"
        f"cp -a {shlex.quote(str(run))} {shlex.quote(str(copy))}\n"  # the mount ends with the namespace
    )
    done = subprocess.run([*_namespace(), "sh", "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    code, err = int((tmp_path / "rc").read_text()), (tmp_path / "err").read_text()
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(
        f"scopebench train: checkpoint 000004 could not be written: no space left on the device of {run / 'checkpoints'} ("
    ), lines[0]
    assert lines[0].endswith(
        f"); its partial folder was removed and the last checkpoint, step 2, is kept as {run / 'checkpoints' / 'last'}"
    ), lines[0]
    checkpoints = copy / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["000002", "last"]  # no partial folder left
    assert os.readlink(checkpoints / "last") == "000002"
    verify_files(checkpoints / "000002")  # complete, as written
