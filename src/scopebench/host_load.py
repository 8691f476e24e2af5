"""How busy the machine was over an interval: CPU taken by other processes, and steal.

Two cumulative counters read from ``/proc`` (Linux), in clock ticks (``USER_HZ``):

* :func:`read_cpu_times` — ``/proc/stat`` summed over the CPUs this process may use
  (``sched_getaffinity``): ``busy`` (user, nice, system, irq, softirq: what any process in
  this kernel ran, guests included), ``steal`` (time the hypervisor gave to another
  machine) and ``total`` (busy + idle + iowait + steal);
* :class:`OwnTime` — the CPU time (``utime + stime + cutime + cstime`` of
  ``/proc/<pid>/stat``) of every process in the run's process groups: this process, its
  threads and children (dataloader workers), and the other ranks on this host when they
  share a group or are named. The ``c`` fields are the children a process has waited for,
  so a worker that exits between two readings, or is born and exits between two scans,
  still counts as the run's (once: what was read of a known child before it went is not
  counted again when its parent's ``cutime`` takes it).

A driver whose work runs in subprocesses that exit within the interval (the ``perf/``
scripts) counts :func:`self_and_waited_ticks` as its own instead.

Over an interval, :func:`shares` turns two readings into ``host_other_cpu_pct`` (busy
minus own, over total: the share of the run's CPUs other processes took) and
``host_steal_pct``. The sampler thread (:mod:`scopebench.profiler.sampler`) reads both
every period; the ``perf/`` scripts read them around each round
(``perf/round_conditions.py``), so both say the same thing the same way.

Accuracy: ``/proc/stat`` counts in ticks (10 ms at ``USER_HZ = 100``), so an interval of
100 ms on two CPUs holds 20 ticks and a single interval's share is only good to about
±10 %; shares over seconds are good to about 1 %. A process that joins a group is found
when the membership is scanned again (every :data:`RESCAN_SEC`, or when a reader asks:
the sampler does when an interval looks busy); one born since the last scan has all its
CPU time counted as the run's at that scan. A child of the run reaped by a process
outside it (re-parented to init) loses its last interval (counted as other); a child
outside the run's groups that a process of the run waits for counts as the run's when it
is reaped.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "CpuTimes",
    "OwnTime",
    "process_age_sec",
    "read_cpu_times",
    "self_and_waited_ticks",
    "shares",
    "usable_cpus",
]

#: Clock ticks per second of ``/proc/stat`` and ``/proc/<pid>/stat``.
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Seconds between two scans of ``/proc`` for the run's new processes (dataloader workers).
RESCAN_SEC = 1.0


@dataclass(frozen=True)
class CpuTimes:
    """Cumulative ticks over a set of CPUs (one ``/proc/stat`` reading)."""

    busy: int
    steal: int
    total: int


def usable_cpus() -> list[int]:
    """The CPUs this process may run on (all of them where affinity is unknown)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def read_cpu_times(cpus: Iterable[int], root: str | Path = "/") -> CpuTimes | None:
    """``/proc/stat`` summed over ``cpus``; ``None`` where the file is missing (not Linux).

    :Examples:

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "proc").mkdir()
    >>> _ = (root / "proc/stat").write_text("cpu  9 0 9 9 0 0 0 0 0 0\\ncpu0 10 1 5 80 2 1 1 3 0 0\\n")
    >>> read_cpu_times([0], root)
    CpuTimes(busy=18, steal=3, total=103)
    """
    wanted = {f"cpu{cpu}" for cpu in cpus}
    text = _read(Path(root) / "proc/stat")
    if text is None:
        return None
    busy = steal = total = 0
    end = text.find("\nintr")  # the cpu lines come first; the interrupt counts after them can be long
    for line in text[: end if end >= 0 else len(text)].splitlines():
        name, _, rest = line.partition(" ")
        if name not in wanted:
            continue
        values = [int(v) for v in rest.split()[:8]]
        values += [0] * (8 - len(values))
        user, nice, system, idle, iowait, irq, softirq, stolen = values
        busy += user + nice + system + irq + softirq
        steal += stolen
        total += user + nice + system + idle + iowait + irq + softirq + stolen
    return CpuTimes(busy, steal, total)


def _read(path: Path) -> str | None:
    """A ``/proc`` file's text (``os.read``: under half the cost of ``Path.read_text``), ``None`` if absent."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 16384):  # a small buffer: allocating a large one costs more than the read
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int, root: str | Path) -> tuple[int, int, int, int] | None:
    """``(pgrp, utime + stime + cutime + cstime, starttime, ppid)`` of ``pid``, ``None`` once it is gone."""
    text = _read(Path(root) / f"proc/{pid}/stat")
    if text is None:
        return None
    rest = text[text.rfind(")") + 2 :].split()  # the command name may hold spaces and parentheses
    return int(rest[2]), sum(int(v) for v in rest[11:15]), int(rest[19]), int(rest[1])


def _uptime_ticks(root: str | Path) -> int:
    try:
        return int(float((_read(Path(root) / "proc/uptime") or "").split()[0]) * CLK_TCK)
    except (ValueError, IndexError):
        return 0


class OwnTime:
    """Cumulative CPU ticks of the processes in ``pgids`` (the run), read by :meth:`read`.

    Membership is found by scanning ``/proc`` when the object is made and then every
    ``rescan_sec`` (default :data:`RESCAN_SEC`); a scan reads the ``stat`` of new pids only
    (pids seen before, in the run or not, are remembered), so after the first it costs a
    directory listing (about 100 µs for 140 processes). A process's ticks include those of the
    children it reaped (``cutime``): a child of the run's that exits counts once, and one in
    another process group (a helper in its own session) is read at every reading while it
    lives, so that what its parent takes of it on reaping is left out.

    Args:
        pgids: Process groups of the run on this host (default: this process's).
        root: Where ``/proc`` is read (tests pass a fake tree).
        rescan_sec: Seconds between membership scans.
    """

    def __init__(self, pgids: Iterable[int] | None = None, root: str | Path = "/", rescan_sec: float = RESCAN_SEC):
        self.pgids = frozenset(pgids if pgids is not None else [os.getpgrp()])
        self.root = root
        self.rescan_sec = rescan_sec
        self.known: dict[int, int] = {}
        self.ticks = 0
        self._parent: dict[int, int] = {}  # known pid -> its parent
        # parent pid -> ticks already counted of its known children that went away: its
        # cutime/cstime takes them again when it reaps them
        self._counted_gone: dict[int, int] = {}
        self._outside: set[int] = set()  # pids seen that are not the run's
        # Children of the run's processes that are not the run's (another process group or session:
        # a helper, a test's busy loop): pid -> (parent, its ticks when last read, starttime). Their
        # time is another's while they live, and must not become the run's when the parent reaps
        # them (its cutime then takes their whole time at once).
        self._foreign: dict[int, tuple[int, int, int]] = {}
        self._scanned_at = 0  # uptime ticks of the last scan
        self._scan(first=True)
        self._next_scan = time.monotonic() + rescan_sec

    def _scan(self, first: bool = False) -> None:
        now = _uptime_ticks(self.root)
        try:
            pids = {int(name) for name in os.listdir(Path(self.root) / "proc") if name.isdigit()}
        except OSError:
            pids = set()
        self._outside &= pids  # a pid that went away may come back as one of ours
        others = []
        for pid in pids - self._outside - self.known.keys():
            stat = _stat(pid, self.root)
            if stat is None or stat[0] not in self.pgids:
                self._outside.add(pid)
                if stat is not None:
                    others.append((pid, stat))
                continue
            self.known[pid], self._parent[pid] = stat[1], stat[3]
            if not first and stat[2] >= self._scanned_at:
                self.ticks += stat[1]  # born since the last scan: all its time is the run's, since then
        for pid, stat in others:  # once every process of the run is known (a pid may precede its parent's)
            if stat[3] in self.known:
                self._foreign[pid] = (stat[3], stat[1], stat[2])
        self._scanned_at = now

    def read(self, rescan: bool = False) -> int:
        """Ticks the run's processes have used since this object was made (cumulative).

        Args:
            rescan: Scan ``/proc`` for the run's new processes now, not only every ``rescan_sec``.
        """
        stats = {pid: _stat(pid, self.root) for pid in self.known}
        for pid, (parent, ticks, born) in list(self._foreign.items()):
            stat = _stat(pid, self.root)
            if stat is not None and stat[2] == born:
                self._foreign[pid] = (parent, stat[1], born)
                continue
            del self._foreign[pid]  # gone: its parent's cutime takes its time when it reaps it
            if parent in self.known:
                self._counted_gone[parent] = self._counted_gone.get(parent, 0) + ticks
        # The pids gone first: a parent read in this pass may already hold a reaped child's time.
        for pid, stat in stats.items():
            if stat is None or stat[0] not in self.pgids:  # exited (or the pid was reused)
                before = self.known.pop(pid)
                self._counted_gone.pop(pid, None)  # its children not reaped yet go to init
                parent = self._parent.pop(pid)
                if parent in self.known:  # it takes the child's whole time when it reaps it
                    self._counted_gone[parent] = self._counted_gone.get(parent, 0) + before
        for pid, before in list(self.known.items()):
            stat = stats[pid]
            grown = stat[1] - before
            owed = self._counted_gone.pop(pid, 0)
            if owed:  # what was counted of its reaped children, once (the rest at a later reading)
                taken = min(owed, max(grown, 0))
                grown -= taken
                if owed > taken:
                    self._counted_gone[pid] = owed - taken
            self.ticks += grown
            self.known[pid] = stat[1]
        if rescan or time.monotonic() >= self._next_scan:
            self._scan()
            self._next_scan = time.monotonic() + self.rescan_sec
        return self.ticks


def process_age_sec(pid: int | None = None, root: str | Path = "/") -> float | None:
    """Seconds since process ``pid`` (default: this one) started, to a clock tick (10 ms);
    ``None`` without ``/proc`` (not Linux).

    :Examples:

    >>> import tempfile, pathlib
    >>> root = pathlib.Path(tempfile.mkdtemp()); (root / "proc/42").mkdir(parents=True)
    >>> _ = (root / "proc/uptime").write_text("12.50 3.00\\n")
    >>> born = 10 * CLK_TCK  # started 10 s after boot
    >>> _ = (root / "proc/42/stat").write_text(f"42 (x) S 1 42 " + "0 " * 16 + f"{born} 0\\n")
    >>> process_age_sec(42, root)
    2.5
    """
    stat = _stat(os.getpid() if pid is None else pid, root)
    now = _uptime_ticks(root)
    if stat is None or not now:
        return None
    return max(0, now - stat[2]) / CLK_TCK


def self_and_waited_ticks() -> int:
    """CPU ticks of this process and of its descendants already waited for (``getrusage``
    of ``RUSAGE_SELF`` and ``RUSAGE_CHILDREN``): the run's own time for a driver whose work
    runs in short-lived subprocesses (a ``benchopt run`` per round), which a scan of the
    live processes would miss once they exit. Children still running are not included."""
    import resource

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return round(total * CLK_TCK)


def shares(a: tuple[CpuTimes, int], b: tuple[CpuTimes, int]) -> dict[str, float]:
    """``host_other_cpu_pct`` and ``host_steal_pct`` between readings ``a`` and ``b``.

    Each reading is ``(read_cpu_times(...), OwnTime.read())``. Other is clamped to
    [0, 100] (tick rounding can take it a little below 0); no elapsed tick gives ``{}``.

    :Examples:

    >>> shares((CpuTimes(100, 0, 200), 50), (CpuTimes(260, 10, 400), 130))
    {'host_other_cpu_pct': 40.0, 'host_steal_pct': 5.0}
    """
    (cpu_a, own_a), (cpu_b, own_b) = a, b
    total = cpu_b.total - cpu_a.total
    if total <= 0:
        return {}
    other = (cpu_b.busy - cpu_a.busy) - (own_b - own_a)
    return {
        "host_other_cpu_pct": min(100.0, max(0.0, other / total * 100.0)),
        "host_steal_pct": (cpu_b.steal - cpu_a.steal) / total * 100.0,
    }
