"""The Kafka listener: TCP connections speaking Kafka's wire protocol, on the node's event
loop, answered by ``KafkaHandlers``.

Per connection, requests are read one frame at a time and handled in arrival order; a
request's answer may wait (acks=all, a fetch's long poll) while the next requests are
read and handled, and answers are written in request order, as Kafka's protocol
requires. Bounds, each checked before the bytes are used:
- a frame's size in [8, ``REQUEST_BYTES_MAX``], a Produce's up to ``request_bytes_max``
  (its records are a few long byte strings, walked by their lengths before decoding:
  at most ``topics_max`` topics and ``partitions_max`` partitions); outside these the
  connection is closed (so a request of tiny array entries costs at most a fraction of a
  second to decode);
- at most ``HELD_BYTES_MAX`` of request frames being read and handled on the node at
  once: past it, connections wait before reading the next frame;
- at most ``IN_FLIGHT_MAX`` requests per connection answered-but-unwritten or waiting:
  the connection stops reading until one is written;
- a frame whose bytes do not all arrive within ``FRAME_TIMEOUT_S`` closes the
  connection, as does one idle for ``IDLE_TIMEOUT_S`` (Kafka's
  ``connections.max.idle.ms``);
- at most ``CONNECTIONS_MAX`` connections; more are closed at once.
Requests are read only once the node opens them (``open_requests``: it is a registered
broker whose metadata has caught up, so Metadata names it and its partitions, as a Kafka
broker enables request processing only after startup). Until then a connection is
accepted and waits, for up to ``IDLE_TIMEOUT_S``: a client that connects early is answered
as soon as the node can answer correctly, never with an empty broker list.
A request that cannot be decoded closes its connection with one log line (rate-limited
across connections); an API or version not served is answered with Kafka's
UNSUPPORTED_VERSION (``protocol.unsupported_answer``). Nothing a connection sends can
end another connection or the node.

Callers are ``User:ANONYMOUS`` from their host on a PLAINTEXT listener; on a
SASL_PLAINTEXT one (``KafkaSasl``) a connection logs in first and its requests are then
the user's. The node's ACLs and quotas apply to callers as on the gRPC listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final, cast

from headwater.node.authorizer import ANONYMOUS, CALLER, Caller
from headwater.node.kafka import protocol
from headwater.node.kafka.handlers import CLOSE_CONNECTION, KafkaHandlers
from headwater.node.kafka.sasl import KafkaSasl, SaslState
from headwater.shared.errors import HeadwaterError
from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)
REQUEST_BYTES_MAX: Final = 4 << 20
"""Largest request but Produce (a Metadata of 10,000 topics is about 300 KB)."""
HELD_BYTES_MAX: Final = 256 << 20
IN_FLIGHT_MAX: Final = 16
FRAME_TIMEOUT_S: Final = 30.0
IDLE_TIMEOUT_S: Final = 600.0
CONNECTIONS_MAX: Final = 4096
_SIZE: Final = struct.Struct(">i")
_refusals = LogEvery(_log, 10.0)


class KafkaListener:
    """Serves Kafka's protocol on one address; ``start`` binds, ``close`` stops."""

    def __init__(
        self,
        handlers: KafkaHandlers,
        sasl: KafkaSasl | None = None,
        tls: ssl.SSLContext | None = None,
        certificate_principal: Callable[[bytes], str] | None = None,
    ) -> None:
        """``sasl``: connections log in first (SASL_PLAINTEXT, SASL_SSL); ``tls``:
        connections speak TLS (SSL, SASL_SSL); ``certificate_principal``: the caller a
        verified client certificate (DER) names, when there is no login. Otherwise
        callers are anonymous."""
        self.handlers = handlers
        self.sasl = sasl
        self.tls = tls
        self.certificate_principal = certificate_principal
        config = handlers.core.config
        self.produce_bytes_max = config.request_bytes_max
        self.topics_max, self.partitions_max = config.topics_max, config.partitions_max
        self.held = ByteBudget(HELD_BYTES_MAX)
        self._server: asyncio.Server | None = None
        self._closing = False
        self._connections: set[asyncio.Task[None]] = set()
        self._requests_open = asyncio.Event()

    def open_requests(self) -> None:
        """Begin reading requests, on every connection open now or later (idempotent)."""
        self._requests_open.set()

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port``; the port bound (``port`` 0: a free one)."""
        self._server = await asyncio.start_server(
            self._serve, host, port, reuse_address=True, ssl=self.tls
        )
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    async def close(self) -> None:
        """Stop accepting, and end every connection now (answers still waiting are
        dropped: their clients retry elsewhere)."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections))
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection, until it ends or the listener closes (which cancels it: the
        task then ends cleanly, as asyncio's streams expect of a connection callback)."""
        try:
            await self._serve_connection(reader, writer)
        except asyncio.CancelledError:
            if not self._closing:
                raise

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        task = asyncio.current_task()
        assert task is not None
        peer = writer.get_extra_info("peername")
        host = str(peer[0]) if peer else ""
        if len(self._connections) >= CONNECTIONS_MAX:
            _refusals.log("refused a Kafka connection from %s: %d open", host, CONNECTIONS_MAX)
            writer.close()
            return
        self._connections.add(task)
        answers: asyncio.Queue[Awaitable[bytes | None] | None] = asyncio.Queue(IN_FLIGHT_MAX)
        sending = asyncio.ensure_future(_send_in_order(answers, writer))
        try:
            await asyncio.wait_for(self._requests_open.wait(), IDLE_TIMEOUT_S)
            await self._read_requests(reader, writer, answers, host)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            pass
        finally:
            self._connections.discard(task)
            with contextlib.suppress(Exception):
                if not sending.done() and not self._closing:
                    await asyncio.wait_for(answers.put(None), FRAME_TIMEOUT_S)
                    await asyncio.wait_for(sending, FRAME_TIMEOUT_S)
            sending.cancel()
            writer.close()

    async def _read_requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        answers: asyncio.Queue[Awaitable[bytes | None] | None],
        host: str,
    ) -> None:
        sasl = self.sasl
        login = SaslState()
        anonymous = Caller(ANONYMOUS, host)
        tls_object = writer.get_extra_info("ssl_object") if self.tls is not None else None
        der = tls_object.getpeercert(binary_form=True) if tls_object is not None else None
        if der and self.certificate_principal is not None and sasl is None:
            try:
                anonymous = Caller(self.certificate_principal(der), host)
            except HeadwaterError as refused:
                _refusals.log("closed a Kafka connection from %s: %s", host, refused.message)
                return
        while True:
            prefix = await asyncio.wait_for(reader.readexactly(_SIZE.size), IDLE_TIMEOUT_S)
            (size,) = _SIZE.unpack(prefix)
            if not protocol.FRAME_HEADER.size <= size <= self.produce_bytes_max:
                _refusals.log(
                    "closed a Kafka connection from %s: a request of %d bytes (valid: %d to %d)",
                    host,
                    size,
                    protocol.FRAME_HEADER.size,
                    self.produce_bytes_max,
                )
                return
            start = await asyncio.wait_for(
                reader.readexactly(protocol.FRAME_HEADER.size), FRAME_TIMEOUT_S
            )
            fixed = protocol.read_frame_header(start)
            if fixed.api_key != protocol.PRODUCE and size > REQUEST_BYTES_MAX:
                _refusals.log(
                    "closed a Kafka connection from %s: api key %d in %d bytes (at most %d)",
                    host,
                    fixed.api_key,
                    size,
                    REQUEST_BYTES_MAX,
                )
                return
            async with self.held.hold(size):
                rest = await asyncio.wait_for(
                    reader.readexactly(size - len(start)), FRAME_TIMEOUT_S
                )
                frame = start + rest
                if not await self._handle_frame(
                    frame, fixed, answers, host, sasl, login, anonymous
                ):
                    return

    async def _handle_frame(
        self,
        frame: bytes,
        fixed: protocol.FrameHeader,
        answers: asyncio.Queue[Awaitable[bytes | None] | None],
        host: str,
        sasl: KafkaSasl | None,
        login: SaslState,
        anonymous: Caller,
    ) -> bool:
        """Handle one request (its answer queued in order); False: close the connection.
        ``login.caller`` (or ``anonymous``) is the caller its handler sees."""
        if (
            sasl is not None
            and login.caller is None
            and not sasl.allowed_before_login(fixed.api_key)
        ):
            _refusals.log(
                "closed a Kafka connection from %s: api key %d before a SASL login",
                host,
                fixed.api_key,
            )
            return False
        if not protocol.is_supported(fixed.api_key, fixed.api_version, sasl is not None):
            unsupported = protocol.unsupported_answer(fixed, sasl is not None)
            if unsupported is None:
                _refusals.log(
                    "closed a Kafka connection from %s: api key %d version %d is not one of "
                    "Kafka's",
                    host,
                    fixed.api_key,
                    fixed.api_version,
                )
                return False
            await answers.put(_ready(unsupported))
            return True
        try:
            if fixed.api_key == protocol.PRODUCE:
                protocol.check_produce_shape(frame, self.topics_max, self.partitions_max)
            request = protocol.decode_request(frame)
        except protocol.MalformedRequestError as problem:
            _refusals.log("closed a Kafka connection from %s: %s", host, problem)
            return False
        if sasl is not None and request.api_key in protocol.SASL_APIS:
            if request.api_key == protocol.SASL_HANDSHAKE:
                body, close = sasl.handshake(login, request), False
            else:
                body, close = await sasl.authenticate(login, request, host)
            await answers.put(_ready(protocol.encode_response(request.correlation_id, body)))
            if close:
                _refusals.log("a Kafka login from %s failed; its connection is closed", host)
            return not close
        caller = anonymous if login.caller is None else login.caller
        token = CALLER.set(dataclasses.replace(caller, client_id=request.client_id))
        try:
            answer = await self.handlers.handle(request)
            # The answer's task is made here, in the caller's context (its quotas, its
            # permissions), before the caller is reset.
            encoded = (
                None
                if answer is None or answer is CLOSE_CONNECTION
                else _encoded(request, cast(Awaitable[Any], answer))
            )
        except HeadwaterError as refused:  # a request no answer can carry
            _refusals.log("closed a Kafka connection from %s: %s", host, refused.message)
            return False
        except Exception:
            _log.exception(
                "Kafka api key %d version %d failed", request.api_key, request.api_version
            )
            return False
        finally:
            CALLER.reset(token)
        if answer is CLOSE_CONNECTION:
            return False
        if encoded is not None:
            await answers.put(encoded)
        return True


class ByteBudget:
    """Bytes held across connections: ``hold(n)`` waits until ``n`` more fit (a hold
    larger than the whole budget waits until nothing else is held)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def hold(self, size: int) -> AsyncIterator[None]:
        async with self._changed:
            await self._changed.wait_for(
                lambda: self.held == 0 or self.held + size <= self.capacity
            )
            self.held += size
        try:
            yield
        finally:
            async with self._changed:
                self.held -= size
                self._changed.notify_all()


def _ready(frame: bytes) -> Awaitable[bytes | None]:
    future: asyncio.Future[bytes | None] = asyncio.get_running_loop().create_future()
    future.set_result(frame)
    return future


def _encoded(request: protocol.Request, answer: Awaitable[Any]) -> Awaitable[bytes | None]:
    async def encode() -> bytes | None:
        try:
            body = await answer
        except HeadwaterError as refused:
            _refusals.log(
                "closed a Kafka connection after api key %d: %s", request.api_key, refused.message
            )
            return None
        except Exception:
            _log.exception(
                "Kafka api key %d version %d failed", request.api_key, request.api_version
            )
            return None
        return protocol.encode_response(request.correlation_id, body)

    return asyncio.ensure_future(encode())


async def _send_in_order(
    answers: asyncio.Queue[Awaitable[bytes | None] | None], writer: asyncio.StreamWriter
) -> None:
    """Write each answer in request order; an answer that failed ends the connection
    (the client then retries on a new one)."""
    try:
        while (answer := await answers.get()) is not None:
            frame = await answer
            if frame is None:
                writer.close()
                return
            writer.write(frame)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        while not answers.empty():
            left = answers.get_nowait()
            if isinstance(left, asyncio.Future):
                left.cancel()
