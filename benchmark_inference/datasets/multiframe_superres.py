"""K blurred, shifted, decimated noisy frames of one colour image (one operator per frame)."""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "multiframe_superres"
    requirements = []
    parameters = {
        "image_size": [64],
        "num_operators": [4],
        "scale": [2],
        "noise_level": [0.02],
        "seed": [0],
    }

    def get_data(self):
        from scopebench.imaging import build_problem

        problem = build_problem(
            "multiframe_superres",
            image_size=self.image_size,
            num_operators=self.num_operators,
            scale=self.scale,
            noise_level=self.noise_level,
            seed=self.seed,
        )
        return dict(spec=problem.spec, x_true=problem.x_true, y=problem.y)
