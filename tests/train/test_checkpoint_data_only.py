"""Checkpoints are data, not code: a ``.pt`` file holding a pickled call is refused, never run.

The slow tests make real ZeRO-2 and ZeRO-3 checkpoints on two gloo ranks
(``zero_checkpoint_driver.py``), plant a pickle whose ``__reduce__`` calls ``os.system`` (it
only creates a marker file under ``tmp_path``) and check that ``convert-checkpoint`` and a
resume refuse the file by name and that the marker never appears.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from scopebench.cli import main

DRIVER = Path(__file__).with_name("zero_checkpoint_driver.py")
TINY = Path(__file__).resolve().parents[2] / "configs" / "policy" / "tiny.yml"
REFUSAL = "holds Python code or objects that are not data"


class _Planted:
    """Unpickling it runs ``touch <marker>``: what a malicious checkpoint would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _plant(path: Path, marker: Path) -> None:
    """Replace ``path`` with a ``torch.save`` file whose unpickling creates ``marker``."""
    torch.save({"module": _Planted(marker)}, path)


def _torchrun(*args: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(DRIVER), *args],
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


@pytest.fixture(scope="module")
def zero_checkpoints(tmp_path_factory):
    """A genuine ZeRO-2 and ZeRO-3 checkpoint after 2 steps on 2 ranks: ({backend: folder}, dataset cache)."""
    out = tmp_path_factory.mktemp("zero_checkpoints")
    cache = tmp_path_factory.mktemp("datasets")
    _torchrun("save", str(out), str(cache))
    folders = json.loads((out / "checkpoints.json").read_text())
    return {backend: Path(folder) for backend, folder in folders.items()}, cache


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    """A copy to plant into or convert (the module's checkpoints stay genuine)."""
    return Path(shutil.copytree(checkpoint, tmp_path / checkpoint.name, symlinks=True))


def convert(checkpoint: Path, capsys) -> tuple[int, str, str]:
    code = main(["convert-checkpoint", str(checkpoint)])
    out = capsys.readouterr()
    return code, out.out, out.err


# -- (a) a planted pickle is refused, not run -------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(
    ("backend", "shard"),
    [
        ("zero2", "mp_rank_00_model_states.pt"),
        ("zero2", "zero_pp_rank_1_mp_rank_00_optim_states.pt"),
        ("zero3", "zero_pp_rank_0_mp_rank_00_model_states.pt"),
    ],
)
def test_convert_checkpoint_refuses_a_shard_that_holds_code(zero_checkpoints, tmp_path, capsys, backend, shard):
    checkpoint = _copy(zero_checkpoints[0][backend], tmp_path)
    planted = checkpoint / "pytorch_model" / shard
    marker = tmp_path / "ran"
    _plant(planted, marker)
    code, _, err = convert(checkpoint, capsys)
    assert not marker.exists(), "the pickled os.system call ran"
    assert code == 2, err
    ours = [line for line in err.splitlines() if line.startswith("scopebench")]  # not DeepSpeed's progress bar
    assert ours == [
        f"scopebench convert-checkpoint: {planted} {REFUSAL} (posix.system): scopebench loads checkpoints as "
        "data only; do not load checkpoints you do not trust"
    ], err
    assert not (checkpoint / "model.safetensors").exists()


@pytest.mark.slow
def test_a_zero_resume_refuses_a_shard_that_holds_code_and_resumes_a_genuine_one(zero_checkpoints, tmp_path):
    folders, cache = zero_checkpoints
    planted = _copy(folders["zero2"], tmp_path)
    marker = tmp_path / "ran"
    _plant(planted / "pytorch_model" / "mp_rank_00_model_states.pt", marker)
    for name, checkpoint in (("genuine", folders["zero2"]), ("planted", planted)):
        _torchrun("resume", str(checkpoint), str(cache), str(tmp_path / name))
    assert not marker.exists(), "the pickled os.system call ran"
    for rank in (0, 1):
        assert json.loads((tmp_path / f"genuine_rank{rank}.json").read_text()) == {"resumed": 2}
        error = json.loads((tmp_path / f"planted_rank{rank}.json").read_text())["error"]
        assert error.startswith(f"{planted / 'pytorch_model' / 'mp_rank_00_model_states.pt'} {REFUSAL}"), error


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory):
    """``scopebench train`` on one process, 2 steps, a checkpoint at step 2: (run folder, dataset cache)."""
    run, cache = tmp_path_factory.mktemp("ddp_run") / "run", tmp_path_factory.mktemp("datasets")
    args = ["--config", str(TINY), f"--dataset.cache_dir={cache}", "--output_dir", str(run), "--steps", "2"]
    assert main(["train", *args, "--save_freq", "2"]) == 0
    return run, cache


@pytest.mark.slow
@pytest.mark.parametrize("planted", ["optimizer.bin", "random_states_0.pkl"])
def test_train_resume_refuses_a_checkpoint_file_that_holds_code(ddp_run, tmp_path, capsys, planted):
    """``optimizer.bin`` fails accelerate's load; ``random_states_0.pkl`` is one whose failure accelerate
    swallows (it logs "Could not load random states" and goes on): both refuse the resume."""
    run = Path(shutil.copytree(ddp_run[0], tmp_path / "run", symlinks=True))
    marker = tmp_path / "ran"
    _plant(run / "checkpoints" / "000002" / planted, marker)
    capsys.readouterr()
    config = run / "checkpoints" / "000002" / "train_config.yaml"
    args = ["--config", str(config), "--output_dir", str(run), f"--dataset.cache_dir={ddp_run[1]}"]
    code = main(["train", *args, "--resume", "true", "--steps", "4"])
    err = capsys.readouterr().err
    assert not marker.exists(), "the pickled os.system call ran"
    assert code == 2, err
    ours = [line for line in err.splitlines() if line.startswith("scopebench")]
    assert ours == [
        f"scopebench train: {run / 'checkpoints' / '000002' / planted} {REFUSAL} (posix.system): "
        "scopebench loads checkpoints as data only; do not load checkpoints you do not trust"
    ], err
    assert (run / "checkpoints" / "last").resolve().name == "000002"  # nothing was trained or saved


# -- (b) genuine checkpoints still convert -----------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["zero2", "zero3"])
def test_a_genuine_zero_checkpoint_still_converts(zero_checkpoints, tmp_path, capsys, backend):
    from scopebench.policy.checkpoint import load_policy

    checkpoint = _copy(zero_checkpoints[0][backend], tmp_path)
    code, out, err = convert(checkpoint, capsys)
    assert code == 0, err
    assert out.splitlines()[-1].startswith(f"wrote {checkpoint / 'model.safetensors'} (")  # after DeepSpeed's prints
    assert sum(p.numel() for p in load_policy(checkpoint).parameters()) > 0


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["zero2", "zero3"])
def test_an_optimizer_shard_missing_from_folder_and_manifest_is_named(zero_checkpoints, tmp_path, capsys, backend):
    checkpoint = _copy(zero_checkpoints[0][backend], tmp_path)
    name = "pytorch_model/zero_pp_rank_1_mp_rank_00_optim_states.pt"
    (checkpoint / name).unlink()
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    del manifest["files"][name]
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = convert(checkpoint, capsys)
    assert code == 2 and err == (
        f"scopebench convert-checkpoint: {checkpoint / name}: missing (the optimizer shard of rank 1 of 2): "
        "the checkpoint is damaged\n"
    ), err


@pytest.mark.slow
def test_the_allow_list_is_exactly_what_deepspeed_files_hold(zero_checkpoints):
    """Every non-tensor global in the shards of both backends is allow-listed, and nothing more:
    each entry is needed by some file (a plain ``weights_only=True`` load names it)."""
    from scopebench.train.data_only import data_only_globals

    shards = [f for folder in zero_checkpoints[0].values() for f in sorted((folder / "pytorch_model").iterdir())]
    held = {name for f in shards for name in torch.serialization.get_unsafe_globals_in_checkpoint(f)}
    allowed = {f"{g.__module__}.{g.__qualname__}" for g in data_only_globals()}
    assert held == allowed


# -- (c) the context manager ------------------------------------------------------------------------
def _malicious(tmp_path: Path) -> tuple[Path, Path]:
    marker = tmp_path / "ran"
    path = tmp_path / "evil.pt"
    _plant(path, marker)
    return path, marker


def test_inside_data_only_loading_weights_only_false_is_refused(tmp_path):
    from scopebench.train.data_only import data_only_loading

    path, marker = _malicious(tmp_path)
    torch.save({"w": torch.arange(3)}, tmp_path / "data.pt")
    original = torch.load
    with data_only_loading():
        assert torch.load is not original and torch.serialization.load is not original
        assert torch.load(tmp_path / "data.pt", weights_only=False)["w"].tolist() == [0, 1, 2]  # data still loads
    with pytest.raises(ValueError) as info, data_only_loading():
        torch.load(path, map_location="cpu", weights_only=False, pickle_module=pickle)
    assert str(info.value) == (
        f"{path} {REFUSAL} (posix.system): scopebench loads checkpoints as data only; "
        "do not load checkpoints you do not trust"
    )
    assert not marker.exists()
    assert torch.load is original and torch.serialization.load is original


def test_a_refusal_a_library_swallows_is_raised_when_the_block_ends(tmp_path):
    """accelerate's ``load_state`` catches any error loading the RNG states: the refusal must
    not turn into a resume that silently skips them."""
    from scopebench.train.data_only import data_only_loading

    path, marker = _malicious(tmp_path)
    with pytest.raises(ValueError, match=f"{path} {REFUSAL}"):
        with data_only_loading():
            try:
                torch.load(path, weights_only=False)
            except Exception:
                pass
    assert not marker.exists() and torch.load.__module__ == "torch.serialization"


def test_data_only_loading_nests_and_restores_torch_load_after_an_error(tmp_path):
    from scopebench.train.data_only import data_only_globals, data_only_loading

    original, before = torch.load, torch.serialization.get_safe_globals()
    with pytest.raises(KeyError):
        with data_only_loading():
            with data_only_loading():
                assert set(data_only_globals()) <= set(torch.serialization.get_safe_globals())
            assert torch.load is not original  # the outer block still holds
            raise KeyError("boom")
    assert torch.load is original and set(torch.serialization.get_safe_globals()) == set(before)


def test_a_raw_pickle_that_calls_code_is_refused_too(tmp_path):
    """Not only ``torch.save`` files: a bare ``pickle.dump`` (protocol 2, the legacy format)."""
    from scopebench.train.data_only import data_only_loading

    marker = tmp_path / "ran"
    path = tmp_path / "random_states_0.pkl"
    path.write_bytes(pickle.dumps(_Planted(marker), protocol=2))
    with pytest.raises(ValueError, match=rf"random_states_0.pkl {REFUSAL} \(posix.system\)"), data_only_loading():
        torch.load(str(path), weights_only=False)
    assert not marker.exists()
