"""The ``nvidia`` backend: NVTX ranges and a CUDA profiler capture range for nsys.

Every recorded iteration is an NVTX range ``iter_<N>`` and every region inside it a
nested range with the region's name. ``cudaProfilerStart`` is called when the window's
first iteration begins and ``cudaProfilerStop`` after its last one ends (or at
:meth:`finalize` when the window is open-ended or the run stops early), so
``nsys profile --capture-range=cudaProfilerApi`` records exactly the window. Internally
only ``total_time_sec``, ``step_time_sec`` (the total without benchopt's callback) and
``max_gpu_mb`` are measured; nsys holds the detail.

Without CUDA the ranges go to the ``nvtx`` package (inert unless a tool listens), the
capture calls are skipped, and a warning says so once per process.
"""

from __future__ import annotations

import warnings
from typing import Any

from scopebench.profiler.base import Profiler

__all__ = ["NvidiaProfiler", "CudaMarkers"]

_warned = False


class CudaMarkers:
    """NVTX ranges and CUDA profiler start/stop; the seam tests replace with a recorder.

    Args:
        cuda: Whether CUDA is usable (``torch.cuda``'s NVTX and profiler API are then
            used); otherwise NVTX goes through the ``nvtx`` package.
    """

    def __init__(self, cuda: bool) -> None:
        self.capture_active = cuda
        if cuda:
            import torch

            self._push = torch.cuda.nvtx.range_push
            self._pop = torch.cuda.nvtx.range_pop
            self._start = torch.cuda.profiler.start
            self._stop = torch.cuda.profiler.stop
        else:
            import nvtx

            self._push = lambda name: nvtx.push_range(name)
            self._pop = nvtx.pop_range
            self._start = self._stop = lambda: None

    def range_push(self, name: str) -> None:
        self._push(name)

    def range_pop(self) -> None:
        self._pop()

    def profiler_start(self) -> None:
        self._start()

    def profiler_stop(self) -> None:
        self._stop()


class NvidiaProfiler(Profiler):
    """NVTX + capture-range backend; see the module docstring."""

    def __init__(self, *args: Any, markers: CudaMarkers | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.markers = markers if markers is not None else CudaMarkers(self.ops.is_cuda)
        self._capturing = False
        self._iter_open = False
        if not self.markers.capture_active:
            global _warned
            if not _warned:
                _warned = True
                warnings.warn(
                    "profiler_mode=nvidia without CUDA: NVTX ranges go to the nvtx package and no "
                    "CUDA capture range is set, so nsys records nothing of the window; only "
                    "total_time_sec and max_gpu_mb are measured",
                    RuntimeWarning,
                    stacklevel=3,
                )

    def _start_iteration(self, i: int) -> None:
        if not self._capturing:
            self.ops.synchronize()
            self.markers.profiler_start()
            self._capturing = True
        self.markers.range_push(f"iter_{i}")
        self._iter_open = True

    def _enter_region(self, name: str) -> Any:
        self.markers.range_push(name)

    def _exit_region(self, name: str, token: Any) -> None:
        self.markers.range_pop()

    def _close_iteration(self) -> None:
        if self._iter_open:
            self.markers.range_pop()
            self._iter_open = False

    def _iteration_metrics(self, i: int, total_sec: float) -> dict[str, Any]:
        self._close_iteration()
        cfg = self.config
        if cfg.active > 0 and i == cfg.warmup + cfg.active - 1:
            self._stop_capture()
        return {"max_gpu_mb": self.ops.max_memory_mb()}

    def _discard_iteration(self, i: int) -> None:
        self._close_iteration()

    def _stop_capture(self) -> None:
        if self._capturing:
            self.ops.synchronize()
            self.markers.profiler_stop()
            self._capturing = False

    def _finish(self) -> None:
        self._close_iteration()
        self._stop_capture()
