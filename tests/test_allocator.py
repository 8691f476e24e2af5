"""Allocator settings: applied once in-process, and handed to processes we start."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from scopebench.allocator import MMAP_THRESHOLD_BYTES, allocator_env, keep_freed_memory

REPO = Path(__file__).resolve().parents[1]


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


def test_disable_env_turns_the_settings_off():
    code = (
        "from scopebench.allocator import allocator_env, keep_freed_memory; print(keep_freed_memory(), allocator_env())"
    )
    env = dict(os.environ, SCOPEBENCH_KEEP_FREED_MEMORY="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "False {}"


@pytest.mark.slow
def test_denoiser_inside_benchopt_keeps_its_memory(tmp_path):
    """A real ``benchopt run``: the solver's own mallopt call (set_objective) must reach the
    Denoiser's passes. DnCNN on a 128 px image frees and reallocates 4 MiB activations at
    the top of the heap: with glibc's defaults the heap is trimmed and regrown every pass,
    faulting in ~27 000 fresh pages (the control run); with the settings, none after the
    first passes."""
    import pandas as pd
    import yaml

    from scopebench.runs import run_benchopt

    solver = {"denoiser": "dncnn", "pretrained": "none", "profiler_mode": "custom", "profiler_warmup": 2}
    config = {
        "dataset": ["simulated[image_size=128,operator=blur,noise_level=0.03]"],
        "solver": [{"Denoiser": solver}],
        "max-runs": 6,
        "n-repetitions": 1,
    }
    path = tmp_path / "denoiser.yml"
    path.write_text(yaml.safe_dump(config))
    faults, passes = {}, {}
    for setting in ("1", "0"):
        run = run_benchopt(
            REPO / "benchmark_inference",
            path,
            output=tmp_path / f"run{setting}.parquet",
            env={"OMP_NUM_THREADS": "1", "SCOPEBENCH_KEEP_FREED_MEMORY": setting},
        )
        column = pd.read_parquet(run.parquet)["objective_minor_faults_count"].dropna()
        assert len(column) >= 3, column
        faults[setting] = float(column.median())
        passes[setting] = list(column)  # every pass's faults, for the message
    # One 4 MiB activation is 1024 pages. The control faults more than that on a pass (glibc's
    # defaults trim and regrow the heap: ~27 000 here, 2 900 in the one CI run whose heap mostly
    # stayed); with the settings a pass faults less than one activation's pages (0-3 here, 432 in
    # that run): settings that do not reach the passes fault ~26 000 on every one.
    one_activation = 4 * 1024 * 1024 // resource.getpagesize()
    assert faults["0"] > one_activation, (faults, passes)
    assert faults["1"] < one_activation, (faults, passes)


def test_run_objects_apply_the_settings_when_they_start():
    """Every driver of a run object gets them (perf/policy_speed.py drives the policy run
    objects directly, without the solver or the command line that apply them too); all
    four run objects start through RankRun.start."""
    code = (
        "from scopebench import allocator\n"
        "from scopebench.harness.run import RankRun\n"
        "class Run(RankRun):\n"
        "    def step(self, profiler): pass\n"
        "before = allocator._applied\n"
        "with Run(): print(before, allocator._applied)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"None {sys.platform.startswith('linux')}", out.stderr
