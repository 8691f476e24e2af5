"""The two-node test cluster itself: each node in its own network, ranks meeting over the bridge, nothing left behind.

A job step on node 2 sees only its loopback and its end of the veth pair; its ranks find
rank 0 on the job's first node by name and talk through the interface that reaches it
(:mod:`scopebench.distributed.network`), as on a real cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from . import netns
from .cluster import local_slurm

pytestmark = pytest.mark.slow

PROBE = Path(__file__).with_name("rank_probe.py")
REPO = Path(__file__).resolve().parents[2]


def wait_for_end(cluster, job_id: str, timeout: float = 120.0) -> str:
    """The job's final state from ``scontrol`` (polled: the controller pushes nothing)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fields = dict(
            token.split("=", 1)
            for token in cluster.run("scontrol", "show", "job", "--oneliner", job_id).stdout.split()
            if "=" in token
        )
        if fields.get("JobState") not in (None, "PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            return fields["JobState"]
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} did not end within {timeout} s:\n{cluster.log_tail()}")


def submit(cluster, tmp_path: Path, command: str, *sbatch: str) -> tuple[str, str]:
    """Run ``command`` as a batch job; its state and output."""
    out = tmp_path / "job.out"
    job_id = cluster.run("sbatch", *sbatch, f"--output={out}", "--wrap", command).stdout.split()[-1]
    state = wait_for_end(cluster, job_id)
    return state, out.read_text()


def test_two_nodes_start_in_under_10_s_each_in_its_own_network(slurm_two_nodes, tmp_path):
    cluster = slurm_two_nodes
    assert cluster.start_sec < 10.0, cluster.start_sec
    assert [node.name for node in cluster.nodes] == ["sbslurm1", "sbslurm2"]
    state, out = submit(
        cluster,
        tmp_path,
        'srun sh -c \'echo task=$SLURM_PROCID node=$SLURMD_NODENAME addrs=$(ip -o -4 addr show | tr -s " " | '
        'cut -d" " -f2,4 | tr "\\n" ",")\'',
        "--nodes=2",
        "--ntasks-per-node=1",
    )
    assert state == "COMPLETED", out
    lines = sorted(line for line in out.splitlines() if line.startswith("task="))
    assert lines == [
        "task=0 node=sbslurm1 addrs=lo 127.0.0.1/8,sbslurmn1 10.231.47.2/24,",
        "task=1 node=sbslurm2 addrs=lo 127.0.0.1/8,sbslurmn2 10.231.47.3/24,",
    ], out


def test_ranks_meet_on_the_first_node_over_the_bridge(slurm_two_nodes, tmp_path):
    """2 nodes x 2 tasks: world size 4 on every rank, rank 0 on the first node, the rendezvous
    the first node's name (never localhost), each rank's gloo interface its node's link."""
    env_python = f"env PYTHONPATH={os.environ.get('PYTHONPATH', '')} {sys.executable}"
    state, out = submit(slurm_two_nodes, tmp_path, f"srun {env_python} {PROBE}", "--nodes=2", "--ntasks-per-node=2")
    assert state == "COMPLETED", out
    (line,) = [line for line in out.splitlines() if line.startswith("probe: ")]
    probe = json.loads(line.removeprefix("probe: "))
    nodes = {0: "sbslurm1", 1: "sbslurm1", 2: "sbslurm2", 3: "sbslurm2"}
    for seen in probe["ranks"]:
        assert seen["world_size"] == 4 and seen["master_addr"] == "sbslurm1", seen
        assert seen["node"] == nodes[seen["rank"]], seen
        assert seen["ifname"] == f"sbslurmn{seen['node'][-1]}", seen
    assert probe["sum"] == 10.0  # 1 + 2 + 3 + 4 over the bridge


def _leftovers() -> dict[str, list[str]]:
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True).stdout
    spaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {
        "links": [line for line in links.splitlines() if netns.PREFIX in line],
        "namespaces": [line for line in spaces.splitlines() if line.startswith(netns.PREFIX)],
        "hosts": [line for line in netns.HOSTS.read_text().splitlines() if line.endswith(netns.HOSTS_MARK)],
    }


def test_everything_is_removed_even_when_the_body_fails(slurm_clusters):
    slurm_clusters.close()  # one cluster at a time: the module's goes, the next test starts it again
    with pytest.raises(RuntimeError, match="the test failed"):
        with local_slurm(2) as cluster:
            pids = [proc.pid for proc in cluster._procs.values()]
            root = cluster.root
            assert _leftovers()["namespaces"] and _leftovers()["hosts"]
            raise RuntimeError("the test failed")
    assert _leftovers() == {"links": [], "namespaces": [], "hosts": []}
    assert not root.exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text(), pid


def test_refuses_at_once_without_the_privileges():
    """Without CAP_NET_ADMIN (dropped from the bounding set) one message names what is missing, before
    anything is created or the cluster lock is taken."""
    code = "from tests.slurm.cluster import local_slurm\nwith local_slurm(2):\n    pass\n"
    proc = subprocess.run(
        ["setpriv", "--bounding-set", "-net_admin", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert proc.returncode == 1, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == (
        "RuntimeError: cannot start a 2-node local SLURM: missing root with CAP_NET_ADMIN "
        "(network namespaces, veth links and a bridge need it)"
    ), proc.stderr
