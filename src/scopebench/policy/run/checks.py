"""What a policy run refuses before it builds anything: its backend, its memory, its data.

:class:`~scopebench.policy.run.train.PolicyTrainRun` calls :func:`check_run` once, in its
constructor (before any rank starts or any model is built); the tools call the pieces they
need before their own work (``scopebench train`` :func:`check_backend` before it starts its
ranks, ``find-max-batch`` :func:`check_preset_states` before its first trial). Each check takes
the run's backend and accelerate file as resolved once
(:func:`scopebench.train.accelerate_file.resolve_accelerate_file`), never the name again.
Every refusal is a ``ValueError`` naming the setting, the value and what would run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from scopebench.distributed.device import resolve_device
from scopebench.policy.settings import TrainSettings
from scopebench.train.accelerate_file import AccelerateFile
from scopebench.train.backends import TrainingBackend

__all__ = [
    "check_backend",
    "check_model_states",
    "check_preset_states",
    "check_run",
    "model_overrides",
    "training_memory_check",
]


def model_overrides(settings: TrainSettings) -> dict[str, Any]:
    """The :class:`~scopebench.policy.pi05.config.Pi05Config` fields a training run sets (what the
    memory check measures and a resume compares)."""
    return dict(
        attention_implementation=settings.attention_implementation,
        gradient_checkpointing=settings.gradient_checkpointing,
        ce_weight=settings.ce_weight,
    )


def check_backend(settings: TrainSettings, world_size: int, nodes: int = 1, file: AccelerateFile | None = None):
    """The run's accelerate file (``file``, else resolved from ``settings``: its
    :attr:`~scopebench.train.accelerate_file.AccelerateFile.backend` is the run's backend), the
    backend checked against the settings and the layout of ``world_size`` ranks on ``nodes``
    nodes (its conflicts, its minimum ranks, HSDP's mesh), before anything is built or any rank
    started; returns the file.

    Raises:
        ValueError: naming the setting, the file and key, or the layout that cannot run.
    """
    from scopebench.train.accelerate_file import resolve_accelerate_file

    if file is None:
        file = resolve_accelerate_file(settings.backend, settings.accelerate_config)
    backend = file.backend
    conflict = backend.conflict(
        gradient_checkpointing=settings.gradient_checkpointing, no_optim=settings.no_optim, world_size=world_size
    )
    if conflict:
        raise ValueError(conflict)
    backend.check_layout(file, world_size, nodes)
    return file


def training_memory_check(
    settings: TrainSettings,
    processes: int = 1,
    world_size: int = 1,
    config: Any = None,
    *,
    file: AccelerateFile | None = None,
) -> None:
    """Refuse a preset, then a batch, that cannot fit in the free memory.

    First the model states alone (:func:`check_model_states`, counted on the meta device),
    refused naming ``preset``; then with ``config`` (the run's model config) the step's peak
    with the activations of ``batch_size`` samples, measured by a fake forward
    (:func:`scopebench.policy.memory.training_memory`), refused naming ``batch_size``.
    ``file``: the run's accelerate file (its backend, FSDP units and HSDP mesh); None: resolved
    from ``settings``. Skipped with ``check_memory: false``.
    """
    from scopebench.train.accelerate_file import resolve_accelerate_file
    from scopebench.train.memory import GB, check_memory_fits

    if not settings.check_memory:
        return
    if file is None:
        file = resolve_accelerate_file(settings.backend, settings.accelerate_config)
    device = resolve_device(settings.device)
    check_preset_states(settings, backend=file.backend, world_size=world_size, device=device, processes=processes)
    if config is None:
        return
    from scopebench.policy.memory import run_memory

    peak = run_memory(settings, config, world_size, file=file)
    held = peak["parameters"] + peak["optimizer_state"] + peak["gather_buffers"]
    what = (
        f"the step's peak: {held / GB:.1f} GB of weights, optimizer state and gather buffers "
        f"and {peak['activations'] / GB:.1f} GB of activations for {settings.batch_size} samples per rank, "
        "measured by a fake forward"
    )
    check = dict(device=device, override_key="check_memory", processes=processes)
    check_memory_fits("batch_size", settings.batch_size, needed_bytes=int(peak["peak"]), what=what, **check)


def check_preset_states(
    settings: TrainSettings,
    *,
    backend: TrainingBackend,
    world_size: int,
    device: Any,
    processes: int = 1,
    budget_gb: float | None = None,
) -> None:
    """:func:`check_model_states` for pi05's ``preset``, its parameters counted on the meta
    device (nothing allocated)."""
    from scopebench.policy import make_policy

    with torch.device("meta"):
        params = make_policy(settings.preset).num_params()
    check_model_states(
        settings,
        "preset",
        settings.preset,
        params,
        backend=backend,
        world_size=world_size,
        device=device,
        processes=processes,
        budget_gb=budget_gb,
    )


def check_model_states(
    settings: TrainSettings,
    key: str,
    value: Any,
    params: int,
    *,
    backend: TrainingBackend,
    world_size: int,
    device: Any,
    processes: int = 1,
    budget_gb: float | None = None,
) -> None:
    """The one check that a model's states fit: fp32 weights, gradients and (unless
    ``no_optim``) AdamW state of ``params`` parameters, as ``backend`` holds them per rank
    (:meth:`~scopebench.train.backends.TrainingBackend.model_state_bytes`), times the
    ``processes`` sharing the memory; refused naming ``key`` = ``value`` (``preset``, ``policy``).
    With ``budget_gb`` (``find-max-batch``'s ``--memory-gb``) one rank's states must also fit
    in that budget: no batch can fit when they do not.
    """
    from scopebench.train.memory import check_memory_fits

    states = backend.model_state_bytes(params, world_size=world_size, optimizer=not settings.no_optim)
    size = f"{params / 1e9:.2f} B" if params >= 1e8 else f"{params / 1e6:.1f} M"
    what = f"{size} parameters x {sum(states.values()) / params:g} bytes: fp32 weights, gradients"
    what += "" if settings.no_optim else " and AdamW state"
    if backend.shards_parameters or backend.shards_optimizer:
        what += f" ({backend.name} over {world_size} rank(s))"
    if budget_gb is not None and sum(states.values()) > budget_gb * 1e9:
        raise ValueError(
            f"{key}={value!r} needs {sum(states.values()) / 1e9:.2f} GB per rank before any activation ({what}), "
            f"more than --memory-gb {budget_gb:g}: no batch fits; choose a smaller {key} or a larger budget, or set "
            "check_memory: false to try anyway"
        )
    check_memory_fits(
        key,
        value,
        needed_bytes=int(sum(states.values())),
        what=what,
        device=device,
        override_key="check_memory",
        processes=processes,
    )


def check_run(
    settings: TrainSettings,
    *,
    file: AccelerateFile | None,
    world_size: int,
    nodes: int,
    processes: int,
    dataset_root: str | Path,
    chunk_size: int,
    measure: bool,
) -> None:
    """Every check of a :class:`~scopebench.policy.run.train.PolicyTrainRun` before it starts.

    Training (``file``: the run's accelerate file, None for the dataloader task):
    :func:`check_backend`; for pi05 :func:`training_memory_check` of ``processes`` sharing the
    memory, with the activations of the run's model config when ``measure`` (rank 0, or a
    launched rank: a spawned rank's was checked by its rank 0). Then pi05's dataset against the
    batch on ``world_size`` ranks, or a user policy's factory found (its model and dataset are
    checked once built).
    """
    if file is not None:
        check_backend(settings, world_size, nodes, file)
        if settings.policy == "pi05":
            config = None
            if measure and settings.check_memory:
                from scopebench.policy.data.dataset import RobotDataset
                from scopebench.policy.pi05 import config_for_dataset

                dataset = RobotDataset(dataset_root, chunk_size=chunk_size)
                config = config_for_dataset(settings.preset, dataset, **model_overrides(settings))
            training_memory_check(settings, processes=processes, world_size=world_size, config=config, file=file)
    if settings.policy == "pi05":
        from scopebench.policy.data.dataset import check_dataset_batch  # drop_last: a share under one batch has none

        check_dataset_batch(dataset_root, settings.batch_size, world_size)
    else:
        from scopebench.policy.user import resolve_factory

        resolve_factory(settings.policy)  # a module or function not found: refused before any rank starts
