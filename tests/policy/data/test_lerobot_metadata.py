"""LeRobot metadata (``meta/info.json``, ``meta/stats.json``) that would break a run later, or
reach the user as a system error, is refused up front in one line naming the file and the key.

Every case damages a copy of the folder built from LeRobot's published format
(:mod:`tests.policy.data.lerobot_fixture`). Before these checks a ``stats.json`` without ``action``
trained on unnormalised actions, a one-value ``min`` / ``max`` was broadcast over every
dimension, a template width of 999 ended in ``File name too long``, and deep or huge JSON in a
``RecursionError`` or Python's integer-digits message without the file's name.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest

from scopebench.policy import RobotDataset
from scopebench.policy.settings import DatasetSettings

from . import lerobot_fixture as fx

CHUNK = 4


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return fx.write_fixture(tmp_path_factory.mktemp("lerobot_meta") / "pusht_like")


def _edit(name, change):
    """A damage: ``meta/<name>`` read as JSON, changed in place by ``change``, written back."""

    def damage(root):
        path = root / "meta" / name
        value = json.loads(path.read_text())
        change(value)
        path.write_text(json.dumps(value))

    return damage


def _write(name, data):
    def damage(root):
        (root / "meta" / name).write_bytes(data if isinstance(data, bytes) else data.encode())

    return damage


def _stat(feature, stat, value):
    return _edit("stats.json", lambda s: s[feature].__setitem__(stat, value))


def _template(key, value):
    return _edit("info.json", lambda info: info.__setitem__(key, value))


STATS = "meta/stats\\.json"
INFO = "meta/info\\.json"

BROKEN = {
    # -- stats.json: what the policy normalises with
    "no action stats": (
        _edit("stats.json", lambda s: s.pop("action")),
        rf"{STATS} has no 'action' entry \(only \[.*\]\): the policy normalises 'action' with its 'min' and 'max'",
    ),
    "no state stats": (
        _edit("stats.json", lambda s: s.pop("observation.state")),
        rf"{STATS} has no 'observation\.state' entry",
    ),
    "action stats not an object": (
        _edit("stats.json", lambda s: s.__setitem__("action", [0, 1])),
        rf"{STATS} holds \[0, 1\] there: the policy normalises 'action' with its 'min' and 'max'",
    ),
    "action without max": (
        _edit("stats.json", lambda s: s["action"].pop("max")),
        rf"{STATS}: stats\['action'\] lacks 'max' \(it has \['mean', 'min', 'std'\]\)",
    ),
    "one-value min broadcast": (
        _stat("action", "min", [0.0]),
        rf"{STATS}: stats\['action'\]\['min'\] holds 1 value, but .*{INFO} declares features\['action'\] of "
        r"shape \[2\]: a statistic has one number per dimension$",
    ),
    "one-value min and max": (
        _edit("stats.json", lambda s: s["observation.state"].update(min=[0.0], max=[1.0])),
        rf"{STATS}: stats\['observation\.state'\]\['min'\] holds 1 value, .* of shape \[3\]",
    ),
    "too many values in mean": (
        _stat("action", "mean", [0.0, 0.0, 0.0]),
        rf"{STATS}: stats\['action'\]\['mean'\] holds 3 values, .*shape \[2\]",
    ),
    "min as text": (
        _stat("action", "min", "low"),
        rf"{STATS}: stats\['action'\]\['min'\] must be a list of 2 numbers \(one per dimension\), got 'low'$",
    ),
    "a number as text": (
        _stat("observation.state", "max", [1.0, "2", 3.0]),
        rf"{STATS}: stats\['observation\.state'\]\['max'\] must be a list of 3 numbers .*got \[1\.0, '2', 3\.0\]$",
    ),
    "a boolean": (_stat("action", "std", [True, 1.0]), r"\['action'\]\['std'\] must be a list of 2 numbers"),
    "nested lists": (_stat("action", "max", [[1.0], [2.0]]), r"\['action'\]\['max'\] must be a list of 2 numbers"),
    "min above max": (
        _stat("action", "min", [0.0, 99.0]),
        rf"{STATS}: stats\['action'\]\['min'\]\[1\] is 99\.0, above stats\['action'\]\['max'\]\[1\] .*; min must be at",
    ),
    "beyond float32": (
        _stat("action", "max", [1e300, 1.0]),
        rf"{STATS}: stats\['action'\]\['max'\]\[0\] is 1e\+300, beyond float32's range",
    ),
    # -- info.json: the sizes and the templates
    "template width 999": (
        _template("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:999d}.parquet"),
        rf"{INFO}: data_path 'data/chunk-\{{chunk_index:03d\}}/file-\{{file_index:999d\}}\.parquet' with "
        r"chunk_index=0, file_index=0 gives a name of 1012 bytes .*over the 255 a file or folder name may have$",
    ),
    "video template width 999": (
        _template("video_path", "videos/{video_key}/chunk-{chunk_index:0999d}/file-{file_index:03d}.mp4"),
        rf"{INFO}: video_path .* gives a name of 1005 bytes",
    ),
    "a name too long in the template": (
        _template("data_path", "data/" + "d" * 300 + "/file-{file_index:03d}.parquet"),
        rf"{INFO}: data_path .* gives a name of 300 bytes \('dddd",
    ),
    "features not an object": (
        _edit("info.json", lambda info: info.__setitem__("features", ["observation.state", "action"])),
        rf"{INFO}: features must map each feature's name to an object, got \['observation\.state', 'action'\]$",
    ),
    "state shape as text": (
        _edit("info.json", lambda info: info["features"]["observation.state"].__setitem__("shape", "3")),
        rf"{INFO}: features\['observation\.state'\] needs a 'shape' of one integer >= 1 .*got "
        r"features\['observation\.state'\]\['shape'\] '3'$",
    ),
    "action shape of two dimensions": (
        _edit("info.json", lambda info: info["features"]["action"].__setitem__("shape", [2, 1])),
        rf"{INFO}: features\['action'\] needs a 'shape' of one integer >= 1",
    ),
    "camera shape as text": (
        _edit("info.json", lambda info: info["features"]["observation.images.top"].__setitem__("shape", ["3"] * 3)),
        rf"{INFO}: features\['observation\.images\.top'\] needs a 'shape' of three integers >= 1",
    ),
    # -- the JSON itself
    "deeply nested stats.json": (
        _write("stats.json", "[" * 100_000 + "]" * 100_000),
        rf"{STATS}: JSON nested over 32 levels deep; LeRobot's metadata nests a few levels$",
    ),
    "nested just below Python's limit": (
        _edit("stats.json", lambda s: s.__setitem__("extra", json.loads("[" * 900 + "]" * 900))),
        rf"{STATS}: JSON nested over 32 levels deep",
    ),
    "5000-digit integer": (
        _write("info.json", '{"codebase_version": "v3.0", "fps": ' + "7" * 5000 + "}"),
        rf"{INFO} holds an integer of over 4300 digits, which Python refuses to read",
    ),
    "info.json not UTF-8": (
        _write("info.json", b'{"codebase_version": "v3.0", "robot_type": "\xff"}'),
        rf"{INFO} is not UTF-8 text \(byte 0xff at offset 44\); JSON files are UTF-8$",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_metadata_is_refused_in_one_line_naming_the_file_and_key(published, tmp_path, case):
    damage, message = BROKEN[case]
    root = shutil.copytree(published, tmp_path / "ds")
    damage(root)
    for opens in (lambda: RobotDataset(root, chunk_size=CHUNK), DatasetSettings(lerobot=str(root)).materialize):
        with pytest.raises(ValueError, match=message) as raised:
            opens()
        assert "\n" not in str(raised.value) and str(root) in str(raised.value)


def test_the_published_statistics_still_read(published):
    """LeRobot's own layout (per-dimension mean / std / min / max, cameras' (3, 1, 1)) passes."""
    ds = RobotDataset(published, chunk_size=CHUNK)
    assert ds.folder.dims == {"observation.state": 3, "action": 2}
    assert len(ds.stats["observation.images.top"]["mean"]) == 3


def test_a_tool_refuses_missing_action_stats_in_one_line_before_any_run(published, tmp_path, capsys, started):
    from scopebench.cli import main

    from ..conftest import TINY

    root = shutil.copytree(published, tmp_path / "ds")
    BROKEN["no action stats"][0](root)
    code = main(["profile-dataloader", "--config", TINY, f"--dataset.lerobot={root}", "--batches", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("scopebench profile-dataloader:")]
    assert code == 2 and len(lines) == 1 and re.search(r"stats\.json has no 'action' entry", lines[0]), err
    assert "Traceback" not in err and started == []
