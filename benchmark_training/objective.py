"""Imaging training benchmark: unrolled PnP networks trained by supervised MSE.

One benchopt iteration is one optimizer step. Each row reports the step's training loss
(``value`` = ``train_loss``, the batch MSE before the update), the throughput
``samples_per_sec = batch_size / step_time_sec`` (``step_time_sec`` is the profiler's
``total_time_sec - callback_time_sec``), every profiler metric of the step
(``step_time_sec``, ``forward_time_sec``, ``backward_time_sec``,
``optimizer_step_time_sec``, ...) and, every ``eval_every`` steps, the validation PSNR /
SSIM / MSE of the network on the held-out set (``None`` on other rows). The validation
runs inside benchopt's callback, so its time is the profiler's ``callback_time_sec`` and
never part of a region. The row at ``stop_val = k`` carries step ``k`` (1-based), i.e.
profiler iteration ``k - 1``; the row at ``stop_val = 0`` scores the untrained network.
"""

from benchopt import BaseObjective
from benchopt.benchmark import Benchmark

from scopebench.runs import own_job_folder

# A Submitit folder of this run's own: a plain `benchopt run` never reads another run's result.
own_job_folder(Benchmark)


class Objective(BaseObjective):
    name = "unrolled_pnp_training"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {"eval_every": [10]}

    def set_data(self, data, data_params):
        from scopebench.validate import integer

        integer("eval_every", self.eval_every, low=1)
        self.data, self.data_params = data, data_params

    def get_objective(self):
        return dict(data=self.data, data_params=self.data_params)

    def evaluate_result(self, model, train_loss, step, batch_size, grad_norm=None, **metrics):
        from scopebench.imaging.training import evaluate_reconstruction
        from scopebench.stats import samples_per_sec

        scores = dict(value=train_loss, train_loss=train_loss, step=step, grad_norm=grad_norm)
        scores["samples_per_sec"] = samples_per_sec(batch_size, metrics)
        if step % self.eval_every == 0:
            data = self.data
            scores.update(evaluate_reconstruction(model, data.x_val, data.y_val, data.physics))
        else:
            scores.update(val_psnr=None, val_ssim=None, val_mse=None)
        return dict(**scores, **metrics)

    def get_one_result(self):
        from scopebench.imaging.common.denoisers import DenoiserSpec
        from scopebench.imaging.training import UnrolledReconstructor

        spec = self.data.spec
        net = DenoiserSpec(in_channels=spec.channels, out_channels=spec.channels, dim=spec.spatial_dims).build()
        return dict(model=UnrolledReconstructor(net, [1.0], [0.05]), train_loss=None, step=0, batch_size=1)
