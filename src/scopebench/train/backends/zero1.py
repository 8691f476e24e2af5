"""``zero1``: DeepSpeed ZeRO-1. Optimizer state sharded; gradients and weights whole.

Each rank keeps every weight and, through the backward, every gradient (in the weights'
dtype, as DDP does); after the backward DeepSpeed reduces the gradients in buckets to the rank
that owns each partition, which casts its partition to fp32 and steps AdamW on its share of
the master weights and moments (12 bytes per parameter over the ranks); the updated
partitions are all-gathered in ``engine.step``. Against ZeRO-2 it saves no gradient memory
(only the optimizer state shrinks with the ranks) and its gradient hooks do no work before the
accumulation boundary. Everything else (config, plugin, buffers, the step's fp32 partition,
checkpoints and their consolidation by ``zero_to_fp32``) is
:class:`~scopebench.train.backends._deepspeed.ZeroBackend`'s.
"""

from __future__ import annotations

from scopebench.train.backends._deepspeed import ZeroBackend

__all__ = ["BACKEND"]

BACKEND = ZeroBackend(
    name="zero1",
    title="DeepSpeed ZeRO-1",
    order=0.5,
    accelerate_file="deepspeed_zero1.yaml",
    zero_stage=1,
    shards_gradients=False,
    compared_with=("zero2", "ddp"),
    host_hooks="DeepSpeed's ZeRO gradient hooks (per parameter; under ZeRO-1 they only mark the gradient ready, "
    "and the reduction of every gradient to its owner runs after the backward, bucket by bucket)",
    host_hooks_advice="DDP instead of ZeRO-1 for a model whose AdamW state fits one rank, a larger "
    "reduce_bucket_size, fewer small parameters (fused biases and norms)",
    phase_contents={
        "bwd": "engine.backward + every gradient reduced to its owning rank after the backward",
        "unscale_clip": "empty (DeepSpeed clips inside engine.step)",
        "optim_step": "engine.step: clipping, AdamW on this rank's shard, zero_grad, all-gather of the updated "
        "parameters",
        "zero_grad_sched": "LR schedule",
    },
)
