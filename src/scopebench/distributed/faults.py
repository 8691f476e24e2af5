"""Naming the culprit of a failed multi-process run: which rank, how it ended, where it was.

When a local multi-process run fails, rank 0 describes each spawned rank from what the
operating system and the rendezvous store say about it: its exit code or signal
(``rank 1 died with SIGKILL after iteration 12``), whether it is stopped or still running
behind the others (a hang: ``rank 1 is stopped (SIGSTOP or a debugger) after iteration
4``), and the last lines of its log. These functions only read; :mod:`scopebench.distributed.launch`
decides when to call them.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RankReport", "describe_exit", "log_tail", "process_state"]

#: Lines of a failed rank's log quoted in the run's error.
LOG_TAIL_LINES = 25


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

    @property
    def culprit(self) -> bool:
        """Ended badly, is stopped, or fell behind the others (a hang)."""
        if self.returncode is not None:
            return self.returncode != 0
        if self.gone:
            return True
        if self.state == "T":
            return True
        behind = self.lead_iteration is not None and (
            self.last_iteration is None or self.last_iteration < self.lead_iteration
        )
        return behind

    def sentence(self, timeout_sec: float) -> str:
        """One line naming the rank, how it ended or where it hangs, and its last iteration.

        :Examples:
            >>> RankReport(1, -9, None, 12, 12).sentence(60)
            'rank 1 died with SIGKILL after iteration 12'
            >>> RankReport(1, None, "T", 4, 5).sentence(3)
            'rank 1 is stopped (SIGSTOP or a debugger) after iteration 4; no progress within group_timeout_sec=3 s'
            >>> RankReport(2, None, None, 3, 5, node="gpu017").sentence(60)
            'rank 2 on node gpu017 hangs or is too slow (the other ranks finished iteration 5) after iteration 3; no progress within group_timeout_sec=60 s'
        """
        where = _where(self.last_iteration)
        who = f"rank {self.rank}" + (f" on node {self.node}" if self.node else "")
        if self.returncode is not None:
            return f"{who} {describe_exit(self.returncode)} {where}"
        if self.gone:
            return f"{who} died {where} (its launcher reports the exit code or signal)"
        if self.state == "T":
            what = "is stopped (SIGSTOP or a debugger)"
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
