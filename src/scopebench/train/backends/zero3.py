"""``zero3``: DeepSpeed ZeRO-3. Parameters sharded too, gathered layer by layer.

It cannot run with gradient checkpointing (ZeRO-3 re-gathers and frees each layer's
parameters on every forward, which the recomputation does not handle) and runs eager when
``torch_compile`` is asked for (compiled graphs do not follow the re-partitioning). Its
buffers: the gradient bucket, every parameter of at most
``stage3_param_persistence_threshold`` elements kept gathered, and the largest module's own
parameters plus a prefetch bucket in flight.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from scopebench.train.backends._deepspeed import ZERO_DEFAULTS, ZeroBackend
from scopebench.train.backends.base import bytes_per_element

__all__ = ["BACKEND", "Zero3Backend"]

_STEP = "engine.step: clipping, AdamW on this rank's shard, zero_grad"


@dataclass(frozen=True, kw_only=True)
class Zero3Backend(ZeroBackend):
    shards_parameters: bool = True

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

    def gather_buffer_bytes(
        self,
        model: Any,
        *,
        world_size: int = 1,
        precision: str = "fp32",
        units: tuple[str, ...] = (),
        zero: dict[str, Any] | None = None,
        file: Any = None,
    ) -> float:
        knobs = {**ZERO_DEFAULTS, **(zero or {})}
        low = bytes_per_element(precision, True)
        params = [p for p in model.parameters() if p.requires_grad]
        total = sum(p.numel() for p in params)
        threshold = knobs["stage3_param_persistence_threshold"]
        persistent = sum(p.numel() for p in params if p.numel() <= threshold)
        own = [sum(p.numel() for p in m.parameters(recurse=False) if p.numel() > threshold) for m in model.modules()]
        in_flight = min(total - persistent, max(own, default=0) + knobs["stage3_prefetch_bucket_size"])
        return float(knobs["reduce_bucket_size"] * low + (persistent + in_flight) * low)


BACKEND = Zero3Backend(
    name="zero3",
    title="DeepSpeed ZeRO-3",
    order=2,
    accelerate_file="deepspeed_zero3.yaml",
    zero_stage=3,
    compared_with=("zero2",),
    phase_contents={
        "forward": "forward + per-layer parameter all-gather",
        "bwd": "engine.backward + parameter all-gather + gradient reduce-scatter",
        "unscale_clip": "empty (DeepSpeed clips inside engine.step)",
        "optim_step": _STEP,
        "zero_grad_sched": "LR schedule",
    },
)
