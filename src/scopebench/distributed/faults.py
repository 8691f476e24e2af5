"""Naming the culprit of a failed multi-process run: which rank, how it ended, where it was.

When a local multi-process run fails, rank 0 describes each spawned rank from what the
operating system and the rendezvous store say about it: its exit code or signal
(``rank 1 died with SIGKILL after iteration 12``), whether it is stopped or still running
behind the others (a hang: ``rank 1 is stopped (SIGSTOP or a debugger) after iteration
4``), and the last lines of its log. :mod:`scopebench.distributed.launch` decides when to
call these functions.

Under a launcher (torchrun, SLURM) the ranks leave in the rendezvous store their progress
(``progress/<rank>``), their node and process id (``pid/<rank>``) and, when their group
fails, a note that they saw it fail (``failed/<rank>``, :func:`announce_failure`). Rank 0
waits a moment for the notes of the ranks on other nodes (:func:`launcher_reports`): a rank
that leaves none could not reach the store, so its node is cut off or down, and the
report names that node and its ranks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import os
import re
import signal
import socket
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "STACK_SIGNAL",
    "RankReport",
    "announce_failure",
    "describe_exit",
    "dump_stack",
    "launcher_reports",
    "log_tail",
    "node_name",
    "process_state",
    "read_progress",
    "silent_nodes",
    "timed_out",
    "wait_for_notes",
]

#: Lines of a failed rank's log quoted in the run's error.
LOG_TAIL_LINES = 25
#: The signal on which a locally spawned worker writes its Python stack into its log
#: (:mod:`scopebench.distributed.worker`; ranks of torchrun or SLURM keep SIGUSR1 as it is).
STACK_SIGNAL = signal.SIGUSR1
#: How long rank 0 waits for a hung rank's stack to reach its log.
STACK_WAIT_SEC = 3.0
#: How long a rank that saw its group fail tries to leave its note in rank 0's store.
ANNOUNCE_TIMEOUT_SEC = 2.0


def describe_exit(returncode: int) -> str:
    """How a process ended, from ``Popen.returncode`` (negative: killed by a signal).

    :Examples:
        >>> describe_exit(-9), describe_exit(1)
        ('died with SIGKILL', 'exited with code 1')
    """
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"died with {name}"
    return f"exited with code {returncode}"


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``R``, ``S``, ``T`` stopped, ``Z`` zombie...), ``None`` if gone.

    Linux only (``/proc``); elsewhere ``None``.
    """
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: the state follows the last ')'.
    return text.rsplit(")", 1)[-1].split()[0]


def log_tail(path: Path | None, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a rank's log, or ``""`` when there is none."""
    if path is None or not path.is_file():
        return ""
    text = path.read_text(errors="replace").rstrip("\n")
    return "\n".join(text.splitlines()[-lines:])


def _where(iteration: int | None) -> str:
    return "before its first iteration" if iteration is None else f"after iteration {iteration}"


@dataclass(frozen=True)
class RankReport:
    """What rank 0 knows about one spawned rank when the run fails."""

    rank: int
    returncode: int | None
    """Exit status if the process ended on its own (before rank 0 stopped it), else ``None``."""
    state: str | None
    """Kernel state of a process still there (``T``: stopped)."""
    last_iteration: int | None
    """Last iteration the rank finished (from the store), ``None`` before the first."""
    lead_iteration: int | None
    """Last iteration the most advanced rank finished."""
    log: str = ""
    """Tail of the rank's log."""
    gone: bool = False
    """The process is known to be gone although its exit status is not (a launcher's rank)."""
    pid: int | None = None
    """Process id of a launcher's rank on this host (None: elsewhere or unknown)."""
    node: str | None = None
    """The node a launcher's rank runs on (``SLURMD_NODENAME``, else its host name), when known."""
    silent: bool = False
    """A rank on another node that left no note after the group failed (:func:`announce_failure`)."""
    hung: bool = False
    """A live rank that left no note after rank 0 timed out waiting in a collective: it never
    reached that collective (it runs its own code: hung, or slower than the group timeout)."""

    @property
    def behind(self) -> bool:
        """It finished fewer iterations than the most advanced rank."""
        return self.lead_iteration is not None and (
            self.last_iteration is None or self.last_iteration < self.lead_iteration
        )

    @property
    def culprit(self) -> bool:
        """Ended badly, is stopped, fell behind the others (a hang), or went silent."""
        if self.returncode is not None:
            return self.returncode != 0
        return self.gone or self.state == "T" or self.behind or self.silent or self.hung

    def sentence(self, timeout_sec: float) -> str:
        """One line naming the rank, how it ended or where it hangs, and its last iteration.

        :Examples:
            >>> RankReport(1, -9, None, 12, 12).sentence(60)
            'rank 1 died with SIGKILL after iteration 12'
            >>> RankReport(1, None, "T", 4, 5).sentence(3)
            'rank 1 is stopped (SIGSTOP or a debugger) after iteration 4; no progress within group_timeout_sec=3 s'
            >>> RankReport(2, None, None, 3, 5, node="gpu017").sentence(60)
            'rank 2 on node gpu017 hangs or is too slow (the other ranks finished iteration 5) after iteration 3; no progress within group_timeout_sec=60 s'
            >>> RankReport(1, None, None, 5, 5, node="gpu018", silent=True).sentence(60)
            'rank 1 on node gpu018 is unreachable: no word from it after the group failed (its node is cut off or down) after iteration 5'
            >>> RankReport(1, None, "S", 2, 2, hung=True).sentence(10)
            'rank 1 hangs in its own code (or is too slow): it never reached the collective rank 0 waited for, after iteration 2; no progress within group_timeout_sec=10 s'
        """
        where = _where(self.last_iteration)
        who = f"rank {self.rank}" + (f" on node {self.node}" if self.node else "")
        if self.returncode is not None:
            return f"{who} {describe_exit(self.returncode)} {where}"
        if self.gone:
            return f"{who} died {where} (its launcher reports the exit code or signal)"
        if self.state == "T":
            what = "is stopped (SIGSTOP or a debugger)"
        elif self.silent and not self.behind:
            return f"{who} is unreachable: no word from it after the group failed (its node is cut off or down) {where}"
        elif self.hung and not self.behind:
            what = "hangs in its own code (or is too slow): it never reached the collective rank 0 waited for,"
        elif self.culprit:
            what = f"hangs or is too slow (the other ranks finished iteration {self.lead_iteration})"
        else:
            what = "was waiting for the others"
        return f"{who} {what} {where}; no progress within group_timeout_sec={timeout_sec:g} s"

    def describe(self, timeout_sec: float) -> str:
        """:meth:`sentence` followed by the log tail, indented."""
        text = self.sentence(timeout_sec)
        if self.log:
            text += f"\n  last lines of rank {self.rank}'s log:\n" + "\n".join(
                "    " + line for line in self.log.splitlines()
            )
        return text


def node_name() -> str:
    """This rank's node: SLURM's name for it, else the host name (nodes may share a host name
    in containers, never a SLURM node name)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def read_progress(store, world_size: int) -> dict[int, int]:
    """Last finished iteration of every rank that reported one (``{}`` if the store is gone)."""
    out: dict[int, int] = {}
    for rank in range(world_size):
        key = f"progress/{rank}"
        with contextlib.suppress(Exception):  # a store already gone: nothing known
            if store is not None and store.check([key]):
                out[rank] = int(store.get(key))
    return out


def announce_failure(store, rank: int) -> None:
    """Leave ``failed/<rank>`` in rank 0's store: this rank saw the group fail and can still
    reach rank 0 (best effort, bounded by :data:`ANNOUNCE_TIMEOUT_SEC`; nothing if unreachable)."""
    with contextlib.suppress(Exception):
        store.set_timeout(datetime.timedelta(seconds=ANNOUNCE_TIMEOUT_SEC))
        store.set(f"failed/{rank}", node_name())


def launcher_reports(store, world_size: int, wait_sec: float = 0.0) -> list[RankReport]:
    """Rank 0's view of the other ranks of a launcher's group (torchrun, SLURM) when it fails:
    their progress marks; for ranks on this node, whether their process is stopped or gone;
    for ranks on other nodes, whether they left a note (:func:`announce_failure`) within
    ``wait_sec`` (silent: their node is cut off or down)."""
    progress = read_progress(store, world_size)
    host = node_name()
    where: dict[int, tuple[str, int]] = {}
    for rank in range(1, world_size):
        with contextlib.suppress(Exception):
            if store.check([f"pid/{rank}"]):
                node, pid = store.get(f"pid/{rank}").decode().rsplit(" ", 1)
                where[rank] = (node, int(pid))
    remote = [rank for rank, (node, _) in where.items() if node != host]
    noted = wait_for_notes(store, remote, wait_sec)
    reports = []
    for rank in range(1, world_size):
        node, pid = where.get(rank, (None, None))
        state = process_state(pid) if node == host else None
        reports.append(
            RankReport(
                rank=rank,
                returncode=None,
                state=state,
                last_iteration=progress.get(rank),
                lead_iteration=max(progress.values(), default=None),
                gone=node == host and state in (None, "Z"),
                pid=pid if node == host else None,
                node=node,
                silent=rank in remote and rank not in noted,
            )
        )
    if not remote:  # one node: naming it adds nothing
        reports = [dataclasses.replace(report, node=None) for report in reports]
    return reports


#: Where a Python exception's messages say that a collective gave up waiting (gloo:
#: ``Timed out waiting 60000ms for recv operation``; NCCL's watchdog: ``Watchdog caught
#: collective operation timeout``; the store: ``Socket Timeout``).
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)


def timed_out(error: BaseException | None) -> bool:
    """Whether ``error`` (or an exception it was raised from or during) is a collective or
    store operation that gave up at its timeout: this rank waited for a rank that never came.

    :Examples:
        >>> timed_out(RuntimeError("[gloo] Timed out waiting 10000ms for recv operation to complete"))
        True
        >>> timed_out(ValueError("batch_size must be >= 1")), timed_out(None)
        (False, False)
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if _TIMED_OUT.search(str(error)):
            return True
        error = error.__cause__ or error.__context__
    return False


#: A rank's Python stack, dumped into its log by :mod:`faulthandler` (``Stack (most recent
#: call first):`` for one thread, ``Current thread ... (most recent call first):`` for all).
STACK_MARK = "(most recent call first):"


def dump_stack(pid: int, log: Path | None, wait_sec: float = STACK_WAIT_SEC) -> bool:
    """Ask the spawned rank ``pid`` for its Python stack (:data:`STACK_SIGNAL`, which it gave
    to :func:`faulthandler.register`) and wait up to ``wait_sec`` until its log holds a dump
    written after the request. Returns whether one came."""
    if log is None or not log.is_file():
        return False
    start = log.stat().st_size
    try:
        os.kill(pid, STACK_SIGNAL)
    except OSError:
        return False
    deadline = time.monotonic() + wait_sec
    while True:
        with open(log, "rb") as fh:
            fh.seek(start)
            if STACK_MARK.encode() in fh.read():
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def wait_for_notes(store, ranks: list[int], wait_sec: float) -> set[int]:
    """The ``ranks`` that left ``failed/<rank>`` within ``wait_sec`` (polled)."""
    noted: set[int] = set()
    deadline = time.monotonic() + wait_sec
    while True:
        for rank in set(ranks) - noted:
            with contextlib.suppress(Exception):
                if store.check([f"failed/{rank}"]):
                    noted.add(rank)
        if noted == set(ranks) or time.monotonic() >= deadline:
            return noted
        time.sleep(0.1)


def silent_nodes(reports: list[RankReport]) -> str:
    """One line per node whose ranks all went silent, naming them (``""`` when none).

    :Examples:
        >>> silent_nodes([RankReport(2, None, None, 4, 4, node="n2", silent=True),
        ...               RankReport(3, None, None, 4, 4, node="n2", silent=True)])
        'node n2 (ranks 2, 3) is unreachable: none of its ranks reached rank 0 after the group failed'
    """
    nodes: dict[str, list[RankReport]] = {}
    for report in reports:
        if report.node:
            nodes.setdefault(report.node, []).append(report)
    lines = []
    for node, ranks in nodes.items():
        if all(r.silent for r in ranks):
            names = ", ".join(str(r.rank) for r in ranks)
            lines.append(
                f"node {node} (rank{'s' if len(ranks) > 1 else ''} {names}) is unreachable: "
                "none of its ranks reached rank 0 after the group failed"
            )
    return "\n".join(lines)
