"""Rank discovery from each launcher's environment."""

from __future__ import annotations

import pytest

from scopebench.distributed import get_dist_info


def test_single_process():
    info = get_dist_info({})
    assert (info.rank, info.world_size, info.source) == (0, 1, "single")
    assert not info.is_distributed


def test_torchrun():
    env = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "h0", "MASTER_PORT": "1234"}
    info = get_dist_info(env)
    assert (info.rank, info.local_rank, info.world_size, info.master_addr, info.master_port, info.source) == (
        3,
        1,
        8,
        "h0",
        1234,
        "torchrun",
    )


def test_slurm_multi_task():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_JOB_NODELIST": "gpu[010-013]",
        "SLURM_JOB_ID": "4242",
    }
    info = get_dist_info(env)
    assert (info.rank, info.local_rank, info.world_size, info.master_addr, info.source) == (5, 1, 8, "gpu010", "slurm")
    assert 20000 <= info.master_port < 40000
    assert get_dist_info(env).master_port == info.master_port  # every task derives the same port


def test_slurm_single_task_is_single():
    assert get_dist_info({"SLURM_PROCID": "0", "SLURM_NTASKS": "1"}).source == "single"


def test_torchrun_wins_over_slurm():
    env = {"RANK": "0", "WORLD_SIZE": "2", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}
    assert get_dist_info(env).source == "torchrun"


def test_bad_value_names_the_variable():
    with pytest.raises(ValueError, match="RANK must be an integer, got 'x'"):
        get_dist_info({"RANK": "x", "WORLD_SIZE": "2"})
