"""A LeRobot v3.0 dataset folder: its metadata, its frame tables, and the checks made up front.

The format, as LeRobot documents it (``docs/source/lerobot-dataset-v3.mdx`` of
github.com/huggingface/lerobot) and writes it (``src/lerobot/datasets/``)::

    meta/info.json      codebase_version "v3.0", fps, features (dtype / shape / names; a camera
                        has dtype "video" or "image"), data_path and video_path templates
    meta/stats.json     per feature: mean / std / min / max / count (normalisation)
    meta/tasks.parquet  column task_index, and the task strings (pandas' saved index "task")
    meta/episodes/chunk-XXX/file-YYY.parquet   one row per episode: episode_index, length,
                        dataset_from_index / dataset_to_index (its rows' global indices),
                        data/chunk_index, data/file_index, and per video camera
                        videos/<camera>/chunk_index, file_index, from_timestamp, to_timestamp
    data/chunk-XXX/file-YYY.parquet   the frames of many episodes: observation.state, action,
                        timestamp (seconds from the episode's start), frame_index,
                        episode_index, index, task_index; an "image" camera as a column of
                        {bytes, path} (PNG bytes)
    videos/<camera>/chunk-XXX/file-YYY.mp4     one camera's frames of many episodes, one after
                        the other: an episode's frame at ``timestamp`` is the video's frame at
                        ``from_timestamp + timestamp``

:class:`LeRobotFolder` reads all of it but the camera frames, and refuses before any work
what a frame read would trip on later, each error naming the file: another format version,
a missing file or column, an ``fps`` that is not a number > 0, no episode at all, rows and
episodes that disagree, timestamps out of step with ``fps``, task indices without a task, a NaN
or infinite number in a state or action (which would make every training loss NaN), and
(:meth:`LeRobotFolder.check_videos`) a missing, unreadable or undecodable video, or one shorter
than its episodes' rows or timestamps. The metadata itself, ``meta/info.json`` and
``meta/stats.json`` (their JSON, the state and action sizes, the statistics the policy
normalises with, the path templates), is checked by :mod:`scopebench.policy.data.lerobot_meta`
before any of it names a file or is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from scopebench.policy.data.lerobot_meta import (
    ACTION_KEY,
    STATE_KEY,
    TEMPLATES,
    camera_shape,
    check_stats,
    check_template,
    check_version,
    read_json,
    template_path,
    vector_size,
)
from scopebench.policy.data.video import TOLERANCE_SEC, probe_video
from scopebench.validate import number, quote

INFO_KEYS = ("codebase_version", "fps", "features", "data_path", "total_frames")
DATA_COLUMNS = (STATE_KEY, ACTION_KEY, "timestamp", "frame_index", "episode_index", "index", "task_index")
EPISODE_COLUMNS = ("episode_index", "length", "dataset_from_index", "dataset_to_index")
CAMERA_DTYPES = ("video", "image")


def _read_parquet(path: Path, columns=None):
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"{path} is not a readable parquet file: {err}") from err
    absent = sorted(set(columns or ()) - set(table.column_names))
    if absent:
        raise ValueError(f"{path} lacks column(s) {absent}; it has {table.column_names}")
    return table


def _matrix(column, key: str, dim: int, info_path: Path) -> np.ndarray:
    """A column of vectors (fixed-size or variable lists) as an (N, dim) float32 array."""
    import pyarrow as pa

    array = column.combine_chunks()
    if not (pa.types.is_list(array.type) or pa.types.is_fixed_size_list(array.type)):
        raise ValueError(f"column {key!r} holds {array.type}, not lists of {dim} numbers ({info_path} features)")
    lengths = array.value_lengths().to_numpy(zero_copy_only=False)
    if len(array) and (lengths != dim).any():
        raise ValueError(
            f"column {key!r} has vectors of {sorted(set(lengths.tolist()))[:5]} values, but {info_path} "
            f"declares shape [{dim}]"
        )
    return array.flatten().to_numpy(zero_copy_only=False).astype(np.float32).reshape(len(array), dim)


@dataclass
class Episode:
    """Where one episode lies: its rows ``start:stop`` (positions in the dataset) and, per video
    camera, its video file and the time its first frame has there."""

    index: int
    start: int
    stop: int
    videos: dict[str, tuple[Path, float]]


class LeRobotFolder:
    """The metadata and frame tables of a LeRobot v3.0 folder (see the module docstring).

    Attributes:
        info, stats: ``meta/info.json`` and ``meta/stats.json``.
        cameras: the camera features, sorted; ``videos`` / ``images``: those stored as MP4 /
            as image bytes in the parquet files.
        tasks: task_index -> task string.
        episodes: one :class:`Episode` each, in row order; ``episode_of_row``: its position per row.
        state, action (float32), timestamp (float64), frame_index, episode_index, index,
        task_index (int64): one entry per row, in the order of ``index``.
        image_bytes: image camera -> pyarrow BinaryArray of its encoded frames, per row.

    Raises:
        FileNotFoundError: a metadata, parquet or (with :meth:`check_videos`) video file is missing.
        ValueError: a file is malformed, of another version, or inconsistent (named).
    """

    def __init__(self, root: str | Path) -> None:
        self.root = root = Path(root)
        self.info_path = root / "meta" / "info.json"
        self.info = info = read_json(self.info_path)
        check_version(info, self.info_path)
        missing = [k for k in INFO_KEYS if k not in info]
        if missing:
            raise ValueError(f"{self.info_path} lacks key(s) {missing}; a v3.0 info.json has all of {INFO_KEYS}")
        # frames are 1 / fps apart: 0 divided by zero, a string had no float
        self.fps = number(f"{self.info_path}: fps", info["fps"], low=0, low_open=True)
        features = info["features"]
        if not isinstance(features, dict) or not all(isinstance(f, dict) for f in features.values()):
            raise ValueError(
                f"{self.info_path}: features must map each feature's name to an object, got {quote(features)}"
            )
        #: The size of the state and of the action vectors.
        self.dims = {key: vector_size(features, key, self.info_path) for key in (STATE_KEY, ACTION_KEY)}
        self.cameras = sorted(k for k, f in features.items() if f.get("dtype") in CAMERA_DTYPES)
        for camera in self.cameras:
            shape = features[camera].get("shape")
            if not (isinstance(shape, list) and len(shape) == 3 and all(type(n) is int and n >= 1 for n in shape)):
                raise ValueError(
                    f"{self.info_path}: features[{camera!r}] needs a 'shape' of three integers >= 1 (height, width "
                    f"and 3 channels, in either order), got {quote(shape)}"
                )
        if not self.cameras:
            raise ValueError(f"{self.info_path}: no camera feature (dtype 'video' or 'image') in {sorted(features)}")
        self.videos = [c for c in self.cameras if features[c]["dtype"] == "video"]
        self.images = [c for c in self.cameras if features[c]["dtype"] == "image"]
        if self.videos and "video_path" not in info:
            raise ValueError(f"{self.info_path} lacks key 'video_path' for its video features {self.videos}")
        for key in TEMPLATES:  # an image-only folder may hold video_path null (LeRobot writes it so)
            if key == "data_path" or self.videos or info.get(key) is not None:
                check_template(info[key], key, self.info_path)
        self.stats = read_json(root / "meta" / "stats.json")
        check_stats(self.stats, root / "meta" / "stats.json", self.dims, self.info_path)
        self.tasks = self._read_tasks(root / "meta" / "tasks.parquet")
        self._read_episodes()
        self._read_rows()

    # -- metadata ----------------------------------------------------------------------------
    @staticmethod
    def _read_tasks(path: Path) -> dict[int, str]:
        table = _read_parquet(path, ["task_index"]).to_pydict()
        names = [k for k in ("task", "__index_level_0__") if k in table]
        names += [k for k, v in table.items() if k != "task_index" and v and isinstance(v[0], str)]
        if not names:
            raise ValueError(f"{path} has no column of task strings ('task'); it has {sorted(table)}")
        return {int(i): str(t) for i, t in zip(table["task_index"], table[names[0]])}

    def _read_episodes(self) -> None:
        folder = self.root / "meta" / "episodes"
        files = sorted(folder.glob("chunk-*/file-*.parquet"))
        if not files:
            raise FileNotFoundError(f"dataset file not found: {folder}/chunk-XXX/file-YYY.parquet (episode metadata)")
        video_columns = [
            f"videos/{c}/{k}" for c in self.videos for k in ("chunk_index", "file_index", "from_timestamp")
        ]
        needed = [*EPISODE_COLUMNS, "data/chunk_index", "data/file_index", *video_columns]
        rows: list[dict] = []
        for path in files:
            table = _read_parquet(path, needed).select(needed).to_pylist()
            rows += [{**row, "_file": path} for row in table]
        if not rows:
            raise ValueError(f"{folder}: its {len(files)} file(s) hold no episode (0 rows); a dataset needs one")
        rows.sort(key=lambda r: r["dataset_from_index"])
        self._episode_rows = rows
        self.data_files = sorted(
            {(int(r["data/chunk_index"]), int(r["data/file_index"])) for r in rows}
        )  # in the order their rows come

    def _video_path(self, camera: str, row: dict) -> Path:
        chunk, file = (int(row[f"videos/{camera}/{k}"]) for k in ("chunk_index", "file_index"))
        return self._path("video_path", video_key=camera, chunk_index=chunk, file_index=file)

    def _path(self, key: str, **fields) -> Path:
        return template_path(self.root, self.info[key], key, self.info_path, **fields)

    # -- rows --------------------------------------------------------------------------------
    def _read_rows(self) -> None:
        import pyarrow as pa

        tables, paths = [], []
        for chunk, file in self.data_files:
            path = self._path("data_path", chunk_index=chunk, file_index=file)
            table = _read_parquet(path, [*DATA_COLUMNS, *self.images])
            tables.append(table.select([*DATA_COLUMNS, *self.images]))
            paths.append(path)
        table = pa.concat_tables(tables)
        file_of_row = np.repeat(np.arange(len(paths)), [t.num_rows for t in tables])
        index = table.column("index").to_numpy()
        order = np.argsort(index, kind="stable")
        self.index = index[order]
        column = {name: table.column(name) for name in DATA_COLUMNS}
        for key in (STATE_KEY, ACTION_KEY):
            values = _matrix(column[key], key, self.dims[key], self.info_path)
            setattr(self, "state" if key == STATE_KEY else "action", values[order])
        self.timestamp = column["timestamp"].to_numpy().astype(np.float64)[order]
        for name in ("frame_index", "episode_index", "task_index"):
            setattr(self, name, column[name].to_numpy().astype(np.int64)[order])
        self.image_bytes = {c: table.column(c).combine_chunks().field("bytes").take(order) for c in self.images}
        self._file_of_row = file_of_row[order]
        self._data_paths = paths
        self._place_episodes()
        self._check_rows()

    def _place_episodes(self) -> None:
        self.episodes, n = [], len(self.index)
        episode_of_row = np.full(n, -1, dtype=np.int64)
        for row in self._episode_rows:
            e, length = int(row["episode_index"]), int(row["length"])
            start = int(np.searchsorted(self.index, row["dataset_from_index"]))
            stop = start + length
            where = f"{row['_file']}: episode {e}"
            if int(row["dataset_to_index"]) - int(row["dataset_from_index"]) != length:
                raise ValueError(
                    f"{where} has length {length} but dataset_from_index / dataset_to_index "
                    f"{row['dataset_from_index']} / {row['dataset_to_index']}"
                )
            rows = self.episode_index[start:stop]
            if stop > n or self.index[start] != row["dataset_from_index"] or (rows != e).any():
                raise ValueError(
                    f"{where}: rows with index {row['dataset_from_index']} to {row['dataset_to_index']} - 1 should be "
                    f"its {length} frames, but the data files hold {int((self.episode_index == e).sum())} rows of "
                    f"episode_index {e} there or elsewhere"
                )
            videos = {c: (self._video_path(c, row), float(row[f"videos/{c}/from_timestamp"])) for c in self.videos}
            episode_of_row[start:stop] = len(self.episodes)
            self.episodes.append(Episode(e, start, stop, videos))
        if (episode_of_row < 0).any():
            stray = int(np.argmax(episode_of_row < 0))
            raise ValueError(
                f"{self._data_paths[self._file_of_row[stray]]}: row with index {self.index[stray]} (episode_index "
                f"{self.episode_index[stray]}) belongs to no episode of {self.root / 'meta' / 'episodes'}"
            )
        self.episode_of_row = episode_of_row

    def _check_rows(self) -> None:
        self._check_finite()
        step = 1.0 / self.fps
        same = np.diff(self.episode_of_row) == 0
        gaps = np.diff(self.timestamp)
        bad = np.flatnonzero(same & (np.abs(gaps - step) > TOLERANCE_SEC))
        if bad.size:
            r = int(bad[0]) + 1
            raise ValueError(
                f"{self._data_paths[self._file_of_row[r]]}: episode {self.episode_index[r]} frame {self.frame_index[r]} "
                f"has timestamp {self.timestamp[r]:.6f} s, {gaps[r - 1]:.6f} s after the previous frame; at fps "
                f"{self.fps:g} frames are {step:.6f} s apart (within {TOLERANCE_SEC} s)"
            )
        unknown = sorted(set(np.unique(self.task_index).tolist()) - set(self.tasks))
        if unknown:
            raise ValueError(
                f"{self.root / 'meta' / 'tasks.parquet'} has no task for task_index {unknown} used in the data files"
            )

    def _check_finite(self) -> None:
        """Refuse a state or action value that is NaN or infinite (as float32: a float64 beyond
        its range is infinite here), naming the file, the column and the first such row: one
        NaN in a batch makes the training loss NaN. One pass over the arrays already in memory."""
        for key, values in ((STATE_KEY, self.state), (ACTION_KEY, self.action)):
            finite = np.isfinite(values)
            if finite.all():
                continue
            r = int(np.argmin(finite.all(axis=1)))
            i = int(np.argmin(finite[r]))
            raise ValueError(
                f"{self._data_paths[self._file_of_row[r]]}: column {key!r} holds {values[r, i]} (value {i}) in the row "
                f"with index {self.index[r]}, episode {self.episode_index[r]} frame {self.frame_index[r]}; the state "
                "and the actions must be finite numbers"
            )

    # -- videos ------------------------------------------------------------------------------
    def check_videos(self) -> list:
        """Probe every video file once (no frame decoded) against the episodes stored in it.

        Returns:
            The :class:`~scopebench.policy.data.video.VideoInfo` of each file.

        Raises:
            FileNotFoundError: a video file is missing (named).
            ValueError: a file is unreadable, of an unknown codec, holds fewer frames than its
                episodes' rows, or ends before one of its episodes' timestamps (named).
        """
        by_file: dict[Path, list[tuple[Episode, float]]] = {}
        camera_of: dict[Path, str] = {}
        for episode in self.episodes:
            for camera, (path, start) in episode.videos.items():
                by_file.setdefault(path, []).append((episode, start))
                camera_of[path] = camera
        probed = []
        for path, episodes in by_file.items():
            info = probe_video(path)
            declared = camera_shape(self.info["features"][camera_of[path]])
            if (info.height, info.width) != declared:
                raise ValueError(
                    f"{path} holds {info.height} x {info.width} frames, but {self.info_path} declares "
                    f"{declared[0]} x {declared[1]} for {camera_of[path]!r}"
                )
            rows = sum(ep.stop - ep.start for ep, _ in episodes)
            if info.frames and info.frames < rows:
                raise ValueError(
                    f"{path} holds {info.frames} frames, fewer than the {rows} rows of its "
                    f"{len(episodes)} episode(s) in the data files: the video is shorter than its parquet rows"
                )
            last_frame = info.duration_sec - 1.0 / self.fps  # a frame lasts 1/fps; the duration counts the last one
            for episode, start in episodes:
                needed = start + float(self.timestamp[episode.stop - 1])
                if needed > last_frame + TOLERANCE_SEC:
                    raise ValueError(
                        f"{path}: episode {episode.index} needs a frame at {needed:.4f} s (from_timestamp {start:.4f} + "
                        f"timestamp {self.timestamp[episode.stop - 1]:.4f}), beyond the video's last frame at "
                        f"{last_frame:.4f} s ({info.frames} frames, {info.duration_sec:.4f} s)"
                    )
            probed.append(info)
        return probed
