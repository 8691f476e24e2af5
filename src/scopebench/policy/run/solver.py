"""The benchopt-free half of the policy solvers ``Pi05Train``, ``Pi05Dataloader``, ``Pi05Inference``.

``class Solver(TrainSolverMixin, BaseSolver)`` declares its parameter grid and ``task``; the
lifecycle and the skip rule are :class:`~scopebench.harness.solver.ProfiledSolverMixin`'s,
like the imaging solvers' (:mod:`scopebench.imaging.inference.solver`). These mixins add
``check_cell`` (can a cell run: the one check ``skip`` and ``scopebench check-config`` call;
a backend the settings cannot run is declined with a reason), the run object (built by
``set_objective`` from the validated settings, started untimed by ``pre_run_hook``) and
``get_result`` (the work product and the run's
:meth:`~scopebench.harness.run.RankRun.metrics`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from scopebench.harness import ProfiledSolverMixin

__all__ = ["DATALOADER_SETTINGS", "InferenceSolverMixin", "TrainSolverMixin"]

#: The :class:`~scopebench.policy.settings.TrainSettings` fields ``Pi05Dataloader`` varies
#: (the rest are training's: no model, no optimizer).
DATALOADER_SETTINGS = (
    "policy",
    "policy_args",
    "preset",
    "batch_size",
    "num_workers",
    "prefetch_factor",
    "nproc_per_node",
    "group_timeout_sec",
    "device",
)


class _PolicySolverMixin(ProfiledSolverMixin):
    """What the three policy solvers share: the objective's dataset as the cell's spec."""

    #: The benchmark's ``outputs/`` folder (set by the solver file).
    output_dir: Path = Path("outputs")

    def cell_spec(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> dict[str, Any]:
        return {"kind": dataset, "seed": seed}


def _policy_world_size(params: dict[str, Any], launcher_world_size: int | None) -> int:
    """The ranks of a policy run: the launcher's (a job's SLURM tasks), else ``nproc_per_node``
    local processes (:func:`scopebench.cluster.cell_layout`, the one rule); under a running
    launcher ``nproc_per_node`` must agree with its ranks per node (what
    :class:`scopebench.distributed.DistSession` requires)."""
    from scopebench.cluster import CellLayout
    from scopebench.distributed import get_dist_info
    from scopebench.distributed.launch import check_launcher_nproc
    from scopebench.validate import integer

    nproc = integer("nproc_per_node", params.get("nproc_per_node", CellLayout.nproc_per_node), low=1)
    launcher = get_dist_info() if launcher_world_size is not None else None
    if launcher is not None and launcher.is_distributed:  # the run's own skip, under its launcher
        check_launcher_nproc("nproc_per_node", nproc, launcher_world_size, launcher.source, launcher.nodes)
        return launcher_world_size
    # check-config, for the cell's job; or a run without a launcher
    layout = CellLayout.from_params({**params, "nproc_per_node": nproc}).ranks(launcher_world_size)
    return launcher_world_size or layout.world_size


def _policy_nodes(params: dict[str, Any], launcher_world_size: int | None) -> int:
    """The nodes of a policy run: the launcher's, else the cell's ``slurm_nodes`` (1 without SLURM)."""
    from scopebench.cluster import CellLayout
    from scopebench.distributed import get_dist_info

    launcher = get_dist_info() if launcher_world_size is not None else None
    if launcher is not None and launcher.is_distributed:
        return launcher.nodes
    nodes = params.get("slurm_nodes", CellLayout.slurm_nodes)
    return nodes if type(nodes) is int and nodes >= 1 else CellLayout.slurm_nodes


class TrainSolverMixin(_PolicySolverMixin):
    """``Pi05Train`` (``task = "train"``) and ``Pi05Dataloader`` (``task = "dataloader"``)."""

    task = "train"

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """A ``Pi05Train`` backend that cannot run with its settings or on its ranks (ZeRO on
        one process, ZeRO-3 with gradient checkpointing, ZeRO without an optimizer, an HSDP mesh
        that does not divide the ranks) is declined with the backend's own reason
        (:meth:`~scopebench.train.backends.TrainingBackend.conflict`, ``check_layout``), before
        anything else is checked (as benchopt asks ``skip`` before ``set_objective``); its
        accelerate file is resolved then, once. Otherwise the
        :class:`~scopebench.policy.settings.TrainSettings` (seeded by the dataset), the profiler
        parameters and the batch against each rank's share of the dataset's samples
        (:func:`~scopebench.policy.data.dataset.check_batch_fits`) are checked."""
        from scopebench.policy.data.dataset import check_batch_fits, synthetic_samples
        from scopebench.policy.settings import DatasetSettings, TrainSettings, settings_from
        from scopebench.validate import integer

        world = _policy_world_size(params, launcher_world_size)
        if cls.task == "train":
            refused = cls._backend_refused(params, world, _policy_nodes(params, launcher_world_size))
            if refused:
                return refused
        settings = settings_from(TrainSettings, params, seed=spec.get("seed", 0))
        super().check_cell(params, spec, launcher_world_size)
        if settings.policy != "pi05":  # a user policy reads its own dataset, checked once built
            return None
        # The dataset is not written here: its samples are its frames (synthetic_samples).
        defaults = DatasetSettings.__dataclass_fields__
        episodes, length = (
            integer(k, spec.get(k, defaults[k].default), low=1) for k in ("num_episodes", "episode_length")
        )
        dataset = f"the dataset ({episodes} episodes x {length} frames)"
        check_batch_fits(settings.batch_size, synthetic_samples(episodes, length), world, dataset)
        return None

    @staticmethod
    def _backend_refused(params: dict[str, Any], world: int, nodes: int) -> str | None:
        """Why the cell's backend cannot run with its settings or lay out ``world`` ranks on
        ``nodes`` nodes (its conflicts, HSDP's mesh), else None; the backend and its accelerate
        file resolved once.

        Raises:
            ValueError: an unknown backend, an accelerate file missing or selecting another backend.
        """
        from scopebench.train.accelerate_file import resolve_accelerate_file
        from scopebench.train.backends import DEFAULT_BACKEND, get_backend

        backend = get_backend(params.get("backend", DEFAULT_BACKEND))
        conflict = backend.conflict(
            gradient_checkpointing=params.get("gradient_checkpointing", False),
            no_optim=params.get("no_optim", False),
            world_size=world,
        )
        if conflict:
            return conflict
        try:
            file = resolve_accelerate_file(backend, params.get("accelerate_config"))
        except FileNotFoundError as err:
            raise ValueError(f"accelerate_config: {err}") from None
        try:
            backend.check_layout(file, world, nodes)
        except ValueError as err:  # a layout this backend cannot use: the cell is declined, as ZeRO on one rank
            return str(err)
        return None

    def make_run(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> Any:
        from scopebench.policy.run.train import PolicyTrainRun
        from scopebench.policy.settings import TrainSettings, settings_from

        settings = settings_from(TrainSettings, self, seed=seed)
        return PolicyTrainRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            task=self.task,
            profiler=self.profiler_config,
            output_dir=self.output_dir,
            name=f"pi05_{self.task}",
            eval_batch_size=len(eval_batch["actions"]),
        )

    def run(self, callback: Any) -> None:
        """The profiled loop (:meth:`~scopebench.harness.solver.ProfiledSolverMixin.finish_run`);
        a non-finite loss (:mod:`scopebench.policy.run.nonfinite`) stops it on every rank, after
        benchopt's callback has logged that iteration, and rank 0 then raises
        :class:`~scopebench.policy.run.nonfinite.NonFiniteLossError` naming the step and the term,
        which benchopt records as the cell's error (its other ranks end cleanly: no rank is blamed).

        Raises:
            NonFiniteLossError: ``Pi05Train: step 3: loss term 'mse_loss' is nan (train_loss nan): stopped``.
        """
        from scopebench.policy.run.nonfinite import NonFiniteLossError

        run = self.run_object
        if self.task != "train" or callback is None:
            self.finish_run(run, callback)
            return

        def until_nonfinite() -> bool:
            return bool(callback()) and run.work.nonfinite is None

        self.finish_run(run, until_nonfinite)
        if run.work.nonfinite is not None and run.rank == 0:
            raise NonFiniteLossError(f"Pi05Train: {run.work.nonfinite.describe()}: stopped")

    def get_result(self) -> dict[str, Any]:
        run = self.run_object
        if self.task == "dataloader":
            return dict(dataloader=True, **run.metrics())
        # every rank computed the validation loss before this callback (ZeRO-3, FSDP2: a forward needs them all)
        return dict(val_loss=run.val_loss, **run.metrics())


class InferenceSolverMixin(_PolicySolverMixin):
    """``Pi05Inference``: one action chunk per iteration; with ``control_hz``, its rows carry
    the control-rate figures of the timed calls so far (:meth:`InferenceRun.control_metrics`)."""

    @classmethod
    def check_cell(cls, params: dict[str, Any], spec: dict[str, Any], launcher_world_size: int | None) -> str | None:
        """The :class:`~scopebench.policy.settings.InferenceSettings` and profiler parameters
        (an inference cell is never declined)."""
        from scopebench.policy.settings import InferenceSettings, settings_from

        settings_from(InferenceSettings, params, seed=spec.get("seed", 0))
        return super().check_cell(params, spec, launcher_world_size)

    def make_run(self, dataset, eval_batch, seed, dataset_root, chunk_size) -> Any:
        from scopebench.policy.run.inference import InferenceRun
        from scopebench.policy.settings import InferenceSettings, settings_from

        self.action_dim = eval_batch["actions"].shape[-1]
        settings = settings_from(InferenceSettings, self, seed=seed)
        return InferenceRun(
            settings,
            dataset_root=dataset_root,
            chunk_size=chunk_size,
            profiler=self.profiler_config,
            output_dir=self.output_dir,
            tool="Pi05Inference",
        )

    def get_result(self) -> dict[str, Any]:
        import torch

        run = self.run_object
        metrics = {**run.metrics(), **run.control_metrics()}  # control_*: with a control_hz only
        if run.settings.policy != "pi05":  # a user policy's output is not an action chunk of the dataset
            return dict(sampled=True, **metrics)
        actions = run.actions
        if actions is None:  # no call yet (n_warmup: 0): "no motion", scored like any other
            actions = torch.zeros(1, run.executed_actions(), self.action_dim)
        return dict(actions=actions, **metrics)
