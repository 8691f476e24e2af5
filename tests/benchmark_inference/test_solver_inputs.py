"""The inference solvers refuse, in ``set_objective`` and before any work, what could not run."""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmark_inference"
SPEC = {"kind": "simulated", "image_size": 32}


@pytest.fixture(scope="module")
def solvers():
    from benchopt.benchmark import Benchmark

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {s.name: s for s in Benchmark(BENCH).get_solvers()}


@pytest.mark.parametrize("name", ["PnP", "Denoiser"])
@pytest.mark.parametrize(
    "params, message",
    [
        ({"overlap": 16, "patch_size": 16}, "^overlap=16 must be smaller than patch_size=16"),
        ({"group_timeout_sec": -1}, "^group_timeout_sec must be a finite number > 0, got -1$"),
        (
            {"nproc_per_node": 255, "distribute_denoiser": True, "patch_size": 8, "overlap": 2},
            rf"^nproc_per_node=255 exceeds the {os.cpu_count()} CPU cores of this machine",
        ),
    ],
)
def test_bad_values_stop_in_set_objective_naming_the_key(solvers, name, params, message):
    solver = solvers[name].get_instance(**params)
    with pytest.raises(ValueError, match=message):
        solver.set_objective(spec=SPEC)
    assert not hasattr(solver, "pnp")


@pytest.mark.parametrize("name", ["PnP", "Denoiser"])
def test_unwritable_outputs_are_refused_before_any_work(solvers, name, read_only_dir):
    solver = solvers[name].get_instance(profiler_save_file=True)
    solver.output_dir = read_only_dir
    with pytest.raises(ValueError, match=f"^profiler_save_file={str(read_only_dir)!r} is not a writable directory"):
        solver.set_objective(spec=SPEC)
    assert not hasattr(solver, "pnp")


def test_the_grid_is_declared_in_each_solver_file(solvers):
    # A reader finds every parameter of a solver in its own file (issue: thin files with
    # their grid visible), the shared profiler_* ones merged from the mixin.
    for name, solver in solvers.items():
        text = (BENCH / "solvers" / f"{name.lower()}.py").read_text()
        own = [key for key in solver.parameters if not key.startswith("profiler_")]
        assert all(f'"{key}":' in text for key in own), name
