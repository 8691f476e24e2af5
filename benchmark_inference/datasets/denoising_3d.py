"""A synthetic volume (soft ellipsoids) with white Gaussian noise; SSIM is not reported."""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "denoising_3d"
    requirements = []
    parameters = {
        "volume_size": [32],
        "noise_level": [0.1],
        "seed": [0],
    }

    def get_data(self):
        from scopebench.imaging import build_problem

        problem = build_problem(
            "denoising_3d", volume_size=self.volume_size, noise_level=self.noise_level, seed=self.seed
        )
        return dict(spec=problem.spec, x_true=problem.x_true, y=problem.y)
