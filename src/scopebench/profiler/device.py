"""Device operations the profiler needs, gathered so that CPU runs skip them.

Only :class:`DeviceOps` touches ``torch.cuda`` for timing and memory; every backend goes
through it, so tests can replace it with a recorder and check the call order without a
GPU.
"""

from __future__ import annotations

import sys
from typing import Any

from scopebench.host import MB

__all__ = ["DeviceOps", "MB", "MAXRSS_UNIT", "peak_rss_mb"]

#: Bytes per unit of ``getrusage().ru_maxrss``: KiB on Linux, bytes on macOS.
MAXRSS_UNIT = 1.0 if sys.platform == "darwin" else 1024.0


def peak_rss_mb() -> float:
    """Peak resident set size of this process since it started, in MiB."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * MAXRSS_UNIT / MB


class DeviceOps:
    """Synchronisation and peak-memory queries for one device (no-ops off CUDA).

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"`` or a ``torch.device``.
    """

    def __init__(self, device: Any = "cpu") -> None:
        import torch

        self.device = torch.device(device) if not isinstance(device, torch.device) else device
        self.is_cuda = self.device.type == "cuda" and torch.cuda.is_available()

    def cuda_module(self) -> Any:
        """``torch.cuda`` when this device is a CUDA device, else None (what memory tracking
        reads allocator statistics from)."""
        if not self.is_cuda:
            return None
        import torch

        return torch.cuda

    def synchronize(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.synchronize(self.device)

    def reset_peak_memory(self) -> None:
        if self.is_cuda:
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)

    def max_memory_mb(self) -> float:
        """Peak tensor memory allocated through PyTorch since the last reset; 0 on CPU."""
        if not self.is_cuda:
            return 0.0
        import torch

        return torch.cuda.max_memory_allocated(self.device) / MB
