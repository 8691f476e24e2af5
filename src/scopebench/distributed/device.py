"""The one device rule of every run: which device a rank computes on.

``device`` settings are ``auto`` (this rank's GPU when CUDA exists, else the CPU), ``cpu``,
``cuda`` (this rank's GPU; an error without CUDA) or ``cuda:<index>``. A rank's GPU is
``cuda:<local_rank mod visible GPUs>``, so ``nproc_per_node`` ranks of one node spread
over its GPUs.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DEVICE_SETTINGS", "check_device", "resolve_device"]

#: Accepted values besides ``cuda:<index>``.
DEVICE_SETTINGS = ("auto", "cpu", "cuda")


def check_device(key: str, value: Any) -> str:
    """``value`` if it is a device setting usable on this machine, else ``ValueError``.

    :Examples:
        >>> check_device("device", "cpu")
        'cpu'
        >>> check_device("device", "tpu")
        Traceback (most recent call last):
        ...
        ValueError: device must be 'auto', 'cpu' or 'cuda', got 'tpu'
    """
    import torch

    if not isinstance(value, str) or not (value in DEVICE_SETTINGS or value.startswith("cuda:")):
        raise ValueError(f"{key} must be 'auto', 'cpu' or 'cuda', got {value!r}")
    if value.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"{key}={value!r} but CUDA is not available on this machine")
    if value.startswith("cuda:"):
        index = value.removeprefix("cuda:")
        if not index.isdigit() or int(index) >= torch.cuda.device_count():
            raise ValueError(f"{key}={value!r} names no visible GPU ({torch.cuda.device_count()} visible)")
    return value


def resolve_device(setting: str = "auto", local_rank: int = 0):
    """The ``torch.device`` of a rank for a (validated) ``device`` setting.

    :Examples:
        >>> resolve_device("cpu", local_rank=3)
        device(type='cpu')
    """
    import torch

    if setting.startswith("cuda:"):
        return torch.device(setting)
    if setting == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device(f"cuda:{local_rank % torch.cuda.device_count()}")
