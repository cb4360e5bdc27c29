"""Kafka's protocol on one connection, without I/O (in the manner of h11): bytes in,
request frames out, answers in, bytes out. The listener (``headwater.node.kafka.listener``)
is a socket loop around it: it reads what ``next_event`` asks for, hands over each
request frame, and writes what ``bytes_to_send`` gives.

What it owns, checked before the bytes are used:

- **frame bounds**: a frame's size (its first 4 bytes, big-endian) in
  [8, ``produce_bytes_max``], and at most ``REQUEST_BYTES_MAX`` for any API but
  Produce (known from the next 8 bytes: api key, version, correlation id); a frame
  outside them closes the connection before its body is read;
- **the SASL gate**: on a listener that asks for logins, until the connection has logged
  in only ApiVersions, SaslHandshake and SaslAuthenticate, in small frames and few
  (``KafkaSasl.refusal_before_login``), again on the first 12 bytes;
- **version checks**: a request for an API or version this broker does not serve is
  answered here with Kafka's UNSUPPORTED_VERSION (``protocol.unsupported_answer``), and
  one Kafka does not define closes the connection;
- **answer ordering**: each request the listener hands on takes the next answer slot
  (``begin_answer``); answers come back in any order (``answer``) and leave in request
  order (``bytes_to_send``); an answer of None closes the connection once every earlier
  answer is out; at most ``IN_FLIGHT_MAX`` answers are awaited or unsent at a time
  (``may_read``: the listener stops reading until one leaves).

Events (``next_event``): ``NeedBytes`` (how many more bytes the next event needs),
``FrameAnnounced`` (a frame's size and header passed the checks; its body follows),
``FrameArrived`` (a whole frame of a served API and version), ``Answered`` (a request
answered here: its answer is waiting in ``bytes_to_send``) and ``Closed`` (the reason;
the connection takes nothing more).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Final

from headwater.node.kafka import protocol
from headwater.node.kafka.sasl import KafkaSasl, SaslState

REQUEST_BYTES_MAX: Final = 4 << 20
"""Largest request but Produce (a Metadata of 10,000 topics is about 300 KB)."""
IN_FLIGHT_MAX: Final = 16
FRAME_SIZE: Final = struct.Struct(">i")
"""A frame's first 4 bytes: the size of what follows (big-endian)."""
HEADER_BYTES: Final = FRAME_SIZE.size + protocol.FRAME_HEADER.size
"""A frame's size and fixed header: what the checks need before its body is read."""


@dataclass(frozen=True, slots=True)
class NeedBytes:
    count: int
    """Bytes the next event needs beyond those received."""


@dataclass(frozen=True, slots=True)
class FrameAnnounced:
    size: int
    """The frame's bytes after its 4-byte size, the header's 8 included."""
    header: protocol.FrameHeader


@dataclass(frozen=True, slots=True)
class FrameArrived:
    frame: bytes
    """The whole frame after its size: header and body."""
    header: protocol.FrameHeader


@dataclass(frozen=True, slots=True)
class Answered:
    """A request answered by the connection itself (an unsupported version)."""

    header: protocol.FrameHeader


@dataclass(frozen=True, slots=True)
class Closed:
    reason: str


Event = NeedBytes | FrameAnnounced | FrameArrived | Answered | Closed


@dataclass(slots=True)
class _Slot:
    frame: bytes | None = None
    ready: bool = False


@dataclass(slots=True)
class KafkaConnection:
    """One connection's protocol state (see the module doc)."""

    produce_bytes_max: int
    logins: bool
    """Whether this listener asks for a SASL login first."""
    login: SaslState = field(default_factory=SaslState)
    _chunks: list[bytes] = field(default_factory=list)
    """Bytes received and not yet taken, in order (a frame read whole is one chunk, taken
    without a copy)."""
    _buffered: int = 0
    _announced: FrameAnnounced | None = None
    _closed: str | None = None
    _slots: dict[int, _Slot] = field(default_factory=dict)
    _next_slot: int = 0
    _next_out: int = 0
    _closing_after: int | None = None
    """The slot whose answer was None: nothing after it is sent."""

    # ------------------------------------------------------------------ bytes in

    @property
    def logged_in(self) -> bool:
        return not self.logins or self.login.caller is not None

    def receive(self, data: bytes) -> None:
        """Bytes from the peer, in order."""
        if self._closed is None and data:
            self._chunks.append(bytes(data))
            self._buffered += len(data)

    def _peek(self, count: int) -> bytes:
        """The first ``count`` bytes received (there are at least that many)."""
        first = self._chunks[0]
        if len(first) >= count:
            return first[:count]
        return b"".join(self._chunks)[:count]

    def _take(self, count: int) -> bytes:
        """Remove and return the first ``count`` bytes received (at least that many): the
        first chunk itself when it is exactly that, else one copy."""
        self._buffered -= count
        first = self._chunks[0]
        if len(first) == count:
            del self._chunks[0]
            return first
        taken: list[bytes] = []
        while count:
            chunk = self._chunks[0]
            if len(chunk) <= count:
                taken.append(chunk)
                del self._chunks[0]
                count -= len(chunk)
            else:
                taken.append(chunk[:count])
                self._chunks[0] = chunk[count:]
                count = 0
        return b"".join(taken)

    def next_event(self) -> Event:
        """What the bytes received so far make (see the module doc). ``FrameAnnounced``
        comes once per frame, before its ``FrameArrived``."""
        if self._closed is not None:
            return Closed(self._closed)
        if self._announced is None:
            return self._announce()
        announced = self._announced
        if self._buffered < announced.size:
            return NeedBytes(announced.size - self._buffered)
        frame = self._take(announced.size)
        self._announced = None
        header = announced.header
        if protocol.is_supported(header.api_key, header.api_version, self.logins):
            return FrameArrived(frame, header)
        unsupported = protocol.unsupported_answer(header, self.logins)
        if unsupported is None:
            return self.close(
                f"api key {header.api_key} version {header.api_version} is not one of Kafka's"
            )
        self.answer(self.begin_answer(), unsupported)
        return Answered(header)

    def _announce(self) -> Event:
        received = self._buffered
        if received < FRAME_SIZE.size:
            return NeedBytes(HEADER_BYTES - received)
        (size,) = FRAME_SIZE.unpack(self._peek(FRAME_SIZE.size))
        if not protocol.FRAME_HEADER.size <= size <= self.produce_bytes_max:
            return self.close(
                f"a request of {size} bytes (valid: {protocol.FRAME_HEADER.size} to "
                f"{self.produce_bytes_max})"
            )
        if received < HEADER_BYTES:
            return NeedBytes(HEADER_BYTES - received)
        fields = protocol.FRAME_HEADER.unpack_from(self._peek(HEADER_BYTES), FRAME_SIZE.size)
        header = protocol.FrameHeader(*fields)
        if header.api_key != protocol.PRODUCE and size > REQUEST_BYTES_MAX:
            return self.close(
                f"api key {header.api_key} in {size} bytes (at most {REQUEST_BYTES_MAX})"
            )
        if not self.logged_in:
            refusal = KafkaSasl.refusal_before_login(self.login, header.api_key, size)
            if refusal is not None:
                return self.close(refusal)
        self._take(FRAME_SIZE.size)  # the frame is what follows its size
        self._announced = FrameAnnounced(size, header)
        return self._announced

    def close(self, reason: str) -> Closed:
        """Take nothing more (for ``reason``, or the first reason given); answers already
        begun still leave."""
        if self._closed is None:
            self._closed = reason
            self._chunks.clear()
            self._buffered = 0
        return Closed(self._closed)

    @property
    def closed(self) -> bool:
        return self._closed is not None

    # ------------------------------------------------------------------ answers

    def may_read(self) -> bool:
        """Whether another request may be read: fewer than ``IN_FLIGHT_MAX`` answers are
        awaited or unsent."""
        return self._next_slot - self._next_out < IN_FLIGHT_MAX

    def begin_answer(self) -> int:
        """The answer slot of the next request handed on (request order)."""
        slot = self._next_slot
        self._next_slot += 1
        self._slots[slot] = _Slot()
        return slot

    def answer(self, slot: int, frame: bytes | None) -> None:
        """The encoded answer of ``slot`` (size prefix included); None: the connection
        closes once the answers before it are sent."""
        held = self._slots.get(slot)
        if held is None or held.ready:
            return
        held.frame, held.ready = frame, True
        if frame is None and (self._closing_after is None or slot < self._closing_after):
            self._closing_after = slot

    def bytes_to_send(self) -> bytes:
        """The answers ready in request order, as one write (empty when the next one is
        still awaited)."""
        out: list[bytes] = []
        while (held := self._slots.get(self._next_out)) is not None and held.ready:
            if self._closing_after is not None and self._next_out >= self._closing_after:
                break
            del self._slots[self._next_out]
            self._next_out += 1
            assert held.frame is not None  # a None answer sets _closing_after
            out.append(held.frame)
        return b"".join(out)

    @property
    def done_sending(self) -> bool:
        """Whether no answer will leave any more: the one before a None answer has, or
        the connection is closed and every answer begun has."""
        if self._closing_after is not None and self._next_out >= self._closing_after:
            return True
        return self.closed and self._next_out == self._next_slot
