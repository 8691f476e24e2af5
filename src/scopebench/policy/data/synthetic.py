"""Synthetic robot episodes written as a LeRobot v3.0 dataset on disk.

Each episode has a task prompt, smooth state and action trajectories, and camera frames
showing an object (coloured by the task) moving along a smooth path with a marker for
the arm. The point is realistic *input-pipeline* cost (video or PNG decoding, parquet
reads, chunking, padding at episode ends), not a learnable robot task.

Layout under ``root`` (LeRobot v3.0, as :mod:`scopebench.policy.data.lerobot` reads it;
``episodes_per_file`` episodes per data and video file)::

    data/chunk-000/file-000.parquet   observation.state, action, timestamp, frame_index,
                                      episode_index, index, task_index (+ PNG bytes per camera
                                      with ``video: false``)
    videos/observation.images.camera0/chunk-000/file-000.mp4   (``video: true``, the default)
    meta/info.json                    codebase_version v3.0, fps, features, path templates, totals
    meta/stats.json                   mean / std / min / max per feature
    meta/tasks.parquet                task_index, task
    meta/episodes/chunk-000/file-000.parquet   per episode: rows, data and video files, and
                                      the episode's first frame time in each video

Frames are H.264 (or AV1) MP4 at ``g=2`` by default (:mod:`scopebench.policy.data.video`), or
lossless PNG (``video: false``, LeRobot's ``image`` features) for comparison.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import InitVar, dataclass
from pathlib import Path

import numpy as np

from scopebench.policy.data.lerobot_meta import (
    ACTION_KEY,
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    EPISODES_PATH,
    STATE_KEY,
    VIDEO_PATH,
)
from scopebench.validate import choice, flag, integer

FRAME_COLUMNS = ("frame_index", "episode_index", "index", "task_index")
#: Codecs the writer knows (the encoders: :data:`scopebench.policy.data.video.CODECS`).
VIDEO_CODECS = ("h264", "av1")
TASKS = (
    ("pick up the red cube", (220, 40, 40)),
    ("push the green ball to the left", (40, 190, 60)),
    ("put the blue block in the bowl", (40, 70, 220)),
    ("open the yellow drawer", (230, 200, 40)),
    ("stack the purple cup on the plate", (150, 60, 190)),
    ("wipe the table with the orange sponge", (240, 130, 30)),
)


@dataclass(kw_only=True)
class SyntheticRobotConfig:
    """Shape and size of a synthetic robot dataset."""

    num_episodes: int = 4
    """Episodes to write."""
    episode_length: int = 24
    """Frames per episode."""
    num_cameras: int = 2
    """Cameras, named ``camera0``, ``camera1``, ..."""
    image_size: int = 32
    """Side of the square frames in pixels."""
    state_dim: int = 7
    """Size of the state vector."""
    action_dim: int = 7
    """Size of the action vector."""
    fps: int = 10
    """Frames per second (timestamps are ``frame_index / fps``)."""
    num_tasks: int = 4
    """Distinct task prompts, at most ``len(TASKS)``; episode e gets task e % num_tasks."""
    seed: int = 0
    """Seed of every random trajectory; the same seed writes the same dataset."""
    video: bool = True
    """Camera frames as MP4 videos (LeRobot's ``video`` features); false: PNG bytes in the parquet files."""
    codec: str = "h264"
    """Video codec: ``h264`` (libx264) or ``av1`` (libsvtav1)."""
    episodes_per_file: int = 2
    """Episodes per data file and per video file (LeRobot concatenates episodes up to a file size)."""
    key_prefix: InitVar[str] = ""
    """How errors name the keys: ``dataset.`` for a run config's section, nothing for the
    benchopt dataset's parameters (not stored: the dataset's cache key ignores it)."""

    def __post_init__(self, key_prefix: str) -> None:
        for name in ("num_episodes", "episode_length", "num_cameras", "state_dim", "action_dim", "fps"):
            integer(f"{key_prefix}{name}", getattr(self, name), low=1)
        integer(f"{key_prefix}image_size", self.image_size, low=8)
        integer(f"{key_prefix}num_tasks", self.num_tasks, low=1, high=len(TASKS))
        integer(f"{key_prefix}seed", self.seed, low=0)
        flag(f"{key_prefix}video", self.video)
        choice(f"{key_prefix}codec", self.codec, VIDEO_CODECS)
        integer(f"{key_prefix}episodes_per_file", self.episodes_per_file, low=1)
        if self.video and self.image_size % 2:
            raise ValueError(
                f"{key_prefix}image_size must be even with {key_prefix}video=true (yuv420p video halves the colour "
                f"resolution), got {self.image_size}"
            )
        self._check_memory(key_prefix)

    def _check_memory(self, key_prefix: str) -> None:
        """Refuse frames the writer cannot hold: it renders every camera's frames of the
        episodes of one file at once (uint8; float temporaries come on top), so a too-large
        ``image_size`` would end in numpy's ``Unable to allocate`` mid-write."""
        from scopebench.train.memory import available_memory_bytes

        per_file = min(self.episodes_per_file, self.num_episodes)
        needed = per_file * self.episode_length * self.image_size**2 * 3 * self.num_cameras
        available = available_memory_bytes("cpu")
        if needed > available:
            raise ValueError(
                f"{key_prefix}image_size={self.image_size} needs at least {needed} bytes of memory to write the "
                f"dataset ({per_file} episodes x {self.episode_length} frames x {self.image_size}^2 pixels x 3 bytes x "
                f"{self.num_cameras} cameras per file) but {available} bytes are available: lower {key_prefix}image_size"
            )

    @property
    def cameras(self) -> list[str]:
        """Camera feature names (LeRobot's ``observation.images.<name>``)."""
        return [f"observation.images.camera{i}" for i in range(self.num_cameras)]


@dataclass
class Episode:
    """One synthetic episode in memory."""

    episode_index: int
    task_index: int
    state: np.ndarray  # (T, state_dim) float32
    actions: np.ndarray  # (T, action_dim) float32
    frames: dict[str, np.ndarray]  # camera -> (T, H, W, 3) uint8


def _smooth_paths(rng: np.random.Generator, length: int, dims: int, fps: int) -> np.ndarray:
    """(length, dims) sums of two slow sinusoids per dimension, within about [-1, 1]."""
    t = np.arange(length)[:, None] / fps
    freq = rng.uniform(0.05, 0.4, size=(2, dims))
    phase = rng.uniform(0, 2 * np.pi, size=(2, dims))
    amp = rng.uniform(0.2, 0.5, size=(2, dims))
    return amp[0] * np.sin(2 * np.pi * freq[0] * t + phase[0]) + amp[1] * np.sin(2 * np.pi * freq[1] * t + phase[1])


#: Width of the soft edge of the object and the arm marker, as a fraction of the image side.
#: Real camera images have no one-pixel colour steps; yuv420p video (half the colour
#: resolution) renders such steps at ~31 dB PSNR, a soft edge at >= 40 dB at 224 x 224.
EDGE = 0.05


def _render(xy: np.ndarray, arm: np.ndarray, color, size: int, camera: int) -> np.ndarray:
    """Frames (T, H, W, 3) uint8: a gradient background, the object disc, an arm marker,
    both with soft edges (:data:`EDGE`).

    Cameras differ by a mirrored, zoomed view and a background tint.
    """
    if camera % 2:  # a second viewpoint: mirrored and zoomed in on the centre
        xy, arm = 0.5 + 1.3 * (0.5 - xy), 0.5 + 1.3 * (0.5 - arm)
    coords = (np.arange(size, dtype=np.float32) + 0.5) / size
    gy, gx = np.meshgrid(coords, coords, indexing="ij")  # (H, W)
    tint = np.array([90, 90, 110] if camera % 2 else [110, 100, 90], dtype=np.float32)
    background = tint * (0.6 + 0.4 * gy[..., None])  # (H, W, 3)
    xy, arm = xy.astype(np.float32), arm.astype(np.float32)
    dist = np.hypot(gx[None] - xy[:, 0, None, None], gy[None] - xy[:, 1, None, None])  # (T, H, W)
    alpha = np.clip((0.12 - dist) / EDGE + 0.5, 0, 1)[..., None]
    frames = background[None] * (1 - alpha) + alpha * np.asarray(color, dtype=np.float32)
    near_arm = np.maximum(abs(gx[None] - arm[:, 0, None, None]), abs(gy[None] - arm[:, 1, None, None]))
    alpha = np.clip((0.05 - near_arm) / EDGE + 0.5, 0, 1)[..., None]
    frames = frames * (1 - alpha) + alpha * np.float32(235)
    return np.rint(frames).astype(np.uint8)


def generate_episode(config: SyntheticRobotConfig, episode_index: int) -> Episode:
    """One deterministic episode (depends only on ``config.seed`` and the index).

    The state is a smooth trajectory; the action at frame t is the state at t+1 (an
    absolute joint target), so actions are smooth too. The arm marker follows the first
    two state dimensions; the object follows its own smooth path.
    """
    cfg = config
    rng = np.random.default_rng([cfg.seed, episode_index])
    task_index = episode_index % cfg.num_tasks
    dims = max(cfg.state_dim, cfg.action_dim, 2)
    # One extra frame so that the last action (the next state) is defined.
    latent = _smooth_paths(rng, cfg.episode_length + 1, dims, cfg.fps)
    state = latent[:-1, : cfg.state_dim].astype(np.float32)
    actions = latent[1:, : cfg.action_dim].astype(np.float32)
    obj = 0.5 + 0.35 * _smooth_paths(rng, cfg.episode_length, 2, cfg.fps)  # (T, 2) within [0.15, 0.85]
    arm = 0.5 + 0.5 * np.tanh(latent[:-1, :2])
    color = TASKS[task_index][1]
    frames = {cam: _render(obj, arm, color, cfg.image_size, i) for i, cam in enumerate(cfg.cameras)}
    return Episode(episode_index, task_index, state, actions, frames)


def _feature_stats(x: np.ndarray) -> dict[str, list]:
    return {
        "mean": x.mean(0).tolist(),
        "std": x.std(0).tolist(),
        "min": x.min(0).tolist(),
        "max": x.max(0).tolist(),
        "count": [len(x)],
    }


def _chunk_file(k: int) -> dict[str, int]:
    """The ``chunk_index`` / ``file_index`` of the ``k``-th file (``CHUNKS_SIZE`` files per chunk)."""
    return {"chunk_index": k // CHUNKS_SIZE, "file_index": k % CHUNKS_SIZE}


def _png(frame: np.ndarray) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(frame).save(out, format="png", compress_level=1)  # fast to write, still lossless
    return out.getvalue()


def _features(cfg: SyntheticRobotConfig) -> dict[str, dict]:
    s = cfg.image_size
    camera = {"dtype": "video" if cfg.video else "image", "shape": [s, s, 3], "names": ["height", "width", "channels"]}
    if cfg.video:
        camera["info"] = {
            "video.height": s,
            "video.width": s,
            "video.codec": cfg.codec,
            "video.pix_fmt": "yuv420p",
            "video.is_depth_map": False,
            "video.fps": cfg.fps,
            "video.channels": 3,
            "has_audio": False,
        }
    vector = {"dtype": "float32", "names": None}
    return {
        STATE_KEY: {**vector, "shape": [cfg.state_dim], "names": [f"joint_{i}" for i in range(cfg.state_dim)]},
        ACTION_KEY: {**vector, "shape": [cfg.action_dim], "names": [f"joint_{i}" for i in range(cfg.action_dim)]},
        **{cam: camera for cam in cfg.cameras},
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{k: {"dtype": "int64", "shape": [1], "names": None} for k in FRAME_COLUMNS},
    }


def write_synthetic_dataset(root: str | Path, config: SyntheticRobotConfig | None = None) -> Path:
    """Generate and write a dataset in LeRobot v3.0 layout (see the module docstring).

    Args:
        root: folder to write; created if needed. Existing files are overwritten.
        config: sizes, frames as video or PNG, and seed; defaults to :class:`SyntheticRobotConfig`.

    Returns:
        ``root`` as a Path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from scopebench.policy.data.video import encode_video

    cfg = config or SyntheticRobotConfig()
    root = Path(root)
    (root / "meta" / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    n = cfg.episode_length
    states, actions, pixels, episodes, index = [], [], {c: [] for c in cfg.cameras}, [], 0
    for k, first in enumerate(range(0, cfg.num_episodes, cfg.episodes_per_file)):
        group = [generate_episode(cfg, e) for e in range(first, min(first + cfg.episodes_per_file, cfg.num_episodes))]
        where = _chunk_file(k)
        columns = {
            STATE_KEY: pa.FixedSizeListArray.from_arrays(
                np.concatenate([ep.state for ep in group]).ravel(), cfg.state_dim
            ),
            ACTION_KEY: pa.FixedSizeListArray.from_arrays(
                np.concatenate([ep.actions for ep in group]).ravel(), cfg.action_dim
            ),
            "timestamp": pa.array(np.tile(np.arange(n, dtype=np.float32) / cfg.fps, len(group))),
            "frame_index": pa.array(np.tile(np.arange(n, dtype=np.int64), len(group))),
            "episode_index": pa.array(np.repeat([ep.episode_index for ep in group], n).astype(np.int64)),
            "index": pa.array(np.arange(index, index + n * len(group), dtype=np.int64)),
            "task_index": pa.array(np.repeat([ep.task_index for ep in group], n).astype(np.int64)),
        }
        for cam in cfg.cameras:
            if cfg.video:
                path = root / VIDEO_PATH.format(video_key=cam, **where)
                path.parent.mkdir(parents=True, exist_ok=True)
                encode_video(path, (frame for ep in group for frame in ep.frames[cam]), cfg.fps, cfg.codec)
            else:
                images = [_png(frame) for ep in group for frame in ep.frames[cam]]
                columns[cam] = pa.StructArray.from_arrays(
                    [pa.array(images, pa.binary()), pa.nulls(len(images), pa.string())], names=["bytes", "path"]
                )
            px = np.concatenate([ep.frames[cam] for ep in group]).reshape(-1, 3) / 255.0  # running sums
            pixels[cam].append((px.sum(0), (px**2).sum(0), px.min(0), px.max(0), len(px)))
        path = root / DATA_PATH.format(**where)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(columns), path)
        for j, ep in enumerate(group):
            row = {
                "episode_index": ep.episode_index,
                "tasks": [TASKS[ep.task_index][0]],
                "length": n,
                "data/chunk_index": where["chunk_index"],
                "data/file_index": where["file_index"],
                "dataset_from_index": index,
                "dataset_to_index": index + n,
                "meta/episodes/chunk_index": 0,
                "meta/episodes/file_index": 0,
            }
            for cam in cfg.cameras if cfg.video else ():
                row.update({f"videos/{cam}/{key}": value for key, value in where.items()})
                row[f"videos/{cam}/from_timestamp"] = j * n / cfg.fps
                row[f"videos/{cam}/to_timestamp"] = (j + 1) * n / cfg.fps
            episodes.append(row)
            states.append(ep.state)
            actions.append(ep.actions)
            index += n
    info = {
        "codebase_version": CODEBASE_VERSION,
        "robot_type": "synthetic",
        "total_episodes": cfg.num_episodes,
        "total_frames": index,
        "total_tasks": cfg.num_tasks,
        "chunks_size": CHUNKS_SIZE,
        "fps": cfg.fps,
        "splits": {"train": f"0:{cfg.num_episodes}"},
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if cfg.video else None,
        "features": _features(cfg),
    }
    stats = {
        STATE_KEY: _feature_stats(np.concatenate(states)),
        ACTION_KEY: _feature_stats(np.concatenate(actions)),
    }
    for cam, parts in pixels.items():
        total, total_sq, lows, highs, counts = zip(*parts)
        count = sum(counts)
        mean = np.sum(total, axis=0) / count
        std = np.sqrt(np.maximum(np.sum(total_sq, axis=0) / count - mean**2, 0.0))
        stats[cam] = {
            "mean": mean.tolist(),
            "std": std.tolist(),
            "min": np.min(lows, 0).tolist(),
            "max": np.max(highs, 0).tolist(),
            "count": [count],
        }
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2))
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=2))
    tasks = {"task_index": list(range(cfg.num_tasks)), "task": [TASKS[i][0] for i in range(cfg.num_tasks)]}
    pq.write_table(pa.table(tasks), root / "meta" / "tasks.parquet")
    pq.write_table(pa.Table.from_pylist(episodes), root / EPISODES_PATH.format(chunk_index=0, file_index=0))
    return root


def cached_synthetic_dataset(cache_dir: str | Path, config: SyntheticRobotConfig) -> Path:
    """Write the synthetic dataset once per config under ``cache_dir`` and reuse it.

    The folder is ``synthetic_robot_<key>`` (``key``: a hash of the config, the layout's version
    and the codec's encoder settings). It is written
    through :func:`scopebench.atomic.atomic_dir`, so an interrupted write never leaves a
    dataset that looks complete, the temporary folder of a process that died mid-write
    (a second Ctrl-C, ``kill -9``) is removed by the next write, and two processes writing
    the same dataset at once (ranks of one run) keep the first complete copy.
    """
    from scopebench.atomic import atomic_dir
    from scopebench.policy.data.video import CODECS

    # A new layout, look or encoder setting: a new folder (not a cached copy of the old one).
    encoder = CODECS[config.codec] if config.video else None
    described = {**vars(config), "format": CODEBASE_VERSION, "edge": EDGE, "encoder": encoder}
    key = hashlib.sha1(json.dumps(described, sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) / f"synthetic_robot_{key}"
    if not (root / "meta" / "info.json").is_file():
        with atomic_dir(root, exist_ok=True) as tmp:
            write_synthetic_dataset(tmp, config)
    if not (root / "meta" / "info.json").is_file():  # a folder of the same name not written here
        raise ValueError(f"{root} exists but holds no dataset (no meta/info.json): remove it and run again")
    return root
