"""The ledger across the two-node cluster: a late rank on the other node is named, the clocks' alignment reported.

``Pi05Train`` with the stall policy (``tests/profiler/stall_policy.py:stalled``: rank 1's backward
busy-waits 200 ms every step, every rank's forward 40 ms) as one DDP rank per node of
``slurm_two_nodes``, custom profiler, per-rank files on. Two benchopt runs of the same cell, one
job each: the nodes' namespaces share one kernel, so the ranks' clocks are one CLOCK_MONOTONIC
(``shared``, alignment error 0); the second run's job has ``SCOPEBENCH_CLOCK_ALIGN=estimate``
(``sbatch`` hands the submitting environment to the job), so the ranks estimate their offset
over the bridge at start-up as on two machines, and report its error. Both find rank 1 late in
``bwd`` by about 200 ms; in each rank's own rows (its ``<run-name>_gpu_metrics.csv``: the
parquet holds the maximum over ranks) every region's work, wait for a peer and transfer add up
to its time. The environment differs per run, not per cell: benchopt takes only declared
solver parameters, and only the ``slurm_*`` ones reach the job's submission.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from .conftest import REPO, JobFolder
from .test_two_node_benchmarks import _run, assert_ranks_placed

pytestmark = pytest.mark.slow

STALL_POLICY = REPO / "tests" / "profiler" / "stall_policy.py"
DELAY_SEC = 0.2
#: Recorded iterations: ``max-runs`` 6 less the warm-up one.
RECORDED = 5
#: The two runs: the ranks' own clock alignment (one kernel), and the start-up estimate forced.
CLOCKS = ("shared", "estimate")
#: The alignment error the estimate may report over the bridge: ranks leave a barrier within
#: tens to hundreds of µs, a descheduled rank (the machine busy) some ms later.
MAX_ALIGN_ERROR_SEC = 0.020
#: The per-rank files of a ``Pi05Train`` run (``<run-name>_gpu_metrics.csv``, run name ``pi05_train_<id>_rank<r>``).
CSV_GLOB = "pi05_train_*_gpu_metrics.csv"


def _config() -> str:
    solver = {
        "policy": [f"{STALL_POLICY}:stalled"],
        "policy_args": [{"rank": 1, "delay_ms": DELAY_SEC * 1e3, "work_ms": 40}],
        "backend": "ddp",
        "profiler_mode": "custom",
        "profiler_warmup": 1,
        "profiler_save_file": True,
        "check_memory": False,
        "peak_tflops": 1.0,
        "nproc_per_node, slurm_nodes, slurm_ntasks_per_node": [[1, 2, 1]],
    }
    return yaml.safe_dump(
        {
            "dataset": ["synthetic_robot"],
            "solver": [{"Pi05Train": solver}],
            "max-runs": RECORDED + 1,
            "n-repetitions": 1,
        }
    )


def _rank_files(df: pd.DataFrame, added: set[Path]) -> dict[int, pd.DataFrame]:
    """The run's per-rank rows, by rank: of the per-rank files added, the one run (run id) whose
    slowest rank's ``bwd`` time is the parquet's in every recorded iteration (the parquet row at
    ``stop_val`` k: iteration k - 1). Matched by content, not by name: a test beside this one
    may write a ``pi05_train`` run of its own to ``outputs/``."""
    parquet = df.set_index("stop_val")["objective_bwd_time_sec"].dropna()
    found = []
    for stem in sorted({path.name.rsplit("_rank", 1)[0] for path in added}):
        paths = [REPO / "outputs" / f"{stem}_rank{rank}_gpu_metrics.csv" for rank in (0, 1)]
        if set(paths) <= added:
            ranks = {rank: pd.read_csv(path) for rank, path in enumerate(paths)}
            slowest = pd.concat(ranks.values()).groupby("iter")["bwd_time_sec"].max()
            slowest.index += 1
            if slowest.index.equals(parquet.index) and ((slowest - parquet).abs() < 1e-9).all():
                found.append(ranks)
    assert len(found) == 1, (sorted(added), parquet)
    return found[0]


@pytest.fixture(scope="module")
def runs(slurm_two_nodes, tmp_path_factory):
    """Per clock mode: (the parquet's rows, each rank's own rows by rank)."""
    outputs = REPO / "outputs"
    jobs = JobFolder(REPO)
    before = set(outputs.glob(CSV_GLOB))
    out = {}
    try:
        for clock in CLOCKS:
            # "" is the default (one kernel: shared), whatever the caller's environment says.
            env = {"SCOPEBENCH_CLOCK_ALIGN": "estimate" if clock == "estimate" else ""}
            df, folder = _run(slurm_two_nodes, tmp_path_factory.mktemp(clock), REPO, _config(), env=env)
            assert_ranks_placed(folder, [(2, 1)])
            df = df.sort_values("stop_val").reset_index(drop=True)
            out[clock] = df, _rank_files(df, set(outputs.glob(CSV_GLOB)) - before)
        yield out
    finally:
        jobs.cleanup()
        for path in set(outputs.glob(CSV_GLOB)) - before:
            path.unlink()


@pytest.mark.parametrize("clock", CLOCKS)
def test_the_stalled_rank_on_the_second_node_is_named_with_its_delay(runs, clock):
    df, _ = runs[clock]
    assert set(df["objective_world_size"]) == {2}
    recorded = df[df["objective_late_rank"].notna()]
    late = recorded.filter(like="late_rank").to_string()
    assert len(recorded) >= RECORDED - 1, late
    named = recorded[recorded["objective_late_rank"] == 1]
    assert len(named) >= 0.75 * len(recorded), late
    # What the diagnosis reads (late_rank_summary): the delay less each step's lateness from before it.
    from scopebench.report.ledger import late_rank_summary

    found = late_rank_summary(
        [{k.removeprefix("objective_"): v for k, v in r.items()} for r in recorded.to_dict("records")]
    )
    assert found is not None and found.rank == 1, late
    assert found.delay_sec == pytest.approx(DELAY_SEC, rel=0.25), late
    # Where its time went: its own work in bwd (the stall), not where the others met it.
    assert (named["objective_late_rank_region"] == "bwd").all(), late


def test_one_kernel_shares_its_clock_and_the_estimate_reports_its_error(runs):
    shared = runs["shared"][0]["objective_clock_align_error_sec"].dropna()
    estimate = runs["estimate"][0]["objective_clock_align_error_sec"].dropna()
    assert len(shared) >= RECORDED and len(estimate) >= RECORDED, (shared, estimate)
    assert set(shared) == {0.0}, shared
    # One estimate at start-up: every iteration reports the same error.
    assert len(set(estimate)) == 1 and 0.0 < estimate.iloc[0] < MAX_ALIGN_ERROR_SEC, estimate
    print(f"clock_align_error_sec across the two nodes (estimate): {estimate.iloc[0] * 1e6:.0f} µs")


@pytest.mark.parametrize("clock", CLOCKS)
def test_the_ledger_adds_up_to_each_region_on_each_rank(runs, clock):
    _, per_rank = runs[clock]
    for rank, rows in per_rank.items():
        assert set(rows["rank"]) == {rank} and len(rows) >= RECORDED, rows
        regions = [c[: -len("_work_sec")] for c in rows.columns if c.endswith("_work_sec")]
        assert {"forward", "bwd", "optim_step"} <= set(regions), regions
        for region in regions:
            parts = rows[[f"{region}_{k}" for k in ("work_sec", "comm_wait_peer_sec", "comm_transfer_sec")]].sum(axis=1)
            for i, (part, time) in enumerate(zip(parts, rows[f"{region}_time_sec"])):
                assert part == pytest.approx(time, rel=0.05, abs=1e-4), (clock, rank, region, i)
        # The stalled rank did the work in bwd; the other one waited for it there.
        waited = rows["bwd_comm_wait_peer_sec"].median()
        assert waited == (pytest.approx(DELAY_SEC, rel=0.25) if rank == 0 else pytest.approx(0, abs=0.05)), waited
