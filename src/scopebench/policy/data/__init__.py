"""Robot data: the LeRobot v3.0 format read and written, videos, the dataset and its loader.

As lerobot's ``datasets/``:

* :mod:`~scopebench.policy.data.lerobot_meta`: the format's names and path templates, and a
  folder's ``info.json`` / ``stats.json`` checked before use;
* :mod:`~scopebench.policy.data.lerobot`: :class:`LeRobotFolder`, a folder's tables and files,
  checked up front;
* :mod:`~scopebench.policy.data.video`: MP4 encoding, probing and decoding (PyAV);
* :mod:`~scopebench.policy.data.synthetic`: synthetic robot episodes written as a LeRobot folder;
* :mod:`~scopebench.policy.data.dataset`: :class:`RobotDataset`, the weighted mixture sampler,
  the ``DataLoader``.
"""

from scopebench.policy.data.dataset import (
    RobotDataset,
    WeightedMixtureSampler,
    collate_robot_batch,
    make_dataloader,
)
from scopebench.policy.data.lerobot import LeRobotFolder
from scopebench.policy.data.synthetic import (
    SyntheticRobotConfig,
    cached_synthetic_dataset,
    generate_episode,
    write_synthetic_dataset,
)

__all__ = [
    "LeRobotFolder",
    "RobotDataset",
    "SyntheticRobotConfig",
    "WeightedMixtureSampler",
    "cached_synthetic_dataset",
    "collate_robot_batch",
    "generate_episode",
    "make_dataloader",
    "write_synthetic_dataset",
]
