"""Pi05Train: AdamW training steps of the pi05 policy, one benchopt iteration per step."""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.profiler import ProfiledSolverMixin

OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"


class Solver(ProfiledSolverMixin, BaseSolver):
    name = "Pi05Train"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    parameters = {
        **ProfiledSolverMixin.parameters,
        "preset": ["tiny"],
        "batch_size": [4],
        "learning_rate": [1e-3],
        "grad_clip": [1.0],
        "num_workers": [0],
    }

    def get_next(self, stop_val):
        return stop_val + 1

    def set_objective(self, dataset, eval_batch, seed):
        import torch

        from scopebench.policy.steps import TrainStep, policy_for_dataset

        self.validate_profiler()
        torch.manual_seed(seed)
        self.model = policy_for_dataset(self.preset, dataset)
        self.step = TrainStep(
            self.model,
            dataset,
            batch_size=self.batch_size,
            learning_rate=self.learning_rate,
            grad_clip=self.grad_clip,
            num_workers=self.num_workers,
            seed=seed,
        )

    def run(self, callback):
        self.run_profiled(callback, self.step, name="pi05_train", output_dir=OUTPUTS)

    def get_result(self):
        from scopebench.stats import samples_per_sec

        metrics = self.current_metrics()
        if "total_time_sec" in metrics:
            metrics["samples_per_sec"] = samples_per_sec(self.batch_size, metrics)
        return dict(model=self.model, **metrics)
