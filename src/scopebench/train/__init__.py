"""Training set-up shared by the benchmarks: the accelerator, the optimizer, peak FLOP/s, memory.

The model code (``scopebench.policy``) knows nothing about distribution; a run object
(:class:`scopebench.policy.run.train.PolicyTrainRun`) takes a model, an optimizer, a
scheduler and a dataloader and hands them to :func:`build_accelerator`'s
``accelerator.prepare``. The ``backend`` setting (``ddp``, ``zero2``, ``zero3``, ``fsdp2``) chooses
DDP, DeepSpeed ZeRO-2/3, or torch's FSDP2 (``fully_shard``, applied by ``fsdp``).

Modules: ``accelerator`` (accelerate set-up and teardown), ``accelerate_file`` (the
shipped accelerate config files), ``fsdp`` (FSDP2 sharding and its checkpoints), ``checkpoint`` (save / resume / consolidate), ``optim``
(AdamW, LR schedules), ``peak`` (peak FLOP/s of a device, for MFU), ``memory`` (will the
run fit).
"""

from scopebench.train.accelerate_file import (
    BACKEND_FILES,
    AccelerateFile,
    load_accelerate_file,
    settings_in_force,
    shipped_accelerate_file,
)
from scopebench.train.accelerator import (
    BACKENDS,
    PRECISIONS,
    SHARDED_PARAMETERS,
    AcceleratorSettings,
    build_accelerator,
    check_launcher_backend,
    deepspeed_config,
    release_accelerator,
)
from scopebench.train.memory import available_memory_bytes, check_memory_fits
from scopebench.train.optim import SCHEDULERS, build_adamw, build_scheduler
from scopebench.train.peak import PeakFlops, peak_flops

__all__ = [
    "BACKEND_FILES",
    "BACKENDS",
    "AccelerateFile",
    "PRECISIONS",
    "SCHEDULERS",
    "SHARDED_PARAMETERS",
    "AcceleratorSettings",
    "PeakFlops",
    "available_memory_bytes",
    "build_accelerator",
    "check_launcher_backend",
    "deepspeed_config",
    "build_adamw",
    "build_scheduler",
    "check_memory_fits",
    "load_accelerate_file",
    "peak_flops",
    "release_accelerator",
    "settings_in_force",
    "shipped_accelerate_file",
]
