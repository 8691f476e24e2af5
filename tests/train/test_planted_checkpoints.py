"""A run folder or checkpoint someone ships cannot make scopebench touch files outside it.

Each test plants one thing in a copy of a genuine run folder (a tiny ``ddp`` run of 2 steps,
and an ``fsdp2`` one for torch.distributed.checkpoint's ``.metadata``) and checks that
``scopebench train`` (a new run, a resume) and ``convert-checkpoint`` refuse it in one line
naming it, exit 2, and leave the file it points at byte-identical:

* a lock file that is a link (``.scopebench_run.lock``, a ``--json`` output's ``.res.json.lock``);
* a path a checkpoint names that leads out of it (``..`` or absolute in the manifest or in DCP's
  ``relative_path``, a shard replaced by a link out and dropped from the manifest);
* data that would make a loader run for ever or allocate without bound (a ``/proc`` file or a
  FIFO in the manifest, a ``world_size`` of 10^12, DCP sizes of 10^12 elements or negative).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from scopebench.cli import main

TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"
CHECKPOINT = Path("checkpoints") / "000002"


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """``scopebench train`` on one process, 2 steps, a checkpoint at step 2: (run folder, dataset cache)."""
    run, cache = tmp_path_factory.mktemp("ddp_run") / "run", tmp_path_factory.mktemp("datasets")
    args = ["--config", str(TINY), f"--dataset.cache_dir={cache}", "--output_dir", str(run), "--steps", "2"]
    assert main(["train", *args, "--save_freq", "2"]) == 0
    return run, cache


def _copy(run: Path, tmp_path: Path, name: str = "run") -> Path:
    """A copy of a module's run folder, to plant into."""
    return Path(shutil.copytree(run, tmp_path / name, symlinks=True))


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def _refused(result: tuple[int, str, str], command: str, *expected: str) -> str:
    """The one line of a refusal (exit 2, no traceback), holding every ``expected`` text."""
    code, out, err = result
    assert code == 2, out + err
    lines = [line for line in err.splitlines() if line.startswith(f"scopebench {command}:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


def _victim(tmp_path: Path) -> tuple[Path, bytes]:
    """A file of the user's that nothing may write (what ``~/.bashrc`` stands for)."""
    victim = tmp_path / "bashrc"
    content = b"export PATH=$HOME/bin:$PATH\n"
    victim.write_bytes(content)
    return victim, content


def _train(run: Path, cache: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(TINY), f"--dataset.cache_dir={cache}", "--output_dir", str(run), *extra]


# -- lock files are never links ----------------------------------------------------------------------
def test_a_shipped_run_folders_lock_link_is_refused_on_resume(ddp_run, tmp_path, capsys):
    run = _copy(ddp_run[0], tmp_path)
    victim, content = _victim(tmp_path)
    lock = run / ".scopebench_run.lock"
    lock.symlink_to(victim)
    result = _cli(capsys, *_train(run, ddp_run[1], "--resume", "true", "--steps", "4"))
    _refused(result, "train", f"{lock} -> {victim}: a lock file is never a link; refused, nothing was written")
    assert victim.read_bytes() == content
    assert (run / "checkpoints" / "last").resolve().name == "000002"  # nothing trained


def test_a_new_run_into_a_folder_with_a_lock_link_is_refused(ddp_run, tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    victim, content = _victim(tmp_path)
    (run / ".scopebench_run.lock").symlink_to(victim)
    result = _cli(capsys, *_train(run, ddp_run[1], "--steps", "2"))
    _refused(result, "train", "a lock file is never a link")
    assert victim.read_bytes() == content
    assert not (run / "checkpoints").exists()


def test_a_json_outputs_lock_link_in_a_shared_folder_is_refused(ddp_run, tmp_path, capsys):
    shared = tmp_path / "results"
    shared.mkdir()
    victim, content = _victim(tmp_path)
    (shared / ".res.json.lock").symlink_to(victim)
    checkpoint = _copy(ddp_run[0], tmp_path) / CHECKPOINT
    result = _cli(capsys, "convert-checkpoint", str(checkpoint), "--json", str(shared / "res.json"))
    _refused(result, "convert-checkpoint", f"{shared / '.res.json.lock'} -> {victim}: a lock file is never a link")
    assert victim.read_bytes() == content
    assert not (shared / "res.json").exists()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _relist(checkpoint: Path, name: str, entry: dict | None = None) -> None:
    """Rewrite ``name``'s manifest entry as a planter would (its real size and hash; None: drop it)."""
    manifest_file = checkpoint / "manifest.json"
    manifest = json.loads(manifest_file.read_text())
    if entry is None and name in manifest["files"]:
        del manifest["files"][name]
    elif entry is not None:
        manifest["files"][name] = entry
    manifest_file.write_text(json.dumps(manifest))
