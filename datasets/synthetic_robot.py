"""Synthetic robot episodes in LeRobot v3.0 layout (MP4 or PNG frames), written once to
outputs/datasets and reused.

Every parameter is a field of ``scopebench.policy.settings.DatasetSettings`` (the
``dataset:`` section of a policy run config), documented and defaulted there; ``lerobot``
(a user's own folder) is the run configs' and the tools', not this synthetic dataset's.
"""

from pathlib import Path

from benchopt import BaseDataset

from scopebench.policy.settings import DatasetSettings, solver_parameters


class Dataset(BaseDataset):
    name = "synthetic_robot"
    parameters = solver_parameters(DatasetSettings, exclude=("cache_dir", "lerobot"))

    def get_data(self):
        cache = Path(__file__).resolve().parents[1] / "outputs" / "datasets"
        values = {key: getattr(self, key) for key in self.parameters}
        settings = DatasetSettings(**values, cache_dir=str(cache), key_prefix="")
        root = settings.materialize()
        return dict(dataset_root=str(root), chunk_size=self.chunk_size, seed=self.seed)
