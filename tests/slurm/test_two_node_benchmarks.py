"""Every benchmark across the two-node cluster, each against a one-node run of the same world size.

Three benchopt runs, one submission each; every run holds its own reference: next to the
cells that span both nodes, a cell of the same world size on one node (the two-node
cluster's nodes claim :data:`.cluster.MIN_NODE_CPUS` CPUs each, so one node takes 4 tasks,
and a run's jobs all start at once). Rank facts come from Submitit's own log line per task (``JobEnvironment(...
node=<n>(<nodes>), global_rank=<r>(<world>))``): every rank sees the job's world size and
rank 0 runs on the job's first node.

- ``Pi05Train`` (the policy benchmark): ``ddp`` and ``fsdp2`` on 2 nodes x 1 task and 2
  nodes x 2 tasks; the training loss of the first step and the held-out loss after it equal
  the one-node ``ddp`` run's of the same world size (1e-5 relative, fp32). ``hsdp`` on 2 nodes
  x 2 tasks (its mesh from the layout: 2 replica groups, one per node, of 2 shards) gives
  ``fsdp2``'s training and held-out losses of the same world size at every one of 5 steps.
- ``PnP`` with ``distribute_physics`` (``benchmark_inference``), through the Nsight wrapper
  ``configs/parallel/slurm_nsys.yml`` (nsys replaced by ``nsys_standin.py``): PSNR within
  1e-4 dB of the one-node run; one report name per rank, carrying node and rank.
- ``UnrolledPnP`` with ``distribute_model`` (``benchmark_training``): validation PSNR within
  1e-4 dB of the one-node run.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from scopebench.runs import run_benchopt

from .conftest import PARALLEL_CONFIGS, REPO, SUBMITIT_TIMING, JobFolder, cluster_parallel_config

#: ``alone``: 30 ranks in three runs, the CPU busy throughout; beside another test they take
#: a quarter longer (``make test`` runs them after the parallel tests).
pytestmark = [pytest.mark.slow, pytest.mark.alone]

_JOB_ENV = re.compile(
    r"JobEnvironment\(job_id=(\S+), hostname=\S+, local_rank=\d+\(\d+\), node=(\d+)\((\d+)\), global_rank=(\d+)\((\d+)\)\)"
)


def _run(cluster, tmp_path: Path, benchmark: Path, config: str, parallel: str = "slurm.yml", env=None):
    """One benchopt run on the cluster: (rows, the run's job folder)."""
    path = tmp_path / "run.yml"
    path.write_text(config)
    run = run_benchopt(
        benchmark,
        path,
        output=tmp_path / "run.parquet",
        extra_args=["--parallel-config", str(cluster_parallel_config(parallel, cluster, tmp_path))],
        env={**cluster.env, **(env or {})},
        timeout_sec=600,
        **SUBMITIT_TIMING,
    )
    return pd.read_parquet(run.parquet), run.job_folder


def rank_facts(folder: Path) -> dict[str, dict[int, tuple[int, int, int]]]:
    """Job id -> {global rank: (world size, node index, nodes)} from every task's log."""
    jobs: dict[str, dict[int, tuple[int, int, int]]] = {}
    for log in folder.glob("*_log.out"):
        for job, node, nodes, rank, world in _JOB_ENV.findall(log.read_text(errors="replace")):
            jobs.setdefault(job, {})[int(rank)] = (int(world), int(node), int(nodes))
    return jobs


def assert_ranks_placed(folder: Path, layouts: list[tuple[int, int]]) -> None:
    """One job per ``(nodes, tasks per node)``: every rank there, with the world size; rank 0 on node 0."""
    seen = sorted(
        (max(n for _, _, n in ranks.values()), len(ranks) // max(n for _, _, n in ranks.values()))
        for ranks in rank_facts(folder).values()
    )
    assert seen == sorted(layouts), (seen, layouts)
    for job, ranks in rank_facts(folder).items():
        world = len(ranks)
        assert sorted(ranks) == list(range(world)), (job, ranks)
        assert {w for w, _, _ in ranks.values()} == {world}, (job, ranks)
        assert ranks[0][1] == 0, f"job {job}: rank 0 on node {ranks[0][1]}, not the job's first node"
        nodes = ranks[0][2]
        per_node = world // nodes
        assert all(node == rank // per_node for rank, (_, node, _) in ranks.items()), (job, ranks)


def _cells(df: pd.DataFrame, **params) -> pd.DataFrame:
    """The rows of the cell whose solver parameters have these values (benchopt's ``p_solver_*`` columns)."""
    keep = pd.Series(True, index=df.index)
    for key, value in params.items():
        keep &= df[f"p_solver_{key}"].astype(str) == str(value)
    return df[keep]


#: The two-node cells of both backends, and one-node ``ddp`` references of the same world sizes:
#: ``ddp`` and ``fsdp2`` train to the same loss here (equal to the last digit on one node and on
#: two, measured), so one reference per world size checks both and saves two jobs (six ranks).
#: Each of the 22 ranks is a fresh process: ``check_memory: false`` and a stated ``peak_tflops``
#: skip the pre-launch memory estimate and the CPU peak's matmul sample (about 4 s of CPU a
#: rank, a third of its work), which neither the losses nor the placement depend on.
POLICY = """
dataset:
  - synthetic_robot
solver:
  - Pi05Train:
      preset: tiny
      find_unused_params: false
      profiler_warmup: 0
      check_memory: false
      peak_tflops: 1.0
      "backend, nproc_per_node, slurm_nodes, slurm_ntasks_per_node":
        - [ddp, 1, 2, 1]
        - [fsdp2, 1, 2, 1]
        - [ddp, 2, 2, 2]
        - [fsdp2, 2, 2, 2]
        - [hsdp, 2, 2, 2]
        - [ddp, 1, 1, 2]
        - [ddp, 1, 1, 4]
max-runs: 5
n-repetitions: 1
"""


def test_pi05_train_on_two_nodes_matches_one_node(slurm_two_nodes, tmp_path):
    jobs = JobFolder(REPO)
    try:
        df, folder = _run(slurm_two_nodes, tmp_path, REPO, POLICY)
        assert_ranks_placed(folder, [(2, 1), (2, 1), (2, 2), (2, 2), (2, 2), (1, 2), (1, 4)])
        loss = {}
        for backend, nodes, tasks in [(b, 2, t) for b in ("ddp", "fsdp2") for t in (1, 2)] + [
            ("ddp", 1, 2),
            ("ddp", 1, 4),
        ]:
            rows = _cells(df, backend=backend, slurm_nodes=nodes, slurm_ntasks_per_node=tasks)
            assert set(rows["objective_world_size"]) == {nodes * tasks}, rows
            # The first step's training loss (averaged over ranks) and the held-out loss after it.
            (after_one,) = rows[rows["stop_val"] == 1][["objective_train_loss", "objective_val_loss"]].values
            loss[backend, nodes, tasks] = after_one.tolist()
        for backend in ("ddp", "fsdp2"):
            for world in (2, 4):
                got, reference = loss[backend, 2, world // 2], loss["ddp", 1, world]
                for name, a, b in zip(("train_loss", "val_loss"), got, reference):
                    assert abs(a - b) <= 1e-5 * abs(b), (backend, world, name, got, reference)
        assert loss["ddp", 1, 2] != loss["ddp", 1, 4], loss  # the world size changes the step: the check can fail
        # HSDP against FSDP2 on the same 2 nodes x 2 ranks, step by step
        columns = ["stop_val", "objective_train_loss", "objective_val_loss"]
        steps = {
            b: _cells(df, backend=b, slurm_nodes=2, slurm_ntasks_per_node=2)[columns].sort_values("stop_val").values
            for b in ("fsdp2", "hsdp")
        }
        assert [row[0] for row in steps["hsdp"]] == [row[0] for row in steps["fsdp2"]] and len(steps["hsdp"]) >= 5
        assert len({row[1] for row in steps["fsdp2"][1:]}) > 1  # the loss moves: the check can fail
        for got, reference in zip(steps["hsdp"][1:], steps["fsdp2"][1:]):
            for a, b in zip(got[1:], reference[1:]):
                assert abs(a - b) <= 1e-5 * abs(b), ("hsdp", got, reference)
    finally:
        jobs.cleanup()


FRAMES = "multiframe_superres[image_size=32,num_operators=2,scale=2,noise_level=0.02,seed=0]"
PNP = f"""
dataset:
  - {FRAMES}
solver:
  - PnP:
      denoiser: tv
      denoiser_sigma: 0.01
      distribute_physics: true
      profiler_mode: nvidia
      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node":
        - [1, 2, 1]
        - [2, 1, 2]
max-runs: 3
n-repetitions: 1
"""


def _nsys_on_path(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "nsys_bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(f'#!/bin/sh\nexec {sys.executable} {Path(__file__).with_name("nsys_standin.py")} "$@"\n')
    nsys.chmod(0o755)
    return bin_dir


def test_pnp_on_two_nodes_under_nsys_matches_one_node(slurm_two_nodes, tmp_path, request):
    benchmark = REPO / "benchmark_inference"
    jobs = JobFolder(benchmark)
    reports = Path.cwd() / "outputs" / "nsys"  # slurm_setup creates it where benchopt runs from
    created = not reports.exists()
    request.addfinalizer(lambda: created and reports.is_dir() and not any(reports.iterdir()) and reports.rmdir())
    record = tmp_path / "nsys_calls"
    env = {"PATH": f"{_nsys_on_path(tmp_path)}:{slurm_two_nodes.env['PATH']}", "NSYS_STANDIN_RECORD": str(record)}
    try:
        df, folder = _run(slurm_two_nodes, tmp_path, benchmark, PNP, parallel="slurm_nsys.yml", env=env)
        assert_ranks_placed(folder, [(2, 1), (1, 2)])
        last = {}
        for nodes in (2, 1):
            rows = _cells(df, slurm_nodes=nodes).sort_values("stop_val")
            assert set(rows["objective_world_size"]) == {2} and rows["stop_val"].max() >= 3, rows
            last[nodes] = rows.iloc[-1]["objective_psnr"]
        assert abs(last[2] - last[1]) <= 1e-4, last
        # One nsys per rank, each report named by its job, node and rank: none shared.
        prefix = yaml.safe_load((PARALLEL_CONFIGS / "slurm_nsys.yml").read_text())["slurm_srun_args"]
        calls = [json.loads(p.read_text()) for p in record.glob("*.json")]
        assert len(calls) == 4 and len({c["report"] for c in calls}) == 4, calls
        for call in calls:
            assert ["nsys", *call["argv"]] == prefix + call["command"]
            env = call["env"]
            assert (
                call["report"]
                == f"outputs/nsys/{env['SLURM_JOB_ID']}_{env['SLURMD_NODENAME']}_rank{env['SLURM_PROCID']}"
            )
        two_nodes = sorted(
            (c["env"]["SLURMD_NODENAME"], c["env"]["SLURM_PROCID"])
            for c in calls
            if c["env"]["SLURMD_NODENAME"] == "sbslurm2" or c["env"]["SLURM_NTASKS"] == "2"
        )
        assert ("sbslurm2", "1") in two_nodes and ("sbslurm1", "0") in two_nodes, calls
    finally:
        jobs.cleanup()


UNROLLED = """
dataset:
  - synthetic[image_size=16,n_train=8,n_val=2]
objective:
  - unrolled_pnp_training[eval_every=2]
solver:
  - UnrolledPnP:
      batch_size: 4
      patch_size: 8
      overlap: 4
      distribute_model: true
      save_weights: false
      slurm_gres: null
      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node":
        - [1, 2, 1]
        - [2, 1, 2]
max-runs: 2
n-repetitions: 1
"""


def test_unrolled_pnp_on_two_nodes_matches_one_node(slurm_two_nodes, tmp_path):
    benchmark = REPO / "benchmark_training"
    jobs = JobFolder(benchmark)
    try:
        df, folder = _run(slurm_two_nodes, tmp_path, benchmark, UNROLLED)
        assert_ranks_placed(folder, [(2, 1), (1, 2)])
        psnr = {}
        for nodes in (2, 1):
            rows = _cells(df, slurm_nodes=nodes)
            (psnr[nodes],) = rows[rows["stop_val"] == 2]["objective_val_psnr"].tolist()
        assert abs(psnr[2] - psnr[1]) <= 1e-4, psnr
    finally:
        jobs.cleanup()
