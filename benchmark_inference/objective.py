"""Imaging inference benchmark: plug-and-play reconstruction, scored against ground truth.

Every row holds ``psnr``, ``mse`` and, for 2-D images, ``ssim`` of the solver's current
estimate (``value = -psnr``, so lower is better as benchopt expects), every profiler
metric the solver reports (``gradient_time_sec``, ``denoise_time_sec``, ...), and the
torch / deepinv / scopebench versions and device name. The row at ``stop_val = k`` scores
the estimate after ``k`` iterations and carries the profiler metrics of iteration ``k - 1``.
"""

from benchopt import BaseObjective
from benchopt.benchmark import Benchmark

from scopebench.runs import own_job_folder

# A Submitit folder of this run's own: a plain `benchopt run` never reads another run's result.
own_job_folder(Benchmark)


class Objective(BaseObjective):
    name = "Imaging inference"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {}
    test_config = {"dataset": {"name": "simulated", "image_size": 32}}

    def set_data(self, spec, x_true, y):
        self.spec, self.x_true, self.y = spec, x_true, y

    def get_objective(self):
        return dict(spec=self.spec)

    def evaluate_result(self, x, **metrics):
        from scopebench.environment import environment_metrics
        from scopebench.imaging import quality_metrics

        scores = quality_metrics(x.to(self.x_true.device), self.x_true)
        return dict(value=-scores["psnr"], **scores, **metrics, **environment_metrics(x.device))

    def get_one_result(self):
        import torch

        return dict(x=torch.zeros_like(self.x_true))
