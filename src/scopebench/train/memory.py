"""Will a run fit in memory? Refuse before building a model that cannot.

Building the real-size ``pi05`` preset in fp32 takes 13 GB of weights; training it adds
gradients and AdamW's two moments. The estimate counts those (activations are left out,
so it is a lower bound) and compares it with the memory available now.
"""

from __future__ import annotations

__all__ = ["available_memory_bytes", "check_memory_fits"]

GB = 1e9


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
