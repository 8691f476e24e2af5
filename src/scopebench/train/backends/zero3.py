"""``zero3``: DeepSpeed ZeRO-3. Parameters sharded too, gathered layer by layer.

It cannot run with gradient checkpointing (ZeRO-3 re-gathers and frees each layer's
parameters on every forward, which the recomputation does not handle) and runs eager when
``torch_compile`` is asked for (compiled graphs do not follow the re-partitioning). Its
buffers (:meth:`Zero3Backend.buffer_bytes`): the gradient bucket, every parameter of at most
``stage3_param_persistence_threshold`` elements kept gathered, the largest module's own
parameters plus a prefetch bucket in flight, and the forward's tail kept for the backward
within ``stage3_max_reuse_distance``. Its flat gradient partition is allocated at init, so it
lives beside the activations.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scopebench.train.backends._deepspeed import ZeroBackend
from scopebench.train.backends.base import bytes_per_element

__all__ = ["BACKEND", "Zero3Backend"]

_STEP = "engine.step: clipping, AdamW on this rank's shard, zero_grad"


@dataclass(frozen=True, kw_only=True)
class Zero3Backend(ZeroBackend):
    shards_parameters: bool = True
    #: ``stage3.py`` allocates the flat gradient partition (``grad_partitions_flat_buffer``) at init.
    gradients_before_forward: bool = True

    def conflict(self, *, gradient_checkpointing: bool, no_optim: bool, world_size: int | None = None) -> str | None:
        if gradient_checkpointing:
            return (
                f"gradient_checkpointing=true cannot run with backend={self.name}: ZeRO-3 re-gathers and frees each "
                "layer's parameters on every forward, which activation checkpointing's recomputation does not "
                "handle; use backend=fsdp2 or zero2, or gradient_checkpointing=false"
            )
        return super().conflict(gradient_checkpointing=gradient_checkpointing, no_optim=no_optim, world_size=world_size)

    def run_settings(self, settings: Any) -> tuple[Any, str | None]:
        if not getattr(settings, "torch_compile", False):
            return settings, None
        return dataclasses.replace(settings, torch_compile=False), (
            f"torch_compile=true with backend={self.name}: ZeRO-3 re-partitions parameters on every forward, "
            "which compiled graphs do not handle; training runs eager"
        )

    def buffer_bytes(
        self,
        model: Any,
        *,
        world_size: int = 1,
        precision: str = "fp32",
        units: tuple[str, ...] = (),
        zero: dict[str, Any] | None = None,
        file: Any = None,
    ) -> dict[str, float]:
        """ZeRO-2's ``reduce_bucket`` (``stage3.py`` allocates one per dtype at init), then, in the
        weights' dtype, what ``partitioned_param_coordinator.py`` keeps gathered:
        ``persistent_parameters``, every parameter of at most
        ``stage3_param_persistence_threshold`` elements, gathered once and kept; and
        ``live_parameters`` at the turn from forward to backward (where activations peak): the
        largest module's own parameters and ``stage3_prefetch_bucket_size`` in flight (the
        prefetch is capped by ``stage3_max_live_parameters`` less what is gathered), plus the
        forward's tail that is not released because the backward reuses it within
        ``stage3_max_reuse_distance`` elements of the trace (a module ``d`` elements before the
        forward's end is reused about ``2 d`` later: half the distance stays gathered), never
        more than the non-persistent parameters."""
        knobs = self.zero_knobs(zero)
        low = bytes_per_element(precision, True)
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        threshold = knobs["stage3_param_persistence_threshold"]
        persistent = sum(p.numel() for p in params if p.numel() <= threshold)
        own = [sum(p.numel() for p in m.parameters(recurse=False) if p.numel() > threshold) for m in model.modules()]
        largest = max(own, default=0)
        prefetch = min(knobs["stage3_prefetch_bucket_size"], knobs["stage3_max_live_parameters"])
        live = min(total - persistent, largest + prefetch + knobs["stage3_max_reuse_distance"] // 2)
        buckets = super().buffer_bytes(model, world_size=world_size, precision=precision, zero=zero)
        return {**buckets, "persistent_parameters": float(persistent * low), "live_parameters": float(live * low)}


BACKEND = Zero3Backend(
    name="zero3",
    title="DeepSpeed ZeRO-3",
    order=2,
    accelerate_file="deepspeed_zero3.yaml",
    zero_stage=3,
    compared_with=("zero2",),
    host_hooks_advice="ZeRO-2 or DDP for a model whose weights, gradients and AdamW state fit one rank, a larger "
    "stage3_param_persistence_threshold (small parameters stay whole, without gather hooks), a larger "
    "reduce_bucket_size",
    phase_contents={
        "forward": "forward + per-layer parameter all-gather",
        "bwd": "engine.backward + parameter all-gather + gradient reduce-scatter",
        "unscale_clip": "empty (DeepSpeed clips inside engine.step)",
        "optim_step": _STEP,
        "zero_grad_sched": "LR schedule",
    },
)
