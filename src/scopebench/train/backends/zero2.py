"""``zero2``: DeepSpeed ZeRO-2. Gradients and optimizer state sharded, weights whole.

Shared DeepSpeed behaviour (config, plugin, file knobs, memory, consolidation) is in
:mod:`~scopebench.train.backends._deepspeed`.
"""

from __future__ import annotations

from scopebench.train.backends._deepspeed import ZeroBackend

__all__ = ["BACKEND"]

_STEP = "engine.step: clipping, AdamW on this rank's shard, zero_grad"

BACKEND = ZeroBackend(
    name="zero2",
    title="DeepSpeed ZeRO-2",
    order=1,
    accelerate_file="deepspeed_zero2.yaml",
    zero_stage=2,
    compared_with=("ddp",),
    host_hooks_advice="DDP instead of ZeRO-2 for a model whose weights, gradients and AdamW state fit one rank, a "
    "larger reduce_bucket_size, fewer small parameters (fused biases and norms)",
    phase_contents={
        "bwd": "engine.backward + gradient reduce to the owning rank",
        "unscale_clip": "empty (DeepSpeed clips inside engine.step)",
        "optim_step": f"{_STEP}, all-gather of the updated parameters",
        "zero_grad_sched": "LR schedule",
    },
)
