"""Small collectives used by the profiler and solvers; no-ops without a process group."""

from __future__ import annotations

from typing import Any

__all__ = ["group_active", "world", "barrier", "broadcast_flag", "gather_objects"]


def group_active() -> bool:
    """True when a ``torch.distributed`` group with more than one rank is initialised."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world() -> tuple[int, int]:
    """``(rank, world_size)`` of the initialised group, ``(0, 1)`` without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def barrier() -> None:
    """Wait until every rank gets here (bounded by the group timeout); no-op without a group."""
    if not group_active():
        return
    import torch
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        dist.barrier(device_ids=[torch.cuda.current_device()])
    else:
        dist.barrier()


def broadcast_flag(flag: bool | None, device: str = "cpu") -> bool:
    """Rank 0's ``flag`` on every rank (the continue/stop decision of a loop).

    Other ranks pass ``None``. Without a group the flag is returned unchanged.
    """
    if not group_active():
        return bool(flag)
    import torch
    import torch.distributed as dist

    dev = device if str(device).startswith("cuda") and dist.get_backend() == "nccl" else "cpu"
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=dev)
    dist.broadcast(value, src=0)
    return bool(value.item())


def gather_objects(obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank (``[obj]`` without a group)."""
    if not group_active():
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out
