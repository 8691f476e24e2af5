"""Will a run fit in memory? Refuse before building a model that cannot.

Building the real-size ``pi05`` preset in fp32 takes 13 GB of weights; training it adds
gradients and AdamW's two moments, and the forward keeps activations for the backward,
growing with the batch. The estimate (:func:`model_state_bytes` + :func:`activation_bytes`)
is compared with the memory available now, without allocating the model:

* **Model states** per rank follow from the parameter count: fp32 weights (4 bytes),
  gradients (4) and AdamW's two moments (8). Each backend says what it shards and in which
  precision (``model_state_bytes`` of :mod:`scopebench.train.backends`): DDP holds all of
  them; ZeRO-2 keeps the weights whole and shards the gradients and the optimizer state,
  which under DeepSpeed is 12 bytes per parameter (an fp32 master copy beside the two
  moments, as DeepSpeed's own ``estimate_zero2_model_states_mem_needs`` counts it; measured
  so on gloo ranks, fp32 included); ZeRO-3 shards all three (12 bytes of optimizer state
  again); FSDP2 shards all three with AdamW's 8, HSDP the same over one replica group's
  ranks. Under DeepSpeed with ``bf16`` the weights and gradients are bf16 (2 bytes).
* **Buffers** (``buffer_bytes`` of :mod:`scopebench.train.backends`, by name; their sum is
  ``gather_buffers``): DDP's gradient buckets (a flat copy of every gradient, with more than
  one rank); DeepSpeed's ``reduce_bucket`` of ``reduce_bucket_size`` elements and ZeRO-3's
  persistent and live parameters, read from the backend's DeepSpeed config over DeepSpeed's
  defaults; FSDP2's and HSDP's root parameters (kept gathered) and two units in flight.
  ``step_bytes`` names what only the optimizer step holds (ZeRO's fp32 gradient partition).
* **On CUDA** (:func:`cuda_runtime_bytes`, :func:`allocator_block_bytes`): torch's cuBLAS
  workspaces by GPU, the caching allocator's 512-byte blocks; the CUDA context is unknown.
* **Activations** are measured, not modelled: one forward of the model under
  ``FakeTensorMode`` (tensors with shapes and dtypes, no storage; the model is built on the
  meta device) records every tensor autograd saves for the backward
  (``saved_tensors_hooks``), each storage once, parameters left out. It runs the model's own
  code, so gradient checkpointing, attention implementation and dtype are what the run
  will use; it takes seconds even for ``pi05`` at its real size.
* **Left out**: the temporaries of one operation (a few percent of the peak), allocator
  fragmentation, NCCL's buffers and the process's own libraries.

The peak of a step is then ``parameters + optimizer state + buffers + workspaces +
max(activations, gradients + step)`` (:func:`step_peak_bytes`): activations are all alive
when the backward starts, gradients all exist when it ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = [
    "ALLOCATOR_BLOCK",
    "CUDA_WORKSPACES",
    "GB",
    "activation_bytes",
    "allocator_block_bytes",
    "available_memory_bytes",
    "check_memory_fits",
    "cuda_runtime_bytes",
    "saved_storage_bytes",
    "step_peak_bytes",
]

GB = 1e9
#: torch's CUDA caching allocator rounds every block up to a multiple of 512 bytes
#: (``kMinBlockSize`` in c10/cuda/CUDACachingAllocator.cpp; blocks of at most 1 MiB come from
#: 2 MiB segments, larger ones from 20 MiB segments up to 10 MiB, else rounded to 2 MiB).
ALLOCATOR_BLOCK = 512
#: Workspaces torch allocates once per device and stream through its caching allocator, by
#: GPU: ``cublas``, the cuBLAS handle's default ``CUBLAS_WORKSPACE_CONFIG`` ``:4096:2:16:8``
#: before Hopper (2 x 4096 KiB + 8 x 16 KiB = 8,519,680 bytes; torch's CublasHandlePool.cpp,
#: the block a memory snapshot shows after the first matmul), and ``cublaslt``, the cuBLASLt
#: workspace of 4096 KiB on an Ampere GPU of at least 24 GB (torch's CUDABlas.cpp after
#: pytorch/pytorch#120925, which follows the cuBLAS API reference's ``cublasSetWorkspace``:
#: 4 MiB, 32 MiB on Hopper). Other GPUs are unknown here (STYLE.md rule 12).
CUDA_WORKSPACES = {
    "A100": {"cublas": 2 * 4096 * 1024 + 8 * 16 * 1024, "cublaslt": 4096 * 1024},
}


def activation_bytes(build_model: Callable[[], Any], build_inputs: Callable[[Any], Any], forward: Callable) -> int:
    """Bytes autograd saves for the backward in one training forward, measured without memory.

    Args:
        build_model: Builds the ``nn.Module`` (called under the meta device, then materialised
            as fake tensors).
        build_inputs: ``model -> inputs`` (called under ``FakeTensorMode``).
        forward: ``(model, inputs) -> loss``.
    """
    return sum(saved_storage_bytes(build_model, build_inputs, forward))


def allocator_block_bytes(nbytes: int) -> int:
    """Bytes torch's CUDA caching allocator hands out for a request of ``nbytes``: a multiple of
    :data:`ALLOCATOR_BLOCK` (512), at least one.

    :Examples:

    >>> allocator_block_bytes(1), allocator_block_bytes(512), allocator_block_bytes(513)
    (512, 512, 1024)
    """
    return max(1, -(-int(nbytes) // ALLOCATOR_BLOCK)) * ALLOCATOR_BLOCK


def cuda_runtime_bytes(gpu: str | None, streams: int = 1) -> dict[str, float | None]:
    """The workspaces of :data:`CUDA_WORKSPACES` for ``gpu`` (``cublas_workspace``, one per
    stream that runs a matmul) and the ``cuda_context``, which no document sizes and torch's
    allocator statistics leave out: ``None`` (unknown), as is everything for an unknown ``gpu``.

    :Examples:

    >>> cuda_runtime_bytes("A100")["cublas_workspace"]
    12713984.0
    >>> cuda_runtime_bytes(None)
    {'cublas_workspace': None, 'cuda_context': None}
    """
    sizes = CUDA_WORKSPACES.get(gpu or "")
    workspace = None if sizes is None else float(streams * (sizes["cublas"] + sizes["cublaslt"]))
    return {"cublas_workspace": workspace, "cuda_context": None}


def saved_storage_bytes(
    build_model: Callable[[], Any], build_inputs: Callable[[Any], Any], forward: Callable
) -> list[int]:
    """The size of every storage autograd saves in one training forward (each once; parameters
    and buffers left out), measured as :func:`activation_bytes` describes."""
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
    return list(saved.values())


def step_peak_bytes(
    states: dict[str, float],
    activations: float,
    *,
    fixed: dict[str, float | None] | None = None,
    step: dict[str, float] | None = None,
    gradients_before_forward: bool = False,
) -> float:
    """The step's peak from its model states (gather buffers included when given) and
    activations (see the module's docstring): ``parameters + optimizer_state + gather_buffers
    + fixed + max(activations, gradients + step)``, or with ``gradients_before_forward``
    (ZeRO-3's preallocated partition) ``... + gradients + max(activations, step)``. ``fixed``
    and ``step`` are named terms (``None``: unknown, left out).

    :Examples:

    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0}, 10.0)
    22.0
    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0, "gather_buffers": 3.0}, 1.0)
    19.0
    >>> step_peak_bytes({"parameters": 4.0, "gradients": 4.0, "optimizer_state": 8.0}, 10.0,
    ...                 fixed={"workspace": 1.0, "context": None}, step={"fp32": 8.0},
    ...                 gradients_before_forward=True)
    27.0
    """
    total = states["parameters"] + states["optimizer_state"] + states.get("gather_buffers", 0.0)
    total += sum(v for v in (fixed or {}).values() if v is not None)
    after = sum((step or {}).values())
    if gradients_before_forward:
        return total + states["gradients"] + max(activations, after)
    return total + max(activations, states["gradients"] + after)


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
