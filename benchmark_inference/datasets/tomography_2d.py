"""Parallel-beam tomography (deepinv's torch Radon transform) of a phantom or a photograph."""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "tomography_2d"
    requirements = []
    parameters = {
        "image_size": [64],
        "num_angles": [60],
        "noise_level": [0.01],
        "image": ["phantom"],
        "seed": [0],
    }

    def get_data(self):
        from scopebench.imaging import build_problem

        problem = build_problem(
            "tomography_2d",
            image_size=self.image_size,
            num_angles=self.num_angles,
            noise_level=self.noise_level,
            image=self.image,
            seed=self.seed,
        )
        return dict(spec=problem.spec, x_true=problem.x_true, y=problem.y)
