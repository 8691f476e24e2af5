"""One ``accelerate.Accelerator`` per run, on whatever process group the run joined.

:class:`scopebench.dist.DistSession` creates (or joins) the process group: torchrun,
``accelerate launch``, SLURM, or our own local spawn. accelerate then has to see that
group, which it does not by itself in two cases:

* without CUDA it treats the processes as independent (world size 1, no DDP) unless it
  is in ``MULTI_CPU`` mode, which it enters only when ``LOCAL_RANK``/``WORLD_SIZE`` are
  set and the group is created with ``InitProcessGroupKwargs(backend="gloo")``;
* our own spawned ranks carry their rank in ``SCOPEBENCH_*`` variables, which accelerate
  does not read.

:func:`build_accelerator` therefore exports the launcher variables accelerate reads,
for the duration of the constructor only, from the :class:`~scopebench.dist.DistInfo` of
the group that already exists, and restores the environment afterwards (accelerate also
writes ``RANK``... itself in ``MULTI_CPU`` mode, and a later run in the same benchopt
process must not believe it runs under torchrun). accelerate keeps its state in
process-wide singletons; :func:`release_accelerator` clears them so that the next run
starts from scratch.

``backend`` is the seam for the distributed-training issue: ``ddp`` today (plain DDP,
or a single process); DeepSpeed ZeRO-2/3 will add a plugin here and nothing else changes
for the caller, who already sends model, optimizer, scheduler and dataloader through
``accelerator.prepare``.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from scopebench.validate import choice, flag, number, optional

__all__ = ["BACKENDS", "PRECISIONS", "AcceleratorSettings", "build_accelerator", "release_accelerator"]

#: Training backends (``ddp`` covers the single-process case).
BACKENDS = ("ddp",)
#: Precision setting -> accelerate's ``mixed_precision``.
PRECISIONS = {"fp32": "no", "bf16": "bf16"}
_LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
)


@dataclass(frozen=True, kw_only=True)
class AcceleratorSettings:
    """How the accelerator wraps the model."""

    backend: str = "ddp"
    """``ddp`` (DistributedDataParallel when there are several ranks)."""
    precision: str = "fp32"
    """``fp32``, or ``bf16`` autocast over fp32 weights."""
    find_unused_params: bool = True
    """DDP's ``find_unused_parameters`` (walks the autograd graph every step when true)."""
    torch_compile: bool = False
    """Compile the prepared model with inductor (accelerate's dynamo plugin)."""
    timeout_sec: float | None = None
    """Collective timeout of a group accelerate creates itself (None: torch's default)."""

    def __post_init__(self) -> None:
        choice("backend", self.backend, BACKENDS)
        choice("precision", self.precision, PRECISIONS)
        flag("find_unused_params", self.find_unused_params)
        flag("torch_compile", self.torch_compile)
        optional(number, "group_timeout_sec", self.timeout_sec, low=0, low_open=True)


@contextlib.contextmanager
def _launcher_environment(info: Any) -> Iterator[None]:
    """torchrun's variables for ``info``'s group while accelerate reads them; restored after."""
    import torch

    saved = {key: os.environ.get(key) for key in _LAUNCHER_VARS}
    try:
        if info.world_size > 1:
            os.environ.update(
                RANK=str(info.rank),
                WORLD_SIZE=str(info.world_size),
                LOCAL_RANK=str(info.local_rank),
                MASTER_ADDR=str(info.master_addr),
                MASTER_PORT=str(info.master_port),
            )
            if info.source == "spawn":  # every spawned rank is on this machine
                os.environ["LOCAL_WORLD_SIZE"] = str(info.world_size)
        # accelerate resets the thread count in MULTI_CPU mode unless this is set; the run
        # object has already chosen it.
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def build_accelerator(settings: AcceleratorSettings, info: Any, device: Any):
    """An ``Accelerator`` for this rank of the group described by ``info``.

    Args:
        settings: Precision, DDP and compile options.
        info: :class:`scopebench.dist.DistInfo` of the (already initialised) group.
        device: ``torch.device`` this rank computes on; CPU runs use ``cpu=True``.

    Returns:
        The accelerator; its ``num_processes`` equals ``info.world_size``.

    Raises:
        RuntimeError: accelerate sees another world size than the group (a canary for
            the environment handling above).
    """
    import torch
    from accelerate import Accelerator
    from accelerate.utils import DistributedDataParallelKwargs, InitProcessGroupKwargs

    cpu = torch.device(device).type != "cuda"
    group_kwargs = {"backend": "gloo" if cpu else "nccl"}
    if settings.timeout_sec is not None:
        group_kwargs["timeout"] = datetime.timedelta(seconds=settings.timeout_sec)
    handlers = [DistributedDataParallelKwargs(find_unused_parameters=settings.find_unused_params)]
    if info.world_size > 1:  # with one process a backend would make accelerate ask for a group
        handlers.append(InitProcessGroupKwargs(**group_kwargs))
    release_accelerator()  # a previous run's singletons must not leak into this one
    with _launcher_environment(info):
        accelerator = Accelerator(
            cpu=cpu,
            mixed_precision=PRECISIONS[settings.precision],
            kwargs_handlers=handlers,
            dynamo_backend="inductor" if settings.torch_compile else "no",
            # The run object places the model and moves each batch itself (the
            # ``dataload_wait``/``h2d`` regions), so accelerate must not do it inside ``next``.
            device_placement=False,
        )
    if accelerator.num_processes != info.world_size:
        raise RuntimeError(
            f"accelerate sees {accelerator.num_processes} process(es) but the group has {info.world_size} "
            f"({info.source}); its distributed type is {accelerator.distributed_type}"
        )
    return accelerator


def release_accelerator() -> None:
    """Forget accelerate's process-wide state (the group itself belongs to DistSession)."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
