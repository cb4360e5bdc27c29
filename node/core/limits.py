"""Admission of long-lived client calls: streams and long polls.

A gRPC server refuses calls beyond ``concurrent_calls_max`` (RESOURCE_EXHAUSTED), and
every open FetchStream or ProduceStream, and every Fetch parked in a long poll, holds one
of those slots for as long as it lasts: 300 idle FetchStreams once took every slot of a
node, heartbeats included. ``LongCallSlots`` caps them twice, below that limit:

- per client connection (``streams_per_connection_max``): one connection cannot hold more;
- per node (``streams_max``, below ``concurrent_calls_max``): whatever the number of
  connections, at least ``concurrent_calls_max - streams_max`` slots stay free for
  short calls (Produce, Metadata, Admin).

A call over either cap is refused at once with THROTTLING_QUOTA_EXCEEDED naming the
limit and its setting; nothing queues. Heartbeats, replication and ISR changes are on the
inter-broker listener, which has its own call limit. A call forwarded by another node
(the ``headwater-forwarded`` key) counts for this node only: the node it came through
counted it against its client's connection.

``StreamBudget`` bounds the bytes one ProduceStream holds in progress; ``distinct``
bounds the names one request may list, and ``yield_every`` lets a long answer give the
event loop back between pieces (a 100,000-name DescribeTopics answered at once would hold
it 6-9 s, long enough for the broker to be fenced).

Pure bookkeeping, used on the event loop only.
"""

from __future__ import annotations

import asyncio
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Generator,
    Hashable,
    Iterable,
    Iterator,
    Sequence,
)
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, TypeVar

from headwater.log import batch as batch_format
from headwater.shared.errors import ErrorCode, HeadwaterError

T = TypeVar("T")
R = TypeVar("R")
H = TypeVar("H", bound=Hashable)
LOOP_SLICE_ITEMS: Final = 100
"""Items (topics, or partitions described, ...) an answer builds before it yields the
event loop."""


def check_count(count: int, limit: int, what: str, setting: str) -> None:
    """INVALID_REQUEST unless ``count`` items of ``what`` fit ``limit`` (the node setting
    ``setting``)."""
    if count > limit:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"{count} {what} in one request; at most {limit} ({setting})",
        )


def distinct(items: Sequence[H], limit: int, what: str, setting: str) -> list[H]:
    """``items`` without repeats, in order (a name or partition asked twice is answered
    once), after ``check_count``."""
    check_count(len(items), limit, what, setting)
    return list(dict.fromkeys(items))


SHAPE_SLICE_BATCHES: Final = 256
SHAPE_SLICE_RECORDS: Final = 8192
"""A read is made into a front's form (Kafka batches, columnar batches) a piece at a
time, each of at most ``SHAPE_SLICE_BATCHES`` stored batches and, past its first batch,
``SHAPE_SLICE_RECORDS`` records, the event loop given back between pieces
(``stored_slices``). The work goes by batch and by record, not by byte: on the machine
of BENCHMARKS.md, cutting a stored batch to Kafka's costs about 5 µs, transcoding a
Kafka batch to a columnar one about 20 µs, and a record of a columnar batch made into
Kafka's about 0.5 µs; one partition of 10,000 one-record batches shaped in one piece
would hold the loop 100 ms over Kafka and 250 ms over gRPC. A piece costs a few
milliseconds; a read of a few batches of a few thousand records (a client's usual) is
one piece, passed on as it is. A piece of one batch over the record bound is shaped in
a worker thread (``shape_piece``): it cannot be split, and the loop still gets its
turns while the thread works. Pieces are shaped in the loop otherwise: the work is
Python's, and the loop would wait on the interpreter lock for a thread's turns. Each
piece is held to what is left of the answer's bytes, so where an answer stops can
depend on where pieces end (always within its bytes)."""


@dataclass(frozen=True, slots=True)
class StoredPiece:
    """Whole stored batches of a read and the records they hold."""

    data: bytes | memoryview
    records: int


async def stored_slices(
    data: bytes,
    *,
    records_of_kafka: bool,
    batches: int = SHAPE_SLICE_BATCHES,
    records: int = SHAPE_SLICE_RECORDS,
) -> AsyncGenerator[StoredPiece, None]:
    """A read's stored batches ``data`` (whole batches) in pieces of at most ``batches``
    batches and, past a piece's first batch, ``records`` records, the event loop given
    back between pieces; ``data`` itself when it is one piece. The records counted are
    those whose shaping costs work: of batches holding Kafka records when
    ``records_of_kafka`` (transcoded to columnar ones), of the others when not (made
    into Kafka's); the other kind is passed on by its bytes."""
    end, held = batch_format.batches_end(data, 0, batches, records, records_of_kafka)
    if end >= len(data):
        yield StoredPiece(data, held)
        return
    view = memoryview(data)
    position = 0
    while True:
        yield StoredPiece(view[position:end], held)
        position = end
        if position >= len(data):
            return
        await asyncio.sleep(0)
        end, held = batch_format.batches_end(data, position, batches, records, records_of_kafka)


async def shape_piece(piece: StoredPiece, shape: Callable[[], R]) -> R:
    """``shape()``, which makes ``piece`` into a front's form: on the event loop, or in a
    worker thread for a piece of one batch over ``SHAPE_SLICE_RECORDS`` records."""
    if piece.records > SHAPE_SLICE_RECORDS:
        return await asyncio.to_thread(shape)
    return shape()


async def in_steps(steps: Generator[None, None, R]) -> R:
    """Run ``steps`` (a pure computation that yields between pieces of its work) to its
    end, giving the event loop back at each yield; its result."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            result: R = done.value
            return result
        await asyncio.sleep(0)


async def yield_every(
    items: Iterable[T], count: int = LOOP_SLICE_ITEMS, weight: Callable[[T], int] | None = None
) -> AsyncIterator[T]:
    """``items``, giving the event loop back after every ``count`` of them, or, with
    ``weight``, once the items since the last time weigh ``count`` (a topic by its
    partitions: a few wide topics hold the loop as long as many narrow ones)."""
    held = 0
    for item in items:
        yield item
        held += weight(item) if weight is not None else 1
        if held >= count:
            held = 0
            await asyncio.sleep(0)


class LongCallSlots:
    def __init__(self, per_connection_max: int, node_max: int) -> None:
        self.per_connection_max = per_connection_max
        self.node_max = node_max
        self.open = 0
        self._by_connection: dict[str, int] = {}

    def open_on(self, connection: str) -> int:
        return self._by_connection.get(connection, 0)

    @contextmanager
    def hold(self, connection: str, forwarded: bool) -> Iterator[None]:
        """Hold a slot while the call lasts; raise THROTTLING_QUOTA_EXCEEDED when over
        a cap. ``connection`` is the gRPC peer (one per client connection)."""
        if self.open >= self.node_max:
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"this node has {self.open} streams and long polls open, its limit "
                f"(streams_max {self.node_max}); retry later or use fewer",
            )
        counted = not forwarded
        if counted:
            held = self._by_connection.get(connection, 0)
            if held >= self.per_connection_max:
                raise HeadwaterError(
                    ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                    f"this connection has {held} streams and long polls open, its limit "
                    f"(streams_per_connection_max {self.per_connection_max}); close some or "
                    "open another connection",
                )
            self._by_connection[connection] = held + 1
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
            if counted:
                left = self._by_connection[connection] - 1
                if left:
                    self._by_connection[connection] = left
                else:
                    del self._by_connection[connection]


class StreamBudget:
    """Bytes of one stream's requests in progress (``stream_buffer_bytes_max``): each
    request's batches are charged when the request has read them (``charge``, which
    returns the release) and released when it is answered; the stream reads its next
    request only while the charge is within the budget (``wait_for_room``), so it holds at
    most the budget and one request. Used on the event loop only."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.held = 0
        self._freed = asyncio.Event()

    def charge(self, size: int) -> Callable[[], None]:
        self.held += size
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.held -= size
                self._freed.set()

        return release

    async def wait_for_room(self) -> None:
        while self.held > self.budget:
            self._freed.clear()
            await self._freed.wait()
