"""The policy benchmark's run layer: benchmark machinery apart from the model code.

Mirrors :mod:`scopebench.imaging` (run objects beside the solvers' library half):

* :mod:`~scopebench.policy.run.train`: :class:`~scopebench.policy.run.train.PolicyTrainRun`,
  the run object of ``Pi05Train`` / ``Pi05Dataloader`` and of the training tools;
* :mod:`~scopebench.policy.run.inference`: :class:`~scopebench.policy.run.inference.InferenceRun`,
  the run object of ``Pi05Inference``, ``bench-inference`` and ``decompose-latency``;
* :mod:`~scopebench.policy.run.steps`: one iteration of each, in profiled phases;
* :mod:`~scopebench.policy.run.nonfinite`: a training loss found NaN or infinite, and its line;
* :mod:`~scopebench.policy.run.solver`: the benchopt-free half of the three solvers;
* :mod:`~scopebench.policy.run.trainer`: ``scopebench train``'s loop, log and checkpoints.

Both run objects are :class:`scopebench.harness.run.RankRun` subclasses, like
``PnPRun`` and ``TrainingRun``: one lifecycle for every benchmark. Nothing is imported
here, so ``import scopebench.policy`` stays light.
"""
