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


def _resume(run: Path, cache: Path, capsys) -> tuple[int, str, str]:
    """``scopebench train --resume true`` from the checkpoint's own config (its backend)."""
    config = run / CHECKPOINT / "train_config.yaml"
    args = ["--config", str(config), f"--dataset.cache_dir={cache}", "--output_dir", str(run)]
    return _cli(capsys, "train", *args, "--resume", "true", "--steps", "4")


def _convert(checkpoint: Path, capsys) -> tuple[int, str, str]:
    return _cli(capsys, "convert-checkpoint", str(checkpoint))


def _both_refuse(run: Path, cache: Path, capsys, *expected: str) -> None:
    """A resume and ``convert-checkpoint`` both refuse the checkpoint in one line with ``expected``."""
    _refused(_resume(run, cache, capsys), "train", *expected)
    _refused(_convert(run / CHECKPOINT, capsys), "convert-checkpoint", *expected)
    assert (run / "checkpoints" / "last").resolve().name == "000002"


# -- every path a checkpoint names is inside it --------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("../../../bashrc", "a path with '..'"),
        ("{victim}", "an absolute path"),
        ("/proc/self/pagemap", "an absolute path"),  # size 0 for stat, read for ever
    ],
)
def test_a_manifest_entry_naming_a_path_outside_the_checkpoint_is_refused(ddp_run, tmp_path, capsys, name, why):
    run = _copy(ddp_run[0], tmp_path)
    victim, content = _victim(tmp_path)
    name = name.format(victim=victim)
    size = 0 if name.startswith("/proc") else len(content)
    _relist(run / CHECKPOINT, name, {"bytes": size, "sha256": _sha256(victim)})
    manifest = run / CHECKPOINT / "manifest.json"
    _both_refuse(run, ddp_run[1], capsys, f"{manifest} names {name!r}, {why}: refused, a checkpoint names only files")


def test_a_listed_file_that_is_a_link_out_of_the_checkpoint_is_refused(ddp_run, tmp_path, capsys):
    """The manifest is consistent (the link's target's size and hash): the link itself is refused."""
    other = _copy(ddp_run[0], tmp_path, "other")
    run = _copy(ddp_run[0], tmp_path)
    link = run / CHECKPOINT / "model.safetensors"
    link.unlink()
    link.symlink_to(other / CHECKPOINT / "model.safetensors")
    _relist(run / CHECKPOINT, "model.safetensors", {"bytes": link.stat().st_size, "sha256": _sha256(link)})
    _both_refuse(
        run, ddp_run[1], capsys, f"names 'model.safetensors', a link out of {(run / CHECKPOINT).resolve()} ({link} -> "
    )


def test_an_unlisted_link_replacing_a_file_is_refused(ddp_run, tmp_path, capsys):
    """A shard replaced by a link to another run's and dropped from the manifest: the manifest passes,
    the loaders would open the link."""
    other = _copy(ddp_run[0], tmp_path, "other")
    run = _copy(ddp_run[0], tmp_path)
    link = run / CHECKPOINT / "optimizer.bin"
    link.unlink()
    link.symlink_to(other / CHECKPOINT / "optimizer.bin")
    _relist(run / CHECKPOINT, "optimizer.bin", None)
    _refused(_resume(run, ddp_run[1], capsys), "train", "optimizer.bin -> ", "does not list: refused")
    line = _refused(_convert(run / CHECKPOINT, capsys), "convert-checkpoint")
    assert line.endswith(
        f"optimizer.bin -> {other / CHECKPOINT / 'optimizer.bin'}: a link that "
        f"{(run / CHECKPOINT).resolve() / 'manifest.json'} does not list: refused, a checkpoint holds only the files "
        "its manifest lists (a shard replaced by a link and dropped from it?)"
    ), line


def test_an_unlisted_file_is_refused(ddp_run, tmp_path, capsys):
    run = _copy(ddp_run[0], tmp_path)
    (run / CHECKPOINT / "custom_checkpoint_0.pkl").write_bytes(b"x")  # accelerate would load it
    _both_refuse(
        run, ddp_run[1], capsys, "custom_checkpoint_0.pkl: not listed in ", "a file added after it was written"
    )


# -- nothing is read or allocated without bound ---------------------------------------------------------
def test_a_fifo_listed_in_the_manifest_is_refused_before_reading(ddp_run, tmp_path, capsys):
    import os

    run = _copy(ddp_run[0], tmp_path)
    os.mkfifo(run / CHECKPOINT / "extra.pkl")  # reading it would wait for a writer for ever
    _relist(run / CHECKPOINT, "extra.pkl", {"bytes": 0, "sha256": hashlib.sha256(b"").hexdigest()})
    _both_refuse(run, ddp_run[1], capsys, "extra.pkl is a FIFO, not a regular file", "refused before reading it")


def test_a_huge_world_size_is_refused_before_any_name_is_built(ddp_run, tmp_path, capsys):
    run = _copy(ddp_run[0], tmp_path)
    step_file = run / CHECKPOINT / "training_step.json"
    meta = json.loads(step_file.read_text())
    step_file.write_text(json.dumps({**meta, "world_size": 10**12}))
    _both_refuse(
        run, ddp_run[1], capsys, f"training_step.json: world_size {10**12}, but ", "holds 8 entries, and every rank"
    )


# -- torch.distributed.checkpoint's .metadata ---------------------------------------------------------
@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    """``scopebench train`` under fsdp2 on one process, 2 steps, a checkpoint at step 2."""
    run, cache = tmp_path_factory.mktemp("fsdp_run") / "run", tmp_path_factory.mktemp("datasets")
    args = ["--config", str(TINY), f"--dataset.cache_dir={cache}", "--output_dir", str(run), "--steps", "2"]
    assert main(["train", *args, "--save_freq", "2", "--backend=fsdp2", "--find_unused_params=false"]) == 0
    return run, cache


METADATA = "fsdp_model/.metadata"


def _replant_metadata(checkpoint: Path, change) -> None:
    """Rewrite ``fsdp_model/.metadata`` with ``change(metadata)`` applied, and its manifest entry
    to match (what a planter does: the manifest is no signature)."""
    import pickle

    from scopebench.train.data_only import read_dcp_metadata

    metadata = read_dcp_metadata(checkpoint / METADATA)
    change(metadata)
    (checkpoint / METADATA).write_bytes(pickle.dumps(metadata))
    data = (checkpoint / METADATA).read_bytes()
    _relist(checkpoint, METADATA, {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})


def _point_shards_at(path: str):
    def change(metadata) -> None:
        for info in metadata.storage_data.values():
            info.relative_path = path

    return change


@pytest.mark.parametrize("where", ["dotdot", "absolute"])
def test_a_dcp_relative_path_outside_its_folder_is_refused(fsdp_run, tmp_path, capsys, where):
    """Another run's shards would be consolidated into the model.safetensors users share."""
    other = _copy(fsdp_run[0], tmp_path, "other")
    run = _copy(fsdp_run[0], tmp_path)
    shard = other / CHECKPOINT / "fsdp_model" / "__0_0.distcp"
    name = str(shard) if where == "absolute" else "../../../../other/checkpoints/000002/fsdp_model/__0_0.distcp"
    why = "an absolute path" if where == "absolute" else "a path with '..'"
    _replant_metadata(run / CHECKPOINT, _point_shards_at(name))
    metadata = (run / CHECKPOINT).resolve() / METADATA
    _both_refuse(run, fsdp_run[1], capsys, f"{metadata} names {name!r}, {why}: refused")
    assert not (run / CHECKPOINT / "model.safetensors").exists()


def test_an_unlisted_shard_link_out_of_the_checkpoint_is_refused(fsdp_run, tmp_path, capsys):
    other = _copy(fsdp_run[0], tmp_path, "other")
    run = _copy(fsdp_run[0], tmp_path)
    link = run / CHECKPOINT / "fsdp_model" / "__0_0.distcp"
    link.unlink()
    link.symlink_to(other / CHECKPOINT / "fsdp_model" / "__0_0.distcp")
    _relist(run / CHECKPOINT, "fsdp_model/__0_0.distcp", None)
    _both_refuse(run, fsdp_run[1], capsys, "fsdp_model/__0_0.distcp -> ", "does not list: refused")
    assert not (run / CHECKPOINT / "model.safetensors").exists()


@pytest.mark.parametrize("size", [[10**12], [-1, 64]])
def test_dcp_sizes_past_what_is_stored_are_refused_before_any_allocation(fsdp_run, tmp_path, capsys, size):
    import torch

    run = _copy(fsdp_run[0], tmp_path)
    fqn = "vision.pos_embed"

    def change(metadata) -> None:
        metadata.state_dict_metadata[fqn].size = torch.Size(size)

    _replant_metadata(run / CHECKPOINT, change)
    metadata = (run / CHECKPOINT).resolve() / METADATA
    if size[0] < 0:
        expected = f"{metadata}: tensor {fqn!r} has size {size}: sizes are integers >= 0; refused before any allocation"
    else:
        expected = f"{metadata}: tensor {fqn!r} of size {size} ({10**12} elements, {4 * 10**12} bytes) but 5"
    line = _refused(_convert(run / CHECKPOINT, capsys), "convert-checkpoint", expected)
    assert "MemoryError" not in line and not (run / CHECKPOINT / "model.safetensors").exists()
    _refused(_resume(run, fsdp_run[1], capsys), "train", expected)


def test_a_dcp_byte_range_past_its_files_end_is_refused(fsdp_run, tmp_path, capsys):
    """DCP reads ``length`` bytes of a byte item at once: 10^12 asked Python for a terabyte."""
    run = _copy(fsdp_run[0], tmp_path)

    def change(metadata) -> None:
        next(iter(metadata.storage_data.values())).length = 10**12

    _replant_metadata(run / CHECKPOINT, change)
    _both_refuse(
        run, fsdp_run[1], capsys, "fsdp_model/.metadata: bytes 0..1000000000000 of '__0_0.distcp', which holds"
    )


def test_a_genuine_fsdp_checkpoint_converts_and_lists_its_weights(fsdp_run, tmp_path, capsys):
    from scopebench.policy.checkpoint import load_policy

    run = _copy(fsdp_run[0], tmp_path)
    checkpoint = run / CHECKPOINT
    code, out, err = _convert(checkpoint, capsys)
    assert code == 0, err
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    weights = checkpoint / "model.safetensors"
    assert manifest["files"]["model.safetensors"] == {"bytes": weights.stat().st_size, "sha256": _sha256(weights)}
    assert sum(p.numel() for p in load_policy(checkpoint).parameters()) > 0
    assert _convert(checkpoint, capsys)[0] == 0  # converted again: its own listed weights are replaced
    _relist(checkpoint, "model.safetensors", None)  # weights written by an older convert-checkpoint: unlisted
    with pytest.raises(ValueError, match=r"model\.safetensors: not listed in .*run `scopebench convert-checkpoint"):
        load_policy(checkpoint)
    assert _convert(checkpoint, capsys)[0] == 0  # ... which converting again lists
    assert sum(p.numel() for p in load_policy(checkpoint).parameters()) > 0
