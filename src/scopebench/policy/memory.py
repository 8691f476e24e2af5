"""The policy's training memory per rank, estimated without allocating the model.

:func:`training_memory` applies :mod:`scopebench.train.memory` to a
:class:`~scopebench.policy.pi05.config.Pi05Config`: model states from the parameter count
(counted on the meta device), activations from one fake forward on a full-length batch of
the config's shapes (every prompt token real, no padded action, the worst case of a
batch). Activations are linear in the batch: :func:`activations_per_sample` measures
batch 1 and 2 once per config (cached), and every batch size is read off that line.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from scopebench.policy.pi05.config import Pi05Config
from scopebench.train.backends import TrainingBackend

__all__ = ["activations_per_sample", "full_batch", "largest_batch", "run_memory", "training_memory"]


def full_batch(config: Pi05Config, batch_size: int) -> dict[str, torch.Tensor]:
    """Model inputs of ``config``'s shapes for ``batch_size`` samples (values do not matter)."""
    s = config.vision.image_size
    return {
        "images": torch.zeros(batch_size, config.num_cameras, 3, s, s),
        "prompt_ids": torch.full((batch_size, config.prompt_max_length), 2, dtype=torch.long),
        "prompt_mask": torch.ones(batch_size, config.prompt_max_length, dtype=torch.bool),
        "state": torch.zeros(batch_size, config.state_dim),
        "actions": torch.zeros(batch_size, config.chunk_size, config.action_dim),
        "action_is_pad": torch.zeros(batch_size, config.chunk_size, dtype=torch.bool),
    }


def _activations(config: Pi05Config, batch_size: int, precision: str = "fp32") -> tuple[int, int]:
    """``(bytes, bytes in CUDA allocator blocks)`` autograd saves in one forward of ``batch_size``."""
    from scopebench.policy.pi05.model import Pi05Policy
    from scopebench.train.memory import allocator_block_bytes, saved_storage_bytes

    def forward(model, batch):
        # Noise and times given: the model's own Beta sampling reads values, which fake tensors lack.
        noise = torch.zeros_like(batch["actions"])
        # bf16: the training step's autocast (CPU op coverage; CUDA autocasts a few more ops).
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            return model(batch, noise=noise, time=torch.full((batch_size,), 0.5))[0]

    sizes = saved_storage_bytes(
        lambda: Pi05Policy(config).to(getattr(torch, config.dtype)),
        lambda model: full_batch(config, batch_size),
        forward,
    )
    return sum(sizes), sum(allocator_block_bytes(n) for n in sizes)


#: Config (its repr) -> (bytes per sample, fixed bytes) of the activations, then of the same
#: tensors in CUDA allocator blocks: one pair of fake forwards per config.
_LINES: dict[str, tuple[float, float, float, float]] = {}


def _lines(config: Pi05Config, precision: str) -> tuple[float, float, float, float]:
    key = repr((dataclasses.asdict(config), precision))
    if key not in _LINES:
        (one, one_blocks), (two, two_blocks) = _activations(config, 1, precision), _activations(config, 2, precision)
        _LINES[key] = (
            float(two - one),
            float(2 * one - two),
            float(two_blocks - one_blocks),
            float(2 * one_blocks - two_blocks),
        )
    return _LINES[key]


def activations_per_sample(config: Pi05Config, precision: str = "fp32") -> tuple[float, float]:
    """``(bytes per sample, fixed bytes)`` of the activations a training forward of ``config``
    saves, at ``precision`` (``fp32``, or ``bf16`` autocast)."""
    return _lines(config, precision)[:2]


def training_memory(
    config: Pi05Config,
    *,
    batch_size: int,
    backend: TrainingBackend | str,
    world_size: int = 1,
    optimizer: bool = True,
    precision: str = "fp32",
    units: tuple[str, ...] | None = None,
    zero: dict[str, Any] | None = None,
    file: Any = None,
    gpu: str | None = None,
) -> dict[str, Any]:
    """Per-rank bytes at a training step's peak: ``parameters``, ``gradients``,
    ``optimizer_state``, ``gather_buffers`` (the sum of ``buffers``, by name), ``activations``
    and ``peak`` (:func:`scopebench.train.memory.step_peak_bytes`), with ``step`` (what only the
    optimizer step holds, by name). With ``gpu`` (a CUDA run), also ``runtime`` (cuBLAS
    workspaces; the CUDA context ``None``) and ``allocator_rounding`` (the activations' blocks
    rounded to 512 bytes); ``fragmentation_reserve`` is ``None`` (not counted).

    Args:
        backend: The run's backend (a name is resolved).
        units: FSDP2's unit classes (default: :data:`scopebench.train.fsdp.DEFAULT_UNITS`).
        zero: DeepSpeed settings over :data:`scopebench.train.backends.ZERO_DEFAULTS`.
        file: The run's accelerate file (HSDP's mesh sizes), if any.
        gpu: The CUDA device's name (:data:`scopebench.train.memory.CUDA_WORKSPACES`), or None
            for a run whose CUDA terms are not counted (a CPU run).
    """
    from scopebench.policy.pi05.model import Pi05Policy
    from scopebench.train.backends import get_backend
    from scopebench.train.fsdp import DEFAULT_UNITS
    from scopebench.train.memory import cuda_runtime_bytes, step_peak_bytes

    backend = get_backend(backend)
    with torch.device("meta"):
        model = Pi05Policy(config)
    params = sum(p.numel() for p in model.parameters())
    states = backend.model_state_bytes(
        params, world_size=world_size, optimizer=optimizer, precision=precision, file=file
    )
    buffers = backend.buffer_bytes(
        model,
        world_size=world_size,
        precision=precision,
        units=tuple(units or DEFAULT_UNITS),
        zero=zero,
        file=file,
    )
    states["gather_buffers"] = float(sum(buffers.values()))
    step = backend.step_bytes(params, world_size=world_size, precision=precision) if optimizer else {}
    slope, intercept, block_slope, block_intercept = _lines(config, precision)
    activations = intercept + slope * batch_size
    runtime = cuda_runtime_bytes(gpu) if gpu is not None else {}
    rounding = {}
    if gpu is not None:
        rounding = {
            "allocator_rounding_per_sample": block_slope - slope,
            "allocator_rounding_fixed": block_intercept - intercept,
        }
    return {
        "num_params": params,
        **states,
        "buffers": buffers,
        "step": step,
        "gradients_before_forward": backend.gradients_before_forward,
        "activations": activations,
        "activations_per_sample": slope,
        "activations_fixed": intercept,
        "runtime": runtime,
        **rounding,
        "allocator_rounding": _rounding_at(rounding, batch_size) if rounding else None,
        "fragmentation_reserve": None,
        "peak": step_peak_bytes(
            states,
            activations + (_rounding_at(rounding, batch_size) if rounding else 0.0),
            fixed=runtime,
            step=step,
            gradients_before_forward=backend.gradients_before_forward,
        ),
    }


def _rounding_at(rounding: dict[str, float], batch_size: int) -> float:
    return rounding["allocator_rounding_fixed"] + rounding["allocator_rounding_per_sample"] * batch_size


def run_memory(
    settings: Any,
    config: Pi05Config,
    world_size: int,
    batch_size: int | None = None,
    gpu: str | None = None,
    *,
    file: Any = None,
) -> dict[str, Any]:
    """:func:`training_memory` of a run's :class:`~scopebench.policy.settings.TrainSettings`
    (precision, optimizer) and accelerate file (``file``: its backend, FSDP units and HSDP mesh;
    None: resolved from ``settings``) on ``world_size`` ranks (``gpu``: the CUDA device's name,
    see :func:`training_memory`)."""
    if file is None:
        from scopebench.train.accelerate_file import resolve_accelerate_file

        file = resolve_accelerate_file(settings.backend, settings.accelerate_config)
    return training_memory(
        config,
        batch_size=settings.batch_size if batch_size is None else batch_size,
        backend=file.backend,
        world_size=world_size,
        optimizer=not settings.no_optim,
        precision=settings.precision,
        units=file.fsdp.units if file.fsdp is not None else None,
        file=file,
        gpu=gpu,
    )


def largest_batch(memory: dict[str, Any], limit_bytes: float) -> int:
    """The largest per-rank batch whose step peak fits in ``limit_bytes`` (0: none does), from
    :func:`training_memory`'s line of activations against the batch.

    :Examples:

    >>> m = {"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0,
    ...      "activations_fixed": 2.0, "activations_per_sample": 5.0}
    >>> largest_batch(m, 40.0)  # 4 + 8 + 2 + 5 x 5 = 39 <= 40
    5
    >>> largest_batch(m, 15.0)  # weights, AdamW state and gradients alone do not fit
    0
    """
    fixed = memory["parameters"] + memory["optimizer_state"] + memory.get("gather_buffers", 0.0)
    fixed += sum(v for v in memory.get("runtime", {}).values() if v is not None)
    after = sum(memory.get("step", {}).values())
    if memory.get("gradients_before_forward"):
        fixed += memory["gradients"]
    else:
        after += memory["gradients"]
    slope = memory["activations_per_sample"] + memory.get("allocator_rounding_per_sample", 0.0)
    intercept = memory["activations_fixed"] + memory.get("allocator_rounding_fixed", 0.0)
    if fixed + after > limit_bytes or slope <= 0:
        return 0
    return max(0, int((limit_bytes - fixed - intercept) // slope))
