"""Checkpoint folders: names, the ``last`` link, what makes one finished, what a resume refuses."""

from __future__ import annotations

import json

import pytest

from scopebench.train.checkpoint import checkpoint_dir, load_checkpoint, read_step_file, resolve_checkpoint


def _finished(root, step=4, backend="ddp", world_size=2):
    folder = checkpoint_dir(root, step)
    folder.mkdir(parents=True)
    names = ["model.safetensors"] if backend == "ddp" else ["latest", "pytorch_model"]
    for name in names + [f"random_states_{r}.pkl" for r in range(world_size)]:
        (folder / name).write_text("x")
    (folder / "training_step.json").write_text(json.dumps({"step": step, "backend": backend, "world_size": world_size}))
    (folder.parent / "last").symlink_to(folder.name)
    return folder


def test_every_way_to_name_a_checkpoint_resolves_to_it(tmp_path):
    folder = _finished(tmp_path / "run")
    for path in (folder, folder / "training_step.json", tmp_path / "run", tmp_path / "run" / "checkpoints"):
        assert resolve_checkpoint(path) == folder.resolve()
    assert read_step_file(folder)["step"] == 4


def test_a_folder_without_the_step_file_is_unfinished(tmp_path):
    folder = _finished(tmp_path / "run")
    (folder / "training_step.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"not a finished checkpoint: .*training_step.json is missing"):
        resolve_checkpoint(tmp_path / "run")


@pytest.mark.parametrize(("backend", "missing"), [("ddp", "random_states_1.pkl"), ("zero3", "pytorch_model")])
def test_each_missing_file_is_named(tmp_path, backend, missing):
    folder = _finished(tmp_path / "run", backend=backend)
    (folder / missing).unlink()
    with pytest.raises(FileNotFoundError, match=f"incomplete: {missing} missing"):
        resolve_checkpoint(folder)


def test_no_checkpoint_at_all_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint to resume from: folder .*nothing does not exist"):
        resolve_checkpoint(tmp_path / "nothing")


def test_resuming_with_another_backend_or_world_size_is_refused(tmp_path):
    folder = _finished(tmp_path / "run", backend="zero2", world_size=2)
    with pytest.raises(ValueError, match="written with backend=zero2 on 2 rank.*backend=zero3 on 2"):
        load_checkpoint(None, folder, world_size=2, backend="zero3")
    with pytest.raises(ValueError, match="backend=zero2 on 4"):
        load_checkpoint(None, folder, world_size=4, backend="zero2")


def test_a_zero_optimizer_shard_missing_is_named_before_deepspeed_counts_them(tmp_path):
    """zero_to_fp32 said "Expected 2 of '*_optim_states.pt' ... but found 1 files"."""
    from scopebench.train.backends import get_backend

    folder = _finished(tmp_path / "run", backend="zero2", world_size=2)
    (folder / "latest").write_text("pytorch_model")
    (folder / "pytorch_model").unlink()
    (folder / "pytorch_model").mkdir()
    (folder / "pytorch_model" / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_text("x")
    missing = folder / "pytorch_model" / "zero_pp_rank_1_mp_rank_00_optim_states.pt"
    with pytest.raises(FileNotFoundError) as raised:
        get_backend("zero2").check_shards(folder, 2)
    assert str(raised.value) == f"{missing}: missing (the optimizer shard of rank 1 of 2): the checkpoint is damaged"
    missing.write_text("x")
    get_backend("zero3").check_shards(folder, 2)
