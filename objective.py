"""Policy benchmark: a pi05-architecture vision-language-action policy.

Training solvers are scored by the flow-matching loss on a fixed held-out batch (fixed
noise and times, so values are comparable across steps); inference solvers by the mean
squared error of their action chunk against the batch's recorded actions (random weights:
the number checks the pipeline, not the policy). Every profiler metric of the solver is
forwarded, so the parquet holds ``objective_<phase>_time_sec`` etc.
"""

from benchopt import BaseObjective


class Objective(BaseObjective):
    name = "pi05 policy"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {"eval_batch_size": [4]}

    def set_data(self, dataset_root, chunk_size, seed):
        from scopebench.policy.dataset import RobotDataset
        from scopebench.policy.steps import fixed_eval_batch

        self.dataset = RobotDataset(dataset_root, chunk_size=chunk_size)
        self.eval_batch = fixed_eval_batch(self.dataset, self.eval_batch_size)
        self.seed = seed

    def get_objective(self):
        return dict(dataset=self.dataset, eval_batch=self.eval_batch, seed=self.seed)

    def evaluate_result(self, model=None, actions=None, **metrics):
        from scopebench.policy.steps import validation_loss

        if actions is not None:
            target = self.eval_batch["actions"][..., : actions.shape[-1]]
            keep = ~self.eval_batch["action_is_pad"]
            err = ((actions - target) ** 2).mean(-1)[keep].mean()
            return dict(value=float(err), action_mse=float(err), **metrics)
        loss = validation_loss(model, self.eval_batch, self.dataset.stats, seed=self.seed)
        return dict(value=loss, val_loss=loss, **metrics)

    def get_one_result(self):
        import torch

        return dict(actions=torch.zeros_like(self.eval_batch["actions"]))
