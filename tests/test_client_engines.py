"""One behaviour suite for both client engines: the threaded Producer and
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
import inspect
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol

import pytest

from headwater.client import (
    Admin,
    CommitFailedError,
    Consumer,
    LogReader,
    Producer,
    RecordMetadata,
)
from headwater.client.admin_types import OffsetSpec
from headwater.client.aio import AsyncConsumer, AsyncProducer
from headwater.client.partitioner import partition_for_key
from headwater.client.positions import TopicPartition
from headwater.log.batch import HeaderPairs, encode_batch, iter_headers
from headwater.shared.errors import ErrorCode, HeadwaterError
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

    def send_batch(self, topic: str, values: list[bytes], **fields: Any) -> list[Sent]: ...

    def send_encoded(self, topic: str, partition: int, batch: bytes) -> Sent: ...

    def consumer(self, **options: Any) -> Any: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...

    def read(self, topic: str, count: int) -> list[Any]: ...


class ThreadedEngine:
    def __init__(self, address: str, **options: Any) -> None:
        self.address = address
        self.producer = Producer(address, linger_ms=0, **options)
        self.consumers: list[Consumer] = []

    def send(self, topic: str, value: bytes | None, **fields: Any) -> Sent:
        return self.producer.send(topic, value, **fields)

    def send_batch(self, topic: str, values: list[bytes], **fields: Any) -> list[Sent]:
        return list(self.producer.send_batch(topic, values, **fields))

    def send_encoded(self, topic: str, partition: int, batch: bytes) -> Sent:
        return self.producer.send_encoded(topic, partition, batch)

    def consumer(self, **options: Any) -> Any:
        consumer = Consumer(self.address, **options)
        self.consumers.append(consumer)
        return consumer

    def flush(self) -> None:
        self.producer.flush()

    def close(self) -> None:
        for consumer in self.consumers:
            consumer.close()
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
    def __init__(self, engine: AsyncEngine, future: asyncio.Future[Any]) -> None:
        self._engine = engine
        self._future = future

    def result(self, timeout: float | None = None) -> Any:
        async def wait() -> Any:
            return await asyncio.shield(self._future)

        return self._engine.call(wait(), timeout)


class _OnLoop:
    """An asyncio client's methods called from this thread: a coroutine's result is
    awaited on the engine's loop."""

    def __init__(self, engine: AsyncEngine, target: Any) -> None:
        self._engine = engine
        self._target = target

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._target, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            async def run() -> Any:
                answer = method(*args, **kwargs)
                return await answer if inspect.isawaitable(answer) else answer

            return self._engine.call(run())

        return call


class AsyncEngine:
    """The asyncio clients on an event loop of their own thread."""

    def __init__(self, address: str, **options: Any) -> None:
        self.address = address
        self.consumers: list[AsyncConsumer] = []
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

    def send_batch(self, topic: str, values: list[bytes], **fields: Any) -> list[Sent]:
        futures = self.call(self.producer.send_batch(topic, values, **fields))
        return [_AsyncSent(self, f) for f in futures]

    def send_encoded(self, topic: str, partition: int, batch: bytes) -> Sent:
        return _AsyncSent(self, self.call(self.producer.send_encoded(topic, partition, batch)))

    def consumer(self, **options: Any) -> Any:
        async def make() -> AsyncConsumer:
            return AsyncConsumer(self.address, **options)

        consumer = self.call(make())
        self.consumers.append(consumer)
        return _OnLoop(self, consumer)

    def flush(self) -> None:
        self.call(self.producer.flush(), None)

    def close(self) -> None:
        try:
            for consumer in self.consumers:
                self.call(consumer.close(), 30)
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
                await consumer.assign_at(topic, OffsetSpec.EARLIEST)
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
    assert outside.value.code is ErrorCode.PARTITION_OUT_OF_RANGE
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


def test_a_new_producer_waits_for_a_restarting_node(
    node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """A producer's first send to a topic asks for its layout; while no node answers (the
    node was killed and restarts meanwhile, or this process's connection to it is still
    backing off from the failure) the ask is retried within the request timeout, as
    Kafka's producer waits ``max.block.ms`` for metadata, instead of failing the send."""
    with Admin(node.address) as admin:
        topic = _topic(admin, "engines-first-send", 1)
    node.kill()
    restart = threading.Thread(target=node.start)
    restart.start()
    try:
        engine = engine_of(node.address, acks="all")
        assert engine.send(topic, b"after the restart").result(60).offset == 0
    finally:
        restart.join()


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


def test_send_batch_and_send_encoded(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """Many records at once: keyed ones by key, cut at ``batch_bytes``; a batch encoded
    beforehand is sent as it is, after what was queued for its partition."""
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-send-batch-{engine_kind}", 3)
    engine = engine_of(shared_node.address, acks="all", batch_bytes=2000)
    keys = [b"k%d" % (i % 5) for i in range(90)]
    batches = engine.send_batch(topic, [b"v" * 100 + b"%d" % i for i in range(90)], keys=keys)
    landed = [b.result(30) for b in batches]
    assert sum(m.record_count for m in landed) == 90 and len(landed) >= 6
    encoded = encode_batch([b"pre-1", b"pre-2"], timestamps_ms=1_700_000_000_000)
    tail = engine.send_encoded(topic, 2, encoded).result(30)
    assert tail.partition == 2 and tail.record_count == 2
    records = engine.read(topic, 92)
    assert len(records) == 92
    for record in records:
        if record.value.startswith(b"pre-"):
            assert record.partition == 2 and record.timestamp_ms == 1_700_000_000_000
        else:
            assert record.partition == partition_for_key(record.key, 3)
    last = max((r for r in records if r.partition == 2), key=lambda r: r.offset)
    assert last.value == b"pre-2"


def test_assign_seek_position_and_reset(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """Both consumers: assign single partitions, seek to an offset, to the beginning, to
    the end and by time; positions follow what was returned; ``auto_offset_reset``
    places a partition without a position, or refuses under ``none``."""
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-seek-{engine_kind}", 2)
    engine = engine_of(shared_node.address, acks="all")
    sent = [
        engine.send(topic, b"%d" % i, partition=1, timestamp_ms=1_700_000_000_000 + i)
        for i in range(20)
    ]
    assert [s.result(30).offset for s in sent] == list(range(20))
    one = TopicPartition(topic, 1)
    consumer = engine.consumer(auto_offset_reset="earliest")
    consumer.assign([(topic, 1)])
    assert consumer.assignment() == [one]
    consumer.seek(one, 15)
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 5 and time.monotonic() < deadline:
        got += list(consumer.poll(500))
    assert [r.offset for r in got] == list(range(15, 20))
    assert consumer.position(one) == 20
    consumer.seek_to_beginning()
    assert consumer.position(one) == 0
    consumer.seek_to_timestamp(1_700_000_000_007)
    assert consumer.position(one) == 7
    consumer.seek_to_end()
    assert consumer.position(one) == 20
    with pytest.raises(HeadwaterError) as unassigned:
        consumer.seek(TopicPartition(topic, 0), 0)
    assert unassigned.value.code is ErrorCode.INVALID_REQUEST
    fresh = engine.consumer(auto_offset_reset="earliest")
    fresh.assign(topic)
    assert fresh.position(one) == 0
    strict = engine.consumer(auto_offset_reset="none")
    strict.assign([one])
    with pytest.raises(HeadwaterError) as no_position:
        strict.position(one)
    assert no_position.value.code is ErrorCode.OFFSET_OUT_OF_RANGE


class _Events:
    """A rebalance listener that records what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, list[TopicPartition]]] = []

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        self.events.append(("assigned", partitions))

    def on_revoked(self, partitions: list[TopicPartition]) -> None:
        self.events.append(("revoked", partitions))

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        self.events.append(("lost", partitions))


def test_group_subscribe_commit_and_rebalance(
    shared_node: NodeProcess, engine_kind: str, engine_of: Callable[..., Engine]
) -> None:
    """Both consumers: subscribe, read everything, commit and read the commit back; a
    second member takes half the partitions (the first is told on_revoked, the second
    on_assigned, from the committed offsets); a commit of a partition the member does not
    own is refused; when one closes, the other gets every partition."""
    with Admin(shared_node.address) as admin:
        topic = _topic(admin, f"engines-group-{engine_kind}", 4)
    group = f"engines-{engine_kind}"
    engine = engine_of(shared_node.address, acks="all")
    for s in engine.send_batch(topic, [b"%d" % i for i in range(40)], partition=0):
        s.result(30)
    for p in (1, 2, 3):
        engine.send(topic, b"p%d" % p, partition=p).result(30)
    first_events, second_events = _Events(), _Events()
    first = engine.consumer(auto_offset_reset="earliest")
    first.subscribe(topic, group_id=group, listener=first_events, enable_auto_commit=False)
    got: list[Any] = []
    deadline = time.monotonic() + 30
    while len(got) < 43 and time.monotonic() < deadline:
        got += list(first.poll(200))
    assert len(got) == 43 and len(first.assignment()) == 4
    first.commit()
    tps = [TopicPartition(topic, p) for p in range(4)]
    assert first.committed(tps) == {tps[0]: 40, tps[1]: 1, tps[2]: 1, tps[3]: 1}
    second = engine.consumer(auto_offset_reset="latest")
    second.subscribe(topic, group_id=group, listener=second_events)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not (
        len(first.assignment()) == 2 and len(second.assignment()) == 2
    ):
        first.poll(50)
        second.poll(50)
    assert sorted(first.assignment() + second.assignment()) == tps
    assert [kind for kind, _ in first_events.events] == ["assigned", "revoked"]
    assert first_events.events[1][1] == second_events.events[0][1] == second.assignment()
    moved = second.assignment()[0]
    assert second.position(moved) == first.committed([moved])[moved]  # from the commit
    with pytest.raises(CommitFailedError) as refused:
        first.commit({moved: 1})
    assert refused.value.code is ErrorCode.PARTITION_NOT_ASSIGNED
    first.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(second.assignment()) < 4:
        second.poll(50)
    assert second.assignment() == tps
