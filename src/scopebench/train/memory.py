"""Will a run fit in memory? Refuse before building a model that cannot.

Building the real-size ``pi05`` preset in fp32 takes 13 GB of weights; training it adds
gradients and AdamW's two moments, and the forward keeps activations for the backward,
growing with the batch. The estimate (:func:`model_state_bytes` + :func:`activation_bytes`)
is compared with the memory available now, without allocating the model:

* **Model states** per rank follow from the parameter count: fp32 weights (4 bytes),
  gradients (4) and AdamW's two moments (8). DDP holds all of them; ZeRO-2 shards the
  AdamW state over the ranks (gradients are bucketed but counted whole); ZeRO-3 and FSDP2
  shard all three.
* **Activations** are measured, not modelled: one forward of the model under
  ``FakeTensorMode`` (tensors with shapes and dtypes, no storage; the model is built on the
  meta device) records every tensor autograd saves for the backward
  (``saved_tensors_hooks``), each storage once, parameters left out. It runs the model's own
  code, so gradient checkpointing, attention implementation and dtype are what the run
  will use; it takes seconds even for ``pi05`` at its real size.
* **Left out**: the temporaries of one operation (a few percent of the peak), allocator
  fragmentation, ZeRO's and FSDP2's gather buffers, and the process's own libraries.

The peak of a step is then ``parameters + optimizer state + max(activations, gradients)``:
activations are all alive when the backward starts, gradients all exist when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["activation_bytes", "available_memory_bytes", "check_memory_fits", "model_state_bytes", "step_peak_bytes"]

GB = 1e9
#: Bytes per parameter: fp32 weights, fp32 gradients, AdamW's two fp32 moments.
_WEIGHT, _GRADIENT, _ADAMW = 4, 4, 8


def model_state_bytes(
    num_params: int, *, backend: str, world_size: int = 1, optimizer: bool = True
) -> dict[str, float]:
    """Bytes per rank of ``parameters``, ``gradients`` and ``optimizer_state`` under ``backend``.

    :Examples:

    >>> model_state_bytes(1000, backend="zero2", world_size=4)
    {'parameters': 4000.0, 'gradients': 4000.0, 'optimizer_state': 2000.0}
    >>> model_state_bytes(1000, backend="fsdp2", world_size=4, optimizer=False)
    {'parameters': 1000.0, 'gradients': 1000.0, 'optimizer_state': 0.0}
    """
    optim = _ADAMW if optimizer else 0
    shard_optim = world_size if backend in ("zero2", "zero3", "fsdp2") else 1
    shard_all = world_size if backend in ("zero3", "fsdp2") else 1
    return {
        "parameters": num_params * _WEIGHT / shard_all,
        "gradients": num_params * _GRADIENT / shard_all,
        "optimizer_state": num_params * optim / shard_optim,
    }


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
    """The step's peak from its model states and activations (see the module's docstring).

    :Examples:

    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0}, 10.0)
    22.0
    """
    return states["parameters"] + states["optimizer_state"] + max(activations, states["gradients"])


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
