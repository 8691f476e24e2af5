"""Policy benchmark: a pi05-architecture vision-language-action policy.

Training solvers are scored by the flow-matching loss on a fixed held-out batch (fixed
noise and times, so values are comparable across steps; under ZeRO-3 the solver runs the
same function on every rank, since a forward needs every rank's parameter shard), next to
the step's own loss terms (``train_loss``, ``mse_loss``, ``ce_loss``, averaged over ranks); the inference
solver by the mean squared error of its action chunk against the recorded actions of the
same frame (random weights: the number checks the pipeline, not the policy); the
dataloader solver by the seconds per batch. Every metric of the solver is forwarded, so
the parquet holds ``objective_<phase>_time_sec`` etc.
"""

from benchopt import BaseObjective


class Objective(BaseObjective):
    name = "pi05 policy"
    url = "https://github.com/benchopt/benchopt"
    min_benchopt_version = "1.10"
    requirements = []
    parameters = {"eval_batch_size": [4]}

    def set_data(self, dataset_root, chunk_size, seed):
        from scopebench.policy.dataset import RobotDataset, fixed_eval_batch

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

    def evaluate_result(self, model=None, actions=None, dataloader=False, **metrics):
        from scopebench.policy.run.steps import validation_loss

        if actions is not None:
            b, t, a = actions.shape
            target = self.eval_batch["actions"][:b, :t, :a]
            keep = ~self.eval_batch["action_is_pad"][:b, : target.shape[1]]
            err = ((actions[:, : target.shape[1]] - target) ** 2).mean(-1)[keep].mean()
            return dict(value=float(err), action_mse=float(err), **metrics)
        if dataloader:
            step = metrics.get("step_time_sec", float("nan"))  # the profiler's total without the callback
            return dict(value=step, **metrics)
        if model is None:  # ZeRO-3: the solver ran validation_loss on every rank (a forward needs them all)
            loss = metrics.pop("val_loss")
        else:
            loss = validation_loss(model, self.eval_batch, self.dataset.stats, seed=self.seed)
        return dict(value=loss, val_loss=loss, **metrics)

    def get_one_result(self):
        import torch

        return dict(actions=torch.zeros_like(self.eval_batch["actions"][:1]))
