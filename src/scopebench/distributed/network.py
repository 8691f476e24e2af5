"""The network interface a launcher's ranks talk through: the one that reaches the rendezvous host.

gloo and NCCL pick the interface of their sockets themselves unless ``GLOO_SOCKET_IFNAME``
/ ``NCCL_SOCKET_IFNAME`` name one. gloo's own choice is the address this machine's host
name resolves to, often ``127.0.0.1`` (``/etc/hosts``) or an interface the other nodes
cannot reach (a management network, a container bridge): rank 0 then advertises an
address the other nodes' ranks cannot connect to, and the first collective hangs until
the group timeout. Under torchrun or SLURM, :func:`socket_interface_env` therefore names
the interface that holds this machine's source address towards the rendezvous host (the
first node of the job: the route every rank already uses to reach the store). A value
the user set wins; a host that cannot be resolved or routed leaves the choice to gloo
and NCCL.
"""

from __future__ import annotations

import os
import socket
import struct

__all__ = ["SOCKET_IFNAME_VARS", "interface_towards", "socket_interface_env"]

#: What gloo and NCCL read to choose their sockets' interface.
SOCKET_IFNAME_VARS = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
_SIOCGIFADDR = 0x8915  # Linux: the IPv4 address of an interface


def _interface_addr(name: str) -> str | None:
    import fcntl

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            packed = fcntl.ioctl(sock.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
        except OSError:  # no IPv4 address
            return None
    return socket.inet_ntoa(packed[20:24])


def interface_towards(host: str) -> str | None:
    """Name of this machine's interface whose address is the source of packets to ``host``.

    No packet is sent: a UDP socket is connected to pick the route. ``None`` when ``host``
    cannot be resolved or reached, or no interface holds that address (IPv4 only).

    :Examples:
        >>> interface_towards("127.0.0.1")
        'lo'
    """
    try:
        addr = socket.gethostbyname(host)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.connect((addr, 9))
            local = sock.getsockname()[0]
    except OSError:
        return None
    for _, name in socket.if_nameindex():
        if _interface_addr(name) == local:
            return name
    return None


def socket_interface_env(master_addr: str, environ: dict[str, str] | None = None) -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` to set for a group whose rendezvous is
    ``master_addr``: the interface that reaches it, for each variable not set already."""
    env = os.environ if environ is None else environ
    missing = [var for var in SOCKET_IFNAME_VARS if not env.get(var)]
    name = interface_towards(master_addr) if missing else None
    return {var: name for var in missing} if name else {}
