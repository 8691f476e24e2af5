"""UnrolledPnP: supervised training of an unrolled proximal-gradient network.

deepinv's unfolded PGD (``n_unrolled`` iterations) with a learnable DnCNN / DRUNet and
learnable step sizes / noise levels, Adam with two parameter groups (``learning_rate``
for the step sizes and noise levels, ``model_learning_rate`` for the denoiser). One
benchopt iteration = one optimizer step, regions ``forward``, ``backward``,
``optimizer_step``. With ``distribute_model`` the denoiser is tiled over the ranks
(torchrun / SLURM, or spawned locally: ``nproc_per_node``). Set-up is untimed and reported
as ``setup_time_sec``. The trained denoiser goes to
``outputs/unrolled_pnp_<run id>_denoiser.safetensors`` (``load_denoiser_weights`` reads it).
"""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.profiler import ProfiledSolverMixin


class Solver(ProfiledSolverMixin, BaseSolver):
    name = "UnrolledPnP"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    output_dir = Path(__file__).resolve().parents[1] / "outputs"
    parameters = {
        **ProfiledSolverMixin.parameters,  # profiler_mode, profiler_warmup, ... (the seven profiler_*)
        # the network
        "n_unrolled": [3],
        "denoiser": ["dncnn"],
        "denoiser_channels": [16],
        "checkpoint_batches": ["auto"],
        # the optimisation
        "batch_size": [4],
        "learning_rate": [1e-2],
        "model_learning_rate": [1e-3],
        "grad_clip": [1.0],
        "save_weights": [True],
        # tiles and ranks
        "distribute_model": [False],
        "patch_size": [16],
        "overlap": [8],
        "max_batch_size": [None],
        "nproc_per_node": [1],
        "group_timeout_sec": [None],
        "slurm_gres": ["gpu:1"],
        "slurm_nodes": [1],
        "slurm_ntasks_per_node": [1],
    }
    test_config = {"batch_size": 2, "save_weights": False}

    def get_next(self, stop_val):
        return stop_val + 1

    def skip(self, data, data_params):
        from scopebench.distributed import get_dist_info

        launcher = get_dist_info()
        world = launcher.world_size if launcher.is_distributed else self.nproc_per_node
        if isinstance(world, int) and world > 1 and not self.distribute_model:
            return True, f"{world} processes need distribute_model=true (ranks share the tiled denoiser)"
        return False, None

    def set_objective(self, data, data_params):
        from scopebench.imaging.training import SOLVER_PARAMS, TrainingRun, configs_from_params

        profiler = self.validate_profiler()
        unrolled, train = configs_from_params(data.spec, **{key: getattr(self, key) for key in SOLVER_PARAMS})
        self.training = TrainingRun(
            data_params=data_params,
            unrolled=unrolled,
            train=train,
            data=data,
            nproc=self.nproc_per_node,
            profiler=profiler,
            output_dir=self.output_dir,
            group_timeout_sec=self.group_timeout_sec,
        )

    def pre_run_hook(self, callback):
        self.start_run(self.training)  # spawns workers and builds the model: not timed
        self.weights_path = None

    def run(self, callback):
        self.finish_run(self.training, callback)
        if self.save_weights:
            self.weights_path = self.training.save_weights()

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
            **self.training.metrics(),
        )
