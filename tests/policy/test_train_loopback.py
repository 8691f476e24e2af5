"""A multi-rank ``scopebench train`` listens on the loopback interface only (issue 24).

It used to relaunch itself through ``accelerate launch``, whose torch elastic store listened
on every interface (``*:port``), unauthenticated. Now the command starts its ranks itself
(a file store in a private folder): while a 2-rank run trains, every listening TCP socket of
its process tree (the ranks' gloo sockets) must be bound to 127.0.0.1 or ::1.
"""

from __future__ import annotations

import ipaddress
import signal
import time

import psutil
import pytest

from .test_launcher_death import GONE_SEC, _kill_all, _Run, _wait_gone


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip.split("%", 1)[0])
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1
    return (mapped or address).is_loopback


def _listening(processes: list[psutil.Process]) -> list[tuple[int, str, int]]:
    """``(pid, address, port)`` of every listening TCP socket (IPv4 and IPv6) of ``processes``."""
    out = []
    for process in processes:
        for conn in process.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                out.append((process.pid, conn.laddr.ip, conn.laddr.port))
    return out


def test_the_loopback_check_itself():
    assert _loopback("127.0.0.1") and _loopback("::1") and _loopback("::ffff:127.0.0.1")
    assert not _loopback("0.0.0.0") and not _loopback("::") and not _loopback("192.0.2.2")


@pytest.mark.slow
def test_a_two_rank_train_listens_on_loopback_only(robot_data, tmp_path):
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    # many steps: the run is still training (its group, hence its sockets, alive) long after
    # the first step line, the event this test waits for; it is stopped afterwards
    run = _Run(robot_data, tmp_path, tmpdir, steps=100000)
    processes: list[psutil.Process] = []
    try:
        run.wait_for_line("step ")  # both ranks joined the group and finished a step
        processes = run.descendants()  # asserts that the two ranks are there
        top = psutil.Process(run.proc.pid)
        sockets = _listening([top, *processes])
        assert run.proc.poll() is None, run.log()  # the listing was taken while it ran
        # the ranks' gloo pairs listen (the listing sees them), and nothing on another interface
        assert {pid for pid, _, _ in sockets} >= {rank.pid for rank in run.ranks}, (sockets, run.log())
        exposed = [s for s in sockets if not _loopback(s[1])]
        assert not exposed, f"listening beyond loopback: {exposed}"
        assert not [s for s in sockets if s[0] == top.pid], sockets  # the launcher itself: nothing
        run.proc.send_signal(signal.SIGTERM)
        run.proc.wait(timeout=GONE_SEC)
        _wait_gone(processes, time.monotonic())
    finally:
        _kill_all(run, processes)
