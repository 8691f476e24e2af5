"""Every run config names real datasets/solvers and valid values (expanded as benchopt does)."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import yaml

BENCH = Path(__file__).resolve().parents[2] / "benchmark_inference"
CONFIGS = sorted((BENCH / "configs").rglob("*.yml"))


def test_expected_configs_exist():
    names = {str(p.relative_to(BENCH / "configs")) for p in CONFIGS}
    assert {
        "quickstart.yml",
        "examples/simulated.yml",
        "examples/multiframe_superres.yml",
        "examples/tomography_2d.yml",
        "examples/denoising_3d.yml",
        "experiments/strong_scaling.yml",
        "experiments/denoiser_compile.yml",
        "experiments/reconstruction_quality.yml",
        "experiments/comm_inference.yml",
    } <= names
    # config.yml is BenchOpt's settings file: the dashboard's saved views only, never a run config.
    assert set(yaml.safe_load((BENCH / "config.yml").read_text())) == {"plot_configs"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(BENCH)))
def test_config_expands_to_valid_runs(path):
    from benchopt.benchmark import Benchmark, _list_parametrized_classes

    config = yaml.safe_load(path.read_text())
    bench = Benchmark(BENCH)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        solvers = [s for s, _ in _list_parametrized_classes(*bench.check_solver_patterns(config["solver"]))]
        datasets = [d for d, _ in _list_parametrized_classes(*bench.check_dataset_patterns(config["dataset"]))]
    assert solvers and datasets
    for solver in solvers:
        solver.reconstruction_config()  # ValueError on an invalid value
        solver.validate_profiler()
        solver.cell_layout()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(BENCH)))
def test_config_sets_a_timeout(path):
    # benchopt's default of 100 s counts set-up too: a config says what fits it.
    timeout = yaml.safe_load(path.read_text()).get("timeout")
    assert isinstance(timeout, int) and 60 <= timeout <= 4 * 3600, timeout
