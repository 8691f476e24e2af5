"""Reading LeRobot v3.0 robot datasets: a torch Dataset, a weighted mixture, a DataLoader.

:class:`RobotDataset` reads a LeRobot v3.0 folder (:class:`scopebench.policy.data.lerobot.LeRobotFolder`:
the tables in memory, every file checked at construction) and decodes the camera frames
in ``__getitem__`` (MP4 through :mod:`scopebench.policy.data.video`, or PNG bytes), so decoding
runs in DataLoader workers. Each sample holds:

- ``camera{i}``: (3, H, W) float32 in [0, 1] (``uint8 / 255``, exactly), the i-th camera
  feature in sorted order, at the frame's timestamp;
- ``state``: (state_dim,) float32;
- ``actions``: (chunk_size, action_dim) float32, the actions from this frame on (LeRobot's
  ``delta_timestamps`` of ``[0, 1/fps, ..., (chunk_size - 1)/fps]``), the last real one
  repeated past the episode end;
- ``action_is_pad``: (chunk_size,) bool, True on those repeated steps;
- ``prompt``: the frame's task string (``meta/tasks.parquet``);
- ``index``, ``episode_index``, ``frame_index`` (int64) and ``timestamp`` (float32);
- ``decode_time_sec``: the seconds this sample spent decoding its camera frames (what the
  dataloader tools report as ``decode``).

:func:`make_dataloader` samples several datasets with fixed weights from a seeded
sampler, so a seed fixes the order whatever the number of workers.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import ConcatDataset, DataLoader, Dataset, Sampler

from scopebench import validate
from scopebench.policy.data.lerobot import LeRobotFolder
from scopebench.policy.data.lerobot_meta import ACTION_KEY, STATE_KEY, camera_shape, read_json
from scopebench.validate import integer

#: Seconds this process spent decoding camera frames in :meth:`RobotDataset.__getitem__`, all
#: datasets together (a DataLoader worker counts its own): :func:`decode_seconds`.
_DECODE_CLOCK = [0.0]


def decode_seconds() -> float:
    """Seconds this process has spent decoding camera frames so far (a running total: the
    difference around a ``next(loader)`` is the decoding that ran inside it, 0 with workers)."""
    return _DECODE_CLOCK[0]


def decode_image(data: bytes) -> np.ndarray:
    """Encoded image bytes (PNG, JPEG) as an (H, W, 3) uint8 RGB array."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return np.array(img.convert("RGB"))  # a writable copy: torch.from_numpy needs one


class RobotDataset(Dataset):
    """Frames of a LeRobot v3.0 dataset, with action chunks (see the module docstring).

    Args:
        root: dataset folder (with ``meta/info.json``).
        chunk_size: actions per sample.

    Attributes:
        decoder: what decodes the camera frames: ``pyav`` (MP4) and / or ``pil`` (image bytes).

    Raises:
        FileNotFoundError: a metadata, parquet or video file is missing (the error names it).
        ValueError: a file is malformed, of another format version, or inconsistent with
            ``meta/info.json`` or with the rows (named).
    """

    def __init__(self, root: str | Path, chunk_size: int) -> None:
        from scopebench.policy.data.video import DECODER, VideoFrames

        integer("chunk_size", chunk_size, low=1)
        self.root = Path(root)
        self.chunk_size = chunk_size
        self.folder = folder = LeRobotFolder(self.root)
        folder.check_videos()
        self.info, self.stats, self.tasks = folder.info, folder.stats, folder.tasks
        self.cameras, self.fps = folder.cameras, folder.fps
        self.decoder = "+".join(([DECODER] if folder.videos else []) + (["pil"] if folder.images else []))
        self._frames = VideoFrames()

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
        return (*camera_shape(self.info["features"][self.cameras[0]]), 3)

    def __len__(self) -> int:
        return len(self.folder.index)

    def camera_frame(self, camera: str, i: int) -> np.ndarray:
        """Frame ``i``'s image of ``camera`` as (H, W, 3) uint8."""
        folder = self.folder
        if camera in folder.image_bytes:
            return decode_image(folder.image_bytes[camera][i].as_py())
        path, start = folder.episodes[folder.episode_of_row[i]].videos[camera]
        return self._frames.frame_at(path, start + float(folder.timestamp[i]))

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(f"index {i} out of range for a dataset of {len(self)} frames")
        folder = self.folder
        stop = folder.episodes[folder.episode_of_row[i]].stop
        steps = i + np.arange(self.chunk_size)
        is_pad = steps >= stop
        sample = {}
        start = time.perf_counter()
        for c, cam in enumerate(self.cameras):
            sample[f"camera{c}"] = torch.from_numpy(self.camera_frame(cam, i)).permute(2, 0, 1).float().div_(255.0)
        decode = time.perf_counter() - start
        _DECODE_CLOCK[0] += decode
        sample.update(
            state=torch.from_numpy(folder.state[i]),
            actions=torch.from_numpy(folder.action[np.minimum(steps, stop - 1)]),  # (chunk, a)
            action_is_pad=torch.from_numpy(is_pad),
            prompt=self.tasks[int(folder.task_index[i])],
            index=int(folder.index[i]),
            episode_index=int(folder.episode_index[i]),
            frame_index=int(folder.frame_index[i]),
            timestamp=float(folder.timestamp[i]),
            decode_time_sec=decode,
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
    frames = read_json(info_path).get("total_frames")
    return frames if isinstance(frames, int) and not isinstance(frames, bool) else None


#: How the policy's (synthetic) dataset grows, as a refused batch suggests it.
LARGER_DATASET = "a larger dataset (dataset.num_episodes / dataset.episode_length)"


def check_batch_fits(batch_size: int, samples: int | None, world_size: int = 1, dataset: str = "the dataset") -> None:
    """:func:`scopebench.validate.check_batch_fits` (the one home of the rule: the training
    dataloader drops a last incomplete batch, accelerate hands each rank every
    ``world_size``-th batch) naming the policy dataset's knobs."""
    validate.check_batch_fits(batch_size, samples, world_size, dataset, larger=LARGER_DATASET)


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


def eval_indices(samples: int, batch_size: int) -> list[int]:
    """The ``batch_size`` sample indices, evenly spread over ``samples``, of a fixed
    validation batch (pi05's and a user policy's); ``eval_batch_size`` may not exceed
    the dataset.

    :Examples:

    >>> eval_indices(10, 3)
    [0, 3, 6]
    >>> eval_indices(10, 11)
    Traceback (most recent call last):
    ...
    ValueError: eval_batch_size must be an integer >= 1 and <= 10, got 11
    """
    integer("eval_batch_size", batch_size, low=1, high=samples)
    step = samples // batch_size
    return [i * step for i in range(batch_size)]


def fixed_eval_batch(dataset: RobotDataset, batch_size: int) -> dict:
    """``batch_size`` frames evenly spread over the dataset, always the same ones.

    :Examples:

    >>> class Frames(list):
    ...     pass
    >>> batch = fixed_eval_batch(Frames({"i": torch.tensor(i)} for i in range(10)), 3)
    >>> batch["i"].tolist()
    [0, 3, 6]
    """
    return collate_robot_batch([dataset[i] for i in eval_indices(len(dataset), batch_size)])
