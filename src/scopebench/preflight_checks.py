"""Per-solver preflight hooks (:data:`scopebench.preflight.CELL_CHECKS`): is one grid cell runnable?

Each hook takes a :class:`scopebench.preflight.Cell` (full solver and dataset parameters,
defaults included) and the number of SLURM tasks its job gets (``None``: one process,
which may spawn its own ranks). It raises ``ValueError`` naming the key when a value is
invalid or the parameters contradict each other (the process layout among them), returns
the reason when the solver would decline the cell (``skip``: a grid combination that does
not apply, a package missing here) and ``None`` when the cell runs. They call the config
classes and checks the solvers call, without building data or models. The imaging and
policy modules are imported here only.
"""

from __future__ import annotations

from typing import Any

from scopebench.validate import choice, integer

__all__ = ["imaging_inference_cell", "imaging_training_cell", "policy_inference_cell", "policy_train_cell"]


def _profiler(params: dict[str, Any]) -> None:
    from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

    ProfilerConfig.from_params(**{key: params[key] for key in PROFILER_DEFAULTS if key in params})


def imaging_inference_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``PnP`` and ``Denoiser`` of benchmark_inference: what their ``skip`` and ``set_objective`` decide.

    The solvers' own :func:`~scopebench.imaging.inference.solver.cell_problems`: a layout
    it calls invalid raises; a decline (missing denoiser package, 2-D-only denoiser on a
    volume, ``compile`` without a C compiler on this machine) is returned, the machine-dependent
    ones marked as such.
    """
    from scopebench.imaging.inference.engine import ReconstructionConfig
    from scopebench.imaging.inference.solver import CONFIG_KEYS, cell_problems
    from scopebench.imaging.inference.topology import Topology

    params = cell.solver_params
    config = ReconstructionConfig(**{key: params[key] for key in CONFIG_KEYS if key in params})
    _profiler(params)
    topology = Topology(
        nproc_per_node=params.get("nproc_per_node", 1),
        slurm_nodes=params.get("slurm_nodes", 1),
        slurm_ntasks_per_node=params.get("slurm_ntasks_per_node"),
        slurm_gres=params.get("slurm_gres"),
    )
    spec = {"kind": cell.dataset, **cell.dataset_params}
    invalid, inapplicable, unavailable = cell_problems(config, topology, spec, launcher_world_size)
    if invalid:
        raise ValueError(invalid)
    return inapplicable or (f"{unavailable} (on this machine; a compute node may differ)" if unavailable else None)


def imaging_training_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``UnrolledPnP`` of benchmark_training: what its ``skip``, ``set_objective`` and ``TrainingRun`` refuse.

    Several processes without ``distribute_model`` are invalid (the solver declines them,
    ``TrainingRun`` raises): the extra ranks would repeat rank 0's work.
    """
    from scopebench.imaging.training import SOLVER_PARAMS, configs_from_params
    from scopebench.imaging.training.data import TrainingDataSpec

    params = cell.solver_params
    spec = TrainingDataSpec(**cell.dataset_params)
    _, train = configs_from_params(spec, **{key: params[key] for key in SOLVER_PARAMS})
    _profiler(params)
    nproc = integer("nproc_per_node", params.get("nproc_per_node", 1), low=1)
    world = launcher_world_size or nproc
    if world > 1 and not train.distribute_model:
        raise ValueError(
            f"{world} processes need distribute_model=true (the ranks share the work by tiling the denoiser)"
        )
    return None


def _policy_world_size(nproc: int, launcher_world_size: int | None) -> int:
    """The ranks of a policy run: the job's SLURM tasks, else ``nproc_per_node`` local processes.

    Under a launcher the tasks are the ranks and nothing is spawned, so ``nproc_per_node``
    must be 1 or the task count (what :class:`scopebench.distributed.DistSession` requires of ``nproc``).
    """
    from scopebench.distributed.launch import check_launcher_nproc

    if launcher_world_size is None:
        return nproc
    check_launcher_nproc("nproc_per_node", nproc, launcher_world_size, "the job's SLURM tasks")
    return launcher_world_size


def policy_train_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``Pi05Train`` and ``Pi05Dataloader`` of the policy benchmark: what their ``skip`` and
    ``set_objective`` decide, in that order.

    A ``Pi05Train`` cell whose backend cannot run with its settings or on its ranks (ZeRO on
    one process, ZeRO-3 with gradient checkpointing, ZeRO without an optimizer) is declined
    with :func:`~scopebench.policy.settings.backend_conflict`'s reason, as ``skip`` declines
    it before ``set_objective`` would refuse it. Otherwise the solvers'
    :class:`~scopebench.policy.settings.TrainSettings` (seeded by the dataset, as in
    ``set_objective``), the profiler parameters and, for training, the accelerate file of
    ``backend`` are checked.
    """
    from scopebench.policy.settings import TrainSettings, backend_conflict, settings_from
    from scopebench.policy.train_run import resolve_accelerate_file
    from scopebench.train import BACKENDS

    params = cell.solver_params
    nproc = integer("nproc_per_node", params.get("nproc_per_node", 1), low=1)
    world = _policy_world_size(nproc, launcher_world_size)
    if cell.solver == "Pi05Train":
        backend = choice("backend", params.get("backend", "ddp"), BACKENDS)
        flags = (params.get("gradient_checkpointing", False), params.get("no_optim", False))
        conflict = backend_conflict(backend, *flags, world_size=world)
        if conflict:
            return conflict
    settings = settings_from(TrainSettings, params, seed=cell.dataset_params.get("seed", 0))
    _profiler(params)
    if cell.solver == "Pi05Train":
        try:
            resolve_accelerate_file(settings)
        except FileNotFoundError as err:
            raise ValueError(f"accelerate_config: {err}") from None
    return None


def policy_inference_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``Pi05Inference`` of the policy benchmark: the :class:`~scopebench.policy.settings.InferenceSettings`
    and profiler parameters its ``set_objective`` validates (it never declines a cell)."""
    from scopebench.policy.settings import InferenceSettings, settings_from

    params = cell.solver_params
    settings_from(InferenceSettings, params, seed=cell.dataset_params.get("seed", 0))
    _profiler(params)
    return None
