"""Keep large freed blocks in the process instead of returning them to the kernel.

glibc serves allocations above ``M_MMAP_THRESHOLD`` with a fresh ``mmap`` and gives them
back with ``munmap`` when freed, and it returns the free top of the heap to the kernel
(``brk``) once it exceeds ``M_TRIM_THRESHOLD``. Both thresholds start small (128 KiB) and
only grow as large mapped blocks are freed (the mmap threshold at most to 32 MiB). A
convolution network frees and reallocates its activations on every pass — DnCNN on a
128 px image, 4 MiB each — so the heap shrinks and grows again (or the blocks are mapped
afresh) every pass, and each new page costs a minor fault: about 25 000 faults and a
fifth to a quarter of the pass's time here (issue 13; ``perf/inference_overhead.py --case
denoiser``). Raising both thresholds once per process keeps those blocks for reuse.
Raising only one does not help: setting either turns off glibc's dynamic adjustment of
both (measured: trim only, 59 000 faults per pass; mmap only, 26 000; both, none).

The same effect is reached with the environment variables ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` at process start; :func:`keep_freed_memory` applies it to a
process already running (the benchopt process) through ``mallopt``, and
:func:`allocator_env` gives the variables for processes we start (spawned ranks).
Both are no-ops off glibc. ``SCOPEBENCH_KEEP_FREED_MEMORY=0`` in the environment turns
them off (for A/B measurements of the allocator's effect, e.g.
``perf/inference_overhead.py --case denoiser --allocator-ab``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["DISABLE_ENV", "MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "allocator_env", "keep_freed_memory"]

#: Blocks below this size come from the heap (glibc's ceiling for the dynamic threshold
#: is 32 MiB on 64-bit; 64 MiB covers a DnCNN activation of a 1024 px image in fp32).
MMAP_THRESHOLD_BYTES = 64 * 1024 * 1024
#: Free memory at the top of the heap is returned to the kernel only above this size.
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Environment variable that turns the settings off when set to ``0``
#: (:data:`scopebench.environment.SETTINGS`: a value other than 1 / 0 is refused).
DISABLE_ENV = "SCOPEBENCH_KEEP_FREED_MEMORY"

_applied: bool | None = None


def _disabled() -> bool:
    from scopebench.environment import env_setting

    return not env_setting(DISABLE_ENV)  # 0 / false / no / off; anything unknown is refused


def allocator_env() -> dict[str, str]:
    """Environment variables that give a new process the same allocator settings
    (none when :data:`DISABLE_ENV` is ``0``)."""
    if _disabled():
        return {}
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
    if _disabled() or not sys.platform.startswith("linux"):
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
