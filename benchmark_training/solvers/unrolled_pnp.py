"""UnrolledPnP: supervised training of an unrolled proximal-gradient network.

deepinv's unfolded PGD (``n_unrolled`` iterations) with a learnable DnCNN / DRUNet and
learnable step sizes / noise levels, Adam with two parameter groups (``learning_rate``
for the step sizes and noise levels, ``model_learning_rate`` for the denoiser). One
benchopt iteration = one optimizer step, regions ``forward``, ``backward``,
``optimizer_step``. With ``distribute_model`` the denoiser is tiled over the ranks by
``deepinv.distributed``; ranks come from torchrun / SLURM or are spawned locally
(``nproc_per_node``). The trained denoiser is saved to
``outputs/unrolled_pnp_<run id>_denoiser.safetensors`` (see
``scopebench.imaging.unrolled.load_denoiser_weights``).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.profiler import ProfiledSolverMixin

OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"


class Solver(ProfiledSolverMixin, BaseSolver):
    name = "UnrolledPnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    parameters = {
        **ProfiledSolverMixin.parameters,
        "n_unrolled": [3],
        "denoiser": ["dncnn"],
        "denoiser_channels": [16],
        "batch_size": [4],
        "learning_rate": [1e-2],
        "model_learning_rate": [1e-3],
        "grad_clip": [1.0],
        "distribute_model": [False],
        "patch_size": [16],
        "overlap": [8],
        "max_batch_size": [None],
        "checkpoint_batches": ["auto"],
        "nproc_per_node": [1],
        "slurm_gres": ["gpu:1"],
        "slurm_nodes": [1],
        "slurm_ntasks_per_node": [1],
        "save_weights": [True],
    }
    test_config = {"batch_size": 2, "save_weights": False}

    def get_next(self, stop_val):
        return stop_val + 1

    def skip(self, data, data_params):
        from scopebench.dist import get_dist_info

        launcher = get_dist_info()
        world = launcher.world_size if launcher.is_distributed else self.nproc_per_node
        if isinstance(world, int) and world > 1 and not self.distribute_model:
            return True, f"{world} processes need distribute_model=true (ranks share the tiled denoiser)"
        return False, None

    def set_objective(self, data, data_params):
        from scopebench.imaging.train import SOLVER_PARAMS, configs_from_params
        from scopebench.imaging.training_run import TrainingRun

        self.validate_profiler()
        unrolled, train = configs_from_params(data.spec, **{key: getattr(self, key) for key in SOLVER_PARAMS})
        self.data = data
        self.run_args = dict(
            data_params=data_params,
            unrolled=unrolled,
            train=train,
            nproc=self.nproc_per_node,
            profiler_params=self.profiler_kwargs(),
            output_dir=OUTPUTS,
            name="unrolled_pnp",
        )
        TrainingRun(**self.run_args)  # validates the process count before any work

    def pre_run_hook(self, callback):
        from scopebench.imaging.training_run import TrainingRun

        self.training = TrainingRun(**self.run_args)
        self.training.start(self.data)  # spawns workers and builds the model: not timed
        self.prof = self.build_profiler(device=self.training.device, name="unrolled_pnp", output_dir=OUTPUTS)
        self.weights_path = None

    def run(self, callback):
        failed = True
        try:
            with self.prof:
                self.training.loop(self.prof, callback)
            if self.save_weights:
                self.weights_path = self.training.save_weights()
            failed = False
        finally:
            self.training.close(failed=failed)

    def get_result(self):
        trainer = self.training.trainer
        loss = None if trainer.last_loss is None else trainer.last_loss.item()
        grad_norm = None if trainer.last_grad_norm is None else trainer.last_grad_norm.item()
        return dict(
            model=trainer.reconstructor(),
            train_loss=loss,
            step=trainer.step_count,
            batch_size=self.batch_size,
            grad_norm=grad_norm,
            **self.prof.get_current_metrics(),
        )
