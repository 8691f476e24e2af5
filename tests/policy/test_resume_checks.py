"""``scopebench train --resume true`` is exact or refused with the reason: the checkpoint's
manifest (sizes, sha256), its step file, its ``last`` link, the settings that must match and
the model config are checked before anything is built; allowed changes are printed.

One finished 2-step checkpoint per module; each test damages a copy of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from scopebench.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")


@pytest.fixture(scope="module")
def finished(robot_data, tmp_path_factory):
    """A run folder holding one finished checkpoint at step 2 (tiny, 1 process): (run, cache_dir)."""
    cache = robot_data[0].cache_dir
    run = tmp_path_factory.mktemp("resume_checks") / "run"
    args = ["--config", TINY, f"--dataset.cache_dir={cache}", "--output_dir", str(run), "--steps", "2"]
    assert main(["train", *args, "--save_freq", "2", "--log_freq", "2"]) == 0
    return run, cache


@pytest.fixture
def run(finished, tmp_path):
    """A copy of the module's run folder, to damage."""
    return Path(shutil.copytree(finished[0], tmp_path / "run", symlinks=True))


@pytest.fixture
def resume(finished, run, capsys):
    """``scopebench train --resume true`` into the copy: (exit code, stdout, stderr)."""

    def call(*extra: str, steps: int = 2) -> tuple[int, str, str]:
        capsys.readouterr()
        base = ["--config", TINY, f"--dataset.cache_dir={finished[1]}", "--output_dir", str(run)]
        code = main(["train", *base, "--resume", "true", "--steps", str(steps), "--log_freq", "2", *extra])
        out = capsys.readouterr()
        return code, out.out, out.err

    return call


def _refused(result, *expected: str) -> str:
    code, _, err = result
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("scopebench train:")]
    assert len(lines) == 1 and "Traceback" not in err, err  # one line, no traceback
    for text in expected:
        assert text in lines[0], lines[0]
    return lines[0]


CHECKPOINT = Path("checkpoints") / "000002"


# -- a damaged file is named -----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("random_states_0.pkl", "truncate"),
        ("model.safetensors", "truncate"),
        ("model.safetensors", "empty"),
        ("optimizer.bin", "truncate"),
        ("optimizer.bin", "empty"),
    ],
)
def test_a_truncated_or_empty_file_is_named_with_its_size_and_the_recorded_one(run, resume, name, damage):
    path = run / CHECKPOINT / name
    size = path.stat().st_size
    kept = size // 2 if damage == "truncate" else 0
    with open(path, "r+b") as fh:
        fh.truncate(kept)
    _refused(resume(), f"{path}: {kept} bytes, the manifest records {size}: the checkpoint is damaged")


def test_a_file_changed_in_place_is_named_by_its_sha256(run, resume):
    path = run / CHECKPOINT / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # same size: only the hash tells
    path.write_bytes(bytes(data))
    _refused(resume(), f"{path}: sha256 ", "the manifest records", "the checkpoint is damaged")


def test_the_manifest_lists_every_file_with_its_size_and_hash_and_the_settings(finished):
    checkpoint = finished[0] / CHECKPOINT
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    on_disk = {p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file()}
    assert set(manifest["files"]) == on_disk - {"manifest.json", "training_step.json"}
    assert {"model.safetensors", "optimizer.bin", "random_states_0.pkl", "train_config.yaml"} <= set(manifest["files"])
    for name, entry in manifest["files"].items():
        data = (checkpoint / name).read_bytes()
        assert entry == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, name
    settings = manifest["settings"]
    assert settings["batch_size"] == 4 and settings["learning_rate"] == 1e-3 and settings["dataset.num_episodes"] == 4
    assert not {"device", "num_workers", "training.steps", "dataset.cache_dir"} & set(settings)


# -- settings that must match ----------------------------------------------------------------------
@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ("--learning_rate=0.5", "learning_rate 0.001 in the checkpoint, 0.5 given"),
        ("--batch_size=2", "batch_size 4 in the checkpoint, 2 given"),
        ("--dataset.num_episodes=5", "dataset.num_episodes 4 in the checkpoint, 5 given"),
        ("--preset=small", 'preset "tiny" in the checkpoint, "small" given'),
    ],
)
def test_a_setting_that_must_match_is_refused_naming_it(run, resume, override, expected):
    _refused(resume(override), expected, ": an exact resume needs the same")


def test_another_backend_is_refused_naming_the_conversion(run, resume):
    line = _refused(resume("--backend=fsdp2"), 'backend "ddp" in the checkpoint, "fsdp2" given')
    assert line.endswith(
        f"`scopebench convert-checkpoint {(run / CHECKPOINT).resolve()}` writes its weights alone (model.safetensors)"
    )


def test_every_mismatched_setting_is_named_in_one_line(run, resume):
    line = _refused(resume("--learning_rate=0.5", "--batch_size=2"))
    assert "batch_size 4 in the checkpoint, 2 given; learning_rate 0.001 in the checkpoint, 0.5 given" in line


def test_a_model_config_that_differs_from_the_preset_is_refused(run, resume):
    """The preset changed since the checkpoint (here: its policy_config.json edited and the
    manifest updated, as if the preset's definition had moved)."""
    checkpoint = run / CHECKPOINT
    path = checkpoint / "policy_config.json"
    policy = json.loads(path.read_text())
    policy["config"]["width"] = policy["config"].get("width", 0) + 8
    path.write_text(json.dumps(policy))
    manifest = json.loads((checkpoint / "manifest.json").read_text())
    data = path.read_bytes()
    manifest["files"]["policy_config.json"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "manifest.json").write_text(json.dumps(manifest))
    _refused(resume(), f"{path}: the model config differs from preset tiny's", "width")


# -- the step file ---------------------------------------------------------------------------------
def _edit_step(run: Path, **changes) -> None:
    path = run / CHECKPOINT / "training_step.json"
    meta = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            del meta[key]
        else:
            meta[key] = value
    path.write_text(json.dumps(meta))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "is not valid JSON"),
        ("[2]", "must hold a JSON object"),
        ('"2"', "must hold a JSON object"),
    ],
)
def test_a_step_file_that_is_no_json_object_is_named(run, resume, text, expected):
    (run / CHECKPOINT / "training_step.json").write_text(text)
    _refused(resume(), f"{run / CHECKPOINT / 'training_step.json'}", expected)


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"step": "2"}, "training_step.json: step must be an integer >= 1, got '2' (str)"),
        ({"step": -3}, "training_step.json: step must be an integer >= 1, got -3"),
        ({"step": 100}, "training_step.json: step 100 but the folder is 000002"),
        ({"epoch": None}, "training_step.json has no 'epoch' key"),
        ({"position": None}, "training_step.json has no 'position' key"),
    ],
)
def test_a_bad_step_or_a_missing_key_is_named(run, resume, changes, expected):
    _edit_step(run, **changes)
    _refused(resume(), expected)


def _edit_mirror(run: Path, **changes) -> None:
    """Edit the manifest's copy of the step file's data position as a planter would (None: drop it)."""
    path = run / CHECKPOINT / "manifest.json"
    manifest = json.loads(path.read_text())
    if changes.pop("drop", False):
        del manifest["training_step"]
    manifest.get("training_step", {}).update(changes)
    path.write_text(json.dumps(manifest))


def test_the_manifest_mirrors_the_data_position(finished):
    manifest = json.loads((finished[0] / CHECKPOINT / "manifest.json").read_text())
    assert manifest["training_step"] == {"step": 2, "epoch": 0, "position": 2, "world_size": 1}


@pytest.mark.parametrize("key", ["position", "epoch"])
def test_an_edited_data_position_is_refused_naming_the_key(run, resume, key):
    """``position`` / ``epoch`` 10^15 passed as integers >= 0, and the resume said the data order
    continued where it stopped (its losses differed from an uninterrupted run's)."""
    _edit_step(run, **{key: 10**15})
    was = {"position": 2, "epoch": 0}[key]
    _refused(resume(), f"training_step.json: {key} {10**15}, the manifest records {was}: the step file was edited")


@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        ({"position": 10**15}, f"training_step.json: position {10**15} is more than the 24 batches of an epoch"),
        ({"epoch": 10**15}, f"training_step.json: epoch {10**15}, position 2 is {24 * 10**15 + 2} batches of 24 per"),
        ({"epoch": 1, "position": 0}, "epoch 1, position 0 is 24 batches of 24 per epoch, more than the 2 the saved"),
    ],
)
def test_a_data_position_past_what_the_run_took_is_refused_whatever_the_manifest_says(run, resume, changes, expected):
    """The manifest rewritten to match (or from before it mirrored the position): bounded by the
    data, named."""
    _edit_step(run, **changes)
    _edit_mirror(run, **changes)
    _refused(resume(), expected, "the data order cannot continue there")
    _edit_mirror(run, drop=True)
    _refused(resume(), expected)


# -- the last link ---------------------------------------------------------------------------------
def _relink(link: Path, target: str) -> None:
    link.unlink()
    os.symlink(target, link)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("000009", "the link is dangling"),
        ("last", "the link loops"),
    ],
)
def test_a_dangling_or_looping_last_is_named(run, resume, target, expected):
    link = run / "checkpoints" / "last"
    _relink(link, target)
    _refused(resume(), f"{link} -> {target}: {expected}")


def test_a_last_pointing_into_another_runs_folder_is_refused(run, resume, tmp_path):
    other = Path(shutil.copytree(run, tmp_path / "other", symlinks=True))
    link = run / "checkpoints" / "last"
    _relink(link, str(other / CHECKPOINT))
    _refused(resume(), f"{link} -> {other / CHECKPOINT}: the link points outside {link.parent}")


# -- checkpoints written before manifests ----------------------------------------------------------
def test_a_checkpoint_without_a_manifest_is_refused_as_unverifiable(run, resume):
    (run / CHECKPOINT / "manifest.json").unlink()
    _refused(resume(), "has no manifest.json: it predates manifests and cannot be verified")


# -- allowed changes -------------------------------------------------------------------------------
def test_an_allowed_change_is_applied_and_printed(run, resume):
    code, out, err = resume("--save_freq", "3", steps=3)
    assert code == 0, err
    assert "resume: training.steps 2 -> 3 (allowed to change)" in out, out
    assert "resume: training.save_freq 2 -> 3 (allowed to change)" in out, out
    assert "training.log_freq" not in out  # unchanged: not printed
    assert (run / "checkpoints" / "last").resolve().name == "000003"
    assert json.loads((run / "checkpoints" / "000003" / "training_step.json").read_text())["step"] == 3


class _TwoRankSave:
    """An accelerator whose ``save_state`` writes what two ranks would (rank 1's RNG states
    and a ZeRO shard in a sub-folder) and records when the barrier and the manifest came."""

    is_main_process = True

    def __init__(self) -> None:
        self.events: list[str] = []

    def save_state(self, folder: str) -> None:
        (Path(folder) / "pytorch_model").mkdir()
        for name in ("random_states_0.pkl", "random_states_1.pkl", "pytorch_model/shard_rank1.pt", "latest"):
            (Path(folder) / name).write_bytes(name.encode())

    def wait_for_everyone(self) -> None:
        self.events.append("barrier")


def test_the_manifest_covers_every_ranks_files_and_comes_before_the_step_file(tmp_path, monkeypatch):
    import scopebench.train.checkpoint as checkpoint

    accelerator = _TwoRankSave()
    real = checkpoint.write_manifest

    def write_manifest(folder, settings, step):
        assert not (Path(folder) / "training_step.json").exists()  # the step file stays last
        accelerator.events.append("manifest")
        return real(folder, settings, step)

    monkeypatch.setattr(checkpoint, "write_manifest", write_manifest)
    meta = {"epoch": 0, "position": 3, "backend": "zero2", "world_size": 2}
    folder = checkpoint.save_checkpoint(accelerator, tmp_path, 3, meta=meta, settings={"batch_size": 4})
    assert accelerator.events[:2] == ["barrier", "manifest"]  # after every rank's files
    manifest = json.loads((folder / "manifest.json").read_text())
    assert sorted(manifest["files"]) == [
        "latest", "pytorch_model/shard_rank1.pt", "random_states_0.pkl", "random_states_1.pkl"
    ]  # fmt: skip
    assert manifest["settings"] == {"batch_size": 4} and manifest["format"] == 1
    assert manifest["training_step"] == {"step": 3, "epoch": 0, "position": 3, "world_size": 2}
    assert checkpoint.verify_checkpoint(folder, settings={"batch_size": 4}) == manifest
