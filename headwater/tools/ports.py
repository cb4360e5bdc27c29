"""Loopback ports for local clusters (benchmarks, tests) that nothing else will take.

Ports come from below the kernel's ephemeral range (32768-60999 by default), where
outgoing connections take their local ports: a port picked there and released could be
taken by one of the nodes' own connections before the node binds it. A cluster picks all
its ports before any node binds, so a port is never handed out twice by one process.
"""

from __future__ import annotations

import os
import random
import socket
from typing import Final

PORT_LOW: Final = 20_000
PORT_HIGH: Final = 32_000
_ports: Final = random.Random(os.getpid())
_handed_out: Final[set[int]] = set()


class NoFreePortError(RuntimeError):
    pass


def _bindable(ports: range) -> bool:
    sockets = [socket.socket() for _ in ports]
    try:
        for sock, port in zip(sockets, ports, strict=True):
            sock.bind(("127.0.0.1", port))
    except OSError:
        return False
    finally:
        for sock in sockets:
            sock.close()
    return True


def free_port_block(count: int) -> int:
    """The first of ``count`` consecutive ports that were free a moment ago."""
    for _ in range(1000):
        base = _ports.randrange(PORT_LOW, PORT_HIGH - count)
        block = range(base, base + count)
        if any(port in _handed_out for port in block) or not _bindable(block):
            continue
        _handed_out.update(block)
        return base
    raise NoFreePortError(f"no {count} consecutive free ports in [{PORT_LOW}, {PORT_HIGH})")


def free_port() -> int:
    """One port that was free a moment ago."""
    return free_port_block(1)
