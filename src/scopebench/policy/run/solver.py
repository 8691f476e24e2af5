"""The benchopt-free half of the policy solvers ``Pi05Train``, ``Pi05Dataloader``, ``Pi05Inference``.

``class Solver(TrainSolverMixin, BaseSolver)`` declares its parameter grid and ``task`` and
gets, like the imaging solvers (:mod:`scopebench.imaging.inference.solver`): ``skip`` (a
backend the settings cannot run is declined with a reason), ``set_objective`` (every
parameter validated before any work; builds the run object), ``pre_run_hook`` (starts the
ranks and builds the run, untimed: :meth:`~scopebench.profiler.ProfiledSolverMixin.start_run`),
``run`` (the profiled loop, torn down on any exit:
:meth:`~scopebench.profiler.ProfiledSolverMixin.finish_run`) and ``get_result`` (the work
product and the run's :meth:`~scopebench.distributed.run.RankRun.metrics`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.profiler import ProfiledSolverMixin

__all__ = ["InferenceSolverMixin", "TrainSolverMixin"]


class _PolicySolverMixin(ProfiledSolverMixin):
    """What the three policy solvers share; subclasses build :attr:`policy_run` in ``set_objective``."""

    #: The benchmark's ``outputs/`` folder (set by the solver file).
    output_dir: Path = Path("outputs")
    policy_run: Any = None

    def get_next(self, stop_val: int) -> int:
        return stop_val + 1

    def pre_run_hook(self, stop_val: Any) -> None:
        self.start_run(self.policy_run)

    def run(self, callback: Any) -> None:
        self.finish_run(self.policy_run, callback)


class TrainSolverMixin(_PolicySolverMixin):
    """``Pi05Train`` (``task = "train"``) and ``Pi05Dataloader`` (``task = "dataloader"``)."""

    task = "train"

    def skip(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> tuple[bool, str | None]:
        """Decline a backend the settings cannot run (ZeRO on one process, ZeRO-3 with
        gradient checkpointing, ZeRO without an optimizer)."""
        from scopebench.distributed import get_dist_info
        from scopebench.policy.settings import backend_conflict

        if self.task != "train":
            return False, None
        launcher = get_dist_info()
        world = launcher.world_size if launcher.is_distributed else self.nproc_per_node
        args = (self.gradient_checkpointing, self.no_optim)
        conflict = backend_conflict(self.backend, *args, world_size=world if isinstance(world, int) else None)
        return (True, conflict) if conflict else (False, None)

    def set_objective(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> None:
        from scopebench.policy.run.train import PolicyTrainRun
        from scopebench.policy.settings import TrainSettings, settings_from

        profiler = self.validate_profiler()
        settings = settings_from(TrainSettings, self, seed=seed)
        self.policy_run = PolicyTrainRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            task=self.task,
            profiler=profiler,
            output_dir=self.output_dir,
            name=f"pi05_{self.task}",
            eval_batch_size=len(eval_batch["actions"]),
        )

    def get_result(self) -> dict[str, Any]:
        run = self.policy_run
        if self.task == "dataloader":
            return dict(dataloader=True, **run.metrics())
        model = run.unwrapped_model
        if model is None:  # ZeRO-3: every rank computed the validation loss before this callback
            return dict(model=None, val_loss=run.val_loss, **run.metrics())
        return dict(model=model, **run.metrics())


class InferenceSolverMixin(_PolicySolverMixin):
    """``Pi05Inference``: one action chunk per iteration."""

    def set_objective(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> None:
        from scopebench.policy.run.inference import InferenceRun
        from scopebench.policy.settings import InferenceSettings, settings_from

        profiler = self.validate_profiler()
        self.action_dim = eval_batch["actions"].shape[-1]
        settings = settings_from(InferenceSettings, self, seed=seed)
        self.policy_run = InferenceRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            profiler=profiler,
            output_dir=self.output_dir,
        )

    def get_result(self) -> dict[str, Any]:
        import torch

        run = self.policy_run
        actions = run.actions
        if actions is None:  # no call yet (n_warmup: 0): "no motion", scored like any other
            actions = torch.zeros(1, run.settings.n_action_steps or run.chunk_size, self.action_dim)
        return dict(actions=actions, **run.metrics())
