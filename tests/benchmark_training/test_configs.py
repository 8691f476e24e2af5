"""Every run config of benchmark_training expands into runs the solver accepts."""

from __future__ import annotations

import types

import pytest
import yaml
from conftest import REPO

from scopebench.imaging.training import SOLVER_PARAMS, TrainingDataSpec, configs_from_params

BENCH = REPO / "benchmark_training"
CONFIGS = sorted((BENCH / "configs").rglob("*.yml"))


@pytest.fixture(scope="module")
def benchmark():
    from benchopt.benchmark import Benchmark

    return Benchmark(BENCH)


def expand(benchmark, config):
    from benchopt.benchmark import _list_parametrized_classes

    solvers = _list_parametrized_classes(*benchmark.check_solver_patterns(config["solver"]))
    datasets = _list_parametrized_classes(*benchmark.check_dataset_patterns(config["dataset"]))
    return [d for d, _ in datasets], [s for s, _ in solvers]


def test_the_named_configs_exist():
    names = {str(p.relative_to(BENCH / "configs")) for p in CONFIGS}
    assert {"quickstart.yml", "synthetic_unrolled.yml"} <= names
    for name in ("batch_size", "checkpointing", "comm_time", "strong_scaling", "weak_scaling"):
        assert f"experiments/{name}.yml" in names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(BENCH / "configs")))
def test_config_expands_into_valid_runs(benchmark, path):
    config = yaml.safe_load(path.read_text())
    assert config["n-repetitions"] >= 1 and config["max-runs"] >= 1
    datasets, solvers = expand(benchmark, config)
    assert datasets and solvers
    for dataset in datasets:
        spec = TrainingDataSpec(**{key: getattr(dataset, key) for key in type(dataset).parameters})
        for solver in solvers:
            solver.validate_profiler()
            configs_from_params(spec, **{key: getattr(solver, key) for key in SOLVER_PARAMS})
            data = types.SimpleNamespace(spec=spec)  # the cell check reads the training set's spec only
            # check_cell, not skip: skip also builds the run object, which checks this machine (its cores)
            cell = solver.cell_spec(data=data, data_params=spec.to_dict())
            assert solver.check_cell(solver.cell_params(), cell, None) is None, str(solver)


def test_scaling_grids_couple_ranks_with_the_distributed_model(benchmark):
    config = yaml.safe_load((BENCH / "configs" / "experiments" / "strong_scaling.yml").read_text())
    _, solvers = expand(benchmark, config)
    pairs = [(s.nproc_per_node, s.distribute_model, s.slurm_ntasks_per_node) for s in solvers]
    assert pairs == [(1, False, 1), (1, True, 1), (2, True, 2), (4, True, 4)]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(BENCH / "configs")))
def test_config_sets_a_timeout(path):
    # benchopt's default of 100 s counts set-up too: a config says what fits it.
    timeout = yaml.safe_load(path.read_text()).get("timeout")
    assert isinstance(timeout, int) and 60 <= timeout <= 4 * 3600, timeout
