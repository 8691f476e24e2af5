"""Training set-up shared by the benchmarks: backends, the accelerator, the optimizer, peak FLOP/s, memory.

The model code (``scopebench.policy``) knows nothing about distribution; a run object
(:class:`scopebench.policy.run.train.PolicyTrainRun`) resolves the ``backend`` setting to a
:class:`~scopebench.train.backends.TrainingBackend` (one of :func:`~scopebench.train.backends.all_backends`:
DDP, DeepSpeed's ZeRO stages, torch's FSDP2 and its hybrid sharding...), which builds the
accelerator with :func:`build_accelerator` and wraps the model, optimizer, scheduler and
dataloader.

Modules: ``backends`` (one object per backend: everything that differs between them),
``accelerator`` (accelerate set-up and teardown), ``accelerate_file`` (the shipped accelerate
config files), ``fsdp`` (FSDP's sharding and DCP checkpoints), ``checkpoint`` (save / resume),
``consolidate`` (sharded weights into one file), ``data_only`` (checkpoints loaded as data, never code), ``checkpoint_files`` (what a
checkpoint may name and hold: nothing outside it, nothing unbounded), ``optim`` (AdamW, LR
schedules), ``peak`` (peak FLOP/s of a device, for MFU), ``memory`` (will the run fit).
"""

import importlib
from typing import Any

#: Name -> the module of this package that defines it. Imported on first use (PEP 562), so
#: ``import scopebench.train.backends`` (``--help`` strings, reports reading the registry) does
#: not import torch through the optimizer and the accelerator.
_EXPORTS = {
    "BACKEND_FILES": "accelerate_file",
    "AccelerateFile": "accelerate_file",
    "load_accelerate_file": "accelerate_file",
    "resolve_accelerate_file": "accelerate_file",
    "settings_in_force": "accelerate_file",
    "shipped_accelerate_file": "accelerate_file",
    "PRECISIONS": "accelerator",
    "AcceleratorSettings": "accelerator",
    "build_accelerator": "accelerator",
    "release_accelerator": "accelerator",
    "backend_names": "backends",
    "deepspeed_config": "backends",
    "get_backend": "backends",
    "available_memory_bytes": "memory",
    "check_memory_fits": "memory",
    "SCHEDULERS": "optim",
    "build_adamw": "optim",
    "build_scheduler": "optim",
    "PeakFlops": "peak",
    "peak_flops": "peak",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
