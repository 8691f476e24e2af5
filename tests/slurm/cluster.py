"""A real single-node SLURM for the tests: munged, slurmctld and slurmd in a temporary folder.

Recipe (issue 11, prototyped on Debian 12 as root without systemd): ``munged`` runs as the
``munge`` user with its own socket, PID, log and seed files; ``slurm.conf`` points
``AuthInfo`` at that socket and keeps state, spool, logs and PIDs in the folder; one node
(this host, ``127.0.0.1``, all its CPUs) in one default partition; no accounting, no
cgroups. Every daemon runs in the foreground as our child, so it is stopped by its PID.
Nothing of the machine's configuration is touched: clients find the cluster through
``SLURM_CONF`` (see :attr:`LocalSlurm.env`).

slurmctld and slurmd listen on the fixed ports 6817/6818, so one cluster per host at a
time: :func:`local_slurm` holds an exclusive ``flock`` on :data:`LOCK_PATH` while the
cluster lives, and a second test session waits for it instead of colliding.

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

__all__ = ["LOCK_PATH", "PARTITION", "REQUIRED_TOOLS", "LocalSlurm", "local_slurm", "missing_prerequisites"]

LOCK_PATH = Path(tempfile.gettempdir()) / "scopebench-slurm.lock"
PARTITION = "debug"
#: Programs the cluster needs (Debian packages slurmctld, slurmd, slurm-client, munge).
REQUIRED_TOOLS = ("sbatch", "srun", "scontrol", "sinfo", "squeue", "scancel", "slurmctld", "slurmd", "munged")
_STANDIN = Path(__file__).resolve().parent / "sacct_standin.py"


def _which(tool: str) -> str | None:
    # Debian puts the daemons in /usr/sbin, which a non-login PATH may lack.
    return shutil.which(tool) or shutil.which(tool, path="/usr/sbin:/sbin")


def missing_prerequisites() -> list[str]:
    """What this machine lacks to start the cluster (empty when it can)."""
    missing = [tool for tool in REQUIRED_TOOLS if _which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root (slurmd starts jobs as their user, munged as 'munge')")
    try:
        pwd.getpwnam("munge")
    except KeyError:
        missing.append("the 'munge' user (Debian's munge package creates it)")
    return missing


@dataclass
class LocalSlurm:
    """A running single-node cluster."""

    root: Path
    """Temporary folder with config, state, spool and logs."""
    host: str
    """The node's name (this host's short name)."""
    cpus: int
    """CPUs of the node."""
    conf: Path
    """``slurm.conf``."""
    bin_dir: Path
    """Folder put first on the ``PATH`` (the ``sacct`` stand-in)."""
    partition: str = PARTITION
    start_sec: float = 0.0
    """Seconds from starting munged to an idle node (not counting a wait for the lock)."""
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

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

    def log_tail(self, chars: int = 3000) -> str:
        """The end of every daemon log, for error messages."""
        parts = []
        for log in sorted((self.root / "log").glob("*.log")):
            parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)


def _write_conf(root: Path, host: str, cpus: int, munge_socket: Path) -> Path:
    for sub in ("state", "spool", "log", "run"):
        (root / sub).mkdir(exist_ok=True)
    conf = root / "slurm.conf"
    conf.write_text(
        "\n".join(
            [
                "# Written by tests/slurm/cluster.py: a throw-away single-node cluster.",
                "ClusterName=scopebench",
                f"SlurmctldHost={host}(127.0.0.1)",
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
                # Job ids restart with every cluster; starting them from the clock keeps a
                # new job from meeting an old one's files in a Submitit folder.
                f"FirstJobId={1 + int(time.time() * 10) % 60_000_000}",
                # Finished jobs stay visible to `scontrol show job` (the sacct stand-in) for 10 min.
                "MinJobAge=600",
                "KillWait=5",
                "InactiveLimit=0",
                f"StateSaveLocation={root / 'state'}",
                f"SlurmdSpoolDir={root / 'spool'}",
                f"SlurmctldPidFile={root / 'run' / 'slurmctld.pid'}",
                f"SlurmdPidFile={root / 'run' / 'slurmd.pid'}",
                f"SlurmctldLogFile={root / 'log' / 'slurmctld.log'}",
                f"SlurmdLogFile={root / 'log' / 'slurmd.log'}",
                f"PlugStackConfig={root / 'plugstack.conf'}",
                f"NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
                f"PartitionName={PARTITION} Nodes={host} Default=YES MaxTime=INFINITE State=UP",
                "",
            ]
        )
    )
    # An empty SPANK stack: /etc/slurm/plugstack.conf belongs to the machine, not to us.
    (root / "plugstack.conf").write_text("")
    return conf


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
                tail = "".join(p.read_text(errors="replace")[-2000:] for p in sorted((root / "log").glob(f"{name}.*")))
                raise RuntimeError(f"{name} exited with code {proc.returncode} while waiting for {what}:\n{tail}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:.0f} s")
        time.sleep(0.1)


def _stop(cluster: LocalSlurm) -> None:
    procs = cluster._procs
    if "slurmctld" in procs and procs["slurmctld"].poll() is None:
        # Jobs first (a test that failed half-way may leave some; the last test's job may
        # still be finishing after its results were read), and only once they have ended
        # both daemons: slurmd shut down under a running step waits 10 s for it, then
        # leaves its slurmstepd behind.
        ids = cluster.job_ids()
        if ids:
            cluster.run("scancel", *ids, check=False)
            deadline = time.monotonic() + 15
            while cluster.job_ids() and time.monotonic() < deadline:
                time.sleep(0.1)
        cluster.run("scontrol", "shutdown", check=False, timeout=15)
    for name in ("slurmd", "slurmctld", "munged"):
        proc = procs.get(name)
        if proc is None or proc.poll() is not None:
            continue
        if name == "munged":
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _reap_stale() -> None:
    """Stop the daemons of a session that died without stopping its cluster (call holding the lock).

    They are found by the PID files in their own ``scopebench-slurm-*`` folder and stopped
    only if their command line names that folder.
    """
    for root in Path(tempfile.gettempdir()).glob("scopebench-slurm-*"):
        for pid_file in (root / "run" / "slurmctld.pid", root / "run" / "slurmd.pid", root / "munge" / "munged.pid"):
            try:
                pid = int(pid_file.read_text().split()[0])
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except (OSError, ValueError, IndexError):
                continue
            if str(root) in cmdline:
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def local_slurm(timeout_sec: float = 30.0) -> Iterator[LocalSlurm]:
    """Start the cluster (waiting for another session's to stop first), yield it, stop it.

    Raises:
        RuntimeError: a prerequisite is missing, or a daemon died while starting (with the
            end of its log).
    """
    missing = missing_prerequisites()
    if missing:
        raise RuntimeError(f"cannot start a local SLURM: missing {', '.join(missing)}")
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
        host = socket.gethostname().split(".")[0]
        cluster = LocalSlurm(
            root=root,
            host=host,
            cpus=os.cpu_count() or 1,
            conf=root / "slurm.conf",
            bin_dir=root / "bin",
        )
        try:
            (root / "log").mkdir()
            munged, munge_socket = _start_munged(root)
            cluster._procs["munged"] = munged
            _write_conf(root, host, cluster.cpus, munge_socket)
            _write_standin(cluster.bin_dir)
            _wait(munge_socket.exists, timeout_sec, "munged's socket", cluster._procs, root)
            env = {**os.environ, **cluster.env}
            for name, cmd in (
                ("slurmctld", [_which("slurmctld"), "-D", "-i", "-f", str(cluster.conf)]),
                ("slurmd", [_which("slurmd"), "-D", "-f", str(cluster.conf), "-N", host]),
            ):
                cluster._procs[name] = subprocess.Popen(
                    cmd,
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=open(root / "log" / f"{name}.stderr", "wb"),
                    stdin=subprocess.DEVNULL,
                    cwd=root,
                )

            def node_idle() -> bool:
                out = cluster.run("sinfo", "-h", "-N", "-o", "%t", check=False, timeout=5).stdout.strip()
                return out == "idle"

            _wait(node_idle, timeout_sec, "the node to be idle", cluster._procs, root)
            cluster.start_sec = time.perf_counter() - start
            yield cluster
        finally:
            _stop(cluster)
            shutil.rmtree(root, ignore_errors=True)
