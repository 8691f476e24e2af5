"""What the DeepSpeed ZeRO backends share: the config, the plugin, the file's knobs, memory.

Each ZeRO stage is one module of this package (a :class:`ZeroBackend` at its ``zero_stage``); they
run through accelerate's DeepSpeed plugin (accelerate needs
``cpu=False`` even without CUDA: DeepSpeed then runs on the CPU over gloo); the prepared
model is DeepSpeed's engine, whose ``backward`` / ``step`` the training step's hooks call
(the engine scales by ``1 / accumulation``, clips and zeroes inside its ``step``).
Memory: ZeRO shards the optimizer state (and, where :attr:`~ZeroBackend.shards_gradients`, the
gradients; where ``shards_parameters``, the weights), which under DeepSpeed is 12 bytes per
parameter (an fp32 master copy beside AdamW's two moments, as DeepSpeed's own
``estimate_zero2_model_states_mem_needs`` counts it; measured so on gloo ranks, fp32
included); with ``bf16`` the weights and gradients are bf16. Checkpoints are DeepSpeed's
``pytorch_model/`` shards and ``latest``, consolidated by ``zero_to_fp32``.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scopebench.train.backends.base import ADAMW, PRECISIONS, RNG_FILES, StepParts, TrainingBackend, bytes_per_element
from scopebench.validate import choice

__all__ = ["ZERO_DEFAULTS", "ZeroBackend"]

#: DeepSpeed's fp32 master copy of the weights, beside AdamW's moments.
MASTER = 4
#: DeepSpeed's ZeRO defaults the shipped accelerate files keep (``DeepSpeedZeroConfig``'s
#: fields; tests/policy/test_memory_tracking.py checks them against deepspeed's own).
ZERO_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "allgather_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
    "stage3_max_live_parameters": 1_000_000_000,
    "stage3_max_reuse_distance": 1_000_000_000,
}
#: DeepSpeed keys of an accelerate file that the suite uses, with accelerate's defaults.
ZERO_KEYS = {
    "offload_optimizer_device": "none",
    "offload_param_device": "none",
    "zero3_init_flag": False,
    "zero3_save_16bit_model": False,
}
#: DeepSpeed's periodic log line, effectively off (the profiler reports the steps).
_NEVER = 2**31 - 1
#: The most of ``latest`` read: it holds the tag, one folder name.
_TAG_BYTES = 4096


@dataclass(frozen=True, kw_only=True)
class ZeroBackend(TrainingBackend):
    """DeepSpeed ZeRO at :attr:`zero_stage` (see the module docstring)."""

    shards_optimizer: bool = True
    shards_gradients: bool = True
    min_ranks: int = 2
    checkpoint_files: tuple[str, ...] = ("latest", "pytorch_model", RNG_FILES)
    host_hooks: str = (
        "DeepSpeed's ZeRO per-parameter hooks (a gradient hook per parameter copies it into the reduce "
        "bucket and partitions it; under ZeRO-3 also a gather and a release around every module)"
    )
    host_hooks_advice: str = (
        "DDP instead of ZeRO for a model whose weights, gradients and AdamW state fit one rank, a larger "
        "reduce_bucket_size, fewer small parameters (fused biases and norms)"
    )

    def conflict(self, *, gradient_checkpointing: bool, no_optim: bool, world_size: int | None = None) -> str | None:
        if no_optim:
            return (
                f"no_optim=true cannot run with backend={self.name}: ZeRO shards the optimizer's state and "
                "DeepSpeed's engine steps it; measure raw forward + backward with backend=ddp"
            )
        return super().conflict(gradient_checkpointing=gradient_checkpointing, no_optim=no_optim, world_size=world_size)

    def selects(self, distributed_type: str, raw: Mapping[str, Any]) -> bool:
        ds = raw.get("deepspeed_config") or {}
        return distributed_type == "DEEPSPEED" and isinstance(ds, dict) and ds.get("zero_stage") == self.zero_stage

    def read_file(self, raw: Mapping[str, Any], key: Callable[[str], str]) -> dict[str, Any]:
        ds = raw.get("deepspeed_config") or {}
        if ds.get("deepspeed_config_file"):
            raise ValueError(
                f"{key('deepspeed_config.deepspeed_config_file')}: a separate DeepSpeed JSON is not supported; "
                "put zero_stage, offload devices and zero3 flags in deepspeed_config"
            )
        zero = {name: ds.get(name, default) for name, default in ZERO_KEYS.items()}
        for name in ("offload_optimizer_device", "offload_param_device"):
            choice(key(f"deepspeed_config.{name}"), zero[name], ("none", "cpu", "nvme"))
        return {"zero": zero}

    def model_state_bytes(
        self, num_params: int, *, world_size: int = 1, optimizer: bool = True, precision: str = "fp32", file: Any = None
    ) -> dict[str, float]:
        low = bytes_per_element(precision, True)
        params = world_size if self.shards_parameters else 1
        gradients = world_size if self.shards_gradients else 1
        return {
            "parameters": num_params * low / params,
            "gradients": num_params * low / gradients,
            "optimizer_state": num_params * (ADAMW + MASTER) / world_size if optimizer else 0.0,
        }

    def zero_knobs(self, zero: dict[str, Any] | None = None) -> dict[str, Any]:
        """The ZeRO sizes in force: :data:`ZERO_DEFAULTS` under what this backend's DeepSpeed
        config sets in ``zero_optimization`` (:meth:`deepspeed_config` sets none of them, so
        DeepSpeed's defaults apply), under ``zero``."""
        from types import SimpleNamespace

        built = self.deepspeed_config(
            SimpleNamespace(zero={}, micro_batch_size=1, gradient_accumulation_steps=1, grad_clip=1.0)
        )
        configured = {k: v for k, v in built["zero_optimization"].items() if k in ZERO_DEFAULTS}
        return {**ZERO_DEFAULTS, **configured, **(zero or {})}

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
        """``reduce_bucket``: the gradient bucket of ``reduce_bucket_size`` elements in the
        weights' dtype (``stage_1_and_2.py`` ``setup_buckets``: one buffer, two with
        ``overlap_comm``, which DeepSpeed leaves off below stage 3; 1 GB in bf16 at the default
        5e8, whatever the model's size). ``allgather_bucket_size`` allocates nothing: with
        ``all_gather_into_tensor`` (NCCL, gloo) the updated partitions are gathered in place
        (``runtime/utils.py`` ``all_gather_dp_groups``)."""
        knobs = self.zero_knobs(zero)
        overlap = knobs.get("overlap_comm", self.zero_stage == 3)
        buffers = 2 if overlap and self.zero_stage != 3 else 1
        return {"reduce_bucket": float(buffers * knobs["reduce_bucket_size"] * bytes_per_element(precision, True))}

    def step_bytes(self, num_params: int, *, world_size: int = 1, precision: str = "fp32") -> dict[str, float]:
        """``fp32_gradient_partition``: the step casts this rank's gradient partition to the master
        weights' fp32 before AdamW (``stage_1_and_2.py`` ``step``; ``stage3.py``
        ``_prepare_fp32_grad_for_sub_group``, one ``sub_group_size`` = 1e9 elements at most), 4
        bytes per parameter over the ranks, beside the gradients."""
        return {"fp32_gradient_partition": num_params * MASTER / world_size}

    def accelerator_kwargs(self, settings: Any, *, cpu: bool) -> dict[str, Any]:
        import logging

        from accelerate.utils import DeepSpeedPlugin
        from deepspeed.utils import logger as deepspeed_logger

        deepspeed_logger.setLevel(logging.WARNING)
        # The values are passed twice: the plugin otherwise fills its own from a launcher's
        # ACCELERATE_* variables (the accelerate file), and the training config wins.
        plugin = DeepSpeedPlugin(
            hf_ds_config=self.deepspeed_config(settings),
            zero_stage=self.zero_stage,
            gradient_accumulation_steps=settings.gradient_accumulation_steps,
            gradient_clipping=settings.grad_clip,
            zero3_init_flag=bool(settings.zero.get("zero3_init_flag")),
        )
        return dict(
            cpu=False,  # DeepSpeed's path needs it, even without CUDA (it then runs on the CPU)
            mixed_precision=PRECISIONS[settings.precision],
            deepspeed_plugin=plugin,
            dynamo_backend="inductor" if settings.torch_compile else "no",
        )

    def deepspeed_config(self, settings: Any) -> dict[str, Any]:
        """The DeepSpeed config of this backend for ``settings`` (an
        :class:`~scopebench.train.accelerator.AcceleratorSettings`; precision is filled in by
        accelerate)."""
        knobs = {**ZERO_KEYS, **settings.zero}
        zero: dict[str, Any] = {
            "stage": self.zero_stage,
            "offload_optimizer": {"device": knobs["offload_optimizer_device"]},
        }
        if self.shards_parameters:
            zero["offload_param"] = {"device": knobs["offload_param_device"]}
            zero["stage3_gather_16bit_weights_on_model_save"] = bool(knobs.get("zero3_save_16bit_model", False))
        return {
            "train_micro_batch_size_per_gpu": settings.micro_batch_size,
            "gradient_accumulation_steps": settings.gradient_accumulation_steps,
            "gradient_clipping": settings.grad_clip,
            "zero_optimization": zero,
            # torch's AdamW (fused or not) rather than DeepSpeed's JIT-built CPU/fused Adam.
            "zero_allow_untested_optimizer": True,
            "steps_per_print": _NEVER,
            "wall_clock_breakdown": False,
        }

    def engine(self, model: Any) -> Any:
        return model

    # -- the training step: DeepSpeed's engine -------------------------------------------
    def micro_batch(self, step: StepParts, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # the engine knows the boundary (backward)

    def backward(self, step: StepParts, loss: Any, last: bool) -> None:
        """``engine.backward``, which scales by ``1 / accumulation`` itself and reduces at the boundary."""
        step.model.set_gradient_accumulation_boundary(is_boundary=last)
        step.model.backward(loss)

    def clip(self, step: StepParts) -> Any:
        return None  # inside engine.step, from the DeepSpeed config's gradient_clipping

    def optimizer_step(self, step: StepParts) -> None:
        step.model.step()

    def zero_grad(self, step: StepParts) -> None:
        """Nothing: ``engine.step`` zeroes."""

    # -- checkpoints -------------------------------------------------------------------
    def check_shards(self, checkpoint: Any, world_size: int) -> None:
        """Each rank's optimizer shard, ``<tag>/..._pp_rank_<r>_..._optim_states.pt`` (the tag:
        ``latest``'s): ``zero_to_fp32`` only counts them ("Expected 2 of '*_optim_states.pt' ...
        but found 1 files") and DeepSpeed's engine fails on the missing one. The tag must name a
        folder inside the checkpoint (``zero_to_fp32`` joins it as given: ``../other-run``).

        Raises:
            FileNotFoundError: a rank's shard missing, named.
            ValueError: a tag that leads out of the checkpoint, named.
        """
        from scopebench.train.checkpoint_files import confined

        checkpoint = Path(checkpoint)
        try:
            with open(checkpoint / "latest", "rb") as fh:
                tag = fh.read(_TAG_BYTES).decode().strip()
        except (OSError, UnicodeDecodeError):
            return  # named before (resolve_checkpoint: ``latest`` missing) or by DeepSpeed
        # zero_to_fp32 joins the tag to the checkpoint as given: it must name a folder inside it
        folder = confined(checkpoint, tag, checkpoint / "latest")
        rank = re.compile(r"_pp_rank_(\d+)_")
        found = {int(m.group(1)): p.name for p in folder.glob("*_optim_states.pt") if (m := rank.search(p.name))}
        missing = [r for r in range(world_size) if r not in found]
        if found and missing:
            name = rank.sub(f"_pp_rank_{missing[0]}_", next(iter(found.values())), count=1)
            raise FileNotFoundError(
                f"{folder / name}: missing (the optimizer shard of rank {missing[0]} of {world_size}): "
                "the checkpoint is damaged"
            )

    def consolidated_state(self, checkpoint: Any) -> dict[str, Any]:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        from scopebench.train.data_only import data_only_loading

        with data_only_loading():  # zero_to_fp32 loads every shard with weights_only=False
            return get_fp32_state_dict_from_zero_checkpoint(str(checkpoint))
