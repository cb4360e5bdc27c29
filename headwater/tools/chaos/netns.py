"""Network namespaces for a chaos run: each node in its own, all joined by a bridge.

What ``create`` makes, for a run whose prefix is ``hwchaos-<pid>`` (the runner's process
id) and nodes 1..n, and ``destroy`` removes (also after a failure or Ctrl-C):

- namespace ``<prefix>-hub``: ``lo`` up and a bridge ``hwbr0`` holding ``10.231.0.1/24``.
  The runner's workload (producers, consumers, metadata calls) runs in this namespace.
- namespace ``<prefix>-n<i>`` per node: ``lo`` up and ``hw0`` holding ``10.231.0.<10+i>/24``,
  one end of a veth pair whose other end, ``hwn<i>``, is a port of the bridge.

Nothing is created in the machine's own (root) namespace: every link is made inside the
namespaces (``ip link add ... netns``), so deleting the namespaces removes every link,
address and rule, and the addresses are reachable only from inside them. The nodes
listen on their namespace's address; node-to-node traffic and client traffic cross the
bridge.

Partitions are iptables rules in a node's namespace that drop what arrives from another
node (``INPUT -s <ip> -j DROP``, as Jepsen does); healing flushes those rules. The hub's
address (the clients) is never cut.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN), ``ip`` (iproute2) and ``iptables``;
``unavailable_reason`` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from typing import Final

SUBNET_PREFIX: Final = "10.231.0."
HUB_HOST: Final = 1
NODE_HOST_BASE: Final = 10
COMMAND_TIMEOUT_S: Final = 20.0


class NetnsError(RuntimeError):
    """A namespace command failed (the message holds the command and its stderr)."""


@dataclass(frozen=True, slots=True)
class Topology:
    prefix: str
    node_ids: tuple[int, ...]

    @property
    def hub(self) -> str:
        return f"{self.prefix}-hub"

    def namespace(self, node_id: int) -> str:
        return f"{self.prefix}-n{node_id}"

    def namespaces(self) -> list[str]:
        return [self.hub, *(self.namespace(i) for i in self.node_ids)]

    def ip(self, node_id: int) -> str:
        return f"{SUBNET_PREFIX}{NODE_HOST_BASE + node_id}"

    @property
    def hub_ip(self) -> str:
        return f"{SUBNET_PREFIX}{HUB_HOST}"

    def exec_prefix(self, namespace: str) -> list[str]:
        """The command prefix that runs a program inside ``namespace`` (it execs: the
        program keeps the process id of the ``ip`` command started)."""
        return ["ip", "netns", "exec", namespace]


def topology_for(pid: int, node_ids: tuple[int, ...]) -> Topology:
    assert all(0 < i < 255 - NODE_HOST_BASE for i in node_ids)
    return Topology(f"hwchaos-{pid}", node_ids)


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they probably can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "not running as root (network namespaces need CAP_NET_ADMIN)"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"no {tool!r} command"
    return None


def _run(*command: str) -> str:
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise NetnsError(f"{' '.join(command)}: {exc}") from None
    if done.returncode != 0:
        raise NetnsError(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def create(topology: Topology) -> None:
    """Make the namespaces, bridge, links and addresses; on failure (NetnsError) or
    interruption remove what was made and re-raise."""
    hub = topology.hub
    try:
        _run("ip", "netns", "add", hub)
        _run("ip", "-n", hub, "link", "set", "lo", "up")
        _run("ip", "-n", hub, "link", "add", "hwbr0", "type", "bridge")
        _run("ip", "-n", hub, "addr", "add", f"{topology.hub_ip}/24", "dev", "hwbr0")
        _run("ip", "-n", hub, "link", "set", "hwbr0", "up")
        for node_id in topology.node_ids:
            ns = topology.namespace(node_id)
            port = f"hwn{node_id}"
            _run("ip", "netns", "add", ns)
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run(
                "ip", "-n", hub, "link", "add", port, "type", "veth", "peer", "name", "hw0",
                "netns", ns,
            )  # fmt: skip
            _run("ip", "-n", hub, "link", "set", port, "master", "hwbr0")
            _run("ip", "-n", hub, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{topology.ip(node_id)}/24", "dev", "hw0")
            _run("ip", "-n", ns, "link", "set", "hw0", "up")
    except BaseException:  # NetnsError, or Ctrl-C half way
        destroy(topology)
        raise


def existing(topology: Topology) -> list[str]:
    """Those of the topology's namespaces that exist now."""
    try:
        listed = _run("ip", "netns", "list")
    except NetnsError:
        return []
    present = {line.split()[0] for line in listed.splitlines() if line.strip()}
    return [ns for ns in topology.namespaces() if ns in present]


def destroy(topology: Topology) -> list[str]:
    """Kill any process still inside the topology's namespaces (by process id: only this
    run starts processes there), then delete the namespaces, which removes their links,
    addresses and rules. Returns what it did, one line per step, for the run's output."""
    done: list[str] = []
    for ns in existing(topology):
        try:
            pids = [int(p) for p in _run("ip", "netns", "pids", ns).split()]
        except (NetnsError, ValueError):
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                done.append(f"killed process {pid} left in {ns}")
            except ProcessLookupError:
                pass
        try:
            _run("ip", "netns", "del", ns)
            done.append(f"deleted namespace {ns}")
        except NetnsError as exc:
            done.append(f"could not delete namespace {ns}: {exc}")
    return done


def drop_from(topology: Topology, receiver: int, sender: int) -> None:
    """``receiver`` drops every packet from ``sender`` (one direction of a link)."""
    _run(
        *topology.exec_prefix(topology.namespace(receiver)),
        "iptables",
        "-w",
        "-A",
        "INPUT",
        "-s",
        topology.ip(sender),
        "-j",
        "DROP",
    )


def cut(topology: Topology, side_a: tuple[int, ...], side_b: tuple[int, ...]) -> None:
    """No packet crosses between any node of ``side_a`` and any node of ``side_b``."""
    for a in side_a:
        for b in side_b:
            drop_from(topology, a, b)
            drop_from(topology, b, a)


def cut_port(topology: Topology, node_id: int, port: int, peer: int | None = None) -> None:
    """``node_id`` neither sends nor receives TCP to or from ``port``, on its side or the
    other's, with ``peer`` (None: with any address): one service cut off (the Raft
    transport, say, or the inter-broker listener between two nodes) while every other
    connection of the node works."""
    prefix = topology.exec_prefix(topology.namespace(node_id))
    for chain, address in (("INPUT", "-s"), ("OUTPUT", "-d")):
        only = [address, topology.ip(peer)] if peer is not None else []
        for side in ("--dport", "--sport"):
            _run(
                *prefix,
                "iptables",
                "-w",
                "-A",
                chain,
                *only,
                "-p",
                "tcp",
                side,
                str(port),
                "-j",
                "DROP",
            )


def heal(topology: Topology) -> None:
    """Remove every rule from every node namespace."""
    for node_id in topology.node_ids:
        _run(*topology.exec_prefix(topology.namespace(node_id)), "iptables", "-w", "-F")
