"""Ranks that outlive their launcher: how a multi-rank ``scopebench train`` ends them.

A multi-rank ``scopebench train`` is two generations of processes: the top-level command
(the one the user, a shell, ``timeout`` or the OOM killer sees), which launches the ranks
itself (:class:`scopebench.distributed.spawn.LocalSpawn` in launcher mode: a file store in a
private folder, nothing listening on the network), and the ranks, each in its own process
group (so that a Ctrl-C on the terminal reaches the top-level process only, which forwards it
once). Ranks started by hand (``torchrun``, ``accelerate launch``) are three generations: the
launcher runs torch elastic's agent, which starts the ranks in new sessions. Three mechanisms
end the ranks when the top-level process goes:

* SIGTERM and SIGINT sent to the top-level process are forwarded to the ranks
  (:func:`forwarding_signals`), which stop; the ones still running after 30 s are killed
  (:meth:`~scopebench.distributed.spawn.LocalSpawn.supervise`).
* On Linux a launch child (such as ``accelerate launch`` started by hand through a wrapper)
  can ask the kernel for SIGTERM when the top-level process dies (``prctl(PR_SET_PDEATHSIG)``,
  :func:`launch_child_preexec`). Ranks the top-level process spawned do not: their watch
  (below) ends them and removes the private folder, which a SIGTERM would skip.
* Each rank watches its launcher (:func:`watch_launcher`): when its parent (the top-level
  ``scopebench train``, or the torch elastic agent) or the top-level process is gone, or the
  lifeline pipe of a spawned rank reads end-of-file, it prints one line and leaves with
  ``os._exit``.

Bound: **ranks end within 5 s of their launcher's death** (of the top-level process or of
the agent), whichever way it died: the watch polls every :data:`POLL_SEC` seconds and then
exits at once, without waiting for the rank's main thread.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import threading
from collections.abc import Callable, Iterator

__all__ = [
    "LAUNCHER_PID_ENV",
    "LAUNCH_DIR_ENV",
    "ORPHANED_STATUS",
    "POLL_SEC",
    "forwarding_signals",
    "launch_child_preexec",
    "watch_launcher",
]

#: The pid of the top-level ``scopebench train``, handed to its ranks (a spawned rank with it
#: is a rank of ``scopebench train``, which :func:`watch_launcher` watches).
LAUNCHER_PID_ENV = "SCOPEBENCH_TRAIN_LAUNCHER_PID"
#: The top-level process's private folder (the file store's), handed to its ranks:
#: an orphaned rank removes it, as the dead top-level process no longer can.
LAUNCH_DIR_ENV = "SCOPEBENCH_TRAIN_LAUNCH_DIR"
#: Exit status of a rank whose launcher died (as a locally spawned worker whose rank 0 died).
ORPHANED_STATUS = 3
#: Seconds between two looks at the launchers.
POLL_SEC = 0.5

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_FORWARDED = (signal.SIGTERM, signal.SIGINT)
_watching = False


def launch_child_preexec(death_signal: int | None = signal.SIGTERM) -> Callable[[], None]:
    """The ``preexec_fn`` of the launch child: its own process group, and on Linux
    ``death_signal`` when this process dies.

    Its own process group: a Ctrl-C on the terminal then reaches the top-level process only,
    which forwards it once (:func:`forwarding_signals`); the agent would otherwise get it
    twice, and a second signal interrupts its shutdown of the ranks. ``PR_SET_PDEATHSIG``
    fires when the *thread* that started the child ends: the caller starts the child and
    waits for it on the same thread. The C function is looked up here, before the fork, so
    the child between fork and exec only calls it. A top-level process that died before
    the call is caught by comparing the parent's pid afterwards.

    Args:
        death_signal: The signal the child gets when this process dies; ``None``: none (a
            spawned rank, whose :func:`watch_launcher` ends it and removes the private folder).

    Returns:
        The function to pass as ``preexec_fn``.
    """
    prctl = _libc_prctl()
    parent = os.getpid()

    def preexec() -> None:
        os.setpgid(0, 0)
        if prctl is not None and death_signal is not None:
            prctl(_PR_SET_PDEATHSIG, int(death_signal), 0, 0, 0)
            if os.getppid() != parent:  # the top-level process died before the call
                os._exit(128 + int(death_signal))

    return preexec


def _libc_prctl():
    """libc's ``prctl`` (Linux), else ``None``."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    return prctl


@contextlib.contextmanager
def forwarding_signals(child) -> Iterator[None]:
    """SIGTERM and SIGINT received by this process go to ``child`` while the block runs; the
    previous handlers are restored after it.

    This process keeps waiting for the ranks, whose exit code is the run's: they stop, and
    their failure report still reaches the terminal. Off the main thread (where Python
    allows no handler) nothing is forwarded.

    Args:
        child: What has a ``send_signal(signum)``: a ``subprocess.Popen`` (a launch child), or
            the :class:`~scopebench.distributed.spawn.LocalSpawn` of the ranks (all of them).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def forward(signum, frame):
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def watch_launcher() -> threading.Thread | None:
    """In a rank of a multi-rank ``scopebench train`` (spawned by it, or started by torchrun or
    ``accelerate launch``): a daemon thread that ends the rank when its launcher dies;
    ``None`` (and nothing started) in any other process.

    Every :data:`POLL_SEC` seconds it compares ``os.getppid()`` with the parent at start (the
    top-level ``scopebench train``, or the torch elastic agent: a rank whose parent died is
    reparented) and, when the top-level ``scopebench train`` named its pid
    (:data:`LAUNCHER_PID_ENV`), checks that it still runs; a spawned rank also waits on its
    lifeline pipe, which reads end-of-file as soon as the top-level process is gone. Then it
    removes the top-level process's private folder, prints one line and leaves with
    ``os._exit(ORPHANED_STATUS)``.

    A thread rather than ``PR_SET_PDEATHSIG`` on the rank alone: the death signal fires when
    the *thread* that started the rank ends, not the process; a signal only becomes
    ``SystemExit`` once the rank's main thread is back in Python (it may sit in a collective
    up to ``group_timeout_sec``, or in rank 0's failure report, which SIGTERM waits for:
    ``scopebench.commands.train``); it is Linux-only; and under torchrun it does not see the
    top-level process, only the agent. The watch sees both, on any POSIX system, and ends the
    rank whatever its main thread is doing.

    Returns:
        The watching thread; ``None`` outside a launched rank, or when already watching.
    """
    global _watching
    from scopebench.distributed.info import SPAWN_ENV, get_dist_info

    try:
        info = get_dist_info()
    except ValueError:  # a malformed launcher environment: the command reports it
        return None
    launcher = _int_from_env(LAUNCHER_PID_ENV)
    spawned = info.source == "spawn" and launcher is not None  # a rank scopebench train started
    if not (info.source == "torchrun" or spawned) or _watching:
        return None
    _watching = True
    parent = os.getppid()
    lifeline = _int_from_env(SPAWN_ENV["lifeline"]) if spawned else None
    stop = threading.Event()  # never set: its wait is the poll interval
    who = f"the scopebench train, pid {parent}" if spawned else f"the torch elastic agent, pid {parent}"

    def wait() -> None:
        if lifeline is None:
            stop.wait(POLL_SEC)
            return
        import select

        try:
            if select.select([lifeline], [], [], POLL_SEC)[0]:
                _leave(info.rank, f"its launcher ({who}) died")
        except (OSError, ValueError):  # not a pipe after all: poll the pids only
            stop.wait(POLL_SEC)

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                _leave(info.rank, f"its launcher ({who}) died")
            if launcher is not None and not _running(launcher):
                _leave(info.rank, f"the scopebench train that launched it (pid {launcher}) died")
            wait()

    thread = threading.Thread(target=watch, name="scopebench-launcher-watch", daemon=True)
    thread.start()
    return thread


def _int_from_env(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def _running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (dead, not yet reaped) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process holds the pid: ours is gone
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            # "pid (comm) state ...": comm may hold spaces and parentheses
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc (not Linux), or it just ended
        return _running_without_proc(pid)


def _running_without_proc(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _leave(rank: int, why: str) -> None:
    folder = os.environ.get(LAUNCH_DIR_ENV)
    if folder:
        shutil.rmtree(folder, ignore_errors=True)
    with contextlib.suppress(OSError, ValueError):  # the terminal or pipe may be gone too
        sys.stdout.flush()
        print(f"scopebench train: rank {rank}: {why}; ending this rank", file=sys.stderr, flush=True)
    os._exit(ORPHANED_STATUS)
