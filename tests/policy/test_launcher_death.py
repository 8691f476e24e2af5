"""A multi-rank ``scopebench train`` whose top-level process dies takes its ranks with it.

The top-level process starts the ranks itself (each in its own process group): SIGKILL on
it must still end the ranks (:mod:`scopebench.distributed.orphans`), SIGTERM is forwarded,
and neither its private folder nor a ``torchelastic_*`` folder is left in the temporary
directory.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "policy" / "tiny.yml")
#: Only limits a hang (start-up of two ranks on a loaded machine, or processes that never
#: end): never a measure of how fast anything is.
HANG_SEC = 600
GONE_SEC = 120


@pytest.fixture
def private_tmp(tmp_path):
    """A ``TMPDIR`` for the run alone: other jobs' torch elastic folders in ``/tmp`` do not
    count, and what this run leaves in its temporary directory is all that is there."""
    folder = tmp_path / "tmpdir"
    folder.mkdir()
    return folder


class _Run:
    """``scopebench train`` on 2 ranks in a subprocess, its output read by a thread (so the
    ranks never block on a full pipe, and waiting for a line has a bound)."""

    def __init__(self, robot_data, tmp_path: Path, tmpdir: Path, steps: int) -> None:
        self.output_dir = tmp_path / "run"
        command = [
            sys.executable, "-m", "scopebench.cli", "train", "--config", TINY,
            f"--dataset.cache_dir={robot_data[0].cache_dir}", "--nproc-per-node", "2",
            "--output_dir", str(self.output_dir), "--steps", str(steps), "--log_freq", "1",
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "TMPDIR": str(tmpdir)},
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._queue.put(line)
        self._queue.put(None)  # end of output: every holder of the pipe is gone

    def wait_for_line(self, prefix: str) -> None:
        deadline = time.monotonic() + HANG_SEC
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=deadline - time.monotonic())
            except queue.Empty:
                break
            if line is None:
                raise AssertionError(f"the run ended before {prefix!r}:\n" + self.log())
            self.lines.append(line)
            if line.startswith(prefix):
                return
        raise AssertionError(f"no {prefix!r} line within {HANG_SEC} s:\n" + self.log())

    def log(self) -> str:
        while True:
            try:
                line = self._queue.get_nowait()
            except queue.Empty:
                break
            if line is not None:
                self.lines.append(line)
        return "".join(self.lines)[-4000:]

    def descendants(self) -> list[psutil.Process]:
        """Both ranks (and whatever they started)."""
        found = psutil.Process(self.proc.pid).children(recursive=True)
        ranks = []
        for child in found:
            try:
                if "SCOPEBENCH_RANK" in child.environ() and "scopebench.cli" in " ".join(child.cmdline()):
                    ranks.append(child)
            except psutil.Error:
                continue
        assert len(ranks) == 2, (found, self.log())
        self.ranks = ranks
        return found


def _leftovers(tmpdir: Path) -> list[Path]:
    """Torch elastic's folders and the top-level process's private one (other libraries'
    caches, such as ``torchinductor_<user>``, may stay)."""
    return [*tmpdir.glob("torchelastic_*"), *tmpdir.glob("scopebench-train-*")]


def _alive(process: psutil.Process) -> bool:
    """Running, and the same process (``is_running`` compares start times: a reused pid is not)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(processes: list[psutil.Process], sent: float) -> float:
    """Seconds from ``sent`` until every process ended (a zombie counts as ended: its parent,
    dead or not, has yet to reap it); fails after :data:`GONE_SEC`."""
    deadline = sent + GONE_SEC
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in processes):
            return time.monotonic() - sent
        time.sleep(0.1)  # polling interval, not synchronisation: the loop waits for the event
    left = [p.pid for p in processes if _alive(p)]
    raise AssertionError(f"still running {GONE_SEC} s after the launcher's death: {left}")


def _kill_all(run: _Run, processes: list[psutil.Process]) -> None:
    """Whatever a failed test left behind (the ranks run in their own sessions)."""
    if run.proc.poll() is None:
        run.proc.kill()
    for process in processes:
        try:
            process.kill()
        except psutil.Error:
            pass
    run.proc.wait(timeout=GONE_SEC)


@pytest.mark.slow
def test_sigkill_of_the_top_level_process_ends_the_ranks(robot_data, tmp_path, private_tmp):
    run = _Run(robot_data, tmp_path, private_tmp, steps=100000)
    processes: list[psutil.Process] = []
    try:
        run.wait_for_line("step ")
        processes = run.descendants()
        run.proc.kill()
        sent = time.monotonic()
        run.proc.wait(timeout=GONE_SEC)  # reaped, as a shell would
        ranks = _wait_gone(run.ranks, sent)
        elapsed = _wait_gone(processes, sent)
        print(f"SIGKILL: ranks gone after {ranks:.1f} s, all descendants after {elapsed:.1f} s")
    finally:
        _kill_all(run, processes)
    assert not _leftovers(private_tmp), list(private_tmp.iterdir())  # the orphaned ranks removed it


@pytest.mark.slow
def test_sigterm_of_the_top_level_process_is_forwarded_and_it_exits(robot_data, tmp_path, private_tmp):
    run = _Run(robot_data, tmp_path, private_tmp, steps=100000)
    processes: list[psutil.Process] = []
    try:
        run.wait_for_line("step ")
        processes = run.descendants()
        run.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        code = run.proc.wait(timeout=GONE_SEC)
        elapsed = _wait_gone(processes, sent)
        print(f"SIGTERM: exit code {code}; ranks gone after {elapsed:.1f} s")
    finally:
        _kill_all(run, processes)
    assert code != 0, run.log()
    assert not _leftovers(private_tmp), list(private_tmp.iterdir())


@pytest.mark.slow
def test_a_two_rank_run_leaves_no_torchelastic_folder(robot_data, tmp_path, private_tmp):
    run = _Run(robot_data, tmp_path, private_tmp, steps=2)
    try:
        code = run.proc.wait(timeout=HANG_SEC)
    finally:
        if run.proc.poll() is None:
            run.proc.kill()
            run.proc.wait(timeout=GONE_SEC)
    assert code == 0, run.log()
    assert (run.output_dir / "checkpoints" / "000002").is_dir(), run.log()
    assert not list(private_tmp.rglob("torchelastic_*")), list(private_tmp.rglob("*"))
    assert not _leftovers(private_tmp), list(private_tmp.iterdir())


# The two mechanisms on their own, with plain Python processes (seconds, no torch run): a
# middle process starts the child under test and is SIGKILLed; the child's output, on a
# pipe this test reads, says what it did.

_MIDDLE = """
import subprocess, sys, time
from scopebench.distributed.orphans import launch_child_preexec
preexec = launch_child_preexec() if sys.argv[1] == "preexec" else None
env = {**__import__("os").environ, "RANK": "0", "WORLD_SIZE": "2"}
child = subprocess.Popen([sys.executable, "-c", sys.argv[2]], preexec_fn=preexec, env=env)
print(child.pid, flush=True)
time.sleep(3600)
"""
_SLEEPER = "import signal, sys, time; print('started', flush=True); time.sleep(3600)"
_RANK = (
    "import time; from scopebench.distributed.orphans import watch_launcher; "
    "assert watch_launcher() is not None; print('watching', flush=True); time.sleep(3600)"
)


def _middle(tmp_path: Path, mode: str, child: str) -> tuple[subprocess.Popen, psutil.Process, _Lines]:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    middle = subprocess.Popen(
        [sys.executable, "-c", _MIDDLE, mode, child],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    lines = _Lines(middle.stdout)
    return middle, psutil.Process(int(lines.next())), lines


class _Lines:
    """The lines of a pipe, each waited for with a bound (a hang fails, a slow start does not)."""

    def __init__(self, stream) -> None:
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=lambda: [*map(self._queue.put, stream), self._queue.put(None)], daemon=True).start()

    def next(self) -> str:
        line = self._queue.get(timeout=GONE_SEC)
        assert line is not None, "the pipe closed"
        return line.strip()

    def rest(self) -> str:
        out = []
        while (line := self._queue.get(timeout=GONE_SEC)) is not None:
            out.append(line)
        return "".join(out)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_launch_child_gets_sigterm_when_its_parent_is_killed(tmp_path):
    middle, child, lines = _middle(tmp_path, "preexec", _SLEEPER)
    try:
        assert lines.next() == "started"
        assert os.getpgid(child.pid) == child.pid  # its own process group
        middle.kill()
        middle.wait(timeout=GONE_SEC)
        _wait_gone([child], time.monotonic())
        assert lines.rest() == ""  # the pipe closed: nothing else held it
    finally:
        for process in (middle, child):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                process.kill()


def test_a_rank_ends_when_its_launcher_dies(tmp_path):
    middle, child, lines = _middle(tmp_path, "plain", _RANK)
    try:
        assert lines.next() == "watching"
        middle.kill()
        middle.wait(timeout=GONE_SEC)
        said = lines.rest()  # until the child closed the pipe: it ended
        assert "rank 0: its launcher (the torch elastic agent, pid" in said and "ending this rank" in said, said
        _wait_gone([child], time.monotonic())  # the pipe closes just before the process ends
    finally:
        for process in (middle, child):
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                process.kill()


def test_no_watch_outside_a_launched_rank(monkeypatch):
    from scopebench.distributed.orphans import watch_launcher

    for name in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SCOPEBENCH_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert watch_launcher() is None
