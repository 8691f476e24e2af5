"""The optimizer and learning-rate schedule of a training run.

AdamW like the upstream training loops; ``fused`` is a tri-state (``None``: torch's
default choice, ``True``/``False``: forced, for A/B comparisons). torch checks fused
support only at the first ``step``; :func:`build_adamw` checks it up front and falls back
with one warning instead of crashing mid-run.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable

import torch

from scopebench.validate import choice, integer, number, optional

__all__ = ["SCHEDULERS", "build_adamw", "build_scheduler", "fused_adamw_supported"]

#: Learning-rate schedules: ``constant`` after a linear warm-up, or ``cosine`` decay to 10 %.
SCHEDULERS = ("constant", "cosine")
# Devices with fused AdamW kernels (torch/optim/optimizer.py, _device_dtype_check_for_fused).
_FUSED_DEVICES = ("cpu", "cuda", "mps", "xpu", "hpu")


def fused_adamw_supported(params: Iterable[torch.Tensor]) -> tuple[bool, str]:
    """Whether ``torch.optim.AdamW(fused=True)`` can step these parameters, and why not."""
    for p in params:
        if not p.is_floating_point():
            return False, f"a parameter has dtype {p.dtype} (fused AdamW needs floating point)"
        if p.device.type not in _FUSED_DEVICES:
            return False, f"a parameter is on {p.device.type} (fused AdamW runs on {', '.join(_FUSED_DEVICES)})"
    return True, ""


def build_adamw(
    params: Iterable[torch.nn.Parameter], *, lr: float, weight_decay: float = 0.0, fused: bool | None = None
) -> torch.optim.AdamW:
    """AdamW over ``params``; ``fused=True`` where unsupported warns once and uses the default.

    :Examples:

    >>> w = torch.nn.Parameter(torch.zeros(2))
    >>> build_adamw([w], lr=1e-3, fused=True).defaults["fused"]
    True
    """
    params = list(params)
    number("learning_rate", lr, low=0, low_open=True)
    number("weight_decay", weight_decay, low=0)
    if fused:
        ok, why = fused_adamw_supported(params)
        if not ok:
            warnings.warn(
                f"fused_adamw=true: fused AdamW is unavailable here ({why}); using torch's default", stacklevel=2
            )
            fused = None
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, fused=fused)


def build_scheduler(
    optimizer: torch.optim.Optimizer, *, name: str = "constant", warmup_steps: int = 0, decay_steps: int | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A linear warm-up over ``warmup_steps``, then constant or a cosine decay to 10 %.

    Args:
        optimizer: The optimizer whose learning rate is scaled.
        name: ``constant`` or ``cosine``.
        warmup_steps: Steps of the linear warm-up (0: none).
        decay_steps: Length of the cosine decay after warm-up (``cosine`` only; None: 1000).

    :Examples:

    >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    >>> sched = build_scheduler(opt, name="cosine", warmup_steps=2, decay_steps=2)
    >>> lrs = []
    >>> for _ in range(5):
    ...     lrs.append(round(opt.param_groups[0]["lr"], 3)); opt.step(); sched.step()
    >>> lrs
    [0.333, 0.667, 1.0, 0.55, 0.1]
    """
    choice("scheduler", name, SCHEDULERS)
    integer("warmup_steps", warmup_steps, low=0)
    decay = optional(integer, "decay_steps", decay_steps, low=1) or 1000

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / (warmup_steps + 1)
        if name == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / decay)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
