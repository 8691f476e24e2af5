"""Keep large freed blocks in the process instead of returning them to the kernel.

glibc serves allocations above ``M_MMAP_THRESHOLD`` (dynamic, at most 32 MiB by default)
with a fresh ``mmap`` and gives them back with ``munmap`` when freed, and it trims the
heap above ``M_TRIM_THRESHOLD``. A convolution or a matmul on large activations then
maps, faults in page by page, and unmaps the same temporaries on every pass: the kernel's
page-fault handling, not the arithmetic, sets the speed (issue 13; measured in
``benchmarks/inference_overhead.py``). Raising both thresholds once per process keeps
those blocks in the heap for reuse.

The same effect is reached with the environment variables ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` at process start; :func:`keep_freed_memory` applies it to a
process already running (the benchopt process) through ``mallopt``, and
:func:`allocator_env` gives the variables for processes we start (spawned ranks).
Both are no-ops off glibc.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "allocator_env", "keep_freed_memory"]

#: Blocks below this size come from the heap (glibc's ceiling for the dynamic threshold
#: is 32 MiB on 64-bit; 64 MiB covers a DnCNN activation of a 1024 px image in fp32).
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
#: Free memory at the top of the heap is returned to the kernel only above this size.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

_applied: bool | None = None


def allocator_env() -> dict[str, str]:
    """Environment variables that give a new process the same allocator settings."""
    return {
        "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD_BYTES),
        "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD_BYTES),
    }


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds in this process (once; later calls are free).

    Returns:
        Whether the settings are in force (False off Linux/glibc).
    """
    global _applied
    if _applied is not None:
        return _applied
    _applied = False
    if not sys.platform.startswith("linux"):
        return _applied
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and others have no mallopt
        return _applied
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    return _applied
