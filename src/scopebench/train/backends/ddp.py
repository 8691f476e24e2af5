"""``ddp``: DistributedDataParallel with several ranks, the plain model with one.

Every rank holds the whole model, its gradients and AdamW state; DDP all-reduces the
gradients in buckets during the backward. The base class is this backend's behaviour.
"""

from __future__ import annotations

from scopebench.train.backends.base import TrainingBackend

__all__ = ["BACKEND"]

BACKEND = TrainingBackend(
    name="ddp",
    title="DDP",
    order=0,
    accelerate_file="ddp.yaml",
    phase_contents={
        "bwd": "backward + DDP's gradient all-reduce",
        "optim_step": "AdamW",
        "zero_grad_sched": "zero_grad + LR schedule",
    },
)
