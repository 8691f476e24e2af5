"""Reading LeRobot-style robot datasets: a torch Dataset, a weighted mixture, a DataLoader.

:class:`RobotDataset` loads the small tables (states, actions, indices) at construction
and decodes PNG frames in ``__getitem__``, so decoding runs in DataLoader workers.
Each sample holds:

- ``camera{i}``: (3, H, W) float32 in [0, 1] (``uint8 / 255``, exactly);
- ``state``: (state_dim,) float32;
- ``actions``: (chunk_size, action_dim) float32, the actions from this frame on, the
  last real one repeated past the episode end;
- ``action_is_pad``: (chunk_size,) bool, True on those repeated steps;
- ``prompt``: the episode's task string;
- ``index``, ``episode_index``, ``frame_index`` (int64) and ``timestamp`` (float32).

:func:`make_dataloader` samples several datasets with fixed weights from a seeded
sampler, so a seed fixes the order whatever the number of workers.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

from scopebench.policy.data import ACTION_KEY, CHUNKS_SIZE, STATE_KEY
from scopebench.validate import integer

INFO_KEYS = ("fps", "features", "total_episodes", "data_path", "image_path")


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    try:
        value = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(value, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(value).__name__}")
    return value


def _read_jsonl(path: Path) -> list[dict]:
    if not path.is_file():
        raise FileNotFoundError(f"dataset file not found: {path}")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path} line {number} is not valid JSON: {err}") from err
    return rows


def load_png(path: str | Path) -> torch.Tensor:
    """A PNG as (3, H, W) float32 in [0, 1] (exactly ``uint8 / 255``)."""
    from PIL import Image

    with Image.open(path) as img:
        array = np.asarray(img.convert("RGB"))  # (H, W, 3) uint8
    return torch.from_numpy(array.copy()).permute(2, 0, 1).float().div_(255.0)


class RobotDataset(Dataset):
    """Frames of a LeRobot-style dataset, with action chunks (see the module docstring).

    Args:
        root: dataset folder (with ``meta/info.json``).
        chunk_size: actions per sample.

    Raises:
        FileNotFoundError: a metadata or parquet file is missing (the error names it).
        ValueError: a file is malformed or inconsistent with ``meta/info.json``.
    """

    def __init__(self, root: str | Path, chunk_size: int) -> None:
        import pyarrow.parquet as pq

        integer("chunk_size", chunk_size, low=1)
        self.root = Path(root)
        self.chunk_size = chunk_size
        info_path = self.root / "meta" / "info.json"
        self.info = info = _read_json(info_path)
        missing = [k for k in INFO_KEYS if k not in info]
        if missing:
            raise ValueError(f"{info_path} lacks key(s) {missing}; expected all of {INFO_KEYS}")
        features = info["features"]
        for key in (STATE_KEY, ACTION_KEY):
            if not isinstance(features.get(key), dict) or "shape" not in features[key]:
                raise ValueError(f"{info_path}: features[{key!r}] with a 'shape' is required")
        self.cameras = sorted(k for k, f in features.items() if f.get("dtype") in ("image", "video"))
        if not self.cameras:
            raise ValueError(f"{info_path}: no feature with dtype 'image'")
        self.fps = info["fps"]
        self.stats = _read_json(self.root / "meta" / "stats.json")
        self.tasks = {t["task_index"]: t["task"] for t in _read_jsonl(self.root / "meta" / "tasks.jsonl")}

        self._episodes, states, actions, tasks, indices = [], [], [], [], []
        for e in range(int(info["total_episodes"])):
            path = self.root / info["data_path"].format(
                episode_chunk=e // info.get("chunks_size", CHUNKS_SIZE), episode_index=e
            )
            if not path.is_file():
                raise FileNotFoundError(f"dataset file not found: {path}")
            table = pq.read_table(path).to_pydict()
            absent = {STATE_KEY, ACTION_KEY, "task_index", "index", "frame_index"} - set(table)
            if absent:
                raise ValueError(f"{path} lacks column(s) {sorted(absent)}")
            self._episodes.append((e, len(table["index"])))
            states.append(np.asarray(table[STATE_KEY], dtype=np.float32))
            actions.append(np.asarray(table[ACTION_KEY], dtype=np.float32))
            tasks.append(np.asarray(table["task_index"], dtype=np.int64))
            indices.append(np.asarray(table["index"], dtype=np.int64))
        for key, arrays in ((STATE_KEY, states), (ACTION_KEY, actions)):
            want = tuple(features[key]["shape"])
            for (e, _), a in zip(self._episodes, arrays):
                if a.ndim != 2 or a.shape[1:] != want:
                    raise ValueError(
                        f"episode {e} column {key!r} has shape {a.shape}, " f"but {info_path} declares (T, {want[0]})"
                    )
        self._state, self._actions = states, actions
        self._task, self._global_index = tasks, indices
        lengths = np.array([n for _, n in self._episodes], dtype=np.int64)
        self._starts = np.concatenate([[0], np.cumsum(lengths)])  # frame offsets per episode

    @property
    def state_dim(self) -> int:
        """Size of the state vector."""
        return int(self.info["features"][STATE_KEY]["shape"][0])

    @property
    def action_dim(self) -> int:
        """Size of the action vector."""
        return int(self.info["features"][ACTION_KEY]["shape"][0])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(H, W, 3) of the first camera."""
        return tuple(self.info["features"][self.cameras[0]]["shape"])

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} frames")
        pos = int(np.searchsorted(self._starts, i, side="right")) - 1
        episode, length = self._episodes[pos]
        frame = i - int(self._starts[pos])
        steps = frame + np.arange(self.chunk_size)
        is_pad = steps >= length
        actions = self._actions[pos][np.minimum(steps, length - 1)]  # (chunk, a)
        sample = {}
        for c, cam in enumerate(self.cameras):
            rel = self.info["image_path"].format(image_key=cam, episode_index=episode, frame_index=frame)
            sample[f"camera{c}"] = load_png(self.root / rel)
        task = int(self._task[pos][frame])
        sample.update(
            state=torch.from_numpy(self._state[pos][frame]),
            actions=torch.from_numpy(actions),
            action_is_pad=torch.from_numpy(is_pad),
            prompt=self.tasks.get(task, ""),
            index=int(self._global_index[pos][frame]),
            episode_index=episode,
            frame_index=frame,
            timestamp=float(frame) / self.fps,
        )
        return sample


def synthetic_samples(num_episodes: int, episode_length: int) -> int:
    """Samples of a dataset of ``num_episodes`` episodes of ``episode_length`` frames.

    Every frame starts a sample whatever the chunk size (:class:`RobotDataset` repeats the
    last action past an episode's end), so the count is the number of frames.
    """
    return num_episodes * episode_length


def dataset_samples(root: str | Path) -> int | None:
    """Samples of the dataset at ``root`` as :class:`RobotDataset` counts them (one per frame),
    read from ``meta/info.json``'s ``total_frames`` without opening the episodes; None when
    the file or the key is missing (the dataset's reader names what is wrong, later)."""
    info_path = Path(root) / "meta" / "info.json"
    if not info_path.is_file():
        return None
    frames = _read_json(info_path).get("total_frames")
    return frames if isinstance(frames, int) and not isinstance(frames, bool) else None


def check_batch_fits(batch_size: int, samples: int | None, world_size: int = 1, dataset: str = "the dataset") -> None:
    """Refuse a batch larger than a rank's share of the dataset (``samples``: None skips).

    The training dataloader drops a last incomplete batch, and accelerate hands each rank
    every ``world_size``-th batch, so a rank gets no batch at all (a bare ``StopIteration``
    at the first step) unless ``batch_size x world_size <= samples``.

    Raises:
        ValueError: naming ``batch_size``, the samples (per rank) and ``dataset``.
    """
    if samples is None or batch_size * world_size <= samples:
        return
    share = (
        f"the {samples} training samples of {dataset}"
        if world_size == 1
        else f"the {samples // world_size} training samples per rank of {dataset} ({samples} over {world_size} ranks)"
    )
    raise ValueError(
        f"batch_size {batch_size} is larger than {share}: lower batch_size or use a larger dataset "
        "(dataset.num_episodes / dataset.episode_length)"
    )


def check_dataset_batch(root: str | Path, batch_size: int, world_size: int = 1) -> None:
    """:func:`check_batch_fits` for the dataset at ``root`` (its samples read from ``meta/info.json``)."""
    check_batch_fits(batch_size, dataset_samples(root), world_size, f"the dataset ({root})")


def collate_robot_batch(samples: list[dict]) -> dict:
    """Stack tensors and numbers; keep strings (prompts) as a list."""
    batch = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], str):
            batch[key] = values
        elif isinstance(values[0], torch.Tensor):
            batch[key] = torch.stack(values)
        else:
            batch[key] = torch.tensor(values)
    return batch


class WeightedMixtureSampler(Sampler[int]):
    """Indices into a concatenation of datasets, each dataset drawn with a fixed weight.

    For every draw the dataset is chosen at random with probability proportional to its
    weight, and the next index of a fresh random permutation of that dataset is taken, so
    a small dataset is cycled through rather than sampled with repeats. Iteration ``k``
    (0-based, one per epoch) uses the seed ``seed + k``: every epoch has a new order and
    the sequence of orders is fixed by ``seed`` (:meth:`set_epoch` picks ``k`` explicitly,
    for resuming).

    Args:
        sizes: lengths of the concatenated datasets.
        weights: one non-negative weight per dataset (None: proportional to size).
        num_samples: indices per epoch (default: the total length).
        seed: fixes the order.
    """

    def __init__(self, sizes: Sequence[int], weights=None, num_samples=None, seed: int = 0):
        if not sizes or min(sizes) < 1:
            raise ValueError(f"every dataset needs at least one sample, got sizes {list(sizes)}")
        weights = list(sizes) if weights is None else list(weights)
        if len(weights) != len(sizes) or min(weights) < 0 or sum(weights) <= 0:
            raise ValueError(f"expected {len(sizes)} non-negative weights with a positive sum, got {weights}")
        self.sizes = list(sizes)
        self.weights = torch.tensor(weights, dtype=torch.float64)
        self.num_samples = int(num_samples or sum(sizes))
        self.seed, self.epoch = seed, 0
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)])[:-1].tolist()
        self._skip = 0

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration use the order of epoch ``epoch``."""
        self.epoch = epoch

    def skip_next(self, count: int) -> None:
        """Make the next iteration leave out its first ``count`` indices (resuming mid-epoch:
        the rest of the epoch comes in the same order as without the interruption)."""
        if count < 0:
            raise ValueError(f"skip count must be >= 0, got {count}")
        self._skip = count

    def __len__(self) -> int:
        return self.num_samples

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        self.epoch += 1  # the next epoch gets a new order without the caller's help
        skip, self._skip = self._skip, 0
        choice = torch.multinomial(self.weights, self.num_samples, replacement=True, generator=g)
        perms, cursor = [None] * len(self.sizes), [0] * len(self.sizes)
        for n, d in enumerate(choice.tolist()):
            if perms[d] is None or cursor[d] == self.sizes[d]:
                perms[d], cursor[d] = torch.randperm(self.sizes[d], generator=g).tolist(), 0
            if n >= skip:
                yield self.offsets[d] + perms[d][cursor[d]]
            cursor[d] += 1


def make_dataloader(
    datasets: RobotDataset | Sequence[RobotDataset],
    batch_size: int,
    *,
    weights: Sequence[float] | None = None,
    num_samples: int | None = None,
    seed: int = 0,
    num_workers: int = 0,
    prefetch_factor: int | None = 2,
    persistent_workers: bool = False,
    pin_memory: bool | None = None,
    drop_last: bool = True,
) -> DataLoader:
    """A DataLoader over a weighted mixture of robot datasets.

    Args:
        datasets: one dataset or several with the same cameras, image shape, state and
            action sizes and chunk size.
        batch_size: samples per batch.
        weights: mixture weights, one per dataset (None: proportional to size).
        num_samples: samples per epoch (default: total frames).
        seed: seed of the sampler; the same seed gives the same order.
        num_workers: worker processes decoding PNGs (0: in the main process).
        prefetch_factor: batches prefetched per worker (ignored with 0 workers).
        persistent_workers: keep workers alive between epochs (needs workers).
        pin_memory: page-locked batches; default: True when CUDA is available.
        drop_last: drop a last incomplete batch.
    """
    datasets = [datasets] if isinstance(datasets, RobotDataset) else list(datasets)
    if not datasets:
        raise ValueError("make_dataloader needs at least one dataset, got none")
    integer("batch_size", batch_size, low=1)
    integer("num_workers", num_workers, low=0)
    first = datasets[0]
    signature = (len(first.cameras), first.image_shape, first.state_dim, first.action_dim, first.chunk_size)
    for ds in datasets[1:]:
        other = (len(ds.cameras), ds.image_shape, ds.state_dim, ds.action_dim, ds.chunk_size)
        if other != signature:
            raise ValueError(
                f"datasets differ: {ds.root} has (cameras, image shape, state, action, chunk) "
                f"{other}, {first.root} has {signature}"
            )
    sampler = WeightedMixtureSampler([len(d) for d in datasets], weights, num_samples, seed)
    return DataLoader(
        ConcatDataset(datasets),
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        prefetch_factor=prefetch_factor if num_workers > 0 else None,
        persistent_workers=persistent_workers and num_workers > 0,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        collate_fn=collate_robot_batch,
        drop_last=drop_last,
        # Worker seeds come from this generator, not from the global RNG, so starting an
        # epoch does not move the training step's noise (a resumed run stays exact).
        generator=torch.Generator().manual_seed(seed),
    )


def fixed_eval_batch(dataset: RobotDataset, batch_size: int) -> dict:
    """``batch_size`` frames evenly spread over the dataset, always the same ones.

    :Examples:

    >>> class Frames(list):
    ...     pass
    >>> batch = fixed_eval_batch(Frames({"i": torch.tensor(i)} for i in range(10)), 3)
    >>> batch["i"].tolist()
    [0, 3, 6]
    """
    integer("eval_batch_size", batch_size, low=1, high=len(dataset))
    step = len(dataset) // batch_size
    return collate_robot_batch([dataset[i * step] for i in range(batch_size)])
