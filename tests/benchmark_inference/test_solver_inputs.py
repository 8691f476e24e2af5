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


def test_every_reconstruction_field_reaches_the_config():
    # CONFIG_KEYS listed ReconstructionConfig's 14 fields by hand; a 15th would have been dropped.
    from scopebench.imaging.inference.engine import ReconstructionConfig
    from scopebench.imaging.inference.solver import CONFIG_KEYS
    from scopebench.parameters import defaults

    assert CONFIG_KEYS == tuple(defaults(ReconstructionConfig))


@pytest.mark.parametrize("name", ["PnP", "Denoiser"])
def test_the_grid_holds_the_librarys_defaults(solvers, name):
    # One source (issue 34): the solvers' grids come from ReconstructionConfig and CellLayout,
    # so benchopt run, the library, the tools and the scripts run the same defaults.
    from scopebench.cluster import CellLayout
    from scopebench.imaging.inference.engine import PNP_ONLY, ReconstructionConfig
    from scopebench.parameters import defaults

    grid = solvers[name].parameters
    library = {**defaults(ReconstructionConfig), **defaults(CellLayout)}
    own = {key for key in grid if not key.startswith("profiler_")} - {"group_timeout_sec"}
    expected = set(library) - (set(PNP_ONLY) if name == "Denoiser" else set())
    assert own == expected
    assert all(grid[key] == [library[key]] for key in own), name


@pytest.mark.parametrize("name", ["PnP", "Denoiser"])
def test_denoiser_sigma_in_force_is_the_same_everywhere(solvers, name):
    # benchopt run used 0.01 and the library 0.05 until issue 34; 0.01 suits the 2-D
    # problems' noise (docs/benchmark-inference.md, "Defaults").
    from scopebench.imaging.common.denoisers import DenoiserConfig
    from scopebench.imaging.inference.engine import ReconstructionConfig

    assert solvers[name].parameters["denoiser_sigma"] == [0.01]
    assert ReconstructionConfig().denoiser_sigma == DenoiserConfig().sigma == 0.01
    assert solvers[name].get_instance().reconstruction_config() == ReconstructionConfig()


def test_a_finished_cell_lets_its_run_go_when_the_next_cell_starts(solvers):
    """benchopt keeps every solver instance of its grid until it exits: a finished cell's run
    object (its model, files, process groups; on a GPU, its memory) must not stay with it. It
    stays readable for benchopt's last ``get_result``, and goes at the next cell's ``skip``."""
    import weakref

    def cell(solver):  # benchopt's order (benchopt.runner.run_one_to_cvg)
        assert solver.skip(spec=SPEC) == (False, None)
        solver.set_objective(spec=SPEC)
        solver.pre_run_hook(2)
        calls = iter([True, True, False])
        solver.run(lambda: next(calls))
        return solver.get_result()

    first, second = solvers["PnP"].get_instance(), solvers["PnP"].get_instance(denoiser_sigma=0.02)
    assert "x" in cell(first) and first.get_result()["x"] is not None  # readable after its run
    finished = weakref.ref(first.run_object)
    assert second.skip(spec=SPEC) == (False, None)
    assert first.run_object is None and finished() is None  # dropped, and freed
    assert "x" in cell(second)
