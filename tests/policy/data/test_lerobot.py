"""LeRobot v3.0 folders: the synthetic writer's MP4 frames come back (PSNR, the right frame),
a folder built from LeRobot's published format reads right, broken folders are refused
naming the file, and training on a LeRobot folder resumes at the same data position."""

from __future__ import annotations

import json
import os
import re
import shutil

import numpy as np
import pytest
import torch

from scopebench.policy import RobotDataset, SyntheticRobotConfig, generate_episode, write_synthetic_dataset
from scopebench.policy.data.synthetic import TASKS
from scopebench.policy.settings import DatasetSettings

from . import lerobot_fixture as fx

CHUNK = 6


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255**2 / mse)


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_video_frames_come_back_at_40_db_and_state_and_actions_exactly(tmp_path, codec):
    """224 x 224, two cameras, three episodes over two video files (the third starts a new file,
    the second starts 1.0 s into the first): every frame is the source frame it should be."""
    cfg = SyntheticRobotConfig(
        num_episodes=3, episode_length=10, image_size=224, state_dim=5, action_dim=4, codec=codec
    )
    ds = RobotDataset(write_synthetic_dataset(tmp_path / "ds", cfg), chunk_size=CHUNK)
    assert len(ds) == 30 and ds.decoder == "pyav"
    worst = float("inf")
    for e in range(3):
        episode = generate_episode(cfg, e)
        for f in range(10):
            sample = ds[10 * e + f]
            assert sample["prompt"] == TASKS[e % cfg.num_tasks][0] and sample["frame_index"] == f
            assert torch.equal(sample["state"], torch.from_numpy(episode.state[f]))
            steps = np.minimum(np.arange(f, f + CHUNK), 9)
            assert torch.equal(sample["actions"], torch.from_numpy(episode.actions[steps]))
            assert sample["action_is_pad"].tolist() == [f + k > 9 for k in range(CHUNK)]
            assert sample["decode_time_sec"] > 0
            for c, cam in enumerate(ds.cameras):
                got = (sample[f"camera{c}"].permute(1, 2, 0).numpy() * 255).round().astype(np.uint8)
                scores = [_psnr(got, source) for source in episode.frames[cam]]
                assert int(np.argmax(scores)) == f, (e, f, cam)  # the frame itself, not a neighbour
                worst = min(worst, scores[f])
    assert worst >= 40.0, f"{codec}: worst frame at {worst:.1f} dB"


@pytest.mark.parametrize("codec", ["h264", "av1"])
def test_encoding_leaves_the_threads_scheduling_as_it_was(tmp_path, codec):
    """SVT-AV1 run as root makes the encoding thread SCHED_FIFO 99 and keeps it so: a session
    that wrote AV1 videos then starved beside a busy loop (a CPU hog froze the test suite)."""
    from scopebench.policy.data.video import encode_video

    before = (os.sched_getscheduler(0), os.sched_getparam(0))
    try:
        encode_video(tmp_path / "v.mp4", [np.zeros((32, 32, 3), np.uint8)] * 3, fps=10, codec=codec)
        assert (os.sched_getscheduler(0), os.sched_getparam(0)) == before
    finally:
        os.sched_setscheduler(0, *before)


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    return fx.write_fixture(tmp_path_factory.mktemp("lerobot") / "pusht_like")


def test_a_folder_written_from_the_published_format_reads_right(published):
    ds = RobotDataset(published, chunk_size=CHUNK)
    assert sum(p.stat().st_size for p in published.rglob("*") if p.is_file()) < 1_000_000
    assert ds.cameras == sorted(fx.CAMERAS) and ds.image_shape == (fx.HEIGHT, fx.WIDTH, 3)
    assert len(ds) == sum(fx.LENGTHS) and (ds.state_dim, ds.action_dim) == (3, 2)
    starts = np.cumsum((0, *fx.LENGTHS))
    for e, length in enumerate(fx.LENGTHS):
        for k in range(length):
            i = int(starts[e]) + k
            sample = ds[i]
            assert (sample["episode_index"], sample["frame_index"], sample["index"]) == (e, k, i)
            assert sample["prompt"] == fx.TASKS[fx.TASK_OF_EPISODE[e]]
            assert torch.equal(sample["state"], torch.from_numpy(fx.state(i)))
            last = int(starts[e + 1]) - 1
            want = np.stack([fx.action(min(i + j, last)) for j in range(CHUNK)])
            assert torch.equal(sample["actions"], torch.from_numpy(want))
            assert sample["action_is_pad"].tolist() == [i + j > last for j in range(CHUNK)]
            for c in range(2):
                image = sample[f"camera{c}"]
                assert image.shape == (3, fx.HEIGHT, fx.WIDTH)
                assert abs(float(image.mean()) * 255 - fx.level(i)) < 3, (i, c)  # levels are 13 apart
    assert ds.stats["action"]["max"] == pytest.approx(fx.action(sum(fx.LENGTHS) - 1).tolist())


# -- broken folders: each refused naming the file, before any run ------------------------------------
@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A 32 x 32 H.264 dataset: 3 episodes of 6 frames, files 000 (episodes 0, 1) and 001."""
    cfg = SyntheticRobotConfig(num_episodes=3, episode_length=6, image_size=32)
    return write_synthetic_dataset(tmp_path_factory.mktemp("small") / "ds", cfg), cfg


def _video(root, camera=0, file=0):
    return root / f"videos/observation.images.camera{camera}/chunk-000/file-{file:03d}.mp4"


def _shorter(root, cfg):
    from scopebench.policy.data.video import encode_video

    frames = [f for e in (0, 1) for f in generate_episode(cfg, e).frames["observation.images.camera0"]]
    encode_video(_video(root), frames[:-2], cfg.fps, "h264")


def _late_episode(root, cfg):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "meta/episodes/chunk-000/file-000.parquet"
    rows = pq.read_table(path).to_pylist()
    rows[1]["videos/observation.images.camera0/from_timestamp"] += 0.5  # 5 frames later than it is
    pq.write_table(pa.Table.from_pylist(rows), path)


def _unknown_codec(root, cfg):
    path = _video(root)
    path.write_bytes(path.read_bytes().replace(b"avc1", b"zzzz"))


def _version_2(root, cfg):
    info = json.loads((root / "meta/info.json").read_text())
    info["codebase_version"] = "v2.1"
    info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
    (root / "meta/info.json").write_text(json.dumps(info))


def _rewrite_data(root, column, change):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    values = table.column(column).to_numpy().copy()
    change(values)
    pq.write_table(table.set_column(table.column_names.index(column), column, pa.array(values)), path)


def _set_vector(root, column, row, dim, value):
    """``column``'s entry ``dim`` of the data row ``row`` (of file-000) set to ``value``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "data/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    values = table.column(column).to_pylist()
    values[row][dim] = value
    array = pa.array(values, type=table.schema.field(column).type)
    pq.write_table(table.set_column(table.column_names.index(column), column, array), path)


def _set_stat(root, feature, stat, dim, text):
    """``meta/stats.json``'s ``feature`` ``stat`` entry ``dim`` written as ``text`` (Python's json reads NaN)."""
    path = root / "meta/stats.json"
    stats = json.loads(path.read_text())
    stats[feature][stat][dim] = "@"
    path.write_text(json.dumps(stats).replace('"@"', text))


def _no_episodes(root, cfg):
    import pyarrow.parquet as pq

    files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    pq.write_table(pq.read_table(files[0]).slice(0, 0), files[0])  # the columns, no row
    for path in files[1:]:
        path.unlink()


def _set_fps(value):
    def damage(root, cfg):
        info = json.loads((root / "meta/info.json").read_text())
        info["fps"] = value
        (root / "meta/info.json").write_text(json.dumps(info))

    return damage


def _late_row(values):
    values[3] += 0.05  # episode 0, frame 3: half a frame late at 10 fps


def _unknown_task(values):
    values[:] = 5  # tasks.parquet holds task_index 0 to 3


BROKEN = {
    "missing video": (
        lambda root, cfg: _video(root, 1, 1).unlink(),
        FileNotFoundError,
        r"not found: .*camera1/chunk-000/file-001\.mp4",
    ),
    "unreadable video": (
        lambda root, cfg: _video(root).write_bytes(b"\x00not an mp4" * 50),
        ValueError,
        r"camera0/chunk-000/file-000\.mp4 is not a readable video",
    ),
    "video shorter than rows": (_shorter, ValueError, r"file-000\.mp4 holds 10 frames, fewer than the 12 rows"),
    "timestamp beyond the video": (
        _late_episode,
        ValueError,
        r"file-000\.mp4: episode 1 needs a frame at 1\.6000 s .*beyond the video's last frame at 1\.1000 s",
    ),
    "v2.1 folder": (
        _version_2,
        ValueError,
        r"info\.json: codebase_version 'v2\.1' is a LeRobot v2 dataset.*reads LeRobot v3\.0",
    ),
    "unknown codec": (_unknown_codec, ValueError, r"file-000\.mp4: unknown video codec 'zzzz'"),
    "timestamps out of step": (
        lambda root, cfg: _rewrite_data(root, "timestamp", _late_row),
        ValueError,
        r"data/chunk-000/file-000\.parquet: episode 0 frame 3 has timestamp 0\.35.*at fps 10 frames are 0\.100000 s apart",
    ),
    "NaN in a state": (  # row 8 of file-000: episode 1, frame 2
        lambda root, cfg: _set_vector(root, "observation.state", 8, 1, float("nan")),
        ValueError,
        r"data/chunk-000/file-000\.parquet: column 'observation\.state' holds nan \(value 1\) in the row with index 8, "
        r"episode 1 frame 2; the state and the actions must be finite numbers",
    ),
    "infinity in an action": (
        lambda root, cfg: _set_vector(root, "action", 3, 0, float("-inf")),
        ValueError,
        r"file-000\.parquet: column 'action' holds -inf \(value 0\) in the row with index 3, episode 0 frame 3",
    ),
    "NaN in stats.json": (
        lambda root, cfg: _set_stat(root, "observation.state", "std", 1, "NaN"),
        ValueError,
        r"meta/stats\.json: stats\['observation\.state'\]\['std'\]\[1\] is nan; every statistic must be a finite",
    ),
    "Infinity in stats.json": (
        lambda root, cfg: _set_stat(root, "action", "max", 0, "Infinity"),
        ValueError,
        r"meta/stats\.json: stats\['action'\]\['max'\]\[0\] is inf",
    ),
    "fps 0": (_set_fps(0), ValueError, r"ds/meta/info\.json: fps must be a finite number > 0, got 0$"),
    "fps as text": (
        _set_fps("thirty"),
        ValueError,
        r"ds/meta/info\.json: fps must be a finite number > 0, got 'thirty' \(str\)$",
    ),
    "no episode": (
        _no_episodes,
        ValueError,
        r"ds/meta/episodes: its 1 file\(s\) hold no episode \(0 rows\); a dataset needs one$",
    ),
    "task index without a task": (
        lambda root, cfg: _rewrite_data(root, "task_index", _unknown_task),
        ValueError,
        r"meta/tasks\.parquet has no task for task_index \[5\]",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_broken_folder_is_refused_naming_the_file(small, tmp_path, case):
    damage, error, message = BROKEN[case]
    root = shutil.copytree(small[0], tmp_path / "ds")
    damage(root, small[1])
    with pytest.raises(error, match=message):
        RobotDataset(root, chunk_size=CHUNK)
    with pytest.raises(error, match=message):  # what every tool calls before it starts a run
        DatasetSettings(lerobot=str(root)).materialize()


def test_a_tool_refuses_a_broken_folder_in_one_line_before_any_run(small, tmp_path, capsys, started):
    from scopebench.cli import main

    from ..conftest import TINY

    root = shutil.copytree(small[0], tmp_path / "ds")
    _shorter(root, small[1])
    code = main(["profile-dataloader", "--config", TINY, f"--dataset.lerobot={root}", "--batches", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("scopebench profile-dataloader:")]
    assert code == 2 and len(lines) == 1 and "file-000.mp4 holds 10 frames" in lines[0], err
    assert "Traceback" not in err and started == []


# -- path templates: every file named stays inside the folder ---------------------------------------
def _edit_info(root, **changes):
    info = json.loads((root / "meta/info.json").read_text())
    info.update(changes)
    (root / "meta/info.json").write_text(json.dumps(info))


def _openers(root):
    """Both ways in: the dataset itself, and what every tool calls before it starts a run."""
    return lambda: RobotDataset(root, chunk_size=CHUNK), DatasetSettings(lerobot=str(root)).materialize


def _outside_data(root, outside):
    """The genuine parquet files copied out of the folder, so a template may lead to them."""
    shutil.copytree(root / "data/chunk-000", outside / "chunk-000")
    return "chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


def _outside_videos(root, outside):
    shutil.copytree(root / "videos", outside)
    return "{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


ESCAPES = {  # case -> key, what is copied outside, whether the template says "../outside" (else its absolute path)
    "data_path with ..": ("data_path", _outside_data, True),
    "absolute data_path": ("data_path", _outside_data, False),
    "video_path with ..": ("video_path", _outside_videos, True),
    "absolute video_path": ("video_path", _outside_videos, False),
}


@pytest.mark.parametrize("case", list(ESCAPES))
def test_a_template_leading_out_of_the_folder_is_refused_though_the_files_there_are_genuine(small, tmp_path, case):
    """Genuine copies wait outside, so the template is the only thing wrong: before, they were
    read and decoded (FFmpeg on any file the user can read) and the run went on."""
    key, place, dotdot = ESCAPES[case]
    root = shutil.copytree(small[0], tmp_path / "ds")
    outside = tmp_path / "outside"
    rest = place(root, outside)
    value = f"../outside/{rest}" if dotdot else f"{outside}/{rest}"
    _edit_info(root, **{key: value})
    message = rf"ds/meta/info\.json: {key} '{re.escape(value)}' must be a path inside the dataset folder"
    for opens in _openers(root):
        with pytest.raises(ValueError, match=message):
            opens()


TEMPLATE_SYNTAX = {
    "attribute access": ("data_path", "data/chunk-{chunk_index.real:03d}/file-{file_index:03d}.parquet"),
    "dunder attribute": ("data_path", "data/chunk-{chunk_index.__class__}/file-{file_index:03d}.parquet"),
    "index access": ("data_path", "data/chunk-{chunk_index[0]}/file-{file_index:03d}.parquet"),
    "conversion": ("data_path", "data/chunk-00{chunk_index!r}/file-{file_index:03d}.parquet"),
    "nested spec": ("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:{chunk_index}}.parquet"),
    "unknown field": ("data_path", "data/chunk-{episode_chunk:03d}/file-{file_index:03d}.parquet"),
    "4-digit width": ("data_path", "data/chunk-{chunk_index:03d}/file-{file_index:1000d}.parquet"),
    "unbalanced brace": ("data_path", "data/chunk-{chunk_index:03d/file-{file_index:03d}.parquet"),
    "camera name attribute": ("video_path", "videos/{video_key.__class__}/chunk-{chunk_index:03d}/f.mp4"),
    "camera name width": ("video_path", "videos/{video_key:>9}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"),
}


@pytest.mark.parametrize("case", list(TEMPLATE_SYNTAX))
def test_a_template_with_more_than_plain_fields_is_refused_in_one_line(small, tmp_path, case):
    """``str.format`` evaluates attribute and index access; only plain named fields with a plain
    format spec are allowed (some of these read the right files before, and are refused anyway)."""
    key, value = TEMPLATE_SYNTAX[case]
    root = shutil.copytree(small[0], tmp_path / "ds")
    _edit_info(root, **{key: value})
    for opens in _openers(root):
        with pytest.raises(ValueError, match=rf"ds/meta/info\.json: {key} '{re.escape(value)}'") as raised:
            opens()
        assert "\n" not in str(raised.value)


def _rename_camera(root, old, new):
    import pyarrow.parquet as pq

    info = json.loads((root / "meta/info.json").read_text())
    info["features"][new] = info["features"].pop(old)
    (root / "meta/info.json").write_text(json.dumps(info))
    path = root / "meta/episodes/chunk-000/file-000.parquet"
    table = pq.read_table(path)
    pq.write_table(
        table.rename_columns([c.replace(f"videos/{old}/", f"videos/{new}/") for c in table.column_names]), path
    )
    stats = json.loads((root / "meta/stats.json").read_text())
    stats[new] = stats.pop(old)
    (root / "meta/stats.json").write_text(json.dumps(stats))


def test_a_camera_name_leading_out_of_the_folder_is_refused(small, tmp_path):
    """The camera name fills ``{video_key}``: a feature named ``../../outside`` made
    ``videos/../../outside/...``, a genuine video outside the folder, which was decoded."""
    root = shutil.copytree(small[0], tmp_path / "ds")
    camera = "../../outside"
    _rename_camera(root, "observation.images.camera0", camera)
    shutil.copytree(root / "videos/observation.images.camera0", tmp_path / "outside")
    message = r"ds/meta/info\.json: video_path '.*' with video_key='\.\./\.\./outside', .* outside the dataset folder"
    for opens in _openers(root):
        with pytest.raises(ValueError, match=message):
            opens()


def test_symlinks_inside_the_folder_are_followed_wherever_they_point(small, tmp_path):
    """Hugging Face's hub cache links each snapshot file to a blob outside the snapshot folder:
    a lexical rule reads it, ``Path.resolve()`` would not."""
    root = shutil.copytree(small[0], tmp_path / "ds")
    shutil.move(root / "videos", tmp_path / "blobs_videos")
    (root / "videos").symlink_to(tmp_path / "blobs_videos", target_is_directory=True)
    data = root / "data/chunk-000/file-001.parquet"
    shutil.move(data, tmp_path / "blob.parquet")
    data.symlink_to(tmp_path / "blob.parquet")
    DatasetSettings(lerobot=str(root)).materialize()
    ds, genuine = RobotDataset(root, chunk_size=CHUNK), RobotDataset(small[0], chunk_size=CHUNK)
    for i in (0, 11, len(ds) - 1):  # files 000 and 001
        got, want = ds[i], genuine[i]
        assert torch.equal(got["state"], want["state"]) and torch.equal(got["camera0"], want["camera0"])


def test_a_tool_refuses_a_template_leading_out_of_the_folder_in_one_line(small, tmp_path, capsys, started):
    from scopebench.cli import main

    from ..conftest import TINY

    root = shutil.copytree(small[0], tmp_path / "ds")
    _edit_info(root, data_path="../outside/" + _outside_data(root, tmp_path / "outside"))
    code = main(["profile-dataloader", "--config", TINY, f"--dataset.lerobot={root}", "--batches", "2"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("scopebench profile-dataloader:")]
    assert code == 2 and len(lines) == 1 and "info.json: data_path '../outside/chunk-" in lines[0], err
    assert "Traceback" not in err and started == []


def test_a_frame_past_the_end_of_a_video_names_the_file(small):
    from scopebench.policy.data.video import VideoFrames

    frames = VideoFrames()
    assert frames.frame_at(_video(small[0]), 1.1).shape == (32, 32, 3)  # the last of 12 frames at 10 fps
    with pytest.raises(ValueError, match=r"file-000\.mp4: no frame at timestamp 1\.2000 s .*last decoded at 1\.1"):
        frames.frame_at(_video(small[0]), 1.2)


def test_a_worker_forked_after_the_parent_read_frames_reads_the_same_frames(robot_data):
    """From PyAV 18.1.1 ``to_ndarray`` converts through one swscale context per thread, with
    automatic slice threads: a DataLoader worker forked after the parent had read a sample
    inherited that context without its threads and hung on its first frame (CI, 7 December).
    The reader converts with its own one-thread converter, made again in each process."""
    import multiprocessing

    from scopebench.policy import RobotDataset

    ds = RobotDataset(robot_data[1], chunk_size=8)
    here = torch.stack([ds[i]["camera0"] for i in range(4)])  # the parent converts first
    loader = torch.utils.data.DataLoader(
        ds, batch_size=4, num_workers=1, multiprocessing_context=multiprocessing.get_context("fork"), timeout=300
    )
    assert torch.equal(next(iter(loader))["camera0"], here)


@pytest.mark.slow
def test_training_on_a_lerobot_folder_resumes_at_the_same_data_position(published, tmp_path, capsys, monkeypatch):
    """4 steps straight, and 2 steps then ``--resume`` to 4: the resumed run reads the frames the
    straight one read after its second step, in the same order."""
    from ..conftest import TINY
    from ..helpers import train_tool as train

    read: list[int] = []
    original = RobotDataset.__getitem__
    monkeypatch.setattr(RobotDataset, "__getitem__", lambda self, i: read.append(int(i)) or original(self, i))

    def run(folder, steps, *extra):
        read.clear()
        args = ["--config", TINY, f"--dataset.lerobot={published}", "--dataset.chunk_size=4", "--batch_size=2"]
        args += ["--output_dir", str(tmp_path / folder), "--steps", str(steps), "--save_freq", "2", *extra]
        code, out, err = train(args, capsys)
        assert code == 0, err
        return list(read), out

    straight, _ = run("a", 4)
    run("b", 2)
    resumed, out = run("b", 4, "--resume", "true")
    assert "at step 2 (epoch 0, batch 2" in out
    assert len(straight) >= 8 and resumed == straight[4:]  # 2 steps x 2 samples skipped, never decoded


@pytest.mark.parametrize("workers", [0, 1])
def test_the_dataloader_run_reports_decode_apart_from_fetch_when_it_runs_in_the_process(robot_data, workers):
    """0 workers: ``decode`` is taken out of ``fetch`` (the regions still add up to the step);
    1 worker: the decoding runs there, no ``decode`` region, but the step still counts it."""
    from scopebench.policy.run.train import PolicyTrainRun
    from scopebench.policy.settings import TrainSettings
    from scopebench.profiler import ProfilerConfig

    calls = iter([True] * 5 + [False])
    run = PolicyTrainRun(
        TrainSettings(num_workers=workers),
        dataset_root=robot_data[1],
        chunk_size=8,
        task="dataloader",
        profiler=ProfilerConfig(warmup=1),
        keep_rows=True,
    )
    with run:
        run.loop(lambda: next(calls))
    rows = run.rank_rows[0]
    assert len(rows) == 4 and run.work.decoder == "pyav"
    for row in rows:
        regions = row["fetch_time_sec"] + row.get("decode_time_sec", 0.0) + row["h2d_time_sec"]
        assert regions <= row["step_time_sec"] + 1e-9
        assert ("decode_time_sec" in row) == (workers == 0)
        if workers == 0:
            assert row["decode_time_sec"] > 0 and row["fetch_time_sec"] >= 0
    assert run.work.decoded_frames == 5 * 4 * 2 and run.work.decode_sec > 0  # 5 batches of 4 samples x 2 cameras


def test_hevc_with_an_open_gop_reads_every_frame(tmp_path):
    """x265 (LeRobot's HEVC) presents B-frames before the keyframe they decode after: a seek to
    that keyframe skips them ("no frame at timestamp 0.1 s ... nearest 0.2 s" for a third of the
    frames); the reader seeks earlier and reads every frame, each the right one."""
    from fractions import Fraction

    import av

    from scopebench.policy.data.video import VideoFrames, thread_scheduling_kept

    fps, count = 10, 30
    sources = [np.full((64, 64, 3), 8 * k, dtype=np.uint8) for k in range(count)]
    path = tmp_path / "hevc.mp4"
    with thread_scheduling_kept(), av.open(str(path), "w") as out:  # LeRobot's options: crf 30, g 2
        stream = out.add_stream("libx265", rate=fps, options={"crf": "30", "g": "2", "x265-params": "log-level=error"})
        stream.height = stream.width = 64
        stream.pix_fmt = "yuv420p"
        stream.codec_context.time_base = Fraction(1, fps)
        for k, image in enumerate(sources):
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, fps)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())
    with av.open(str(path)) as probe:  # packets in decode order: (pts, keyframe)
        packets = [(p.pts, p.is_keyframe) for p in probe.demux(probe.streams.video[0]) if p.pts is not None]
    # the case itself: a frame decoded after a keyframe that is presented later than it
    assert any(not key and any(k and q > pts for q, k in packets[:i]) for i, (pts, key) in enumerate(packets))
    frames = VideoFrames()
    for k in range(count):
        got = frames.frame_at(path, k / fps).astype(np.float64).mean()
        assert int(np.argmin([abs(got - s.mean()) for s in sources])) == k, (k, got)
    frames.close()
