"""The Kafka listener: TCP connections speaking Kafka's wire protocol, on the node's event
loop, answered by ``KafkaHandlers``.

Sockets are accepted, counted and (with TLS) handshaken by ``Sockets``
(``headwater.node.kafka.sockets``, ``headwater.node.kafka.admission``). Each connection's
protocol is a ``KafkaConnection`` (``headwater.node.kafka.connection``: frame bounds, the
SASL gate, version checks, answer ordering, without I/O); this module is the socket loop
around it, with what needs time and the node: timeouts, the bytes held across
connections, rates, decoding off the loop, logins and the handlers. Per connection,
requests are read one frame at a time and handled in arrival order; a request's answer
may wait (acks=all, a fetch's long poll) while the next requests are read and handled,
and answers are written in request order, as Kafka's protocol requires. Bounds, each
checked before the bytes are used:

- a frame's size in [8, ``REQUEST_BYTES_MAX``], a Produce's up to ``request_bytes_max``;
  before a login on a listener that asks for one, at most 64 KiB and only ApiVersions,
  SaslHandshake and SaslAuthenticate (``KafkaSasl.refusal_before_login``), checked on the
  first 12 bytes, before the rest is read; outside these the connection is closed;
- the body is read as it arrives, and its bytes count against ``HELD_BYTES_MAX`` for the
  node (``ByteBudget``) only once they have arrived, until its request is handled (its
  answer may wait; its bytes do not): a connection that announces a frame and stalls
  holds nothing that others wait on. A frame of up to ``SMALL_FRAME_BYTES`` never waits
  for room; a larger one waits for room before its next chunk is read, except the oldest
  frame that holds bytes, which always goes on (so frames read together can never hold
  each other up for good): at most ``HELD_BYTES_MAX`` plus one request are held. While a
  frame waits for room, a frame that holds bytes but brought less than ``CHUNK_BYTES`` in
  the last ``STALLED_FRAME_S`` (and is not itself waiting) closes its connection: bytes
  others wait for are held only by frames that keep arriving;
- every count in a request is checked while its frame is walked, before it is decoded
  (``request_shape``: what one request may name, ``RequestLimits``, the same limits as
  the gRPC front's); a frame of more than ``WALK_INLINE_BYTES_MAX`` (but a Produce) is
  walked and decoded, a request of more than ``INLINE_ENTRIES_MAX`` entries decoded, and
  an answer of more built and encoded, in a worker thread (pure code: the loop gets the interpreter
  back every few milliseconds);
- at most ``IN_FLIGHT_MAX`` requests per connection answered-but-unwritten or waiting:
  the connection stops reading until one is written;
- a frame whose bytes do not all arrive within ``FRAME_TIMEOUT_S`` closes the
  connection, as does a client that takes none of its answers' bytes for
  ``ANSWER_STALL_S`` (its answers are dropped), one idle for ``IDLE_TIMEOUT_S`` (Kafka's
  ``connections.max.idle.ms``), and, on a listener that asks for logins, one that has not
  logged in within ``LOGIN_TIMEOUT_S``;
- before a login, a client address may send ``kafka_prelogin_request_rate_per_host_max``
  requests a second over all its connections (``HostRates``); past it a connection waits,
  once the first bytes of its next request have come, before it reads the request.
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
import functools
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, cast

from headwater.node.config import parse_host_counts
from headwater.node.kafka import protocol
from headwater.node.kafka.admission import ConnectionAdmission, ConnectionLimits
from headwater.node.kafka.connection import (
    FRAME_SIZE,
    Answered,
    Closed,
    FrameAnnounced,
    FrameArrived,
    KafkaConnection,
    NeedBytes,
)
from headwater.node.kafka.handlers import CLOSE_CONNECTION, KafkaHandlers
from headwater.node.kafka.request_shape import MalformedRequestError, RequestLimits
from headwater.node.kafka.sasl import KafkaSasl
from headwater.node.kafka.sockets import Sockets, reset
from headwater.node.security.authorizer import ANONYMOUS, CALLER, Caller
from headwater.node.security.host_rates import HostRates
from headwater.shared.errors import HeadwaterError
from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)
HELD_BYTES_MAX: Final = 256 << 20
SMALL_FRAME_BYTES: Final = 64 << 10
CHUNK_BYTES: Final = 64 << 10
WALK_INLINE_BYTES_MAX: Final = 16 << 10
"""A larger request frame (but a Produce) is walked and decoded in a worker thread: 16 KiB
holds at most a few thousand entries, a few milliseconds to walk. A Produce is walked on
the loop whatever its size: its bytes are a few long record batches, passed over by their
lengths (its partitions are bounded by ``partitions_max``), and the hand-over to a thread
cost 0.15 µs of the node's CPU a record produced."""
INLINE_ENTRIES_MAX: Final = 1000
"""A request with more entries than this is decoded in a worker thread, and an answer
with more is built and encoded there (about 1 µs an entry to decode, 10-30 µs to build
and encode: a 10,000-partition answer took 0.3 s), so the event loop is never held for
long; fewer are done on the loop, where a thread's hand-over would cost more."""
FRAME_TIMEOUT_S: Final = 30.0
ANSWER_STALL_S: Final = 30.0
"""A connection whose client takes no byte of its answers for this long is closed."""
STALLED_FRAME_S: Final = 2.0
"""A frame that holds bytes others wait for must bring ``CHUNK_BYTES`` within this."""
IDLE_TIMEOUT_S: Final = 600.0
LOGIN_TIMEOUT_S: Final = 30.0
_refusals = LogEvery(_log, 10.0)


class _ClosedError(Exception):
    """The connection is closed for the reason given (one log line, rate-limited)."""


@dataclasses.dataclass(slots=True)
class _Connection:
    """One connection's state: its protocol object and what the socket loop adds."""

    id: int
    host: str
    anonymous: Caller
    abort: Callable[[], None]
    """Closes the connection at once, dropping what is unwritten."""
    protocol: KafkaConnection
    proven: bool = False
    answered: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set when an answer is ready to send, or the connection ends."""
    sent: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)
    """Set when answers leave (room for more requests)."""
    pending: set[asyncio.Future[Any]] = dataclasses.field(default_factory=set)
    """Answers still awaited (cancelled when the connection ends)."""

    def await_answer(self, answer: Awaitable[bytes | None]) -> None:
        """Take the next answer slot for ``answer`` and fill it when it is done."""
        slot = self.protocol.begin_answer()
        future = asyncio.ensure_future(answer)
        self.pending.add(future)

        def done(future: asyncio.Future[bytes | None]) -> None:
            self.pending.discard(future)
            failed = future.cancelled() or future.exception() is not None
            self.protocol.answer(slot, None if failed else future.result())
            self.answered.set()

        future.add_done_callback(done)


class KafkaListener:
    """Serves Kafka's protocol on one address; ``start`` binds, ``close`` stops."""

    def __init__(
        self,
        handlers: KafkaHandlers,
        sasl: KafkaSasl | None = None,
        tls: ssl.SSLContext | None = None,
        certificate_principal: Callable[[bytes], str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``sasl``: connections log in first (SASL_PLAINTEXT, SASL_SSL); ``tls``:
        connections speak TLS (SSL, SASL_SSL); ``certificate_principal``: the caller a
        verified client certificate (DER) names, when there is no login. Otherwise
        callers are anonymous."""
        self.handlers = handlers
        self.sasl = sasl
        self.tls = tls
        self.certificate_principal = certificate_principal
        self.clock = clock
        config = handlers.core.config
        self.produce_bytes_max = config.request_bytes_max
        self.limits = RequestLimits.of(
            config.topics_max, config.partitions_max, config.group_members_max
        )
        self.admission = ConnectionAdmission(
            ConnectionLimits(
                connections_max=config.kafka_connections_max,
                per_host_max=config.kafka_connections_per_host_max,
                per_host_overrides=parse_host_counts(config.kafka_connections_per_host_overrides),
                rate_per_host_max=config.connection_rate_per_host_max,
            )
        )
        self.prelogin_rates = HostRates(config.kafka_prelogin_request_rate_per_host_max)
        self.sockets = Sockets(self.admission, tls, clock)
        self.held = ByteBudget(HELD_BYTES_MAX, clock)
        self._requests_open = asyncio.Event()

    def open_requests(self) -> None:
        """Begin reading requests, on every connection open now or later (idempotent)."""
        self._requests_open.set()

    async def start(self, host: str, port: int) -> int:
        """Bind ``host:port`` and accept; the port bound (``port`` 0: a free one)."""
        bound = await self.sockets.bind(host, port)
        self.sockets.serve(self._serve)
        return bound

    async def close(self) -> None:
        """Stop accepting, and end every connection now (answers still waiting are
        dropped: their clients retry elsewhere)."""
        await self.sockets.close()

    async def _serve(
        self,
        connection_id: int,
        host: str,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
    ) -> None:
        """One connection, until it ends (``Sockets`` closes and uncounts it)."""
        connection = self._connection(connection_id, host, writer)
        if connection is None:
            return
        sending = asyncio.ensure_future(_send_in_order(connection, writer))
        ended = False
        try:
            async with asyncio.timeout(IDLE_TIMEOUT_S):
                await self._requests_open.wait()
            await self._read_requests(connection, reader)
            ended = True
        except _ClosedError as closed:
            _refusals.log("closed a Kafka connection from %s: %s", host, closed)
            ended = True
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError):
            ended = True
        finally:
            connection.protocol.close("the connection ended")
            connection.answered.set()
            with contextlib.suppress(Exception):
                if ended and not sending.done():
                    async with asyncio.timeout(FRAME_TIMEOUT_S):
                        await sending
            sending.cancel()
            for waiting in list(connection.pending):
                waiting.cancel()

    def _connection(
        self, connection_id: int, host: str, writer: asyncio.StreamWriter
    ) -> _Connection | None:
        """The connection's state, its caller named by its client certificate when that
        is how this listener names callers; None when the certificate names nobody."""
        anonymous = Caller(ANONYMOUS, host)
        tls_object = writer.get_extra_info("ssl_object") if self.tls is not None else None
        der = tls_object.getpeercert(binary_form=True) if tls_object is not None else None
        if der and self.certificate_principal is not None and self.sasl is None:
            try:
                anonymous = Caller(self.certificate_principal(der), host)
            except HeadwaterError as refused:
                _refusals.log("closed a Kafka connection from %s: %s", host, refused.message)
                return None
        return _Connection(
            connection_id,
            host,
            anonymous,
            functools.partial(reset, writer.transport),
            KafkaConnection(self.produce_bytes_max, logins=self.sasl is not None),
        )

    def _prove(self, connection: _Connection) -> None:
        if not connection.proven:
            connection.proven = True
            self.admission.prove(connection.id)

    async def _read_requests(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        """Read and hand on requests until the connection ends: the socket loop around
        ``connection.protocol`` (see ``headwater.node.kafka.connection``)."""
        loop = asyncio.get_running_loop()
        login_deadline = loop.time() + LOGIN_TIMEOUT_S
        kafka = connection.protocol
        while True:
            while not kafka.may_read():
                connection.sent.clear()
                await connection.sent.wait()
            before_login = not kafka.logged_in
            wait_s = login_deadline - loop.time() if before_login else IDLE_TIMEOUT_S
            if wait_s <= 0:
                raise _ClosedError(f"no login within {LOGIN_TIMEOUT_S:.0f} s")
            async with asyncio.timeout(wait_s):
                kafka.receive(await reader.readexactly(FRAME_SIZE.size))
            if before_login:
                await self._wait_for_prelogin_room(connection.host, login_deadline)
            event = kafka.next_event()
            if isinstance(event, NeedBytes):
                async with asyncio.timeout(FRAME_TIMEOUT_S):
                    kafka.receive(await reader.readexactly(event.count))
                event = kafka.next_event()
            if isinstance(event, Closed):
                raise _ClosedError(event.reason)
            assert isinstance(event, FrameAnnounced)
            frame_id = object()
            try:
                await self._read_frame(reader, frame_id, event.size, connection)
                arrived = kafka.next_event()
                if isinstance(arrived, Closed):
                    raise _ClosedError(arrived.reason)
                if isinstance(arrived, Answered):
                    connection.answered.set()
                    continue
                assert isinstance(arrived, FrameArrived)
                answer, keep_open = await self._handle_frame(arrived, connection)
            finally:
                self.held.release(frame_id)
            if answer is not None:
                connection.await_answer(answer)
            if not keep_open:
                return
            if self.sasl is None:
                self._prove(connection)

    async def _wait_for_prelogin_room(self, host: str, login_deadline: float) -> None:
        """Until ``host`` may send another request before a login (``prelogin_rates``)."""
        loop = asyncio.get_running_loop()
        while (wait_s := self.prelogin_rates.take(host, self.clock())) > 0:
            if loop.time() + wait_s > login_deadline:
                raise _ClosedError(f"no login within {LOGIN_TIMEOUT_S:.0f} s")
            await asyncio.sleep(wait_s)

    async def _read_frame(
        self, reader: asyncio.StreamReader, frame_id: object, size: int, connection: _Connection
    ) -> None:
        """Hand ``connection.protocol`` the rest of a frame of ``size`` bytes whose header
        it has, its bytes held in the node's budget as they arrive (see the module doc)."""
        start = protocol.FRAME_HEADER.size
        left = size - start
        kafka = connection.protocol
        if size <= SMALL_FRAME_BYTES:
            async with asyncio.timeout(FRAME_TIMEOUT_S):
                kafka.receive(await reader.readexactly(left))
            self.held.add(frame_id, size)
            return

        def close_stalled() -> None:
            _refusals.log(
                "closed a Kafka connection from %s: a frame of %d bytes held bytes others "
                "waited for and brought less than %d in %.0f s",
                connection.host,
                size,
                CHUNK_BYTES,
                STALLED_FRAME_S,
            )
            connection.abort()

        self.held.begin(frame_id, start, close_stalled)
        async with asyncio.timeout(FRAME_TIMEOUT_S):
            while left:
                chunk = await reader.read(min(left, CHUNK_BYTES))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", size)
                await self.held.take(frame_id, len(chunk))
                kafka.receive(chunk)
                left -= len(chunk)
        self.held.arrived(frame_id)

    async def _handle_frame(
        self, arrived: FrameArrived, connection: _Connection
    ) -> tuple[Awaitable[bytes | None] | None, bool]:
        """Handle one request of a served API and version: its answer to queue (None: no
        answer), and whether the connection stays open. The connection's login (or its
        anonymous caller) is the caller its handler sees."""
        sasl = self.sasl
        host = connection.host
        frame, fixed = arrived.frame, arrived.header
        try:
            if fixed.api_key != protocol.PRODUCE and len(frame) > WALK_INLINE_BYTES_MAX:
                request = await asyncio.to_thread(protocol.decode_request, frame, self.limits)
            else:
                walked = protocol.walk(frame, self.limits)
                request = (
                    protocol.decode_walked(walked)
                    if walked.entries <= INLINE_ENTRIES_MAX
                    else await asyncio.to_thread(protocol.decode_walked, walked)
                )
        except MalformedRequestError as problem:
            closed = connection.protocol.close(f"{_api_name(fixed)}: {problem}")
            raise _ClosedError(closed.reason) from None
        login = connection.protocol.login
        if sasl is not None and request.api_key in protocol.SASL_APIS:
            if request.api_key == protocol.SASL_HANDSHAKE:
                body, close = sasl.handshake(login, request)
            else:
                body, close = await sasl.authenticate(login, request, host)
            if login.caller is not None:
                self._prove(connection)
            if close:
                _refusals.log(
                    "a Kafka login from %s failed (api key %d); its connection is closed",
                    host,
                    request.api_key,
                )
            return _ready(protocol.encode_response(request.correlation_id, body)), not close
        caller = connection.anonymous if login.caller is None else login.caller
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
            raise _ClosedError(refused.message) from None
        except Exception:
            _log.exception(
                "Kafka api key %d version %d failed", request.api_key, request.api_version
            )
            return None, False
        finally:
            CALLER.reset(token)
        return encoded, answer is not CLOSE_CONNECTION


@dataclasses.dataclass(slots=True)
class _HeldFrame:
    """One frame's bytes in a ``ByteBudget``."""

    held: int
    close_stalled: Callable[[], None] | None = None
    """Closes the frame's connection; None once the frame has arrived whole."""
    moved_at: float = 0.0
    """When the frame last brought ``CHUNK_BYTES`` (or last got room)."""
    since_moved: int = 0
    waiting: bool = False


class ByteBudget:
    """Bytes of request frames held across connections (see the module doc). Each frame
    is known by an object of its own; ``add`` counts a whole frame's bytes at once,
    ``begin`` the first bytes of one read in chunks, ``take`` waits until a chunk fits or
    the frame is the oldest that holds bytes, ``arrived`` marks a frame read whole,
    ``release`` frees a frame's bytes. While a chunk waits, a frame read in chunks that
    brought less than ``CHUNK_BYTES`` in ``stalled_s`` and does not wait itself is closed
    and its bytes freed (checked as each waiter comes and every ``stalled_s`` while it
    waits). Used on one event loop."""

    def __init__(
        self,
        capacity: int,
        clock: Callable[[], float] = time.monotonic,
        stalled_s: float = STALLED_FRAME_S,
    ) -> None:
        self.capacity = capacity
        self.clock = clock
        self.stalled_s = stalled_s
        self.held = 0
        self._frames: dict[object, _HeldFrame] = {}  # in the order each first held bytes
        self._waiters: list[asyncio.Future[None]] = []

    def add(self, frame: object, size: int) -> None:
        self._frames.setdefault(frame, _HeldFrame(0)).held += size
        self.held += size

    def begin(self, frame: object, size: int, close_stalled: Callable[[], None]) -> None:
        self.add(frame, size)
        held = self._frames[frame]
        held.close_stalled = close_stalled
        held.moved_at = self.clock()

    def arrived(self, frame: object) -> None:
        held = self._frames.get(frame)
        if held is not None:
            held.close_stalled = None

    def _fits(self, frame: object, size: int) -> bool:
        return self.held + size <= self.capacity or next(iter(self._frames), frame) is frame

    async def take(self, frame: object, size: int) -> None:
        held = self._frames[frame]
        if not self._fits(frame, size):
            held.waiting = True
            try:
                while not self._fits(frame, size):
                    self._close_stalled()
                    if self._fits(frame, size):
                        break
                    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                    self._waiters.append(waiter)
                    try:
                        async with asyncio.timeout(self.stalled_s):
                            await waiter
                    except TimeoutError:
                        pass
                    finally:
                        with contextlib.suppress(ValueError):
                            self._waiters.remove(waiter)
            finally:
                held.waiting = False
            held.moved_at, held.since_moved = self.clock(), 0
        self.add(frame, size)
        held.since_moved += size
        if held.since_moved >= CHUNK_BYTES:
            held.moved_at, held.since_moved = self.clock(), 0

    def _close_stalled(self) -> None:
        now = self.clock()
        stalled = [
            (frame, held)
            for frame, held in self._frames.items()
            if held.close_stalled is not None
            and not held.waiting
            and now - held.moved_at > self.stalled_s
        ]
        for frame, held in stalled:
            assert held.close_stalled is not None
            held.close_stalled()
            self.release(frame)

    def release(self, frame: object) -> None:
        freed = self._frames.pop(frame, _HeldFrame(0)).held
        self.held -= freed
        if freed and self._waiters:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()


def _api_name(fixed: protocol.FrameHeader) -> str:
    return f"{protocol.api_name(fixed.api_key)} v{fixed.api_version}"


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
        if isinstance(body, protocol.Unbuilt) and body.entries > INLINE_ENTRIES_MAX:
            return await asyncio.to_thread(protocol.encode_response, request.correlation_id, body)
        return protocol.encode_response(request.correlation_id, body)

    return asyncio.ensure_future(encode())


async def _send_in_order(connection: _Connection, writer: asyncio.StreamWriter) -> None:
    """Write the answers in request order as they become ready; an answer that failed
    ends the connection (the client then retries on a new one)."""
    kafka = connection.protocol
    try:
        while True:
            connection.answered.clear()
            ready = kafka.bytes_to_send()
            if ready:
                writer.write(ready)
                connection.sent.set()
                await _drain(writer)
                continue
            if kafka.done_sending:
                writer.close()
                return
            await connection.answered.wait()
    except (ConnectionError, asyncio.CancelledError):
        pass


async def _drain(writer: asyncio.StreamWriter) -> None:
    """Until the answers written have left (below the transport's high-water mark); a
    client that takes none of their bytes for ``ANSWER_STALL_S`` has its connection closed
    at once (ConnectionAbortedError), its answers dropped."""
    transport = writer.transport
    while True:
        unsent = transport.get_write_buffer_size()
        try:
            async with asyncio.timeout(ANSWER_STALL_S):
                await writer.drain()
            return
        except TimeoutError:
            if transport.get_write_buffer_size() >= unsent:
                _refusals.log(
                    "closed a Kafka connection from %s: %d bytes of answers not taken in %.0f s",
                    writer.get_extra_info("peername"),
                    unsent,
                    ANSWER_STALL_S,
                )
                reset(transport)
                raise ConnectionAbortedError("answers not taken") from None
