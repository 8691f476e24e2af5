"""A bundled natural colour image, degraded by blur, downsampling or inpainting, plus noise."""

from benchopt import BaseDataset


class Dataset(BaseDataset):
    name = "simulated"
    requirements = []
    parameters = {
        "image_size": [64],
        "operator": ["blur"],
        "noise_level": [0.03],
        "seed": [0],
    }

    def get_data(self):
        from scopebench.imaging import build_problem

        problem = build_problem(
            "simulated",
            image_size=self.image_size,
            operator=self.operator,
            noise_level=self.noise_level,
            seed=self.seed,
        )
        return dict(spec=problem.spec, x_true=problem.x_true, y=problem.y)
