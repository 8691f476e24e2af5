"""A small LeRobot v3.0 folder written from LeRobot's published format, not by the suite's writer.

LeRobot itself cannot be installed beside this project (Python and torch pins), so this
fixture is built by hand from the format as LeRobot publishes it:

* the layout and the role of each file: ``docs/source/lerobot-dataset-v3.mdx`` of
  https://github.com/huggingface/lerobot (read at commit 7427f3180);
* the column names of ``meta/episodes/`` (``dataset_from_index``, ``data/chunk_index``,
  ``videos/<key>/from_timestamp``...), ``meta/tasks.parquet`` as a pandas frame indexed by
  ``task``, and the encoder defaults (libsvtav1, ``yuv420p``, ``g=2``, CRF 30): the writer in
  ``src/lerobot/datasets/dataset_metadata.py``, ``dataset_writer.py`` and
  ``src/lerobot/configs/video.py`` there;
* a published ``meta/info.json`` (e.g. huggingface.co/datasets/aero1201/my_custom_pusht):
  ``codebase_version`` "v3.0", ``video.*`` info per camera, a camera ``shape`` given as
  ``[3, H, W]``.

Three episodes of 5, 7 and 4 frames at 30 fps: episodes 0 and 1 share ``data/.../file-000``
and each camera's ``file-000.mp4`` (episode 1 starts 5/30 s into the video), episode 2 is in
``file-001``. Every camera frame is one flat grey level, :func:`level`, distinct per frame,
so a decoded frame tells which frame it is even through a lossy codec.
"""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import numpy as np

FPS = 30
LENGTHS = (5, 7, 4)
FILE_OF_EPISODE = (0, 0, 1)
TASKS = ("insert the peg", "fold the towel")
TASK_OF_EPISODE = (0, 1, 0)
HEIGHT, WIDTH = 48, 64
#: camera -> (encoder, options, shape in info.json, names in info.json)
CAMERAS = {
    "observation.images.top": (
        "libsvtav1",
        {"g": "2", "crf": "30", "preset": "12"},
        [3, HEIGHT, WIDTH],
        ["c", "h", "w"],
    ),
    "observation.images.wrist": (
        "libx264",
        {"g": "2", "crf": "23"},
        [HEIGHT, WIDTH, 3],
        ["height", "width", "channel"],
    ),
}


def level(index: int) -> int:
    """The grey level of every pixel of frame ``index`` (global row index), in both cameras."""
    return 20 + 13 * index


def state(index: int) -> np.ndarray:
    return np.array([index, -index / 3, 0.25], dtype=np.float32)


def action(index: int) -> np.ndarray:
    return np.array([index + 0.5, index / 7], dtype=np.float32)


def _encode(path: Path, levels: list[int], encoder: str, options: dict) -> None:
    import av

    from scopebench.policy.data.video import thread_scheduling_kept

    path.parent.mkdir(parents=True, exist_ok=True)
    with thread_scheduling_kept(), av.open(str(path), "w") as out:
        stream = out.add_stream(encoder, rate=FPS, options=options)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for k, value in enumerate(levels):
            frame = av.VideoFrame.from_ndarray(np.full((HEIGHT, WIDTH, 3), value, np.uint8), format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, FPS)
            out.mux(stream.encode(frame))
        out.mux(stream.encode())


def write_fixture(root: Path) -> Path:
    """Write the folder (about 20 kB) under ``root``; returns ``root``."""
    import os

    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.environ.setdefault("SVT_LOG", "1")
    starts = np.concatenate([[0], np.cumsum(LENGTHS)])
    rows = {f: [] for f in (0, 1)}
    episodes = []
    for e, length in enumerate(LENGTHS):
        file = FILE_OF_EPISODE[e]
        first_in_file = min(i for i, f in enumerate(FILE_OF_EPISODE) if f == file)
        offset = (starts[e] - starts[first_in_file]) / FPS
        for k in range(length):
            i = int(starts[e]) + k
            rows[file].append(
                {
                    "observation.state": state(i).tolist(),
                    "action": action(i).tolist(),
                    "timestamp": np.float32(k / FPS),
                    "frame_index": k,
                    "episode_index": e,
                    "index": i,
                    "task_index": TASK_OF_EPISODE[e],
                }
            )
        episode = {
            "episode_index": e,
            "tasks": [TASKS[TASK_OF_EPISODE[e]]],
            "length": length,
            "data/chunk_index": 0,
            "data/file_index": file,
            "dataset_from_index": int(starts[e]),
            "dataset_to_index": int(starts[e + 1]),
        }
        for camera in CAMERAS:
            episode[f"videos/{camera}/chunk_index"] = 0
            episode[f"videos/{camera}/file_index"] = file
            episode[f"videos/{camera}/from_timestamp"] = float(offset)
            episode[f"videos/{camera}/to_timestamp"] = float(offset + length / FPS)
        episode["stats/action/mean"] = np.mean([action(i) for i in range(starts[e], starts[e + 1])], 0).tolist()
        episode["meta/episodes/chunk_index"] = 0
        episode["meta/episodes/file_index"] = 0
        episodes.append(episode)
    vector = pa.list_(pa.float32())  # what Hugging Face datasets writes for a Sequence feature
    schema = pa.schema(
        [("observation.state", vector), ("action", vector), ("timestamp", pa.float32())]
        + [(k, pa.int64()) for k in ("frame_index", "episode_index", "index", "task_index")]
    )
    for file, table_rows in rows.items():
        path = root / f"data/chunk-000/file-{file:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(table_rows, schema=schema), path)
        levels = [level(r["index"]) for r in table_rows]
        for camera, (encoder, options, _, _) in CAMERAS.items():
            _encode(root / f"videos/{camera}/chunk-000/file-{file:03d}.mp4", levels, encoder, options)
    (root / "meta/episodes/chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(episodes), root / "meta/episodes/chunk-000/file-000.parquet")
    pd.DataFrame({"task_index": range(len(TASKS))}, index=pd.Index(TASKS, name="task")).to_parquet(
        root / "meta/tasks.parquet"
    )
    features = {
        "observation.state": {"dtype": "float32", "shape": [3], "names": ["x", "y", "gripper"]},
        "action": {"dtype": "float32", "shape": [2], "names": ["vx", "vy"]},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in ("frame_index", "episode_index", "index")},
        "task_index": {"dtype": "int64", "shape": [1], "names": None},
    }
    for camera, (encoder, _, shape, names) in CAMERAS.items():
        codec = {"libsvtav1": "av1", "libx264": "h264"}[encoder]
        features[camera] = {"dtype": "video", "shape": shape, "names": names, "info": {"video.codec": codec}}
    info = {
        "codebase_version": "v3.0",
        "robot_type": None,
        "total_episodes": len(LENGTHS),
        "total_frames": int(starts[-1]),
        "total_tasks": len(TASKS),
        "chunks_size": 1000,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "fps": FPS,
        "splits": {"train": f"0:{len(LENGTHS)}"},
        "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
        "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
        "features": features,
    }
    (root / "meta/info.json").write_text(json.dumps(info, indent=4))
    everything = np.array([state(i) for i in range(starts[-1])]), np.array([action(i) for i in range(starts[-1])])
    stats = {
        key: {"min": v.min(0).tolist(), "max": v.max(0).tolist(), "mean": v.mean(0).tolist(), "std": v.std(0).tolist()}
        for key, v in zip(("observation.state", "action"), everything)
    }
    for camera in CAMERAS:  # LeRobot keeps image stats per channel as (3, 1, 1)
        stats[camera] = {k: [[[0.5]]] * 3 for k in ("min", "max", "mean", "std")}
    (root / "meta/stats.json").write_text(json.dumps(stats, indent=4))
    return root
