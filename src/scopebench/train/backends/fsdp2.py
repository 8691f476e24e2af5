"""``fsdp2``: torch's FSDP2 (``fully_shard``), applied by the suite, the same code on CPU and CUDA.

Parameters, gradients and AdamW state are sharded over every rank (a 1-D mesh); each unit's
parameters are all-gathered before its forward and again in the backward, gradients are
reduce-scattered. accelerate's FSDP plugin does nothing without CUDA, so the model is sharded
by :func:`scopebench.train.fsdp.shard_model` before the optimizer is built, and accelerate
only prepares the schedule and the loader. It runs on one rank too (a group of one), with
gradient checkpointing and with ``torch_compile`` (each unit compiled on its own).
Checkpoints are torch.distributed.checkpoint folders, read as data only.

:class:`FSDPBackend` is also the base of ``hsdp`` (:mod:`~scopebench.train.backends.hsdp`),
which differs only in its device mesh (:meth:`FSDPBackend.mesh`) and the file that selects it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from scopebench.train.backends.base import ADAMW, PRECISIONS, RNG_FILES, Prepared, StepParts, TrainingBackend

__all__ = ["BACKEND", "FSDPBackend"]


@dataclass(frozen=True, kw_only=True)
class FSDPBackend(TrainingBackend):
    """torch's ``fully_shard`` on the mesh :meth:`mesh` gives (see the module docstring)."""

    shards_parameters: bool = True
    shards_optimizer: bool = True
    shards_gradients: bool = True
    fully_shards: bool = True
    checkpoint_files: tuple[str, ...] = ("fsdp_model/.metadata", RNG_FILES)
    host_hooks: str = (
        "FSDP2's pre/post forward and backward hooks (per unit: the all-gather, the reshard, the gradient "
        "reduce-scatter)"
    )
    host_hooks_advice: str = (
        "fewer, larger units (fsdp_transformer_layer_cls_to_wrap), DDP or ZeRO-2 for a model whose weights "
        "fit one rank, fewer small parameters (fused biases and norms)"
    )

    # -- the accelerate file -----------------------------------------------------------
    def selects(self, distributed_type: str, raw: Mapping[str, Any]) -> bool:
        return distributed_type == "FSDP" and not raw.get("parallelism_config")

    def read_file(self, raw: Mapping[str, Any], key: Callable[[str], str]) -> dict[str, Any]:
        """``fsdp_config``'s knobs (:class:`~scopebench.train.fsdp.FSDPSettings`) and its
        activation checkpointing flag (None when unset; the training config's wins)."""
        from scopebench.train.fsdp import FSDPSettings
        from scopebench.validate import choice, flag

        cfg = raw.get("fsdp_config") or {}
        if not isinstance(cfg, dict):
            raise ValueError(f"{key('fsdp_config')} must be a mapping, got {cfg!r}")
        choice(key("fsdp_config.fsdp_version"), cfg.get("fsdp_version", 1), (2,))
        wrap = cfg.get("fsdp_auto_wrap_policy", "TRANSFORMER_BASED_WRAP")
        choice(key("fsdp_config.fsdp_auto_wrap_policy"), wrap, ("TRANSFORMER_BASED_WRAP",))
        state = cfg.get("fsdp_state_dict_type", "SHARDED_STATE_DICT")
        choice(key("fsdp_config.fsdp_state_dict_type"), state, ("SHARDED_STATE_DICT",))
        units = cfg.get("fsdp_transformer_layer_cls_to_wrap")  # None: the policy's shard_modules
        if isinstance(units, str):
            units = [name.strip() for name in units.split(",")]
        if units is not None and (
            not isinstance(units, list) or not units or not all(isinstance(n, str) and n for n in units)
        ):
            raise ValueError(
                f"{key('fsdp_config.fsdp_transformer_layer_cls_to_wrap')} must name module classes "
                f"(comma-separated), got {units!r}"
            )
        knobs = {}
        for name, field_name in (
            ("fsdp_reshard_after_forward", "reshard_after_forward"),
            ("fsdp_offload_params", "offload_params"),
        ):
            if name in cfg:
                knobs[field_name] = flag(key(f"fsdp_config.{name}"), cfg[name])
        checkpointing = cfg.get("fsdp_activation_checkpointing")
        if checkpointing is not None:
            flag(key("fsdp_config.fsdp_activation_checkpointing"), checkpointing)
        fsdp = FSDPSettings(units=None if units is None else tuple(units), **knobs)
        return {"fsdp": fsdp, "activation_checkpointing": checkpointing}

    # -- layout ------------------------------------------------------------------------
    def shard_degree(self, file: Any, world_size: int, nodes: int = 1) -> int:
        """Ranks each parameter is sharded over: all of them."""
        return world_size

    def mesh(self, device: Any, file: Any, world_size: int, nodes: int = 1) -> Any:
        """The device mesh of ``fully_shard``; None: the default, every rank on one dimension."""
        return None

    # -- memory ------------------------------------------------------------------------
    def model_state_bytes(
        self, num_params: int, *, world_size: int = 1, optimizer: bool = True, precision: str = "fp32", file: Any = None
    ) -> dict[str, float]:
        """Everything sharded over :meth:`shard_degree` ranks, fp32 (bf16 only in the gathers),
        AdamW's 8 bytes (no master copy)."""
        shard = self.shard_degree(file, world_size)
        return {
            "parameters": num_params * 4 / shard,
            "gradients": num_params * 4 / shard,
            "optimizer_state": num_params * ADAMW / shard if optimizer else 0.0,
        }

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
        """``gather_buffers``: the root's parameters (kept gathered) and two units in flight, in bf16 under ``bf16``
        (FSDP2's mixed precision gathers in bf16 on CUDA)."""
        params = [p for p in model.parameters() if p.requires_grad]
        unit_sizes, in_units = [], set()
        named = sorted(model.named_modules(), key=lambda item: -item[0].count(".") if item[0] else 1)
        for _, module in named:  # deepest first: a parameter belongs to its innermost unit
            if type(module).__name__ in units and module is not model:
                ids = {id(p) for p in module.parameters()} - in_units
                in_units |= ids
                unit_sizes.append(sum(p.numel() for p in module.parameters() if id(p) in ids))
        root = sum(p.numel() for p in params if id(p) not in in_units)
        largest = max(unit_sizes, default=0)
        gathered = 2 if precision == "bf16" else 4
        return {"gather_buffers": float((root + 2 * largest) * gathered)}

    # -- the run -----------------------------------------------------------------------
    def accelerator_kwargs(self, settings: Any, *, cpu: bool) -> dict[str, Any]:
        """accelerate sees a plain ``MULTI_CPU`` / ``MULTI_GPU`` run. On CUDA FSDP2 casts to bf16
        through its ``MixedPrecisionPolicy``, not autocast; on the CPU it uses autocast like
        ``ddp``. Units are compiled by :meth:`prepare`, not by accelerate's dynamo plugin."""
        return dict(
            cpu=cpu,
            mixed_precision="no" if not cpu else PRECISIONS[settings.precision],
            deepspeed_plugin=None,
            dynamo_backend="no",
        )

    def join_group(self, device: Any) -> bool:
        from scopebench.train.fsdp import join_single_rank_group

        return join_single_rank_group(device)  # fully_shard needs a group, even of one

    def prepare(
        self,
        accelerator: Any,
        model: Any,
        loader: Any,
        *,
        build_optimizer: Callable[[list], tuple[Any, Any]] | None,
        settings: Any,
        file: Any,
        device: Any,
        modules: Any = None,
        world_size: int = 1,
        nodes: int = 1,
    ) -> Prepared:
        """Shard in place before the optimizer sees the parameters, then build it on the shards."""
        from scopebench.train.fsdp import shard_model

        units = shard_model(
            model,
            file.fsdp,
            device=device,
            precision=settings.precision,
            compile_units=settings.torch_compile,
            modules=modules,
            mesh=self.mesh(device, file, world_size, nodes),
        )
        if build_optimizer is None:
            return Prepared(model, None, None, accelerator.prepare(loader), units)
        optimizer, scheduler = build_optimizer([p for p in model.parameters() if p.requires_grad])
        scheduler, loader = accelerator.prepare(scheduler, loader)
        return Prepared(model, optimizer, scheduler, loader, units)

    # -- the training step ---------------------------------------------------------------
    def micro_batch(self, step: StepParts, last: bool) -> contextlib.AbstractContextManager:
        """The gradients are reduce-scattered on the last micro-batch only."""
        step.model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()

    def clip(self, step: StepParts) -> Any:
        """By the norm over every rank's gradient shards, not this rank's."""
        if step.optimizer is None or step.grad_clip <= 0:
            return None
        from scopebench.train.fsdp import clip_grad_norm

        return clip_grad_norm(step.params, step.grad_clip)

    # -- checkpoints -------------------------------------------------------------------
    def save(self, model: Any, optimizer: Any, folder: Any) -> None:
        from scopebench.train.fsdp import save_sharded

        save_sharded(model, optimizer, folder)

    def load(self, model: Any, optimizer: Any, folder: Any) -> None:
        from scopebench.train.fsdp import load_sharded

        load_sharded(model, optimizer, folder)

    def consolidated_state(self, checkpoint: Any) -> dict[str, Any]:
        from scopebench.train.fsdp import consolidated_model_state

        return consolidated_model_state(checkpoint)


BACKEND = FSDPBackend(
    name="fsdp2",
    title="FSDP2",
    order=3,
    accelerate_file="fsdp2.yaml",
    compared_with=("zero2", "ddp"),
    phase_contents={
        "forward": "forward + per-unit parameter all-gather (and the reshard after each unit)",
        "bwd": "backward + parameter re-gather + gradient reduce-scatter",
        "unscale_clip": "clipping by the total norm over every rank's gradient shards (an all-reduce)",
        "optim_step": "AdamW on this rank's shards",
        "zero_grad_sched": "zero_grad + LR schedule",
    },
)
