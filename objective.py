"""Policy benchmark: a pi05-architecture vision-language-action policy.

Training solvers are scored by the policy's loss on a fixed held-out batch of its dataset
(pi05: the flow-matching loss with fixed noise and times, so values are comparable across
steps; every rank computes it, since under ZeRO-3 and FSDP2 a forward needs every rank's
parameter shard), next to the step's own loss terms (``train_loss``, pi05's ``mse_loss`` and
``ce_loss``, averaged over ranks); the inference solver by the mean squared error of pi05's
action chunk against the recorded actions of the same frame (random weights: the number
checks the pipeline, not the policy), or a user policy's seconds per call; the dataloader
solver by the seconds per batch. Every metric of the solver is forwarded, so
the parquet holds ``objective_<phase>_time_sec`` etc.
"""

from benchopt import BaseObjective
from benchopt.benchmark import Benchmark

from scopebench.runs import own_job_folder

# A Submitit folder of this run's own: a plain `benchopt run` never reads another run's result.
own_job_folder(Benchmark)


class Objective(BaseObjective):
    name = "pi05 policy"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {"eval_batch_size": [4]}

    def set_data(self, dataset_root, chunk_size, seed):
        from scopebench.policy.data.dataset import RobotDataset, fixed_eval_batch

        self.dataset = RobotDataset(dataset_root, chunk_size=chunk_size)
        self.eval_batch = fixed_eval_batch(self.dataset, self.eval_batch_size)
        self.dataset_root, self.chunk_size, self.seed = dataset_root, chunk_size, seed

    def get_objective(self):
        return dict(
            dataset=self.dataset,
            eval_batch=self.eval_batch,
            seed=self.seed,
            dataset_root=self.dataset_root,
            chunk_size=self.chunk_size,
        )

    def evaluate_result(self, actions=None, dataloader=False, sampled=False, val_loss=None, **metrics):
        if actions is not None:
            b, t, a = actions.shape
            target = self.eval_batch["actions"][:b, :t, :a]
            keep = ~self.eval_batch["action_is_pad"][:b, : target.shape[1]]
            err = ((actions[:, : target.shape[1]] - target) ** 2).mean(-1)[keep].mean()
            return dict(value=float(err), action_mse=float(err), **metrics)
        if dataloader or sampled:  # the dataloader ceiling, or a user policy's inference call
            step = metrics.get("step_time_sec", float("nan"))  # the profiler's total without the callback
            return dict(value=step, **metrics)
        # every rank of the run computed it before this callback (ZeRO-3, FSDP2: a forward needs them all)
        return dict(value=val_loss, val_loss=val_loss, **metrics)

    def get_one_result(self):
        import torch

        return dict(actions=torch.zeros_like(self.eval_batch["actions"][:1]))
