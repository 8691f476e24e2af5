"""Local spawn of real gloo workers: success, early death, late failure, teardown."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from scopebench.distributed import DistSession, broadcast_flag, gather_objects

pytestmark = pytest.mark.slow


def test_spawn_joins_group_and_tears_it_down(worker_path):
    with DistSession(2, worker="distributed.workers:sum_ranks") as info:
        assert (info.rank, info.world_size, info.source) == (0, 2, "spawn")
        value = torch.tensor([1.0])
        dist.all_reduce(value)
        assert value.item() == 3.0  # 1 (rank 0) + 2 (rank 1)
    assert not dist.is_initialized()


def test_worker_dead_before_joining_is_reported_fast(worker_path):
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"died before joining(.|\n)*cannot be imported \(on purpose\)"):
        DistSession(2, worker="distributed.broken_worker_module:anything", timeout_sec=60).start()
    # detection is bounded by the worker's own start-up (python + torch import), not the timeout
    assert time.monotonic() - start < 30
    assert not dist.is_initialized()


def test_worker_failing_after_join_fails_the_close(worker_path):
    session = DistSession(2, worker="distributed.workers:fail_after_join", timeout_sec=60)
    session.start()
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    with pytest.raises(RuntimeError, match="worker failed after the collective"):
        session.close()
    assert not dist.is_initialized()


def test_helpers_without_group_are_identity():
    assert broadcast_flag(True) is True
    assert gather_objects({"a": 1}) == [{"a": 1}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"nproc": 0}, "nproc must be a positive integer, got 0"),
        ({"nproc": 2}, "needs worker='module:function', got None"),
        ({"nproc": 2, "worker": "m:f", "worker_kwargs": {"t": torch.ones(1)}}, "JSON-serialisable"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        DistSession(**kwargs)


def test_nproc_disagreeing_with_launcher(monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match=r"nproc=2 disagrees with 1 node\(s\) x 4 task\(s\) per node \(torchrun\)"):
        DistSession(2)


def test_nproc_is_the_launchers_ranks_per_node(monkeypatch):
    """torchrun on 2 nodes x 2 ranks: nproc 2 (per node) or 1 (the launcher's) is accepted, 4 is not."""
    for key, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    assert DistSession(2).info.nodes == 2 and DistSession(1).info.world_size == 4
    with pytest.raises(ValueError, match="must be 2, or 1 for the launcher's ranks"):
        DistSession(4)


def test_local_nproc_above_the_cores_is_refused_with_the_numbers():
    import os

    from scopebench.distributed import check_local_nproc

    cores = os.cpu_count()
    assert check_local_nproc("nproc_per_node", cores) == cores
    with pytest.raises(ValueError, match=rf"nproc_per_node=255 exceeds the {cores} CPU cores"):
        check_local_nproc("nproc_per_node", 255)
    with pytest.raises(ValueError, match=r"nproc_per_node must be an integer >= 1, got 'two'"):
        check_local_nproc("nproc_per_node", "two")


def test_launcher_reports_name_the_node_of_each_rank_across_nodes(monkeypatch):
    """Across nodes a failed group names where each late rank runs (SLURM's node name, which
    differs between nodes even where their host names do not); on one node it adds nothing."""
    import torch.distributed as dist

    from scopebench.distributed.faults import launcher_reports

    store = dist.HashStore()
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    for rank, where in ((1, "node1"), (2, "node2"), (3, "node2")):
        store.set(f"pid/{rank}", f"{where} {999_999_000 + rank}")
        store.set(f"progress/{rank}", "4" if rank == 1 else "3")
    store.set("progress/0", "4")
    sentences = [r.sentence(30) for r in launcher_reports(store, 4) if r.culprit]
    assert len(sentences) == 3 and sentences[0].startswith("rank 1 on node node1 died"), sentences  # its pid is gone
    assert sentences[1].startswith("rank 2 on node node2 hangs or is too slow"), sentences
    assert sentences[2].startswith("rank 3 on node node2 hangs"), sentences
    one_node = dist.HashStore()
    one_node.set("pid/1", "node1 999999001")
    (report,) = launcher_reports(one_node, 2)
    assert report.node is None


#: Three groups one after the other in each rank of a torchrun job; rank 0 starts each new group
#: while rank 1 is still in the previous one (rank 1 leaves it half a second after rank 0's file
#: says rank 0 left), so rank 0's rendezvous finds rank 1's address of the group before.
SEQUENTIAL_GROUPS = """
import os, pathlib, sys, time
import torch, torch.distributed as dist
from scopebench.distributed.launch import DistSession

marks, rank = pathlib.Path(sys.argv[1]), int(os.environ["RANK"])
for k in range(3):
    with DistSession(2, device="cpu", timeout_sec=20):
        x = torch.ones(1)
        dist.all_reduce(x)
        assert x.item() == 2.0
        if rank == 1 and k < 2:
            while not (marks / str(k)).exists():
                time.sleep(0.01)
            time.sleep(0.5)
    if rank == 0:
        (marks / str(k)).touch()
(marks / f"done-{rank}").write_text(str(rank))
"""


@pytest.mark.slow
def test_groups_one_after_the_other_under_torchrun_each_meet_their_own_peers(tmp_path):
    """torchrun's agent hosts one store for the job: a second group of the same process read the
    first group's gloo addresses there and waited for peers that were gone (the validation
    benchmark's torchrun_detect.py hung at its second run). Each group now has its own prefix."""
    script = tmp_path / "groups.py"
    script.write_text(SEQUENTIAL_GROUPS)
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env={**env, "OMP_NUM_THREADS": "1"},
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    # Each rank says it got through all three groups in a file of its own: the ranks share the
    # job's stdout, where two prints can interleave mid-line ("groups donegroups done 0", CI).
    assert sorted(p.name for p in tmp_path.glob("done-*")) == ["done-0", "done-1"], proc.stdout[-3000:]
