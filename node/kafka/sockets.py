"""The Kafka listener's sockets: binding, accepting, counting and the TLS handshake, before
any request is read.

Every socket is counted from its accept (``ConnectionAdmission``: per host, per second,
per node, the oldest connection that has not proved itself giving way at the node's cap)
and costs the node, until its client speaks, a socket and a waiting task: on a TLS
listener the handshake starts only once the client's first bytes (its ClientHello) have
arrived, so a socket that connects and says nothing holds no TLS state. The handshake must
end within ``TLS_HANDSHAKE_TIMEOUT_S`` of the accept. asyncio's TLS reads through a
buffer of its own per connection, 256 KiB by default; ``TLS_READ_BUFFER_BYTES`` (32 KiB,
two TLS records) is used instead, so a connection holds a fraction of that.

``Sockets.serve(handler)`` calls ``handler(connection_id, host, reader, writer)`` once
per connection that is kept and, with TLS, has completed its handshake; the handler
returns when the connection is done, and the socket is then closed and uncounted.
``close`` stops accepting and cancels every handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import socket
import ssl
import struct
import time
from asyncio import sslproto
from collections.abc import Awaitable, Callable
from typing import Final

from headwater.node.kafka.admission import ConnectionAdmission, RefusedConnectionError
from headwater.shared.acls import normalize_host
from headwater.shared.errors import HeadwaterError
from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)
_LINGER_NONE: Final = struct.pack("ii", 1, 0)
"""SO_LINGER on, for 0 s: close sends a reset and drops the unsent bytes."""
_refusals = LogEvery(_log, 10.0)
TLS_HANDSHAKE_TIMEOUT_S: Final = 10.0
TLS_READ_BUFFER_BYTES: Final = 32 << 10
BACKLOG: Final = 1024
STREAM_BUFFER_BYTES: Final = 64 << 10
"""A connection's read buffer: asyncio stops reading its socket past twice this."""
ACCEPT_RETRY_S: Final = 0.1

Handler = Callable[[int, str, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Sockets:
    """One listener's sockets (see the module doc). Used on one event loop."""

    def __init__(
        self,
        admission: ConnectionAdmission,
        tls: ssl.SSLContext | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.admission = admission
        self.tls = tls
        self.clock = clock
        self._listening: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._connections: dict[int, asyncio.Task[None]] = {}
        self._unowned: dict[int, socket.socket] = {}
        """Accepted sockets no transport has taken yet (closed here when their task ends)."""
        self._ids = itertools.count(1)
        self._closing = False
        if tls is not None:
            # asyncio reads TLS through a buffer of this size per connection (a class
            # attribute of its TLS protocol; the node has no other asyncio TLS).
            sslproto.SSLProtocol.max_size = TLS_READ_BUFFER_BYTES

    @property
    def open(self) -> int:
        return len(self._connections)

    async def bind(self, host: str, port: int) -> int:
        """Bind ``host:port`` on every address it names (as asyncio's servers do); the
        port bound (``port`` 0: one the system picks, the same on every address)."""
        loop = asyncio.get_running_loop()
        found = await loop.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        seen: set[tuple[int, object]] = set()
        try:
            for family, kind, proto, _name, address in found:
                if (family, address) in seen:
                    continue
                seen.add((family, address))
                listening = socket.socket(family, kind, proto)
                self._listening.append(listening)
                listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    listening.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                if port == 0 and len(self._listening) > 1:  # the first address's port
                    listening.bind((address[0], self._listening[0].getsockname()[1], *address[2:]))
                else:
                    listening.bind(address)
                listening.listen(BACKLOG)
                listening.setblocking(False)
        except OSError:
            self._close_listening()
            raise
        bound: int = self._listening[0].getsockname()[1]
        return bound

    def serve(self, handler: Handler) -> None:
        """Accept on every bound address, calling ``handler`` for each connection."""
        loop = asyncio.get_running_loop()
        self._accepting = [
            loop.create_task(self._accept(listening, handler)) for listening in self._listening
        ]

    async def close(self) -> None:
        """Stop accepting and end every connection now."""
        self._closing = True
        for task in self._accepting:
            task.cancel()
        self._close_listening()
        tasks = list(self._connections.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)

    def _close_listening(self) -> None:
        for listening in self._listening:
            listening.close()
        self._listening = []

    async def _accept(self, listening: socket.socket, handler: Handler) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                accepted, address = await loop.sock_accept(listening)
            except OSError as error:  # out of file descriptors, or the like: try again
                _refusals.log("the Kafka listener cannot accept: %s", error)
                await asyncio.sleep(ACCEPT_RETRY_S)
                continue
            self._admit(accepted, _host_of(address), handler)

    def _admit(self, accepted: socket.socket, host: str, handler: Handler) -> None:
        connection = next(self._ids)
        try:
            replaced = self.admission.admit(connection, host, self.clock())
        except RefusedConnectionError as refused:
            _refusals.log("refused a Kafka connection from %s: %s", host, refused.message)
            accepted.close()
            return
        if replaced is not None:
            task = self._connections.get(replaced)
            if task is not None:
                task.cancel()
        accepted.setblocking(False)
        self._unowned[connection] = accepted
        task = asyncio.get_running_loop().create_task(
            self._serve(connection, accepted, host, handler)
        )
        self._connections[connection] = task
        task.add_done_callback(functools.partial(self._forget, connection))

    def _forget(self, connection: int, _task: object) -> None:
        """The connection's task ended, or was cancelled before it ran: uncount it, and
        close its socket if no transport took it."""
        self.admission.close(connection)
        self._connections.pop(connection, None)
        unowned = self._unowned.pop(connection, None)
        if unowned is not None:
            unowned.close()

    async def _serve(
        self, connection: int, accepted: socket.socket, host: str, handler: Handler
    ) -> None:
        writer: asyncio.StreamWriter | None = None
        try:
            streams = await self._streams(accepted)
            if streams is None:
                return
            reader, writer = streams
            self._unowned.pop(connection, None)  # its transport closes it
            await handler(connection, host, reader, writer)
        except asyncio.CancelledError:
            if not self._closing and self.admission.is_open(connection):
                raise
        except Exception:
            _log.exception("a Kafka connection from %s failed", host)
        finally:
            if writer is not None:
                if writer.transport.get_write_buffer_size():
                    reset(writer.transport)  # its client takes nothing: close() would wait
                else:
                    writer.close()

    async def _streams(
        self, accepted: socket.socket
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
        """The connection's streams, after its TLS handshake when the listener has TLS;
        None when the handshake did not complete in time or failed."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=STREAM_BUFFER_BYTES, loop=loop)
        stream = asyncio.StreamReaderProtocol(reader, loop=loop)
        if self.tls is None:
            transport, _ = await loop.connect_accepted_socket(lambda: stream, accepted)
            return reader, asyncio.StreamWriter(transport, stream, reader, loop)
        deadline = loop.time() + TLS_HANDSHAKE_TIMEOUT_S
        try:
            async with asyncio.timeout_at(deadline):
                await _readable(accepted)
                transport, _ = await loop.connect_accepted_socket(
                    lambda: stream,
                    accepted,
                    ssl=self.tls,
                    ssl_handshake_timeout=max(0.1, deadline - loop.time()),
                )
        except (TimeoutError, ssl.SSLError, ConnectionError, OSError) as failed:
            _refusals.log(
                "a TLS handshake on the Kafka listener did not complete: %s",
                str(failed) or type(failed).__name__,
            )
            return None
        return reader, asyncio.StreamWriter(transport, stream, reader, loop)


async def _readable(accepted: socket.socket) -> None:
    """Until ``accepted`` has bytes to read (or its peer closed it)."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[None] = loop.create_future()
    descriptor = accepted.fileno()

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    loop.add_reader(descriptor, wake)
    try:
        await ready
    finally:
        with contextlib.suppress(Exception):
            loop.remove_reader(descriptor)


def _host_of(address: object) -> str:
    """The client's IP address in the canonical form ACL hosts are kept in."""
    text = str(address[0]) if isinstance(address, tuple) and address else str(address)
    try:
        return normalize_host(text)
    except HeadwaterError:
        return text


def reset(transport: asyncio.WriteTransport) -> None:
    """Close ``transport``'s connection at once with a TCP reset, dropping what is unsent:
    a plain close of a socket whose peer takes nothing leaves the kernel holding its
    unsent bytes, retrying, for minutes."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_NONE)
    transport.abort()
