"""Synthetic LeRobot-style robot episodes, written once to outputs/datasets and reused."""

from pathlib import Path

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "synthetic_robot"
    parameters = {
        "num_episodes": [4],
        "episode_length": [24],
        "image_size": [32],
        "num_cameras": [2],
        "chunk_size": [8],
        "seed": [0],
    }

    def get_data(self):
        from scopebench.policy.data import SyntheticRobotConfig, cached_synthetic_dataset

        config = SyntheticRobotConfig(
            num_episodes=self.num_episodes,
            episode_length=self.episode_length,
            image_size=self.image_size,
            num_cameras=self.num_cameras,
            seed=self.seed,
        )
        cache = Path(__file__).resolve().parents[1] / "outputs" / "datasets"
        root = cached_synthetic_dataset(cache, config)
        return dict(dataset_root=str(root), chunk_size=self.chunk_size, seed=self.seed)
