"""Per-solver preflight hooks (:data:`scopebench.preflight.CELL_CHECKS`): is one grid cell runnable?

Each hook takes a :class:`scopebench.preflight.Cell` (full solver and dataset parameters,
defaults included) and the number of SLURM tasks its job gets (``None``: one process,
which may spawn its own ranks). It raises ``ValueError`` naming the key when a value is
invalid or the parameters contradict each other (the process layout among them), returns
the reason when the solver would decline the cell (``skip``: a grid combination that does
not apply, a package missing here) and ``None`` when the cell runs. They call the config
classes and checks the solvers call, without building data or models. The imaging
modules are imported here only.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["imaging_inference_cell", "imaging_training_cell"]


def _profiler(params: dict[str, Any]) -> None:
    from scopebench.profiler.config import PROFILER_DEFAULTS, ProfilerConfig

    ProfilerConfig.from_params(**{key: params[key] for key in PROFILER_DEFAULTS if key in params})


def imaging_inference_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``PnP`` and ``Denoiser`` of benchmark_inference: what ``ImagingSolverMixin.skip`` and ``set_objective`` decide.

    A layout :func:`~scopebench.imaging.topology.check_topology` refuses is invalid;
    a missing denoiser package, a 2-D-only denoiser on a volume and ``compile`` without a
    C compiler on this machine are declines.
    """
    from scopebench.imaging.denoisers import denoiser_unavailable
    from scopebench.imaging.pnp import ReconstructionConfig
    from scopebench.imaging.problems import describe_problem
    from scopebench.imaging.topology import Topology, check_topology

    params = cell.solver_params
    fields = {f.name for f in dataclasses.fields(ReconstructionConfig)}
    config = ReconstructionConfig(**{key: value for key, value in params.items() if key in fields})
    _profiler(params)
    shape, num_operators = describe_problem(cell.dataset, **cell.dataset_params)
    topology = Topology(
        nproc_per_node=params.get("nproc_per_node", 1),
        slurm_nodes=params.get("slurm_nodes", 1),
        slurm_ntasks_per_node=params.get("slurm_ntasks_per_node"),
        slurm_gres=params.get("slurm_gres"),
    )
    layout = dict(
        distribute_physics=config.distribute_physics,
        distribute_denoiser=config.distribute_denoiser,
        num_operators=num_operators,
        signal_shape=shape,
        patch_size=config.patch_size,
        overlap=config.overlap,
        launcher_world_size=launcher_world_size,
    )
    reason = check_topology(topology, **layout, compile_mode="none")
    if reason:
        raise ValueError(reason)
    if len(shape) == 5 and config.denoiser in ("median", "bm3d", "wavelet"):
        return f"denoiser={config.denoiser!r} only handles 2-D images; {cell.dataset} is a volume"
    reason = denoiser_unavailable(config.denoiser) or check_topology(topology, **layout, compile_mode=config.compile)
    return f"{reason} (on this machine; a compute node may differ)" if reason else None


def imaging_training_cell(cell: Any, launcher_world_size: int | None) -> str | None:
    """``UnrolledPnP`` of benchmark_training: what its ``skip``, ``set_objective`` and ``TrainingRun`` refuse.

    Several processes without ``distribute_model`` are invalid (the solver declines them,
    ``TrainingRun`` raises): the extra ranks would repeat rank 0's work.
    """
    from scopebench.imaging.train import SOLVER_PARAMS, configs_from_params
    from scopebench.imaging.training_data import TrainingDataSpec

    params = cell.solver_params
    spec = TrainingDataSpec(**cell.dataset_params)
    _, train = configs_from_params(spec, **{key: params[key] for key in SOLVER_PARAMS})
    _profiler(params)
    nproc = params.get("nproc_per_node", 1)
    if isinstance(nproc, bool) or not isinstance(nproc, int) or nproc < 1:
        raise ValueError(f"nproc_per_node must be a positive integer, got {nproc!r}")
    world = launcher_world_size or nproc
    if world > 1 and not train.distribute_model:
        raise ValueError(
            f"{world} processes need distribute_model=true (the ranks share the work by tiling the denoiser)"
        )
    return None
