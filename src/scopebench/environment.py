"""What a result was measured with: package versions and the device's name."""

from __future__ import annotations

import functools
import platform
from typing import Any

__all__ = ["device_name", "package_version", "environment_metrics"]


def package_version(name: str) -> str | None:
    """Installed version of ``name``, ``None`` when it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def device_name(device: Any = "cpu") -> str:
    """The GPU's name for a CUDA device, else ``cpu (<processor>)``."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()})"


@functools.lru_cache(maxsize=8)
def _environment(device: str) -> tuple[tuple[str, str], ...]:
    import torch

    return (
        ("torch_version", torch.__version__),
        ("deepinv_version", package_version("deepinv") or "unknown"),
        ("scopebench_version", package_version("scopebench") or "unknown"),
        ("device_name", device_name(device)),
    )


def environment_metrics(device: Any = "cpu") -> dict[str, str]:
    """Versions of torch, deepinv and scopebench and the device name, as string metrics.

    Looked up once per device: objectives call this at every evaluation.
    """
    return dict(_environment(str(device)))
