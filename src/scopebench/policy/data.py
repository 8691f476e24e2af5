"""Synthetic robot episodes written as a LeRobot-style dataset on disk.

Each episode has a task prompt, smooth state and action trajectories, and camera frames
showing an object (coloured by the task) moving along a smooth path with a marker for
the arm. The point is realistic *input-pipeline* cost (PNG decoding, parquet reads,
chunking, padding at episode ends), not a learnable robot task.

Layout under ``root`` (LeRobot v2 style, PNG frames instead of videos)::

    data/chunk-000/episode_000000.parquet   observation.state, action, timestamp,
                                            frame_index, episode_index, index, task_index
    images/camera0/episode_000000/frame_000000.png
    meta/info.json       fps, features (dtype / shape / names), path templates, totals
    meta/stats.json      mean / std / min / max per feature
    meta/tasks.jsonl     {"task_index": i, "task": "..."}
    meta/episodes.jsonl  {"episode_index": e, "tasks": [...], "length": T}
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import InitVar, dataclass
from pathlib import Path

import numpy as np

from scopebench.validate import integer

#: Column and feature names of the state and action vectors (LeRobot's), the one definition.
STATE_KEY = "observation.state"
ACTION_KEY = "action"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
IMAGE_PATH = "images/{image_key}/episode_{episode_index:06d}/frame_{frame_index:06d}.png"
CHUNKS_SIZE = 1000  # episodes per data/chunk-XXX folder, as in LeRobot
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
    key_prefix: InitVar[str] = ""
    """How errors name the keys: ``dataset.`` for a run config's section, nothing for the
    benchopt dataset's parameters (not stored: the dataset's cache key ignores it)."""

    def __post_init__(self, key_prefix: str) -> None:
        for name in ("num_episodes", "episode_length", "num_cameras", "state_dim", "action_dim", "fps"):
            integer(f"{key_prefix}{name}", getattr(self, name), low=1)
        integer(f"{key_prefix}image_size", self.image_size, low=8)
        integer(f"{key_prefix}num_tasks", self.num_tasks, low=1, high=len(TASKS))
        integer(f"{key_prefix}seed", self.seed, low=0)
        self._check_memory(key_prefix)

    def _check_memory(self, key_prefix: str) -> None:
        """Refuse frames the writer cannot hold: :func:`generate_episode` renders every
        camera's frames of one episode at once (uint8; its float temporaries come on top), so
        a too-large ``image_size`` would end in numpy's ``Unable to allocate`` mid-write."""
        from scopebench.train.memory import available_memory_bytes

        needed = self.episode_length * self.image_size**2 * 3 * self.num_cameras
        available = available_memory_bytes("cpu")
        if needed > available:
            raise ValueError(
                f"{key_prefix}image_size={self.image_size} needs at least {needed} bytes of memory to write the "
                f"dataset ({self.episode_length} frames x {self.image_size}^2 pixels x 3 bytes x {self.num_cameras} "
                f"cameras per episode) but {available} bytes are available: lower {key_prefix}image_size"
            )

    @property
    def cameras(self) -> list[str]:
        """Camera names."""
        return [f"camera{i}" for i in range(self.num_cameras)]


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


def _render(xy: np.ndarray, arm: np.ndarray, color, size: int, camera: int) -> np.ndarray:
    """Frames (T, H, W, 3) uint8: a gradient background, the object disc, an arm marker.

    Cameras differ by a mirrored, zoomed view and a background tint.
    """
    if camera % 2:  # a second viewpoint: mirrored and zoomed in on the centre
        xy, arm = 0.5 + 1.3 * (0.5 - xy), 0.5 + 1.3 * (0.5 - arm)
    coords = (np.arange(size) + 0.5) / size
    gy, gx = np.meshgrid(coords, coords, indexing="ij")  # (H, W)
    tint = np.array([90, 90, 110]) if camera % 2 else np.array([110, 100, 90])
    background = (tint * (0.6 + 0.4 * gy[..., None])).astype(np.uint8)  # (H, W, 3)
    frames = np.repeat(background[None], len(xy), axis=0)  # (T, H, W, 3)
    dist = np.hypot(gx[None] - xy[:, 0, None, None], gy[None] - xy[:, 1, None, None])
    frames[dist < 0.12] = color
    near_arm = np.maximum(abs(gx[None] - arm[:, 0, None, None]), abs(gy[None] - arm[:, 1, None, None]))
    frames[near_arm < 0.05] = (235, 235, 235)
    return frames


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


def write_synthetic_dataset(root: str | Path, config: SyntheticRobotConfig | None = None) -> Path:
    """Generate and write a dataset (see the module docstring for the layout).

    Args:
        root: folder to write; created if needed. Existing files are overwritten.
        config: sizes and seed; defaults to :class:`SyntheticRobotConfig`.

    Returns:
        ``root`` as a Path.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    cfg = config or SyntheticRobotConfig()
    root = Path(root)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    states, actions, pixels, episodes, index = [], [], {c: [] for c in cfg.cameras}, [], 0
    for e in range(cfg.num_episodes):
        ep = generate_episode(cfg, e)
        n = cfg.episode_length
        table = pa.table(
            {
                STATE_KEY: pa.FixedSizeListArray.from_arrays(ep.state.ravel(), cfg.state_dim),
                ACTION_KEY: pa.FixedSizeListArray.from_arrays(ep.actions.ravel(), cfg.action_dim),
                "timestamp": pa.array(np.arange(n, dtype=np.float32) / cfg.fps),
                "frame_index": pa.array(np.arange(n, dtype=np.int64)),
                "episode_index": pa.array(np.full(n, e, dtype=np.int64)),
                "index": pa.array(np.arange(index, index + n, dtype=np.int64)),
                "task_index": pa.array(np.full(n, ep.task_index, dtype=np.int64)),
            }
        )
        path = root / DATA_PATH.format(episode_chunk=e // CHUNKS_SIZE, episode_index=e)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        for cam, frames in ep.frames.items():
            for f, frame in enumerate(frames):
                png = root / IMAGE_PATH.format(image_key=cam, episode_index=e, frame_index=f)
                png.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(frame).save(png, compress_level=1)  # fast to write, still lossless
            px = frames.reshape(-1, 3) / 255.0  # running sums: all frames may not fit in memory
            pixels[cam].append((px.sum(0), (px**2).sum(0), px.min(0), px.max(0), len(px)))
        states.append(ep.state)
        actions.append(ep.actions)
        episodes.append({"episode_index": e, "tasks": [TASKS[ep.task_index][0]], "length": n})
        index += n
    s = cfg.image_size
    features = {
        STATE_KEY: {
            "dtype": "float32",
            "shape": [cfg.state_dim],
            "names": [f"joint_{i}" for i in range(cfg.state_dim)],
        },
        ACTION_KEY: {
            "dtype": "float32",
            "shape": [cfg.action_dim],
            "names": [f"joint_{i}" for i in range(cfg.action_dim)],
        },
        **{
            cam: {"dtype": "image", "shape": [s, s, 3], "names": ["height", "width", "channels"]} for cam in cfg.cameras
        },
        "timestamp": {"dtype": "float32", "shape": [1], "names": None},
        **{
            k: {"dtype": "int64", "shape": [1], "names": None}
            for k in ("frame_index", "episode_index", "index", "task_index")
        },
    }
    info = {
        "codebase_version": "v2.1",
        "robot_type": "synthetic",
        "fps": cfg.fps,
        "total_episodes": cfg.num_episodes,
        "total_frames": index,
        "total_tasks": cfg.num_tasks,
        "chunks_size": CHUNKS_SIZE,
        "data_path": DATA_PATH,
        "image_path": IMAGE_PATH,
        "features": features,
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
    tasks = [{"task_index": i, "task": TASKS[i][0]} for i in range(cfg.num_tasks)]
    (root / "meta" / "tasks.jsonl").write_text("".join(json.dumps(t) + "\n" for t in tasks))
    (root / "meta" / "episodes.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    return root


def cached_synthetic_dataset(cache_dir: str | Path, config: SyntheticRobotConfig) -> Path:
    """Write the synthetic dataset once per config under ``cache_dir`` and reuse it.

    The folder is ``synthetic_robot_<key>`` (``key``: a hash of the config). It is written
    through :func:`scopebench.atomic.atomic_dir`, so an interrupted write never leaves a
    dataset that looks complete, the temporary folder of a process that died mid-write
    (a second Ctrl-C, ``kill -9``) is removed by the next write, and two processes writing
    the same dataset at once (ranks of one run) keep the first complete copy.
    """
    from scopebench.atomic import atomic_dir

    key = hashlib.sha1(json.dumps(vars(config), sort_keys=True).encode()).hexdigest()[:12]
    root = Path(cache_dir) / f"synthetic_robot_{key}"
    if not (root / "meta" / "info.json").is_file():
        with atomic_dir(root, exist_ok=True) as tmp:
            write_synthetic_dataset(tmp, config)
    if not (root / "meta" / "info.json").is_file():  # a folder of the same name not written here
        raise ValueError(f"{root} exists but holds no dataset (no meta/info.json): remove it and run again")
    return root
