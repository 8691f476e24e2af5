"""Solver-side glue of the policy benchmark, without importing benchopt.

``solvers/pi05_train.py``, ``pi05_dataloader.py`` and ``pi05_inference.py`` declare their
parameter grids and mix one of these in; the mixins hold the lifecycle: validate every
parameter in ``set_objective`` (before any work), start the run object in
``pre_run_hook`` (spawning ranks, building and compiling are not timed), loop in ``run``
and close it on any exit, and return the run's metrics from ``get_result``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.profiler import ProfiledSolverMixin

__all__ = ["InferenceSolverMixin", "TrainSolverMixin"]


class _RunSolverMixin(ProfiledSolverMixin):
    """The shared lifecycle; subclasses build :attr:`policy_run` in ``set_objective``."""

    #: The benchmark's ``outputs/`` folder (set by the solver file).
    output_dir: Path = Path("outputs")
    policy_run: Any = None

    def get_next(self, stop_val: int) -> int:
        return stop_val + 1

    def pre_run_hook(self, callback) -> None:
        self.policy_run.start()

    def run(self, callback) -> None:
        with self.policy_run as run:  # starts if pre_run_hook did not; closes on any exit
            self.profiler = run.profiler
            run.loop(callback)
            self.close_callback(run.rank, callback)


class TrainSolverMixin(_RunSolverMixin):
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
        from scopebench.policy.settings import TrainSettings, settings_from
        from scopebench.policy.train_run import PolicyTrainRun

        self.validate_profiler()
        settings = settings_from(TrainSettings, self, seed=seed)
        self.policy_run = PolicyTrainRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            task=self.task,
            profiler_params=self.profiler_kwargs(),
            output_dir=self.output_dir,
            name=f"pi05_{self.task}",
            eval_batch_size=len(eval_batch["actions"]),
        )

    def get_result(self) -> dict[str, Any]:
        run = self.policy_run
        if self.task == "dataloader":
            return dict(dataloader=True, **run.current_metrics())
        model = run.unwrapped_model
        if model is None:  # ZeRO-3: every rank computed the validation loss before this callback
            return dict(model=None, val_loss=run.val_loss, **run.current_metrics())
        return dict(model=model, **run.current_metrics())


class InferenceSolverMixin(_RunSolverMixin):
    """``Pi05Inference``: one action chunk per iteration."""

    def set_objective(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> None:
        from scopebench.policy.inference_run import InferenceRun
        from scopebench.policy.settings import InferenceSettings, settings_from

        self.validate_profiler()
        self.action_dim = eval_batch["actions"].shape[-1]
        settings = settings_from(InferenceSettings, self, seed=seed)
        self.policy_run = InferenceRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            profiler_params=self.profiler_kwargs(),
            output_dir=self.output_dir,
        )

    def get_result(self) -> dict[str, Any]:
        import torch

        run = self.policy_run
        actions = run.actions
        if actions is None:  # no call yet (n_warmup: 0): "no motion", scored like any other
            actions = torch.zeros(1, run.settings.n_action_steps or run.chunk_size, self.action_dim)
        return dict(actions=actions, **run.current_metrics())
