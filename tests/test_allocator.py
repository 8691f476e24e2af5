"""Allocator settings: applied once in-process, and handed to processes we start."""

from __future__ import annotations

import subprocess
import sys

from scopebench.allocator import MMAP_THRESHOLD_BYTES, allocator_env, keep_freed_memory


def test_keep_freed_memory_applies_on_linux_glibc():
    assert keep_freed_memory() is (sys.platform.startswith("linux"))
    assert keep_freed_memory() is keep_freed_memory()  # idempotent


def test_allocator_env_matches_thresholds():
    env = allocator_env()
    assert env["MALLOC_MMAP_THRESHOLD_"] == str(MMAP_THRESHOLD_BYTES)


def test_large_blocks_are_reused_instead_of_mapped_again():
    # Allocate, touch and free a 48 MiB buffer 20 times in a fresh process. glibc's dynamic
    # threshold stops at 32 MiB, so by default every round maps and faults in new pages;
    # with the settings the block stays in the heap and later rounds fault in none.
    code = (
        "import resource, sys, numpy as np\n"
        "from scopebench.allocator import keep_freed_memory\n"
        "if sys.argv[1] == '1': keep_freed_memory()\n"
        "def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "np.ones(48 * 2**20 // 8); start = faults()\n"
        "for _ in range(20): np.ones(48 * 2**20 // 8)\n"
        "print(faults() - start)\n"
    )
    counts = {}
    for on in ("0", "1"):
        out = subprocess.run([sys.executable, "-c", code, on], capture_output=True, text=True, check=True)
        counts[on] = int(out.stdout)
    # 20 x 48 MiB of 4 KiB pages is ~250k faults (fewer with huge pages) when every round maps afresh.
    assert counts["1"] < counts["0"] / 10, counts
