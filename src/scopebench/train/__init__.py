"""Training set-up shared by the benchmarks: the accelerator, the optimizer, peak FLOP/s, memory.

The model code (``scopebench.policy``) knows nothing about distribution; a run object
(:class:`scopebench.policy.train_run.PolicyTrainRun`) takes a model, an optimizer, a
scheduler and a dataloader and hands them to :func:`build_accelerator`'s
``accelerator.prepare``. The ``backend`` setting is the seam where DeepSpeed ZeRO-2/3 plug
in next to DDP.

Modules: ``accelerator`` (accelerate set-up and teardown), ``optim`` (AdamW, LR schedules),
``peak`` (peak FLOP/s of a device, for MFU), ``memory`` (will the run fit).
"""

from scopebench.train.accelerator import (
    BACKENDS,
    PRECISIONS,
    AcceleratorSettings,
    build_accelerator,
    release_accelerator,
)
from scopebench.train.memory import available_memory_bytes, check_memory_fits
from scopebench.train.optim import SCHEDULERS, build_adamw, build_scheduler
from scopebench.train.peak import PeakFlops, peak_flops

__all__ = [
    "BACKENDS",
    "PRECISIONS",
    "SCHEDULERS",
    "AcceleratorSettings",
    "PeakFlops",
    "available_memory_bytes",
    "build_accelerator",
    "build_adamw",
    "build_scheduler",
    "check_memory_fits",
    "peak_flops",
    "release_accelerator",
]
