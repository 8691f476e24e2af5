"""Pi05Inference: one action chunk per iteration (preprocess, prefill, denoise, postprocess)."""

from pathlib import Path

from benchopt import BaseSolver
from benchopt.stopping_criterion import NoCriterion

from scopebench.profiler import ProfiledSolverMixin

OUTPUTS = Path(__file__).resolve().parents[1] / "outputs"


class Solver(ProfiledSolverMixin, BaseSolver):
    name = "Pi05Inference"
    sampling_strategy = "callback"
    stopping_criterion = NoCriterion(strategy="callback")
    parameters = {
        **ProfiledSolverMixin.parameters,
        "preset": ["tiny"],
        "num_steps": [10],
    }

    def get_next(self, stop_val):
        return stop_val + 1

    def set_objective(self, dataset, eval_batch, seed):
        import torch

        from scopebench.policy.steps import InferenceStep, policy_for_dataset

        self.validate_profiler()
        torch.manual_seed(seed)
        model = policy_for_dataset(self.preset, dataset)
        self.step = InferenceStep(model, eval_batch, num_steps=self.num_steps, stats=dataset.stats)
        # Before the first chunk the result is "no motion" (scored like any other).
        self.actions = torch.zeros_like(eval_batch["actions"])

    def run(self, callback):
        def chunk(prof):
            self.actions = self.step(prof)

        self.run_profiled(callback, chunk, name="pi05_inference", output_dir=OUTPUTS)

    def get_result(self):
        return dict(actions=self.actions, **self.current_metrics())
