"""Training set-up shared by the benchmarks: backends, the accelerator, the optimizer, peak FLOP/s, memory.

The model code (``scopebench.policy``) knows nothing about distribution; a run object
(:class:`scopebench.policy.run.train.PolicyTrainRun`) resolves the ``backend`` setting to a
:class:`~scopebench.train.backends.TrainingBackend` (``ddp``, ``zero2``, ``zero3``, ``fsdp2``,
``hsdp``: DDP, DeepSpeed ZeRO-2/3, torch's FSDP2 and its hybrid sharding), which builds the
accelerator with :func:`build_accelerator` and wraps the model, optimizer, scheduler and
dataloader.

Modules: ``backends`` (one object per backend: everything that differs between them),
``accelerator`` (accelerate set-up and teardown), ``accelerate_file`` (the shipped accelerate
config files), ``fsdp`` (FSDP's sharding and DCP checkpoints), ``checkpoint`` (save / resume /
consolidate), ``data_only`` (checkpoints loaded as data, never code), ``checkpoint_files`` (what a
checkpoint may name and hold: nothing outside it, nothing unbounded), ``optim`` (AdamW, LR
schedules), ``peak`` (peak FLOP/s of a device, for MFU), ``memory`` (will the run fit).
"""

from scopebench.train.accelerate_file import (
    BACKEND_FILES,
    AccelerateFile,
    load_accelerate_file,
    resolve_accelerate_file,
    settings_in_force,
    shipped_accelerate_file,
)
from scopebench.train.accelerator import PRECISIONS, AcceleratorSettings, build_accelerator, release_accelerator
from scopebench.train.backends import backend_names, deepspeed_config, get_backend
from scopebench.train.memory import available_memory_bytes, check_memory_fits
from scopebench.train.optim import SCHEDULERS, build_adamw, build_scheduler
from scopebench.train.peak import PeakFlops, peak_flops

__all__ = [
    "BACKEND_FILES",
    "AccelerateFile",
    "PRECISIONS",
    "SCHEDULERS",
    "AcceleratorSettings",
    "PeakFlops",
    "available_memory_bytes",
    "backend_names",
    "build_accelerator",
    "deepspeed_config",
    "build_adamw",
    "build_scheduler",
    "check_memory_fits",
    "get_backend",
    "load_accelerate_file",
    "peak_flops",
    "release_accelerator",
    "resolve_accelerate_file",
    "settings_in_force",
    "shipped_accelerate_file",
]
