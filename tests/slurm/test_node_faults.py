"""A node lost mid-run on the two-node cluster: cut off (its link down) or dead (slurmd and processes killed).

One ``PnP`` cell (``distribute_physics``) on 2 nodes x 1 task, rank 0 on ``sbslurm1`` and
rank 1 on ``sbslurm2``, with a short ``group_timeout_sec``. The fault comes once both ranks
have marked an iteration as done in the rendezvous store (``progress/<rank>``, read here
over the bridge), never after a sleep. Then:

- the run (``run_benchopt``) fails, naming the node and its rank; a cut-off node within
  ``group_timeout_sec`` + :data:`CUT_MARGIN_SEC`, a dead one once SLURM declares it DOWN
  (``SlurmdTimeout``, :data:`DEAD_SLURMD_TIMEOUT_SEC` here, + :data:`DEAD_MARGIN_SEC`, which
  holds SLURM's ``MessageTimeout``), with SLURM's state of the job
  (``scontrol show job``: ``NODE_FAIL``) in the error;
- the iterations that were recorded are kept, in profiler files named ``_partial``;
- nothing of the job is left: on the first node at once (the run cancels its job, which a
  cut-off node's ``srun`` would otherwise hold), on a cut-off node once its ranks' own group
  timeout ends them and, for SLURM's step daemon, once the link is back.

The margins are measured here and explained in docs/cluster.md (section 7).
"""

from __future__ import annotations

import contextlib
import datetime
import socket
import threading
import time
from pathlib import Path

import pytest

from scopebench.distributed.faults import read_progress
from scopebench.distributed.info import get_dist_info
from scopebench.distributed.launch import NOTE_WAIT_SEC
from scopebench.runs import STATE_CHECK_MIN_SEC, run_benchopt

from .cluster import local_slurm
from .conftest import REPO, SUBMITIT_TIMING, JobFolder, cluster_parallel_config

#: ``alone``: their bounds are SLURM's and the ranks' timeouts plus margins measured on this
#: machine, under two CPU hogs at most; ``make test`` runs them after the parallel tests.
pytestmark = [pytest.mark.slow, pytest.mark.alone]

BENCHMARK = REPO / "benchmark_inference"
#: The ranks' group timeout: long enough for two ranks starting on a loaded machine to meet.
GROUP_TIMEOUT_SEC = 15.0
#: A cut-off node: after rank 0's group timeout, its wait for notes (NOTE_WAIT_SEC), its
#: exit, Submitit's collection (1 s here, benchopt's own 10 s) and benchopt's end.
CUT_MARGIN_SEC = NOTE_WAIT_SEC + 25.0
#: ``SlurmdTimeout`` and ``MessageTimeout`` of the dead-node test's own cluster (the other
#: tests' are 45 s and SLURM's 10 s, see :data:`.cluster.SLURMD_TIMEOUT_SEC`): with a dead node
#: nothing races SLURM's verdict (the first node's ranks fail at once). SLURM declares a dead
#: node DOWN about SlurmdTimeout + 2 x MessageTimeout after its last answer (measured on
#: this cluster: 16 s with these, 30 s with 10 s and SLURM's MessageTimeout, 29 s with 20 s).
DEAD_SLURMD_TIMEOUT_SEC = 10
DEAD_MESSAGE_TIMEOUT_SEC = 5
#: A dead node: SLURM declares it DOWN (above) up to one ping interval (SlurmdTimeout / 3)
#: late, then the job ends (NODE_FAIL); Submitit sees that within its state check
#: (STATE_CHECK_MIN_SEC here) and benchopt's collection follows.
DEAD_MARGIN_SEC = 2 * DEAD_MESSAGE_TIMEOUT_SEC + DEAD_SLURMD_TIMEOUT_SEC / 3 + STATE_CHECK_MIN_SEC + 20.0
CELL = f"""
dataset:
  - multiframe_superres[image_size=32,num_operators=2,scale=2,noise_level=0.02,seed=0]
solver:
  - PnP:
      denoiser: tv
      denoiser_sigma: 0.01
      distribute_physics: true
      profiler_save_file: true
      group_timeout_sec: {GROUP_TIMEOUT_SEC}
      "nproc_per_node, slurm_nodes, slurm_ntasks_per_node": [[1, 2, 1]]
max-runs: 1000000
timeout: 100000
n-repetitions: 1
"""


class Run:
    """A ``run_benchopt`` of :data:`CELL` in a thread; its error and when it ended."""

    def __init__(self, cluster, tmp_path: Path) -> None:
        config = tmp_path / "fault.yml"
        config.write_text(CELL)
        self.error: BaseException | None = None
        self.ended: float | None = None
        self.thread = threading.Thread(
            target=self._run, args=(cluster, config, cluster_parallel_config("slurm.yml", cluster, tmp_path))
        )
        self.thread.start()

    def _run(self, cluster, config: Path, parallel: Path) -> None:
        try:
            run_benchopt(
                BENCHMARK,
                config,
                output=config.with_suffix(".parquet"),
                extra_args=["--parallel-config", str(parallel)],
                env=cluster.env,
                timeout_sec=600,
                **SUBMITIT_TIMING,
            )
        except BaseException as err:  # noqa: BLE001 - handed to the test
            self.error = err
        self.ended = time.monotonic()

    def wait(self, bound_sec: float) -> None:
        self.thread.join(bound_sec)
        assert not self.thread.is_alive(), f"the run did not end within {bound_sec:.0f} s of the fault"


def wait_for_progress(cluster, jobs: JobFolder, iteration: int, bound_sec: float = 600.0) -> None:
    """Until both ranks marked ``iteration`` done in rank 0's store (on the first node, over the bridge)."""
    import torch.distributed as dist

    deadline = time.monotonic() + bound_sec
    while not jobs.job_ids():
        assert time.monotonic() < deadline, "no job submitted"
        time.sleep(0.2)
    (job,) = jobs.job_ids()
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": cluster.host}
    rendezvous = (cluster.nodes[0].addr, get_dist_info(env).master_port)  # the ranks' own derivation
    store, progress = None, {}
    while len(progress) < 2 or min(progress.values()) < iteration:
        assert time.monotonic() < deadline, f"the ranks did not reach iteration {iteration}:\n{jobs.logs()}"
        if store is None and _listening(*rendezvous):
            timeout = datetime.timedelta(seconds=10)
            store = dist.TCPStore(*rendezvous, is_master=False, wait_for_workers=False, timeout=timeout)
        time.sleep(0.2)
        progress = read_progress(store, 2) if store is not None else {}


def _listening(host: str, port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=1):
        return True
    return False


def wait_until(predicate, bound_sec: float, what: str):
    deadline = time.monotonic() + bound_sec
    while not (value := predicate()):
        assert time.monotonic() < deadline, what
        time.sleep(0.2)
    return value


def partial_files(outputs_before: set[Path]) -> list[Path]:
    outputs = BENCHMARK / "outputs"
    return sorted(p for p in set(outputs.iterdir()) - outputs_before if p.name.startswith("pnp_"))


@pytest.fixture
def outputs():
    folder = BENCHMARK / "outputs"
    before = set(folder.iterdir())
    yield before
    for path in set(folder.iterdir()) - before:
        if path.name.startswith("pnp_"):
            path.unlink()


def _assert_named_and_partial(error, outputs_before) -> str:
    assert isinstance(error, RuntimeError), repr(error)
    message = str(error)
    assert "node sbslurm2 (rank 1) is unreachable" in message, message
    # Its rank's own line says "unreachable", or "hangs" when the link went down while it was an
    # iteration behind rank 0 (a matter of timing; silence alone cannot tell the two apart).
    assert "rank 1 on node sbslurm2 is unreachable" in message or "rank 1 on node sbslurm2 hangs" in message, message
    assert "SLURM's view of this run's jobs (scontrol show job)" in message, message
    files = partial_files(outputs_before)
    assert files and all(p.name.endswith("_partial_gpu_metrics.csv") for p in files), files
    rank0 = [p for p in files if "_rank0_" in p.name]
    assert rank0 and len(rank0[0].read_text().splitlines()) > 2, files  # a header and the iterations done
    return message


def _fault_mid_run(cluster, jobs: JobFolder, tmp_path: Path, outputs, fault, bound_sec: float) -> tuple[float, str]:
    """Run :data:`CELL`, ``fault("sbslurm2")`` once both ranks finished iteration 2; the run must
    fail within ``bound_sec`` of the fault, naming the node, with partial files. (seconds, error)."""
    run = Run(cluster, tmp_path)
    wait_for_progress(cluster, jobs, iteration=2)
    at = time.monotonic()
    fault("sbslurm2")
    run.wait(bound_sec + 60)
    elapsed = run.ended - at
    message = _assert_named_and_partial(run.error, outputs)
    assert elapsed <= bound_sec, (elapsed, message)
    return elapsed, message


def test_a_node_cut_off_mid_run_is_named_and_leaves_nothing(slurm_two_nodes, tmp_path, outputs):
    cluster = slurm_two_nodes
    jobs = JobFolder(BENCHMARK)
    try:
        bound = GROUP_TIMEOUT_SEC + CUT_MARGIN_SEC
        elapsed, message = _fault_mid_run(cluster, jobs, tmp_path, outputs, cluster.cut_off, bound)
        assert "(still running: cancelled by this run)" in message, message
        # Node 1: the cancelled job's processes go (KillWait 5 s). Node 2: its rank ended
        # on its own group timeout; SLURM's step daemon goes once the node is reachable.
        wait_until(lambda: not cluster.job_pids("sbslurm1"), 30, f"left on sbslurm1: {cluster.job_pids('sbslurm1')}")
        ranks = lambda: [c for c in cluster.job_pids("sbslurm2").values() if "submitit" in c]  # noqa: E731
        wait_until(lambda: not ranks(), 30, f"ranks left on sbslurm2: {ranks()}")
        cluster.reconnect("sbslurm2")
        wait_until(lambda: not cluster.job_pids("sbslurm2"), 60, f"left on sbslurm2: {cluster.job_pids('sbslurm2')}")
        print(f"cut-off node: the run failed {elapsed:.1f} s after the cut (group_timeout_sec={GROUP_TIMEOUT_SEC:g})")
    finally:
        with contextlib.suppress(Exception):
            cluster.reconnect("sbslurm2")
        jobs.cleanup()


def test_a_dead_node_is_named_with_slurms_state_and_leaves_nothing(slurm_clusters, tmp_path, outputs):
    # Node 2's slurmd will be gone: a cluster of this test's own, with short SLURM timeouts;
    # the next module starts a whole one.
    slurm_clusters.close()
    jobs = JobFolder(BENCHMARK)
    try:
        timeouts = {"slurmd_timeout_sec": DEAD_SLURMD_TIMEOUT_SEC, "message_timeout_sec": DEAD_MESSAGE_TIMEOUT_SEC}
        with local_slurm(2, **timeouts) as cluster:
            bound = DEAD_SLURMD_TIMEOUT_SEC + DEAD_MARGIN_SEC
            elapsed, message = _fault_mid_run(cluster, jobs, tmp_path, outputs, cluster.kill_node, bound)
            assert "JobState=NODE_FAIL" in message, message
            left = lambda: cluster.job_pids("sbslurm1")  # noqa: E731
            wait_until(lambda: not left(), 30, f"left on sbslurm1: {left()}")
            assert not cluster.node_pids("sbslurm2"), cluster.job_pids("sbslurm2")
            print(f"dead node: the run failed {elapsed:.1f} s after the kill (SlurmdTimeout={DEAD_SLURMD_TIMEOUT_SEC})")
    finally:
        jobs.cleanup()
