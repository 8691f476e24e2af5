"""Peak FLOP/s of the device a rank computes on: the denominator of MFU.

Three sources, in order:

* ``override``: a ``peak_tflops`` the user gives (per device);
* ``table:<device name>`` on CUDA: dense (no sparsity) peaks from NVIDIA's datasheets,
  bf16 tensor-core for ``bf16`` runs and plain fp32 for ``fp32`` runs (torch does not use
  TF32 for fp32 matmuls by default);
* ``measured_cpu_matmul`` on the CPU: the best rate of a large matmul in the run's dtype
  (on the run's threads, or the one-thread rate times the threads if higher), measured
  once per process and thread count, so the figure says how close the model gets to what
  this CPU does with the threads it has.

An unknown CUDA device has no peak (``None``): MFU is then absent, never a guess.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

__all__ = [
    "CUDA_PEAK_TFLOPS",
    "PeakFlops",
    "measure_cpu_matmul_flops",
    "peak_flops",
    "sample_cpu_peak",
    "sustained_cpu_matmul_flops",
]

#: Dense peak TFLOP/s by CUDA device-name fragment: ``(bf16 tensor core, fp32)``; ``None``
#: where the datasheet gives no dense figure. Longer fragments are matched first.
#: Sources: NVIDIA datasheets — A100 (nvidia-a100-datasheet-us-nvidia-1758950-r4),
#: H100 and H200 (nvidia.com/en-us/data-center/h100/, /h200/; "specifications are one-half
#: lower without sparsity"), B200 (nvidia.com/en-us/data-center/hgx/, HGX B200 per GPU),
#: L40S (nvidia-l40s-datasheet), L4 (nvidia-l4-datasheet), A10 (nvidia-a10-datasheet).
CUDA_PEAK_TFLOPS: dict[str, tuple[float | None, float | None]] = {
    "H100 NVL": (835.0, 60.0),
    "H100 PCIe": (756.0, 51.0),
    "H100": (989.0, 67.0),
    "H200": (989.0, 67.0),
    "B200": (2250.0, None),
    "A100": (312.0, 19.5),
    "L40S": (362.0, 91.6),
    "L4": (121.0, 30.3),
    "A10": (125.0, 31.2),
}


@dataclass(frozen=True)
class PeakFlops:
    """Peak FLOP/s of one device and where the number comes from."""

    flops_per_sec: float | None
    """Peak rate of one device (None: unknown)."""
    source: str | None
    """``measured_cpu_matmul``, ``table:<device name>``, ``override``, or None when unknown."""


def _operands(size: int, dtype):
    """Two random ``size x size`` matrices from a generator of their own: a measurement must not
    draw from the global RNG, or a run's losses would depend on whether the (cached) peak was
    measured earlier in the process (the first training run in a process differed from the next)."""
    import torch

    generator = torch.Generator().manual_seed(0)
    return (torch.randn(size, size, generator=generator).to(dtype) for _ in range(2))


def measure_cpu_matmul_flops(dtype_name: str = "float32", size: int = 2048, repeats: int = 6) -> float:
    """Best FLOP/s of a ``size x size`` matmul (``2 size^3`` FLOPs) on this process's threads.

    The best of several repeats: on a shared machine a single sample can land on a moment
    another process holds a core, and a low peak would inflate MFU.
    """
    import torch

    dtype = getattr(torch, dtype_name)
    a, b = _operands(size, dtype)
    for _ in range(2):  # BLAS picks its kernels and the threads wake up
        a @ b
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def sustained_cpu_matmul_flops(seconds: float, dtype_name: str = "float32", size: int = 2048) -> float:
    """Mean FLOP/s of back-to-back ``size x size`` matmuls for at least ``seconds`` (two at least).

    The rate the CPU keeps up over a period as long as a training step, where
    :func:`measure_cpu_matmul_flops` keeps the best of short bursts: on a shared machine, or
    one that lowers its clock under sustained vector load, the two differ (here a loop of
    nothing but these matmuls ran at 0.5-0.8 of the burst figure). Measured next to a
    step, over the same length of time, it says how close the step gets to pure matmul
    under the same conditions.
    """
    import torch

    if not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    dtype = getattr(torch, dtype_name)
    a, b = _operands(size, dtype)
    a @ b  # BLAS picks its kernels and the threads wake up
    count, start = 0, time.perf_counter()
    while count < 2 or time.perf_counter() - start < seconds:
        a @ b
        count += 1
    return count * 2 * size**3 / (time.perf_counter() - start)


def sample_cpu_peak(dtype_name: str = "float32") -> float:
    """One sample of the CPU peak: the higher of the matmul rate on torch's ``threads``
    threads and ``threads`` x the one-thread rate.

    A large matmul scales linearly with cores (86.7 -> 172 GFLOP/s from one to two
    threads here), and the one-thread sample needs only one idle core: on a shared machine
    the multi-thread sample alone can come out low and inflate MFU; this never deflates the
    peak. :func:`peak_flops` takes one sample per process and thread count;
    ``perf/policy_speed.py`` takes one per round.
    """
    import torch

    threads = torch.get_num_threads()
    best = measure_cpu_matmul_flops(dtype_name)
    if threads > 1:
        torch.set_num_threads(1)
        try:
            best = max(best, threads * measure_cpu_matmul_flops(dtype_name))
        finally:
            torch.set_num_threads(threads)
    return best


@functools.lru_cache(maxsize=8)
def _cpu_peak(dtype_name: str, threads: int) -> float:
    """:func:`sample_cpu_peak`, once per process, dtype and thread count (``threads`` is
    torch's current count: the cache key)."""
    return sample_cpu_peak(dtype_name)


def peak_flops(device, precision: str = "fp32", override_tflops: float | None = None) -> PeakFlops:
    """Peak FLOP/s of ``device`` for ``precision`` (``fp32`` or ``bf16``).

    :Examples:

    >>> peak_flops("cpu", override_tflops=1.5)
    PeakFlops(flops_per_sec=1500000000000.0, source='override')
    """
    import torch

    if override_tflops is not None:
        return PeakFlops(float(override_tflops) * 1e12, "override")
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment in sorted(CUDA_PEAK_TFLOPS, key=len, reverse=True):
            if fragment in name:
                tflops = CUDA_PEAK_TFLOPS[fragment][0 if precision == "bf16" else 1]
                return PeakFlops(None if tflops is None else tflops * 1e12, None if tflops is None else f"table:{name}")
        return PeakFlops(None, None)
    dtype = "bfloat16" if precision == "bf16" else "float32"
    return PeakFlops(_cpu_peak(dtype, torch.get_num_threads()), "measured_cpu_matmul")
