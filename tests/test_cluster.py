"""The cell layout every solver shares (:class:`scopebench.cluster.CellLayout`): one source for
the ``nproc_per_node`` and ``slurm_*`` parameters of the six solvers and their defaults.

(The SLURM cluster tests themselves are in ``tests/slurm/``.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from scopebench.cluster import SLURM_PARAMETERS, CellLayout
from scopebench.parameters import defaults
from scopebench.preflight import load_classes

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = (REPO, REPO / "benchmark_inference", REPO / "benchmark_training")


@pytest.fixture(scope="module")
def grids() -> dict[str, dict]:
    return {name: grid for bench in BENCHMARKS for name, grid in load_classes(bench).solvers.items()}


def test_every_solver_with_a_slurm_job_takes_its_layout_from_cell_layout(grids):
    layout = defaults(CellLayout)
    with_job = {name: grid for name, grid in grids.items() if any(k.startswith("slurm_") for k in grid)}
    # Pi05Inference runs one process: its job is the parallel config's alone
    assert set(with_job) == set(grids) - {"Pi05Inference"}, sorted(with_job)
    for name, grid in with_job.items():
        assert {k for k in grid if k.startswith("slurm_")} == set(SLURM_PARAMETERS), name
        theirs = {key: grid[key] for key in layout if key in grid}
        assert theirs == {key: [layout[key]] for key in theirs}, (name, theirs)


def test_a_cell_layout_is_read_back_from_solver_parameters():
    cell = CellLayout.from_params({"nproc_per_node": 2, "slurm_ntasks_per_node": 2, "batch_size": 4})
    assert cell == CellLayout(nproc_per_node=2, slurm_ntasks_per_node=2)
    assert cell.ranks().world_size == 2 and cell.ranks(launcher_world_size=2).world_size == 2


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"nproc_per_node": 0}, r"^nproc_per_node must be an integer >= 1, got 0$"),
        ({"slurm_nodes": "two"}, r"^slurm_nodes must be an integer >= 1, got 'two' \(str\)$"),
        ({"slurm_ntasks_per_node": 0}, r"^slurm_ntasks_per_node must be an integer >= 1, got 0$"),
        ({"slurm_gres": 4}, r"^slurm_gres must be a string such as 'gpu:4', got 4$"),
    ],
)
def test_a_cell_layout_refuses_a_bad_value_naming_its_key(fields, message):
    with pytest.raises(ValueError, match=message):
        CellLayout(**fields)
