"""What a training backend is: :class:`TrainingBackend`, the one object every layer asks.

A backend owns everything that differs between backends (DDP, DeepSpeed's ZeRO stages, torch's
``fully_shard``...): its name and prose name, its shipped accelerate file and how a file selects it, what it
shards, its minimum ranks, the settings it cannot run with, its model-state and buffer
memory, how the accelerator is built for it and how it wraps the model, optimizer,
scheduler and loader, how the training step runs under it (the step hooks: a micro-batch's
gradient sync, the backward, clipping, the optimizer step and ``zero_grad``, on the
:class:`StepParts` the step built once), its checkpoint files (saving, loading, consolidating)
and what each training phase holds under it. The base class is DDP's behaviour where one is
needed; a backend overrides what differs (``ddp.py`` is the base with a name).

Everything here imports torch, accelerate and DeepSpeed inside the methods that need them,
so reading a backend's facts (a report, ``--help``) stays light.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["MODEL_FILE", "RNG_FILES", "Prepared", "StepParts", "TrainingBackend", "bytes_per_element"]

#: What ``accelerator.save_state`` writes for the weights (accelerate's ``SAFE_WEIGHTS_NAME``)
#: and for every rank's RNG states.
MODEL_FILE = "model.safetensors"
RNG_FILES = "random_states_{rank}.pkl"
#: Bytes per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments.
WEIGHT, GRADIENT, ADAMW = 4, 4, 8
#: accelerate's ``mixed_precision`` for each ``precision`` setting.
PRECISIONS = {"fp32": "no", "bf16": "bf16"}


def bytes_per_element(precision: str, low: bool) -> int:
    """Bytes of one weight or gradient element: 2 where the backend keeps them in bf16 under
    ``bf16`` (``low``), else 4.

    :Examples:
        >>> bytes_per_element("bf16", True), bytes_per_element("bf16", False)
        (2, 4)
    """
    return 2 if low and precision == "bf16" else 4


@dataclass
class Prepared:
    """What :meth:`TrainingBackend.prepare` hands the training step."""

    model: Any
    """The model to call (DDP wrapper, DeepSpeed engine, or the sharded module itself)."""
    optimizer: Any
    scheduler: Any
    loader: Any
    units: list[str] = field(default_factory=list)
    """FSDP units sharded on their own (their names), else empty."""


@dataclass(frozen=True, kw_only=True)
class StepParts:
    """What the step hooks of a :class:`TrainingBackend` act on, built once per training step
    by :meth:`TrainingBackend.step_parts` (``scopebench.policy.run.steps.TrainStep``)."""

    accelerator: Any
    model: Any
    """The prepared model (DDP wrapper, DeepSpeed's engine, or the model sharded in place)."""
    optimizer: Any
    """The optimizer to step and zero (accelerate's wrapper or the one it wraps), or None
    (``no_optim``: gradients are dropped)."""
    params: list
    """The trainable parameters (what clipping reads)."""
    grad_clip: float
    """Maximum global gradient norm; 0: no clipping."""
    accumulation: int
    """Micro-batches per optimizer step."""
    torch_clip: bool = False
    """Clip with torch's ``clip_grad_norm_`` rather than accelerate's."""
    torch_backward: bool = False
    """Call ``loss.backward()`` rather than ``accelerator.backward``."""


@dataclass(frozen=True, kw_only=True)
class TrainingBackend:
    """One training backend (see the module docstring). Instances are the registry's entries
    (:mod:`scopebench.train.backends`); the run resolves one from the ``backend`` setting once
    and hands it down."""

    name: str
    """The ``backend`` setting's value."""
    title: str
    """Its name in prose (``DeepSpeed ZeRO-2``)."""
    order: float
    """Where it comes in listings (choices, tables); a fraction places a new backend between two
    others without renumbering them."""
    accelerate_file: str
    """The shipped accelerate config file (``configs/accelerate/<file>``)."""
    phase_contents: Mapping[str, str]
    """Training phase -> what it holds under this backend, for the phases whose work depends on it."""
    shards_parameters: bool = False
    """Every rank holds a shard of each parameter (no rank has the whole model)."""
    shards_optimizer: bool = False
    """The optimizer state is sharded over the ranks."""
    shards_gradients: bool = False
    """The gradients are sharded over the ranks (reduced to their owner, not all-reduced)."""
    min_ranks: int = 1
    """Fewest processes it runs on."""
    zero_stage: int | None = None
    """DeepSpeed ZeRO stage, for the DeepSpeed backends."""
    gradients_before_forward: bool = False
    """The gradient buffer is allocated once, before the first forward, and kept (ZeRO-3's flat
    gradient partition), so it is alive beside the activations instead of after them."""
    fully_shards: bool = False
    """torch's ``fully_shard`` applied by the suite (FSDP2, HSDP): gradient sync, clipping and
    checkpoints are its own."""
    checkpoint_files: tuple[str, ...] = (MODEL_FILE, RNG_FILES)
    """Files a finished checkpoint holds besides its step file (``{rank}``: one per rank)."""
    compared_with: tuple[str, ...] = ()
    """Backends whose median-step ratio the backend comparison prints against this one."""
    host_hooks: str = (
        "DDP's reducer hooks (an autograd hook per parameter marks its gradient ready and launches its "
        "bucket's all-reduce)"
    )
    """The host-side work the backend adds to every step, in prose: what the ``host-overhead``
    diagnosis names when a region's host overhead is large."""
    host_hooks_advice: str = (
        "larger buckets (DDP's bucket_cap_mb: fewer hook-driven all-reduces), fewer small parameters (fused "
        "biases and norms)"
    )
    """What to try when :attr:`host_hooks` take a large share of a region."""

    # -- settings ----------------------------------------------------------------------
    @property
    def uses_deepspeed(self) -> bool:
        """accelerate's DeepSpeed plugin builds the run (the prepared model is an engine)."""
        return self.zero_stage is not None

    def conflict(self, *, gradient_checkpointing: bool, no_optim: bool, world_size: int | None = None) -> str | None:
        """Why the backend cannot run with these settings (None: it can); a solver declines the
        cell with it, the settings refuse it."""
        if world_size is not None and world_size < self.min_ranks:
            return (
                f"backend={self.name} shards training state across ranks and needs at least {self.min_ranks} "
                f"processes, got {world_size}: set nproc_per_node >= {self.min_ranks} (or start the ranks with a "
                "launcher), or use backend=ddp"
            )
        return None

    def check_layout(self, file: Any, world_size: int, nodes: int = 1) -> None:
        """Refuse a layout of ranks the backend cannot use, before anything is built (any here)."""

    def run_settings(self, settings: Any) -> tuple[Any, str | None]:
        """``settings`` as the backend runs them, and a warning when it changed one."""
        return settings, None

    def describe_phases(self) -> str:
        """One line: what the backend-dependent phases hold (``describe_phases`` of
        :mod:`scopebench.policy.phases` shows one)."""
        return f"{self.title}: " + "; ".join(f"{p} = {what}" for p, what in self.phase_contents.items())

    # -- the accelerate file -----------------------------------------------------------
    def selects(self, distributed_type: str, raw: Mapping[str, Any]) -> bool:
        """Whether an accelerate file (``raw``, its ``distributed_type``) selects this backend."""
        return distributed_type in ("NO", "MULTI_GPU", "MULTI_CPU")

    def read_file(self, raw: Mapping[str, Any], key: Callable[[str], str]) -> dict[str, Any]:
        """The backend's knobs of an accelerate file, validated (``key(name)`` names one in errors):
        fields of :class:`~scopebench.train.accelerate_file.AccelerateFile`."""
        return {}

    # -- memory ------------------------------------------------------------------------
    def model_state_bytes(
        self, num_params: int, *, world_size: int = 1, optimizer: bool = True, precision: str = "fp32", file: Any = None
    ) -> dict[str, float]:
        """Bytes per rank of ``parameters``, ``gradients`` and ``optimizer_state``: every rank
        holds all of them (fp32 weights and gradients, AdamW's two fp32 moments)."""
        return {
            "parameters": float(num_params * WEIGHT),
            "gradients": float(num_params * GRADIENT),
            "optimizer_state": float(num_params * ADAMW) if optimizer else 0.0,
        }

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
        """Bytes per rank of the backend's communication buffers for ``model`` (meta device is
        enough): the sum of :meth:`buffer_bytes`, which each backend defines."""
        kwargs = dict(world_size=world_size, precision=precision, units=units, zero=zero, file=file)
        return float(sum(self.buffer_bytes(model, **kwargs).values()))

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
        """The backend's communication buffers by name, for the estimate's lines (DeepSpeed names
        each configured buffer; the others have one, ``gather_buffers``): here DDP's gradient
        buckets, a flat copy of every gradient with more than one rank."""
        total = sum(p.numel() for p in model.parameters() if p.requires_grad)
        return {"gather_buffers": float(total * GRADIENT) if world_size > 1 else 0.0}

    def step_bytes(self, num_params: int, *, world_size: int = 1, precision: str = "fp32") -> dict[str, float]:
        """Bytes per rank that exist only in the optimizer step, by name (none here)."""
        return {}

    # -- the run -----------------------------------------------------------------------
    def accelerator_kwargs(self, settings: Any, *, cpu: bool) -> dict[str, Any]:
        """``Accelerator`` keyword arguments for ``settings`` (an
        :class:`~scopebench.train.accelerator.AcceleratorSettings`): DDP on the CPU or the GPU,
        autocast for ``bf16``, accelerate's dynamo plugin for ``torch_compile``."""
        return dict(
            cpu=cpu,
            mixed_precision=PRECISIONS[settings.precision],
            deepspeed_plugin=None,
            dynamo_backend="inductor" if settings.torch_compile else "no",
        )

    def join_group(self, device: Any) -> bool:
        """Create a process group the backend needs even alone; returns whether it did (the run
        destroys it)."""
        return False

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
        """Wrap the model and build the optimizer and schedule (``build_optimizer(params) ->
        (optimizer, scheduler)``; None: no optimizer), through ``accelerator.prepare``."""
        if build_optimizer is None:
            prepared, loader = accelerator.prepare(model, loader)
            return Prepared(prepared, None, None, loader)
        optimizer, scheduler = build_optimizer([p for p in model.parameters() if p.requires_grad])
        prepared, optimizer, scheduler, loader = accelerator.prepare(model, optimizer, scheduler, loader)
        return Prepared(prepared, optimizer, scheduler, loader)

    def engine(self, model: Any) -> Any:
        """DeepSpeed's engine, when the prepared ``model`` is one (the memory tracker reads it), else None."""
        return None

    # -- the training step ---------------------------------------------------------------
    def step_parts(self, accelerator: Any, model: Any, optimizer: Any, *, grad_clip: float, accumulation: int):
        """The :class:`StepParts` of a training step over the prepared ``model`` and
        ``optimizer``. accelerate's optimizer wrapper only adds, without a gradient scaler (fp16,
        which the suite does not offer) or XLA, two package look-ups a step (lomo_optim: 0.1-1
        ms) and an ``inspect.signature`` of ``zero_grad`` (0.1 ms; perf/user_policy_overhead.py):
        the wrapped optimizer is stepped and zeroed itself (the suite accumulates micro-batches
        itself, so accelerate's ``sync_gradients`` is always true and its wrapper would zero).
        Clipping is torch's own ``clip_grad_norm_`` where accelerate's adds only a no-op unscale
        and a grouping of the gradients by device mesh (no DTensor here: 0.1 ms a step), and
        ``backward`` torch's where accelerate's only divides the loss by 1 first."""
        from accelerate.utils import DistributedType

        inner = getattr(optimizer, "optimizer", None)
        unscaled = getattr(optimizer, "scaler", None) is None and getattr(accelerator, "scaler", None) is None
        direct = inner is not None and unscaled and accelerator.distributed_type != DistributedType.XLA
        plain = (DistributedType.NO, DistributedType.MULTI_CPU, DistributedType.MULTI_GPU)
        torch_clip = unscaled and accelerator.distributed_type in plain
        return StepParts(
            accelerator=accelerator,
            model=model,
            optimizer=inner if direct else optimizer,
            params=[p for p in model.parameters() if p.requires_grad],
            grad_clip=grad_clip,
            accumulation=accumulation,
            torch_clip=torch_clip,
            torch_backward=torch_clip and accelerator.gradient_accumulation_steps == 1,
        )

    def micro_batch(self, step: StepParts, last: bool) -> contextlib.AbstractContextManager:
        """The context of one micro-batch's forward and backward (``last``: the optimizer step's
        last): DDP all-reduces the gradients on the last micro-batch only (``no_sync`` before)."""
        return contextlib.nullcontext() if last else step.accelerator.no_sync(step.model)

    def backward(self, step: StepParts, loss: Any, last: bool) -> None:
        """The backward of one micro-batch's ``loss``, scaled by ``1 / accumulation``."""
        scaled = loss / step.accumulation if step.accumulation > 1 else loss
        if step.torch_backward:
            scaled.backward()
        else:
            step.accelerator.backward(scaled)

    def clip(self, step: StepParts) -> Any:
        """Clip the gradients to ``grad_clip`` by their global norm; the norm before clipping (a
        tensor), or None when nothing was clipped (no optimizer, ``grad_clip`` 0)."""
        if step.optimizer is None or step.grad_clip <= 0:
            return None
        if step.torch_clip:
            import torch

            return torch.nn.utils.clip_grad_norm_(step.params, step.grad_clip)
        return step.accelerator.clip_grad_norm_(step.params, step.grad_clip)

    def optimizer_step(self, step: StepParts) -> None:
        """Step the optimizer (none: nothing)."""
        if step.optimizer is not None:
            step.optimizer.step()

    def zero_grad(self, step: StepParts) -> None:
        """Drop the gradients (the optimizer's, else the model's: ``no_optim``)."""
        (step.optimizer if step.optimizer is not None else step.model).zero_grad(set_to_none=True)

    # -- checkpoints -------------------------------------------------------------------
    def save(self, model: Any, optimizer: Any, folder: Any) -> None:
        """Every rank: write what ``accelerator.save_state`` does not (nothing here)."""

    def load(self, model: Any, optimizer: Any, folder: Any) -> None:
        """Every rank: read back what :meth:`save` wrote, as data only (nothing here)."""

    def check_shards(self, checkpoint: Any, world_size: int) -> None:
        """Name a shard file that ``world_size`` ranks wrote and the checkpoint lacks, before a
        library reads the shards (nothing to check here).

        Raises:
            FileNotFoundError: the missing file, named.
        """

    def consolidated_state(self, checkpoint: Any) -> dict[str, Any] | None:
        """The full fp32 weights of a checkpoint's shards, on one process; None when the
        checkpoint already holds :data:`MODEL_FILE`."""
        return None
