"""Will a run fit in memory? Refuse before building a model that cannot.

Building the real-size ``pi05`` preset in fp32 takes 13 GB of weights; training it adds
gradients and AdamW's two moments, and the forward keeps activations for the backward,
growing with the batch. The estimate (:func:`model_state_bytes` + :func:`activation_bytes`)
is compared with the memory available now, without allocating the model:

* **Model states** per rank follow from the parameter count: fp32 weights (4 bytes),
  gradients (4) and AdamW's two moments (8). DDP holds all of them; ZeRO-2 keeps the
  weights whole and shards the gradients and the optimizer state, which under DeepSpeed is
  12 bytes per parameter (an fp32 master copy beside the two moments, as DeepSpeed's own
  ``estimate_zero2_model_states_mem_needs`` counts it; measured so on gloo ranks, fp32
  included); ZeRO-3 shards all three (12 bytes of optimizer state again); FSDP2 shards
  all three with AdamW's 8. Under DeepSpeed with ``bf16`` the weights and gradients are
  bf16 (2 bytes).
* **Gather buffers** (:func:`gather_buffer_bytes`): DDP's gradient buckets (a flat copy of
  every gradient, with more than one rank); ZeRO's gradient bucket of
  ``reduce_bucket_size`` elements (DeepSpeed's default 5e8: 2 GB in fp32, allocated whatever
  the model's size); ZeRO-3's gathered parameters (every parameter of at most
  ``stage3_param_persistence_threshold`` elements stays gathered, plus the largest module's
  own and a prefetch bucket); FSDP2's root parameters (kept gathered) and two units in
  flight.
* **Activations** are measured, not modelled: one forward of the model under
  ``FakeTensorMode`` (tensors with shapes and dtypes, no storage; the model is built on the
  meta device) records every tensor autograd saves for the backward
  (``saved_tensors_hooks``), each storage once, parameters left out. It runs the model's own
  code, so gradient checkpointing, attention implementation and dtype are what the run
  will use; it takes seconds even for ``pi05`` at its real size.
* **Left out**: the temporaries of one operation (a few percent of the peak), allocator
  fragmentation, and the process's own libraries.

The peak of a step is then ``parameters + optimizer state + gather buffers +
max(activations, gradients)``: activations are all alive when the backward starts,
gradients all exist when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ZERO_DEFAULTS",
    "activation_bytes",
    "available_memory_bytes",
    "check_memory_fits",
    "gather_buffer_bytes",
    "model_state_bytes",
    "step_peak_bytes",
]

GB = 1e9
#: Bytes per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments.
_WEIGHT, _GRADIENT, _ADAMW = 4, 4, 8
#: DeepSpeed's fp32 master copy of the weights, beside AdamW's moments, under ZeRO.
_MASTER = 4
#: DeepSpeed's ZeRO defaults the shipped accelerate files keep (``DeepSpeedZeroConfig``'s
#: fields; tests/policy/test_memory_tracking.py checks them against deepspeed's own).
ZERO_DEFAULTS = {
    "reduce_bucket_size": 500_000_000,
    "stage3_prefetch_bucket_size": 50_000_000,
    "stage3_param_persistence_threshold": 100_000,
}
_ZERO = ("zero2", "zero3")


def _low_precision_bytes(backend: str, precision: str) -> int:
    """Bytes of one weight or gradient element: DeepSpeed keeps them in bf16 under ``bf16``."""
    return 2 if backend in _ZERO and precision == "bf16" else 4


def model_state_bytes(
    num_params: int, *, backend: str, world_size: int = 1, optimizer: bool = True, precision: str = "fp32"
) -> dict[str, float]:
    """Bytes per rank of ``parameters``, ``gradients`` and ``optimizer_state`` under ``backend``.

    :Examples:

    >>> model_state_bytes(1000, backend="zero2", world_size=4)
    {'parameters': 4000.0, 'gradients': 1000.0, 'optimizer_state': 3000.0}
    >>> model_state_bytes(1000, backend="zero3", world_size=4, precision="bf16")
    {'parameters': 500.0, 'gradients': 500.0, 'optimizer_state': 3000.0}
    >>> model_state_bytes(1000, backend="fsdp2", world_size=4, optimizer=False)
    {'parameters': 1000.0, 'gradients': 1000.0, 'optimizer_state': 0.0}
    """
    low = _low_precision_bytes(backend, precision)
    optim = (_ADAMW + (_MASTER if backend in _ZERO else 0)) if optimizer else 0
    shard_optim = world_size if backend in ("zero2", "zero3", "fsdp2") else 1
    shard_params = world_size if backend in ("zero3", "fsdp2") else 1
    return {
        "parameters": num_params * low / shard_params,
        "gradients": num_params * low / shard_optim,
        "optimizer_state": num_params * optim / shard_optim,
    }


def gather_buffer_bytes(
    model: Any,
    *,
    backend: str,
    world_size: int = 1,
    precision: str = "fp32",
    units: tuple[str, ...] = (),
    zero: dict[str, Any] | None = None,
) -> float:
    """Bytes per rank of the communication buffers of ``backend`` for ``model`` (a module, on
    the meta device is enough; see the module's docstring).

    Args:
        units: FSDP2's unit classes (``fsdp_transformer_layer_cls_to_wrap``).
        zero: DeepSpeed settings overriding :data:`ZERO_DEFAULTS`.

    :Examples:

    >>> import torch
    >>> with torch.device("meta"):
    ...     model = torch.nn.Sequential(torch.nn.Linear(100, 100), torch.nn.Linear(100, 10))
    >>> gather_buffer_bytes(model, backend="ddp", world_size=2)  # DDP's buckets: every gradient again
    44440.0
    >>> gather_buffer_bytes(model, backend="zero2", world_size=2) / 1e9  # the 5e8-element bucket
    2.0
    """
    params = [p for p in model.parameters() if p.requires_grad]
    total = sum(p.numel() for p in params)
    if backend == "ddp":
        return float(total * _GRADIENT) if world_size > 1 else 0.0
    knobs = {**ZERO_DEFAULTS, **(zero or {})}
    low = _low_precision_bytes(backend, precision)
    if backend == "zero2":
        return float(knobs["reduce_bucket_size"] * low)
    if backend == "zero3":
        threshold = knobs["stage3_param_persistence_threshold"]
        persistent = sum(p.numel() for p in params if p.numel() <= threshold)
        own = [sum(p.numel() for p in m.parameters(recurse=False) if p.numel() > threshold) for m in model.modules()]
        in_flight = min(total - persistent, max(own, default=0) + knobs["stage3_prefetch_bucket_size"])
        return float(knobs["reduce_bucket_size"] * low + (persistent + in_flight) * low)
    if backend == "fsdp2":
        unit_sizes, in_units = [], set()
        named = sorted(model.named_modules(), key=lambda item: -item[0].count(".") if item[0] else 1)
        for _, module in named:  # deepest first: a parameter belongs to its innermost unit
            if type(module).__name__ in units and module is not model:
                ids = {id(p) for p in module.parameters()} - in_units
                in_units |= ids
                unit_sizes.append(sum(p.numel() for p in module.parameters() if id(p) in ids))
        root = sum(p.numel() for p in params if id(p) not in in_units)
        largest = max(unit_sizes, default=0)
        gathered = 2 if precision == "bf16" else 4  # FSDP2 gathers in bf16 under its mixed precision (CUDA)
        return float((root + 2 * largest) * gathered)
    return 0.0


def activation_bytes(build_model: Callable[[], Any], build_inputs: Callable[[Any], Any], forward: Callable) -> int:
    """Bytes autograd saves for the backward in one training forward, measured without memory.

    Args:
        build_model: Builds the ``nn.Module`` (called under the meta device, then materialised
            as fake tensors).
        build_inputs: ``model -> inputs`` (called under ``FakeTensorMode``).
        forward: ``(model, inputs) -> loss``.
    """
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.multiprocessing.reductions import StorageWeakRef

    with torch.device("meta"):
        model = build_model()
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = model.to_empty(device="cpu")
        model.train()
        params = {StorageWeakRef(p.untyped_storage()) for p in model.parameters()}
        params |= {StorageWeakRef(b.untyped_storage()) for b in model.buffers()}
        saved: dict[Any, int] = {}

        def pack(tensor):
            ref = StorageWeakRef(tensor.untyped_storage())
            if ref not in params:
                saved[ref] = tensor.untyped_storage().nbytes()
            return tensor

        inputs = build_inputs(model)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            forward(model, inputs)
    return sum(saved.values())


def step_peak_bytes(states: dict[str, float], activations: float) -> float:
    """The step's peak from its model states (gather buffers included when given) and
    activations (see the module's docstring).

    :Examples:

    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0}, 10.0)
    22.0
    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0, "gather_buffers": 3.0}, 1.0)
    19.0
    """
    fixed = states["parameters"] + states["optimizer_state"] + states.get("gather_buffers", 0.0)
    return fixed + max(activations, states["gradients"])


def available_memory_bytes(device) -> int:
    """Free memory of a CUDA device, else the host's available memory (``MemAvailable``)."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    import psutil

    return int(psutil.virtual_memory().available)


def check_memory_fits(
    key: str, value: object, *, needed_bytes: int, what: str, device, override_key: str, processes: int = 1
) -> None:
    """``ValueError`` naming ``key``/``value`` when ``processes x needed_bytes`` exceeds what is free.

    Args:
        key: The parameter that chose the size (``preset``).
        value: Its value.
        needed_bytes: Estimate for one process.
        what: What the estimate counts, for the message.
        device: Where the memory must be found.
        override_key: The parameter that skips this check, for the message.
        processes: Ranks sharing that memory (local ranks on a CPU).
    """
    available = available_memory_bytes(device)
    total = needed_bytes * processes
    if total > available:
        per = f" per process x {processes} processes" if processes > 1 else ""
        raise ValueError(
            f"{key}={value!r} needs at least {total / GB:.1f} GB on {device} ({what}{per}) but only "
            f"{available / GB:.1f} GB are available; choose a smaller {key}, or set {override_key}: false "
            f"to try anyway"
        )
