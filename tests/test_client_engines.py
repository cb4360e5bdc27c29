"""One behaviour suite for both client engines (issue 12): the threaded Producer and
Consumer, and the asyncio AsyncProducer and AsyncConsumer, driven through one small
synchronous face each, against real nodes.

What both must do alike: route keys by murmur2 and spread keyless records; carry headers
and timestamps; keep each partition's order; refuse unknown topics, partitions and
settings with the same codes; retry through a node's restart and a paused node; give up
at ``delivery_timeout_ms``; bound the records waiting (``buffer_bytes_max``, then
REQUEST_TIMED_OUT after ``max_block_ms``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import pytest

from headwater.client import Admin, Consumer, LogReader, Producer, RecordMetadata
from headwater.client.aio import AsyncConsumer, AsyncProducer
from headwater.client.partitioner import partition_for_key
from headwater.errors import ErrorCode, HeadwaterError
from headwater.log.batch import HeaderPairs, iter_headers
from headwater.v1 import headwater_pb2 as pb
from tests.node_process import NodeProcess

ENGINES = ("threaded", "asyncio")


class Sent(Protocol):
    def result(self, timeout: float | None = None) -> RecordMetadata: ...


class Engine(Protocol):
    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        headers: HeaderPairs | None = None,
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> Sent: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def read(self, topic: str, count: int) -> list[Any]: ...


class ThreadedEngine:
    def __init__(self, address: str, **options: Any) -> None:
        self.address = address
        self.producer = Producer(address, linger_ms=0, **options)

    def send(self, topic: str, value: bytes | None, **fields: Any) -> Sent:
        return self.producer.send(topic, value, **fields)

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        self.producer.close()

    def read(self, topic: str, count: int) -> list[Any]:
        with Consumer(self.address, auto_offset_reset="earliest") as consumer:
            consumer.assign(topic)
            records: list[Any] = []
            deadline = time.monotonic() + 30
            while len(records) < count and time.monotonic() < deadline:
                records += list(consumer.poll(timeout_ms=500))
            return records


class _AsyncSent:
    def __init__(self, engine: AsyncEngine, future: asyncio.Future[RecordMetadata]) -> None:
        self._engine = engine
        self._future = future

    def result(self, timeout: float | None = None) -> RecordMetadata:
        async def wait() -> RecordMetadata:
            return await asyncio.shield(self._future)

        return self._engine.call(wait(), timeout)


class AsyncEngine:
    """The asyncio clients on an event loop of their own thread."""

    def __init__(self, address: str, **options: Any) -> None:
        self.address = address
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> AsyncProducer:
            return AsyncProducer(address, **options)

        try:
            self.producer = self.call(make())
        except BaseException:
            self._stop_loop()
            raise

    def call(self, coroutine: Any, timeout: float | None = 60) -> Any:
        future: Future[Any] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def send(self, topic: str, value: bytes | None, **fields: Any) -> Sent:
        return _AsyncSent(self, self.call(self.producer.send(topic, value, **fields)))

    def flush(self) -> None:
        self.call(self.producer.flush(), None)

    def close(self) -> None:
        try:
            self.call(self.producer.close(), None)
        finally:
            self._stop_loop()

    def _stop_loop(self) -> None:
        """Cancel what is left on the loop (as asyncio.run does), then stop and close it."""

        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self.call(cancel_the_rest(), 30)
        self.call(self.loop.shutdown_asyncgens(), 30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def read(self, topic: str, count: int) -> list[Any]:
        async def run() -> list[Any]:
            async with AsyncConsumer(self.address) as consumer:
                await consumer.assign_at(topic, pb.OFFSET_SPEC_EARLIEST)
                records: list[Any] = []
                deadline = time.monotonic() + 30
                while len(records) < count and time.monotonic() < deadline:
                    records += list(await consumer.poll(timeout_ms=500))
                return records

        return self.call(run(), None)


def make_engine(kind: str, address: str, **options: Any) -> Engine:
    return (
        ThreadedEngine(address, **options)
        if kind == "threaded"
        else AsyncEngine(address, **options)
    )


@pytest.fixture(params=ENGINES)
def engine_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def engine_of(engine_kind: str) -> Iterator[Callable[..., Engine]]:
    made: list[Engine] = []

    def make(address: str, **options: Any) -> Engine:
        made.append(make_engine(engine_kind, address, **options))
        return made[-1]

    yield make
    for engine in made:
        with contextlib.suppress(HeadwaterError):
            engine.close()


def _topic(admin: Admin, name: str, partitions: int) -> str:
    admin.create_topic(name, partitions, 1)
    return name


def test_keys_headers_timestamps_and_order(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-keys-{engine_kind}", 3)
    engine = engine_of(shared_node.address, acks="all")
    keys = [b"user-%d" % (i % 7) for i in range(60)]
    sent = [
        engine.send(
            topic,
            b"%d" % i,
            key=key,
            headers=[("n", b"%d" % i)] if i % 2 else None,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i, key in enumerate(keys)
    ]
    landed = [s.result(30) for s in sent]
    assert [m.partition for m in landed] == [partition_for_key(k, 3) for k in keys]
    records = engine.read(topic, 60)
    assert sorted(int(r.value) for r in records) == list(range(60))
    for record in records:
        i = int(record.value)
        assert record.key == keys[i]
        assert record.timestamp_ms == 1_700_000_000_000 + i
        assert record.headers == ([("n", b"%d" % i)] if i % 2 else [])
    for partition in range(3):  # each partition holds its records in send order
        values = [int(r.value) for r in records if r.partition == partition]
        assert values == sorted(values)


def test_keyless_records_spread_over_partitions(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-spread-{engine_kind}", 4)
    engine = engine_of(shared_node.address, acks=1)
    used = set()
    for round_ in range(12):  # one batch per round: the sticky partition moves between them
        used |= {engine.send(topic, b"%d" % round_).result(30).partition for _ in range(3)}
    assert len(used) >= 2


def test_the_same_refusals(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-refusals-{engine_kind}", 2)
    engine = engine_of(shared_node.address)
    with pytest.raises(HeadwaterError) as unknown:
        engine.send(f"engines-no-such-topic-{engine_kind}", b"v")
    assert unknown.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with pytest.raises(HeadwaterError) as outside:
        engine.send(topic, b"v", partition=2)
    assert outside.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "[0, 2)" in outside.value.message
    for bad, code in (
        ({"retries": -1}, ErrorCode.INVALID_CONFIG),
        ({"delivery_timeout_ms": 0}, ErrorCode.INVALID_CONFIG),
        ({"buffer_bytes_max": 0}, ErrorCode.INVALID_CONFIG),
        ({"acks": "2"}, ErrorCode.INVALID_REQUIRED_ACKS),
    ):
        with pytest.raises(HeadwaterError) as refused:
            make_engine(engine_kind, shared_node.address, **bad)
        assert refused.value.code is code, bad


def test_records_survive_a_node_restart(
    node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """Records sent while the node is down are retried until it is back: every one is
    acknowledged and stored, each partition in send order (the first copy of each value
    comes in send order; a retry after a lost answer may store a value twice)."""
    with Admin(node.address) as admin:
        topic = _topic(admin, "engines-restart", 2)
    engine = engine_of(
        node.address, acks="all", retries=1000, request_timeout_ms=2000, append_timeout_ms=1000
    )
    before = [engine.send(topic, b"%d" % i, partition=i % 2) for i in range(100)]
    assert all(s.result(30).offset >= 0 for s in before)
    node.kill()
    during = [engine.send(topic, b"%d" % i, partition=i % 2) for i in range(100, 200)]
    node.start()
    landed = [s.result(60) for s in during]
    assert {m.partition for m in landed} == {0, 1}
    records = engine.read(topic, 200)
    first_seen: dict[int, list[int]] = {0: [], 1: []}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        value = int(record.value)
        if value not in first_seen[record.partition]:
            first_seen[record.partition].append(value)
    assert first_seen[0] == list(range(0, 200, 2))
    assert first_seen[1] == list(range(1, 200, 2))


def test_a_paused_node_is_waited_out_and_the_buffer_is_bounded(
    node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """With the node paused nothing is answered: records fill the buffer, then a send
    waits ``max_block_ms`` and raises REQUEST_TIMED_OUT; the stream that stopped answering
    is abandoned after ``request_timeout_ms`` and its batches are retried once the node
    is back, so every record that was let in is stored."""
    with Admin(node.address) as admin:
        topic = _topic(admin, "engines-paused", 1)
    engine = engine_of(
        node.address,
        acks=1,
        buffer_bytes_max=2000,
        max_block_ms=300,
        request_timeout_ms=1000,
        append_timeout_ms=1000,
    )
    engine.send(topic, b"warm").result(30)  # the layout is cached before the pause
    assert node.process is not None
    node.pause()
    try:
        accepted: list[Sent] = []
        began = time.monotonic()

        def fill() -> None:
            for i in range(100):
                accepted.append(engine.send(topic, b"x" * 100 + b"%d" % i))  # noqa: PERF401

        with pytest.raises(HeadwaterError) as full:
            fill()
        assert full.value.code is ErrorCode.REQUEST_TIMED_OUT
        assert "buffer full" in full.value.message
        assert time.monotonic() - began >= 0.25
        assert 1 <= len(accepted) < 100
        time.sleep(1.5)  # the fault: longer than request_timeout_ms
    finally:
        node.resume()
    assert [s.result(30).offset for s in accepted] == sorted(s.result(30).offset for s in accepted)
    assert engine.send(topic, b"after").result(30).offset > 0


def test_delivery_gives_up_at_the_delivery_timeout(
    node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    with Admin(node.address) as admin:
        topic = _topic(admin, "engines-give-up", 1)
    engine = engine_of(
        node.address,
        acks=1,
        delivery_timeout_ms=2000,
        request_timeout_ms=1000,
        append_timeout_ms=500,
    )
    engine.send(topic, b"first").result(30)
    node.kill()
    began = time.monotonic()
    doomed = engine.send(topic, b"lost")
    with pytest.raises(HeadwaterError) as failed:
        doomed.result(30)
    assert failed.value.retriable
    # Retried (each retry waits out the failed attempt's 500 ms append deadline), and no
    # retry starts past the delivery deadline: the outcome is known within it plus one
    # request's timeout (and a loaded machine's slack).
    assert 0.5 <= time.monotonic() - began < 2 + 1 + 5


def test_batches_are_cut_at_batch_bytes(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """Records that pile up (sent at once, or during a stall) leave in batches of about
    ``batch_bytes``, never one batch the broker would refuse as too large."""
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-batch-bytes-{engine_kind}", 1)
    engine = engine_of(shared_node.address, acks=1, batch_bytes=1000)
    sent = [engine.send(topic, b"x" * 100) for _ in range(50)]
    assert [s.result(30).offset for s in sent] == list(range(50))
    with LogReader(shared_node.address) as reader:
        records = reader.fetch(topic, 0, 0, max_bytes=1 << 20).records
    counts = [header.record_count for _, header in iter_headers(records)]
    assert sum(counts) == 50 and len(counts) >= 5
    assert max(counts) <= 1000 // 100, counts
