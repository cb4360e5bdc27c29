"""Which connections the Kafka listener keeps (pure bookkeeping: the listener passes the
time and does the closing).

Every accepted socket is counted from the moment it is accepted, before its TLS handshake
or its login:

- **per host**: at most ``per_host_max`` open connections from one address (Kafka's
  ``max.connections.per.ip``; ``per_host_overrides`` gives some addresses another number,
  as ``max.connections.per.ip.overrides``), and at most ``rate_per_host_max`` new ones a
  second (``connection_rate_per_host_max``, the gRPC listener's setting; 0: no limit).
  A connection past either is refused: closed at once.
- **per node**: at most ``connections_max``. At the cap, a new connection takes the place
  of the oldest connection that has not yet proved itself: one that has not logged in on
  a listener that asks for logins, or, on one that does not, has not had a request
  answered (a socket that connects and waits, or a TLS handshake that never ends). The
  new connection is refused only when every open connection has proved itself. So sockets
  that cost a stranger nothing can delay a real client by at most their own churn, never
  shut it out.

Refusals name the limit and its setting (``RefusedConnectionError``), for the listener's one
log line.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from headwater.node.security.host_rates import HostRates

CONNECTIONS_MAX_DEFAULT: Final = 4096
CONNECTIONS_PER_HOST_MAX_DEFAULT: Final = 1024


class RefusedConnectionError(Exception):
    """A new connection that is not kept: the message names the limit."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    connections_max: int = CONNECTIONS_MAX_DEFAULT
    per_host_max: int = CONNECTIONS_PER_HOST_MAX_DEFAULT
    per_host_overrides: Mapping[str, int] = field(default_factory=dict)
    rate_per_host_max: int = 0

    def host_max(self, host: str) -> int:
        return self.per_host_overrides.get(host, self.per_host_max)


class ConnectionAdmission:
    """The listener's open connections, by host and in order of arrival (see the module
    doc). A connection is known by an id the listener gives it; not thread-safe (the
    listener's event loop)."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0
        self._hosts: dict[int, str] = {}
        self._by_host: dict[str, int] = {}
        self._unproven: dict[int, None] = {}  # in order of arrival
        self._rates = HostRates(limits.rate_per_host_max) if limits.rate_per_host_max else None

    def open_from(self, host: str) -> int:
        return self._by_host.get(host, 0)

    @property
    def unproven(self) -> int:
        return len(self._unproven)

    def admit(self, connection: int, host: str, now_s: float) -> int | None:
        """Count ``connection`` from ``host`` as open and not proven; the connection whose
        place it takes (to be closed by the caller; already forgotten here), or None.
        RefusedConnectionError when it is not kept (nothing is counted)."""
        assert connection not in self._hosts, connection
        host_max = self.limits.host_max(host)
        held = self._by_host.get(host, 0)
        if held >= host_max:
            raise RefusedConnectionError(
                f"host {host} has {held} Kafka connections open, its limit "
                f"(kafka_connections_per_host_max {host_max})"
            )
        if self._rates is not None and self._rates.take(host, now_s) > 0:
            raise RefusedConnectionError(
                f"host {host} opened more than {self.limits.rate_per_host_max} connections "
                "this second (connection_rate_per_host_max)"
            )
        replaced = None
        if self.open >= self.limits.connections_max:
            if not self._unproven:
                raise RefusedConnectionError(
                    f"this node has {self.open} Kafka connections open, its limit "
                    "(kafka_connections_max), and every one has proved itself"
                )
            replaced = next(iter(self._unproven))
            self.close(replaced)
        self.open += 1
        self._hosts[connection] = host
        self._by_host[host] = self._by_host.get(host, 0) + 1  # the replaced may be its own
        self._unproven[connection] = None
        return replaced

    def prove(self, connection: int) -> None:
        """``connection`` has proved itself: it is no longer taken over at the cap."""
        self._unproven.pop(connection, None)

    def is_open(self, connection: int) -> bool:
        return connection in self._hosts

    def close(self, connection: int) -> None:
        """Forget ``connection`` (nothing when it is already forgotten)."""
        host = self._hosts.pop(connection, None)
        if host is None:
            return
        self.open -= 1
        self._unproven.pop(connection, None)
        left = self._by_host[host] - 1
        if left:
            self._by_host[host] = left
        else:
            del self._by_host[host]
