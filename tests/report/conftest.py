"""Fixtures of the report tests: real quickstart results of the three benchmarks, run once."""

from __future__ import annotations

import time

import pytest
from conftest import REPO

from scopebench.runs import run_benchopt

BENCHMARKS = {"policy": REPO, "inference": REPO / "benchmark_inference", "training": REPO / "benchmark_training"}


@pytest.fixture(scope="session")
def quickstarts(tmp_path_factory):
    """Benchmark key -> parquet of its quickstart (``configs/quickstart.yml``), through run_benchopt."""
    start = time.time()
    folder = tmp_path_factory.mktemp("quickstarts")
    out = {}
    for key, bench in BENCHMARKS.items():
        run = run_benchopt(bench, bench / "configs" / "quickstart.yml", output=folder / f"{key}.parquet",
                           env={"OMP_NUM_THREADS": "1"})  # fmt: skip
        out[key] = run.parquet
    yield out
    for path in (REPO / "benchmark_training" / "outputs").glob("unrolled_pnp_*_denoiser.safetensors"):
        if path.stat().st_mtime >= start:
            path.unlink(missing_ok=True)
