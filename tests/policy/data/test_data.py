"""Synthetic robot data: writer / reader round trip (PNG frames: bit-exact), loader order, errors,
runner stages. Video frames, LeRobot's own layout and broken folders: ``test_lerobot.py``."""

from __future__ import annotations

import json

import pytest
import torch

from scopebench.policy import (
    PolicyRunner,
    RobotDataset,
    SyntheticRobotConfig,
    generate_episode,
    make_dataloader,
    make_policy,
    write_synthetic_dataset,
)
from scopebench.policy.data.synthetic import TASKS

CHUNK = 8


@pytest.fixture(scope="module")
def data_config() -> SyntheticRobotConfig:
    return SyntheticRobotConfig(
        num_episodes=3, episode_length=12, image_size=32, state_dim=5, action_dim=4, num_tasks=2, seed=7, video=False
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory, data_config):
    return write_synthetic_dataset(tmp_path_factory.mktemp("robot") / "ds", data_config)


CAM0, CAM1 = "observation.images.camera0", "observation.images.camera1"


def test_layout_and_metadata(root, data_config):
    import pyarrow.parquet as pq

    # two episodes per file (episodes_per_file): files 000 and 001
    assert sorted(p.name for p in (root / "data/chunk-000").iterdir()) == ["file-000.parquet", "file-001.parquet"]
    assert not (root / "videos").exists()  # video: false keeps PNG bytes in the parquet files
    info = json.loads((root / "meta/info.json").read_text())
    assert info["codebase_version"] == "v3.0" and info["fps"] == data_config.fps and info["total_frames"] == 36
    assert info["features"][CAM0] == {"dtype": "image", "shape": [32, 32, 3], "names": ["height", "width", "channels"]}
    assert info["features"]["action"]["shape"] == [4]
    stats = json.loads((root / "meta/stats.json").read_text())
    assert len(stats["observation.state"]["mean"]) == 5 and len(stats[CAM0]["std"]) == 3
    assert pq.read_table(root / "meta/tasks.parquet").to_pylist() == [
        {"task_index": i, "task": TASKS[i][0]} for i in range(2)
    ]
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert [
        (e["episode_index"], e["dataset_from_index"], e["dataset_to_index"], e["data/file_index"]) for e in episodes
    ] == [
        (0, 0, 12, 0),
        (1, 12, 24, 0),
        (2, 24, 36, 1),
    ]


def test_round_trip_gives_back_actions_frames_and_prompts(root, data_config):
    ds = RobotDataset(root, chunk_size=CHUNK)
    assert len(ds) == 36 and ds.cameras == [CAM0, CAM1] and ds.decoder == "pil"
    episode = generate_episode(data_config, 1)
    sample = ds[12 + 3]  # episode 1, frame 3
    assert sample["episode_index"] == 1 and sample["frame_index"] == 3 and sample["index"] == 15
    assert sample["prompt"] == TASKS[1][0]
    torch.testing.assert_close(sample["state"], torch.from_numpy(episode.state[3]), rtol=0, atol=0)
    torch.testing.assert_close(sample["actions"], torch.from_numpy(episode.actions[3 : 3 + CHUNK]), rtol=0, atol=0)
    assert not sample["action_is_pad"].any()
    for i, cam in enumerate(ds.cameras):
        frame = torch.from_numpy(episode.frames[cam][3]).permute(2, 0, 1).float() / 255
        assert sample[f"camera{i}"].dtype == torch.float32
        assert torch.equal(sample[f"camera{i}"], frame)  # PNG is lossless


def test_chunks_past_the_episode_end_are_padded(root, data_config):
    ds = RobotDataset(root, chunk_size=CHUNK)
    episode = generate_episode(data_config, 0)
    sample = ds[9]  # 3 real actions left in episode 0
    assert sample["action_is_pad"].tolist() == [False] * 3 + [True] * 5
    last = torch.from_numpy(episode.actions[-1])
    assert all(torch.equal(row, last) for row in sample["actions"][3:])


def _order(loader) -> list[int]:
    return [i for batch in loader for i in batch["index"].tolist()]


def test_two_workers_and_a_seed_give_a_reproducible_order(root):
    ds = RobotDataset(root, chunk_size=CHUNK)
    kwargs = dict(num_workers=2, prefetch_factor=2, drop_last=False)
    first = _order(make_dataloader(ds, 5, seed=3, **kwargs))
    assert first == _order(make_dataloader(ds, 5, seed=3, **kwargs))
    assert first == _order(make_dataloader(ds, 5, seed=3, num_workers=0, drop_last=False))
    assert sorted(first) == list(range(36))  # one epoch covers every frame once
    assert first != _order(make_dataloader(ds, 5, seed=4, **kwargs))
    # a new epoch has a new order, and the sequence of epochs is reproducible as well
    loader = make_dataloader(ds, 5, seed=3, **kwargs)
    epochs = [_order(loader), _order(loader)]
    assert epochs[0] == first and epochs[1] != first and sorted(epochs[1]) == sorted(first)
    loader.sampler.set_epoch(1)
    assert _order(loader) == epochs[1]


def test_mixture_weights_pick_datasets(root, tmp_path):
    other = write_synthetic_dataset(
        tmp_path / "b",
        SyntheticRobotConfig(num_episodes=1, episode_length=12, image_size=32, state_dim=5, action_dim=4),
    )
    a, b = RobotDataset(root, CHUNK), RobotDataset(other, CHUNK)
    loader = make_dataloader([a, b], 4, weights=[0.0, 1.0], num_samples=20, seed=0)
    batches = list(loader)
    assert len(batches) == 5 and all(p == TASKS[0][0] for x in batches for p in x["prompt"])
    assert all(set(x["episode_index"].tolist()) == {0} for x in batches)
    mixed = make_dataloader([a, b], 4, weights=[1.0, 3.0], num_samples=400, seed=0)
    from_b = sum(int(idx) >= len(a) for idx in mixed.sampler)
    assert 250 < from_b < 350  # about 3/4 of 400
    with pytest.raises(ValueError, match=r"expected 2 non-negative weights"):
        make_dataloader([a, b], 4, weights=[1.0])
    c = write_synthetic_dataset(tmp_path / "c", SyntheticRobotConfig(num_episodes=1, episode_length=4, image_size=16))
    with pytest.raises(ValueError, match=r"datasets differ: .*c has"):
        make_dataloader([a, RobotDataset(c, CHUNK)], 4)


def test_missing_and_malformed_files_name_the_file(root, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nowhere/meta/info\.json"):
        RobotDataset(tmp_path / "nowhere", CHUNK)
    broken = tmp_path / "broken"
    (broken / "meta").mkdir(parents=True)
    (broken / "meta/info.json").write_text("{ not json")
    with pytest.raises(ValueError, match=r"broken/meta/info\.json is not valid JSON"):
        RobotDataset(broken, CHUNK)
    (broken / "meta/info.json").write_text(json.dumps({"codebase_version": "v3.0", "fps": 10}))
    with pytest.raises(ValueError, match=r"info\.json lacks key\(s\) \['features'"):
        RobotDataset(broken, CHUNK)
    copy = tmp_path / "copy"
    write_synthetic_dataset(copy, SyntheticRobotConfig(num_episodes=2, episode_length=4, image_size=16, video=False))
    (copy / "data/chunk-000/file-000.parquet").unlink()
    with pytest.raises(FileNotFoundError, match=r"data/chunk-000/file-000\.parquet"):
        RobotDataset(copy, CHUNK)


def test_runner_stages_turn_a_loader_batch_into_actions(root):
    ds = RobotDataset(root, chunk_size=8)
    model = make_policy("tiny")  # 6-dim state/actions: the dataset's 5/4 are zero-padded
    runner = PolicyRunner(model, stats=ds.stats)
    batch = next(iter(make_dataloader(ds, 3, seed=0)))
    obs = runner.preprocess(batch)
    assert obs["images"].shape == (3, 2, 3, 32, 32) and obs["actions"].shape == (3, 8, 6)
    assert obs["state"].abs().max() <= 1.0 + 1e-6  # min/max normalisation to [-1, 1]
    loss, _ = model(obs)
    assert torch.isfinite(loss)
    cache = runner.prefill(obs)
    assert len(cache.kv) == model.config.depth
    actions = runner.postprocess(runner.denoise(cache, num_steps=2))
    assert actions.shape == (3, 8, 4)
    with pytest.raises(ValueError, match=r"batch lacks key\(s\) \['camera1'\]"):
        runner.preprocess({k: v for k, v in batch.items() if k != "camera1"})


def test_cached_dataset_is_written_once_and_a_dead_writers_temporary_is_removed(tmp_path, data_config):
    """A second Ctrl-C mid-write leaves ``.synthetic_robot_<key>.<pid>.<random>.tmp``; the next
    write removes it (its process is gone), and a complete dataset is reused as is."""
    import subprocess
    import sys

    from scopebench.policy.data.synthetic import cached_synthetic_dataset

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    root = cached_synthetic_dataset(tmp_path, data_config)
    stale = tmp_path / f".{root.name}.{pid}.abc123.tmp"
    stale.mkdir()
    (stale / "half_written.mp4").write_bytes(b"x")
    import shutil

    shutil.rmtree(root)
    again = cached_synthetic_dataset(tmp_path, data_config)
    assert again == root and (root / "meta" / "info.json").is_file()
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [root.name]
    mtime = (root / "meta" / "info.json").stat().st_mtime_ns
    assert cached_synthetic_dataset(tmp_path, data_config) == root
    assert (root / "meta" / "info.json").stat().st_mtime_ns == mtime  # reused, not rewritten


def test_a_new_encoder_setting_writes_a_new_cached_dataset(tmp_path, monkeypatch):
    """The AV1 settings changed when PyAV's SVT-AV1 build did: a cache written with the old ones
    is not the dataset the new settings describe, so the key holds the encoder's settings."""
    from scopebench.policy.data import video
    from scopebench.policy.data.synthetic import cached_synthetic_dataset

    config = SyntheticRobotConfig(num_episodes=2, episode_length=4, image_size=32, video=True, codec="av1")
    root = cached_synthetic_dataset(tmp_path, config)
    encoder, options = video.CODECS["av1"]
    monkeypatch.setitem(video.CODECS, "av1", (encoder, {**options, "crf": "30"}))
    other = cached_synthetic_dataset(tmp_path, config)
    assert other != root and (other / "meta" / "info.json").is_file()


def test_a_folder_of_the_same_name_without_a_dataset_is_refused(tmp_path, data_config):
    from scopebench.policy.data.synthetic import cached_synthetic_dataset

    root = cached_synthetic_dataset(tmp_path, data_config)
    import shutil

    shutil.rmtree(root / "meta")
    with pytest.raises(ValueError, match=r"exists but holds no dataset \(no meta/info.json\): remove it"):
        cached_synthetic_dataset(tmp_path, data_config)


def test_pi05_and_user_policies_take_the_same_fixed_eval_batch():
    # One rule for the validation batch (scopebench.policy.data.dataset.eval_indices): evenly
    # spread, never larger than the dataset.
    from types import SimpleNamespace

    from scopebench.policy.calls import fixed_batch
    from scopebench.policy.data.dataset import fixed_eval_batch

    frames = [{"i": torch.tensor(i)} for i in range(10)]
    policy = SimpleNamespace(dataset=frames, collate_fn=None)
    assert fixed_batch(policy, 3)["i"].tolist() == fixed_eval_batch(frames, 3)["i"].tolist() == [0, 3, 6]
    for take in (lambda: fixed_batch(policy, 11), lambda: fixed_eval_batch(frames, 11)):
        with pytest.raises(ValueError, match=r"^eval_batch_size must be an integer >= 1 and <= 10, got 11$"):
            take()
