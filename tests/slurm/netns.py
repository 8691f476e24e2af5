"""Network namespaces for the test cluster's nodes: one bridge, one veth pair and one address per node.

Each node of a two-node test cluster lives in its own network namespace (``ip netns``),
linked to a bridge on this host by a veth pair: its ``slurmd`` and the job steps it starts
see only their own loopback and their end of the pair, so a rank on node 2 reaches rank 0
on node 1 only over the bridge. The addresses live in a private /24 (:data:`SUBNET`) on
links created here and removed by :meth:`Network.remove`; nothing is routed off the
machine (no default route in a namespace, no forwarding set up).

Programs enter a node's namespace with ``nsenter --net`` (:meth:`Network.exec_prefix`),
which changes the network only: ``ip netns exec`` would also remount ``/sys``, hiding the
cgroup file system slurmd insists on. Node names resolve through lines this module adds
to ``/etc/hosts``, each marked with :data:`HOSTS_MARK` and removed with the network (the
file is rewritten in place: in a container it is often a bind mount).

Every name created here starts with :data:`PREFIX`, so that :func:`remove_stale` can clear
what a killed session left behind.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "HOSTS",
    "HOSTS_MARK",
    "PREFIX",
    "SUBNET",
    "Network",
    "NodeLink",
    "missing_network_prerequisites",
    "remove_stale",
]

#: Start of every namespace, bridge and veth name created here (interface names: 15 chars at most).
PREFIX = "sbslurm"
#: The private network of the nodes: the bridge takes .1, node ``i`` (1-based) takes ``.i+1``.
SUBNET = ipaddress.ip_network("10.231.47.0/24")
HOSTS = Path("/etc/hosts")
#: End of every line this module adds to :data:`HOSTS`.
HOSTS_MARK = "# scopebench test cluster"


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    cmd = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=30)
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def missing_network_prerequisites() -> list[str]:
    """What this machine lacks to create the nodes' namespaces (empty when it can)."""
    missing = []
    if shutil.which("ip") is None and shutil.which("ip", path="/usr/sbin:/sbin:/bin") is None:
        missing.append("ip (Debian's iproute2)")
    if shutil.which("nsenter") is None:
        missing.append("nsenter (Debian's util-linux)")
    if os.geteuid() != 0 or not _has_net_admin():
        missing.append("root with CAP_NET_ADMIN (network namespaces, veth links and a bridge need it)")
    return missing


def _has_net_admin() -> bool:
    """Whether this process holds CAP_NET_ADMIN (bit 12 of ``CapEff`` in ``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return bool(int(line.split()[1], 16) >> 12 & 1)
    return False


@dataclass(frozen=True)
class NodeLink:
    """One node's end of the network."""

    name: str
    """The node's SLURM name (also its namespace's name)."""
    addr: str
    """Its address on the bridge."""
    netns: str
    """Its network namespace."""
    host_veth: str
    """The host's end of its veth pair (on the bridge); set it down to cut the node off."""
    node_veth: str
    """The namespace's end (the interface its ranks talk through)."""


@dataclass
class Network:
    """A bridge on this host and one namespace per node; :meth:`remove` undoes all of it."""

    bridge: str
    bridge_addr: str
    nodes: list[NodeLink] = field(default_factory=list)
    _created: list[tuple[str, str]] = field(default_factory=list)
    """``("link"|"netns", name)`` in creation order (removed in reverse)."""

    @classmethod
    def create(cls, node_names: list[str]) -> Network:
        """The bridge, then each node's namespace, veth pair, address and hosts file.

        Raises:
            RuntimeError: the subnet is already in use here, or an ``ip`` command failed
                (with its message); what was created so far is removed first.
        """
        hosts = list(SUBNET.hosts())
        used = _ip("-4", "-o", "addr", "show").stdout
        if any(str(addr) in used.split() or f"{addr}/" in used for addr in hosts[: len(node_names) + 1]):
            raise RuntimeError(f"the test cluster's subnet {SUBNET} is already in use on this machine:\n{used}")
        net = cls(bridge=f"{PREFIX}br", bridge_addr=str(hosts[0]))
        probe = _ip("link", "add", net.bridge, "type", "bridge", check=False)
        if probe.returncode != 0:
            raise RuntimeError(
                f"cannot create the test cluster's network ({probe.stderr.strip()}): a bridge, veth links and "
                "network namespaces need root with CAP_NET_ADMIN (.ci/run runs as root)"
            )
        try:
            net._created.append(("link", net.bridge))
            _ip("addr", "add", f"{net.bridge_addr}/{SUBNET.prefixlen}", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
            for i, name in enumerate(node_names, start=1):
                net.nodes.append(net._add_node(name, str(hosts[i]), i))
            _edit_hosts([f"{node.addr} {node.name} {HOSTS_MARK}" for node in net.nodes])
            net._created.insert(0, ("hosts", ""))
        except BaseException:
            net.remove()
            raise
        return net

    def _add_node(self, name: str, addr: str, i: int) -> NodeLink:
        node = NodeLink(name=name, addr=addr, netns=name, host_veth=f"{PREFIX}h{i}", node_veth=f"{PREFIX}n{i}")
        _ip("netns", "add", node.netns)
        self._created.append(("netns", node.netns))
        _ip("link", "add", node.host_veth, "type", "veth", "peer", "name", node.node_veth)
        self._created.append(("link", node.host_veth))
        _ip("link", "set", node.node_veth, "netns", node.netns)
        _ip("link", "set", node.host_veth, "master", self.bridge)
        _ip("link", "set", node.host_veth, "up")
        _ip("addr", "add", f"{addr}/{SUBNET.prefixlen}", "dev", node.node_veth, netns=node.netns)
        _ip("link", "set", node.node_veth, "up", netns=node.netns)
        _ip("link", "set", "lo", "up", netns=node.netns)
        return node

    def node(self, name: str) -> NodeLink:
        (found,) = [node for node in self.nodes if node.name == name]
        return found

    def set_link(self, name: str, up: bool) -> None:
        """Cut a node off the bridge (``up=False``: its host-side link down) or reconnect it."""
        _ip("link", "set", self.node(name).host_veth, "up" if up else "down")

    def exec_prefix(self, name: str) -> list[str]:
        """The command prefix that runs a program inside a node's namespace (its network only)."""
        return ["nsenter", f"--net=/run/netns/{self.node(name).netns}"]

    def remove(self) -> None:
        """Delete the namespaces, links and host names created (each step tried even if one fails)."""
        for kind, name in reversed(self._created):
            if kind == "netns":
                _ip("netns", "del", name, check=False)
            elif kind == "link":
                _ip("link", "del", name, check=False)
            else:
                _edit_hosts([])
        self._created.clear()


def _edit_hosts(add: list[str]) -> None:
    """Drop the lines marked :data:`HOSTS_MARK` from :data:`HOSTS`, then append ``add`` (rewritten in place)."""
    kept = [line for line in HOSTS.read_text().splitlines() if not line.endswith(HOSTS_MARK)]
    with open(HOSTS, "r+") as fh:
        fh.write("\n".join([*kept, *add, ""]))
        fh.truncate()


def remove_stale() -> None:
    """Remove namespaces, links and hosts files named :data:`PREFIX`… (call holding the cluster lock)."""
    if missing_network_prerequisites():
        return
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        if name.startswith(PREFIX):
            _ip("netns", "del", name, check=False)
    for line in _ip("-o", "link", "show", check=False).stdout.splitlines():
        parts = line.split(":")
        if len(parts) > 1 and (name := parts[1].strip().split("@")[0]).startswith(PREFIX):
            _ip("link", "del", name, check=False)
    if HOSTS_MARK in HOSTS.read_text():
        _edit_hosts([])
