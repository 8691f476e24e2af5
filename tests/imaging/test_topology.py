"""Layouts that cannot run are named before anything starts."""

from __future__ import annotations

import pytest

from scopebench.cluster import CellLayout, gres_gpu_count
from scopebench.imaging.inference.topology import check_topology, count_patches

IMAGE = (1, 3, 64, 64)


def check(nproc=1, physics=False, denoiser=False, operators=1, patch=None, overlap=8, launcher=None, **slurm):
    return check_topology(
        CellLayout(nproc_per_node=nproc, **slurm),
        distribute_physics=physics,
        distribute_denoiser=denoiser,
        num_operators=operators,
        signal_shape=IMAGE,
        patch_size=patch,
        overlap=overlap,
        launcher_world_size=launcher,
    )


def test_layouts_that_work():
    assert check() is None
    assert check(patch=32) is None
    assert check(nproc=2, physics=True, operators=4) is None
    assert check(nproc=2, denoiser=True, patch=32) is None
    assert check(nproc=4, denoiser=True, patch=16, slurm_gres="gpu:4", slurm_ntasks_per_node=4) is None
    # Two nodes of two tasks: world size 4, nproc_per_node the ranks per node (or 1: the job's tasks).
    for nproc in (1, 2):
        assert check(nproc=nproc, physics=True, operators=4, launcher=4, slurm_nodes=2, slurm_ntasks_per_node=2) is None


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"physics": True}, r"distribute_physics need\(s\) more than one process, got nproc_per_node=1"),
        ({"denoiser": True, "patch": 32}, r"distribute_denoiser need\(s\) more than one process"),
        ({"nproc": 2}, "nproc_per_node=2 .* without distribute_physics or distribute_denoiser"),
        ({"nproc": 2, "physics": True, "operators": 1}, "needs at least 2 operators, the problem has 1"),
        ({"nproc": 2, "denoiser": True}, "distribute_denoiser needs patch_size"),
        (
            {"nproc": 8, "denoiser": True, "patch": 32},
            r"needs at least 8 tiles; patch_size=32 cuts the signal \(64, 64\) into 4",
        ),
        ({"patch": 64}, "patch_size=64 must be smaller than the signal's side 64"),
        (
            {"nproc": 2, "denoiser": True, "patch": 16, "slurm_ntasks_per_node": 4},
            r"nproc_per_node=2 disagrees with 1 node\(s\) x 4 task\(s\) per node \(SLURM\)",
        ),
        (
            {"nproc": 2, "denoiser": True, "patch": 16, "slurm_gres": "gpu:4"},
            r"slurm_gres='gpu:4' gives 4 GPU\(s\) per node but 2 rank\(s\) per node",
        ),
        (
            {"nproc": 1, "denoiser": True, "patch": 16, "slurm_nodes": 2},
            "slurm_nodes=2 needs a SLURM or torchrun launch",
        ),
        (
            {"nproc": 2, "denoiser": True, "patch": 16, "launcher": 4},
            "the launcher started 4 processes but the cell's layout has 2 ranks",
        ),
    ],
)
def test_layouts_that_cannot_run_name_their_parameters(kwargs, match):
    reason = check(**kwargs)
    assert reason is not None
    assert pytest.importorskip("re").search(match, reason), reason


@pytest.mark.parametrize("kwargs", [{"nproc_per_node": 0}, {"slurm_nodes": "2"}, {"slurm_ntasks_per_node": -1}])
def test_invalid_values_raise(kwargs):
    with pytest.raises(ValueError, match="must be an integer >= 1"):
        CellLayout(**kwargs)


def test_helpers():
    assert count_patches((1, 1, 16, 16, 16), 8, 2) == 8
    assert gres_gpu_count("gpu:h100:8") == 8
    assert gres_gpu_count("shard:2") is None
