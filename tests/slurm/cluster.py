"""A real SLURM for the tests: munged, slurmctld and one slurmd per node in a temporary folder.

Two layouts of one recipe (:func:`local_slurm`): ``nodes=1``, this host as the only node
on ``127.0.0.1``; ``nodes=2``, two nodes ``sbslurm1`` and ``sbslurm2``, each ``slurmd`` in its
own network namespace linked to a bridge (:mod:`.netns`), the controller on the bridge's
address. A job step on node 2 then has a network of its own: its ranks reach rank 0 only
over the bridge.

Recipe (issue 11, prototyped on Debian 12 as root without systemd): ``munged`` runs as the
``munge`` user with its own socket, PID, log and seed files; ``slurm.conf`` points
``AuthInfo`` at that socket and keeps state, spool, logs and PIDs in the folder; each node
has all this machine's CPUs (two nodes: at least :data:`MIN_NODE_CPUS` each, so that one
node takes a job of the world size the two span), in one default partition; no
accounting, no cgroups. Every
daemon runs in the foreground as our child, so it is stopped by its PID.
Nothing of the machine's configuration is touched: clients find the cluster through
``SLURM_CONF`` (see :attr:`LocalSlurm.env`).

slurmctld and slurmd listen on the fixed ports 6817/6818, so one cluster per host at a
time, whatever its layout: :func:`local_slurm` holds an exclusive ``flock`` on
:data:`LOCK_PATH` while the cluster lives, and a second test session waits for it instead
of colliding.

Without slurmdbd there is no ``sacct``; Submitit asks it for job states (a job that dies
without a result is otherwise never seen to finish), so :attr:`LocalSlurm.env` puts
``sacct_standin.py`` first on the ``PATH``: it answers from ``scontrol show job``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from . import netns

__all__ = [
    "LOCK_PATH",
    "MIN_NODE_CPUS",
    "PARTITION",
    "REQUIRED_TOOLS",
    "LocalSlurm",
    "Node",
    "local_slurm",
    "missing_prerequisites",
]

LOCK_PATH = Path(tempfile.gettempdir()) / "scopebench-slurm.lock"
PARTITION = "debug"
#: Programs the cluster needs (Debian packages slurmctld, slurmd, slurm-client, munge).
#: CPUs each node of the two-node layout claims at least (``SlurmdParameters=config_overrides``):
#: a one-node reference of a 2 nodes x 2 tasks run needs 4 tasks on one node, and this
#: machine may have 2 cores (the two nodes share them anyway). 12 lets every job of the
#: two-node ``Pi05Train`` test (18 tasks, at most 12 on a node) start at once: in waves of
#: 4 CPUs a node, SLURM's start of each wave added about 8 s of idle machine, twice.
MIN_NODE_CPUS = 12
#: ``SlurmdTimeout`` of the test cluster: seconds without an answer before a node is DOWN.
#: Above a fault test's group timeout plus rank 0's wait for notes (15 + 5 s) plus a ping
#: interval (a node's last answer may come SlurmdTimeout / 3 before the cut), so that a
#: cut-off node's job is still running when its ranks name the node.
SLURMD_TIMEOUT_SEC = 45
REQUIRED_TOOLS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel", "slurmctld", "slurmd", "munged")
_STANDIN = Path(__file__).resolve().parent / "sacct_standin.py"


def _which(tool: str) -> str | None:
    # Debian puts the daemons in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def missing_prerequisites(nodes: int = 1) -> list[str]:
    """What this machine lacks to start a cluster of ``nodes`` nodes (empty when it can)."""
    missing = [tool for tool in REQUIRED_TOOLS if _which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (slurmd starts jobs as their user, munged as 'munge')")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        missing.append("the 'munge' user (Debian's munge package creates it)")
    if nodes > 1:
        missing += [m for m in netns.missing_network_prerequisites() if not (m.startswith("root") and os.geteuid())]
    return missing


@dataclass(frozen=True)
class Node:
    """One compute node of the cluster."""

    name: str
    """Its SLURM name (``SLURMD_NODENAME`` of its tasks)."""
    addr: str
    """Its address (``127.0.0.1`` for the single node, else on the bridge)."""
    netns: str | None = None
    """Its network namespace (``None``: this host's network)."""


@dataclass
class LocalSlurm:
    """A running cluster."""

    root: Path
    """Temporary folder with config, state, spool and logs."""
    nodes: list[Node]
    """Its compute nodes, in the order SLURM lists them."""
    controller_addr: str
    """Where slurmctld listens (``127.0.0.1``, or the bridge's address)."""
    cpus: int
    """CPUs of each node."""
    conf: Path
    """``slurm.conf``."""
    bin_dir: Path
    """Folder put first on the ``PATH`` (the ``sacct`` stand-in)."""
    partition: str = PARTITION
    start_sec: float = 0.0
    """Seconds from starting munged to idle nodes (not counting a wait for the lock)."""
    slurmd_timeout_sec: int = SLURMD_TIMEOUT_SEC
    """Its ``SlurmdTimeout``: seconds without an answer before a node is DOWN."""
    message_timeout_sec: int | None = None
    """Its ``MessageTimeout`` (``None``: SLURM's 10 s): how long slurmctld waits on a node's answer."""
    network: netns.Network | None = None
    """The nodes' namespaces and links (two-node layout)."""
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def host(self) -> str:
        """The first node's name (the single node's: this host's short name)."""
        return self.nodes[0].name

    @property
    def env(self) -> dict[str, str]:
        """Variables every client needs (``sbatch``, Submitit, ``benchopt run`` with a SLURM config)."""
        return {"SLURM_CONF": str(self.conf), "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def run(self, *args: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(
            list(args),
            env={**os.environ, **self.env},
            capture_output=True,
            text=True,
            check=check,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def job_ids(self) -> list[str]:
        """Jobs the controller still knows (pending, running, or finished recently)."""
        out = self.run("squeue", "-h", "-o", "%A", check=False).stdout
        return [line.strip() for line in out.splitlines() if line.strip()]

    def node_states(self) -> dict[str, str]:
        """Each node's state as ``sinfo`` prints it (``idle``, ``alloc``, ``down*``...)."""
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False, timeout=10).stdout
        return dict(line.split() for line in out.splitlines() if len(line.split()) == 2)

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every daemon log, for error messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def node_pids(self, name: str) -> list[int]:
        """Processes running in a node's network namespace (its slurmd, job steps and ranks)."""
        node = self._node(name)
        if node.netns is None:
            raise ValueError(f"node {name} runs in this host's network: its processes cannot be told apart")
        out = subprocess.run(["ip", "netns", "pids", node.netns], capture_output=True, text=True, timeout=10).stdout
        return [int(pid) for pid in out.split()]

    def job_pids(self, name: str) -> dict[int, str]:
        """What a node runs besides its slurmd (job steps, ranks): pid -> command line."""
        slurmd = self._procs.get(f"slurmd-{name}")
        out = {}
        for pid in self.node_pids(name):
            with contextlib.suppress(OSError):
                if slurmd is None or pid != slurmd.pid:
                    out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        return out

    def cut_off(self, name: str) -> None:
        """Set a node's link to the bridge down: it stays up, but nothing reaches it."""
        self._network().set_link(name, up=False)

    def reconnect(self, name: str) -> None:
        """Set a cut-off node's link up again."""
        self._network().set_link(name, up=True)

    def kill_node(self, name: str) -> None:
        """Kill a node: its slurmd and every process in its namespace (the job's steps and ranks)."""
        slurmd = self._procs.pop(f"slurmd-{name}")
        slurmd.kill()
        slurmd.wait(timeout=10)
        for pid in self.node_pids(name):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _node(self, name: str) -> Node:
        (node,) = [node for node in self.nodes if node.name == name]
        return node

    def _network(self) -> netns.Network:
        if self.network is None:
            raise ValueError("a single-node cluster has no links of its own")
        return self.network


def _write_conf(cluster: LocalSlurm, munge_socket: Path, first_job_id: int) -> None:
    root = cluster.root
    for sub in ("state", "spool", "log", "run", *(f"spool/{node.name}" for node in cluster.nodes)):
        (root / sub).mkdir(exist_ok=True)
    names = ",".join(node.name for node in cluster.nodes)
    cluster.conf.write_text(
        "\n".join(
            [
                "# Written by tests/slurm/cluster.py: a throw-away test cluster.",
                "ClusterName=scopebench",
                f"SlurmctldHost={socket.gethostname().split('.')[0]}({cluster.controller_addr})",
                "SlurmUser=root",
                "SlurmdUser=root",
                "AuthType=auth/munge",
                "CredType=cred/munge",
                f"AuthInfo=socket={munge_socket}",
                "MpiDefault=none",
                "ProctrackType=proctrack/linuxproc",
                "TaskPlugin=task/none",
                "SelectType=select/cons_tres",
                "SelectTypeParameters=CR_Core",
                "AccountingStorageType=accounting_storage/none",
                "JobCompType=jobcomp/none",
                "JobAcctGatherType=jobacct_gather/none",
                "ReturnToService=2",
                # A node that stops answering (cut off, dead) is DOWN after this long, and its
                # jobs end (NODE_FAIL); SLURM's default is 300 s (tests/slurm/test_node_faults.py).
                f"SlurmdTimeout={cluster.slurmd_timeout_sec}",
                # A dead node is DOWN about SlurmdTimeout + 2 x MessageTimeout after its last
                # answer (measured: 10 s + 2 x 10 s gave 30 s, 10 s + 2 x 5 s gave 16 s).
                *([f"MessageTimeout={cluster.message_timeout_sec}"] if cluster.message_timeout_sec else []),
                # Nodes may claim more CPUs than the machine has (the two-node layout's do).
                "SlurmdParameters=config_overrides",
                f"FirstJobId={first_job_id}",
                # Finished jobs stay visible to `scontrol show job` (the sacct stand-in) for 10 min.
                "MinJobAge=600",
                "KillWait=5",
                "InactiveLimit=0",
                f"StateSaveLocation={root / 'state'}",
                # %n: each node's slurmd keeps its own spool, PID file and log.
                f"SlurmdSpoolDir={root / 'spool' / '%n'}",
                f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'run' / 'slurmd-%n.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd-%n.log'}",
                f"PlugStackConfig={root / 'plugstack.conf'}",
                *(
                    f"NodeName={n.name} NodeAddr={n.addr} CPUs={cluster.cpus} Sockets=1 "
                    f"CoresPerSocket={cluster.cpus} ThreadsPerCore=1 State=UNKNOWN"
                    for n in cluster.nodes
                ),
                f"PartitionName={PARTITION} Nodes={names} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    # An empty SPANK stack: /etc/slurm/plugstack.conf belongs to the machine, not to us.
    (root / "plugstack.conf").write_text("")


def _write_standin(bin_dir: Path) -> None:
    bin_dir.mkdir(exist_ok=True)
    sacct = bin_dir / "sacct"
    sacct.write_text(f'#!/bin/sh\nexec {sys.executable} {_STANDIN} "$@"\n')
    sacct.chmod(0o755)


def _start_munged(root: Path) -> tuple[subprocess.Popen, Path]:
    munge_dir = root / "munge"
    munge_dir.mkdir()
    munge_dir.chmod(0o755)  # munged wants its socket folder searchable by all
    user = pwd.getpwnam("munge")
    os.chown(munge_dir, user.pw_uid, user.pw_gid)
    sock = munge_dir / "munge.socket"
    proc = subprocess.Popen(
        [
            _which("munged"),
            "--foreground",
            f"--socket={sock}",
            f"--pid-file={munge_dir / 'munged.pid'}",
            f"--log-file={munge_dir / 'munged.log'}",
            f"--seed-file={munge_dir / 'munged.seed'}",
        ],
        user=user.pw_uid,
        group=user.pw_gid,
        extra_groups=[],
        stdout=subprocess.DEVNULL,
        stderr=open(root / "log" / "munged.log", "wb"),
        stdin=subprocess.DEVNULL,
    )
    return proc, sock


def _wait(predicate, timeout: float, what: str, procs: dict[str, subprocess.Popen], root: Path) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        for name, proc in procs.items():
            if proc.poll() is not None:
                tail = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((root / "log").glob(f"{name}*")))
                raise RuntimeError(f"{name} exited with code {proc.returncode} while waiting for {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.1)


def _stop(cluster: LocalSlurm) -> None:
    procs = cluster._procs
    if "slurmctld" in procs and procs["slurmctld"].poll() is None:
        # Jobs first (a test that failed half-way may leave some; the last test's job may
        # still be finishing after its results were read), and only once they have ended
        # the daemons: slurmd shut down under a running step waits 10 s for it, then
        # leaves its slurmstepd behind.
        ids = cluster.job_ids()
        if ids:
            cluster.run("scancel", *ids, check=False)
            deadline = time.monotonic() + 15
            while cluster.job_ids() and time.monotonic() < deadline:
                time.sleep(0.1)
        cluster.run("scontrol", "shutdown", check=False, timeout=15)
    for name in [n for n in procs if n.startswith("slurmd")] + ["slurmctld", "munged"]:
        proc = procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        if name == "munged" or name.startswith("slurmd"):
            proc.send_signal(signal.SIGTERM)  # a cut-off slurmd never hears the shutdown
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    if cluster.network is not None:
        # What the namespaces still hold (a step of a cut-off node) goes with them.
        for node in cluster.nodes:
            for pid in cluster.node_pids(node.name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        cluster.network.remove()


def _reap_stale() -> None:
    """Stop the daemons of a session that died without stopping its cluster (call holding the lock).

    They are found by the PID files in their own ``scopebench-slurm-*`` folder and stopped
    only if their command line names that folder; its namespaces and links are removed.
    """
    for root in Path(tempfile.gettempdir()).glob("scopebench-slurm-*"):
        for pid_file in [root / "run" / "slurmctld.pid", root / "munge" / "munged.pid"] + sorted(
            (root / "run").glob("slurmd*.pid")
        ):
            try:
                pid = int(pid_file.read_text().split()[0])
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if str(root) in cmdline:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)
    netns.remove_stale()


def _layout(nodes: int) -> tuple[list[Node], netns.Network | None, str]:
    """The nodes, their network and the controller's address of a ``nodes``-node cluster."""
    if nodes == 1:
        return [Node(socket.gethostname().split(".")[0], "127.0.0.1")], None, "127.0.0.1"
    network = netns.Network.create([f"{netns.PREFIX}{i}" for i in range(1, nodes + 1)])
    return [Node(link.name, link.addr, link.netns) for link in network.nodes], network, network.bridge_addr


def _start_daemons(cluster: LocalSlurm) -> None:
    env = {**os.environ, **cluster.env}
    commands = {"slurmctld": [_which("slurmctld"), "-D", "-i", "-f", str(cluster.conf)]}
    for node in cluster.nodes:
        prefix = cluster.network.exec_prefix(node.name) if node.netns else []
        commands[f"slurmd-{node.name}"] = [*prefix, _which("slurmd"), "-D", "-f", str(cluster.conf), "-N", node.name]
    for name, cmd in commands.items():
        cluster._procs[name] = subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(cluster.root / "log" / f"{name}.stderr", "wb"),
            stdin=subprocess.DEVNULL,
            cwd=cluster.root,
        )


@contextlib.contextmanager
def local_slurm(
    nodes: int = 1,
    timeout_sec: float = 30.0,
    first_job_id: int | None = None,
    slurmd_timeout_sec: int = SLURMD_TIMEOUT_SEC,
    message_timeout_sec: int | None = None,
) -> Iterator[LocalSlurm]:
    """Start a cluster of ``nodes`` (1 or 2) nodes, waiting for another session's to stop first; yield it; stop it.

    Args:
        nodes: 1: this host on ``127.0.0.1``. 2: two nodes, each in its own network namespace.
        timeout_sec: Bound on each start-up wait.
        first_job_id: The first job id (default: from the clock, so that a new cluster's
            jobs do not meet an old one's files; a test sets it to replay a reset cluster).
        slurmd_timeout_sec: SLURM's ``SlurmdTimeout`` (a test of a dead node shortens it).
        message_timeout_sec: SLURM's ``MessageTimeout`` (``None``: its own 10 s; a test of a
            dead node shortens it too).

    Raises:
        RuntimeError: a prerequisite is missing (one message naming each), or a daemon died
            while starting (with the end of its log).
    """
    if nodes not in (1, 2):
        raise ValueError(f"nodes must be 1 or 2, got {nodes!r}")
    missing = missing_prerequisites(nodes)
    if missing:
        raise RuntimeError(f"cannot start a {nodes}-node local SLURM: missing {', '.join(missing)}")
    with open(LOCK_PATH, "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another session's SLURM to stop ({LOCK_PATH})", file=sys.stderr, flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        _reap_stale()
        start = time.perf_counter()
        root = Path(tempfile.mkdtemp(prefix="scopebench-slurm-"))
        root.chmod(0o755)  # munged (user munge) reaches its folder inside
        cluster = LocalSlurm(
            root=root,
            nodes=[],
            controller_addr="",
            cpus=max(os.cpu_count() or 1, MIN_NODE_CPUS if nodes > 1 else 1),
            conf=root / "slurm.conf",
            bin_dir=root / "bin",
            slurmd_timeout_sec=slurmd_timeout_sec,
            message_timeout_sec=message_timeout_sec,
        )
        try:
            cluster.nodes, cluster.network, cluster.controller_addr = _layout(nodes)
            (root / "log").mkdir()
            munged, munge_socket = _start_munged(root)
            cluster._procs["munged"] = munged
            if first_job_id is None:
                first_job_id = 1 + int(time.time() * 10) % 60_000_000
            _write_conf(cluster, munge_socket, first_job_id)
            _write_standin(cluster.bin_dir)
            _wait(munge_socket.exists, timeout_sec, "munged's socket", cluster._procs, root)
            _start_daemons(cluster)

            def nodes_idle() -> bool:
                states = cluster.node_states()
                return len(states) == nodes and set(states.values()) == {"idle"}

            _wait(nodes_idle, timeout_sec, "the nodes to be idle", cluster._procs, root)
            cluster.start_sec = time.perf_counter() - start
            yield cluster
        finally:
            _stop(cluster)
            shutil.rmtree(root, ignore_errors=True)
