"""Producer.send's two paths against a real node: a keyless record without
headers joins the open batch of its topic's sticky partition directly (``OpenBatch``'s
direct-append rule, inlined in ``send``); every other record, and every record the rule
does not admit, takes the general path. Whatever path a record takes, it must land with
the offset, partition and timestamp its future reports, in send order per partition, once;
and a closed producer refuses every record."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from headwater.client import Admin, Consumer, Producer, RecordFuture
from headwater.client.accumulator import RECORD_BYTES_MAX
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.node_process import NodeProcess

MONTH_MS = 30 * 86_400_000


def _read_all(address: str, topic: str, count: int) -> list[Any]:
    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign(topic)
        records: list[Any] = []
        deadline = time.monotonic() + 60
        while len(records) < count and time.monotonic() < deadline:
            records += list(consumer.poll(timeout_ms=500))
        return records


@pytest.mark.parametrize("seed", range(2))
def test_every_path_lands_what_its_future_reports(shared_node: NodeProcess, seed: int) -> None:
    """A seeded mix: keyless records (the direct path) between keyed ones, records with
    headers, an explicit partition or timestamp (near, and months back, which must start
    a new batch), empty and null values, and values near and past batch_bytes, so batches
    close on size, on timestamps and on linger while records keep coming."""
    rng = random.Random(seed)
    topic = f"send-paths-{seed}"
    with Admin(shared_node.address) as admin:
        admin.create_topic(topic, 3, 1)
    now_ms = int(time.time() * 1000)
    sent: list[tuple[RecordFuture, dict[str, Any]]] = []
    with Producer(shared_node.address, acks="1", batch_bytes=2048, linger_ms=2) as producer:
        for i in range(3000):
            fields: dict[str, Any] = {}
            roll = rng.random()
            if roll < 0.1:
                fields["key"] = b"key-%d" % rng.randrange(20)
            elif roll < 0.15:
                fields["partition"] = rng.randrange(3)
            if rng.random() < 0.05:
                fields["headers"] = [("n", b"%d" % i)]
            if rng.random() < 0.05:
                fields["timestamp_ms"] = now_ms + rng.choice([-5, 5, -MONTH_MS, -2 * MONTH_MS])
            size = rng.choice([0, 10, 10, 10, 300, 1900, 2500])
            value = None if rng.random() < 0.02 else (b"%d:" % i).ljust(size, b".")
            sent.append((producer.send(topic, value, **fields), {"value": value, **fields}))
            if rng.random() < 0.002:
                time.sleep(0.005)  # past linger: the open batch leaves while sends go on
        producer.flush()
        landed = [future.result(timeout=30) for future, _ in sent]
    records = _read_all(shared_node.address, topic, len(sent))
    assert len(records) == len(sent)
    by_position = {(r.partition, r.offset): r for r in records}
    assert len(by_position) == len(sent)  # none twice
    for metadata, (_future, fields) in zip(landed, sent, strict=True):
        record = by_position[(metadata.partition, metadata.offset)]
        assert record.value == fields["value"]
        assert record.key == fields.get("key")
        assert record.headers == fields.get("headers", [])
        assert record.timestamp_ms == metadata.timestamp_ms
        if "timestamp_ms" in fields:
            assert record.timestamp_ms == fields["timestamp_ms"]
        if "partition" in fields:
            assert metadata.partition == fields["partition"]
    for partition in range(3):  # send order within each partition
        offsets = [m.offset for m in landed if m.partition == partition]
        assert offsets == sorted(offsets)


def test_keyless_records_fill_one_partition_batch_by_batch(shared_node: NodeProcess) -> None:
    """The direct path keeps the sticky partition: keyless records go to one partition
    until its batch closes, then the next batch may go elsewhere."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("send-paths-sticky", 4, 1)
    with Producer(shared_node.address, acks="1", batch_bytes=1200, linger_ms=1000) as producer:
        futures = [producer.send("send-paths-sticky", b"x" * 88) for _ in range(40)]
        producer.flush()
        landed = [f.result(timeout=30) for f in futures]
    per_batch = 1200 // 100  # 88 bytes + 12 of overhead each: a batch closes at 12 records
    for start in range(0, 40, per_batch):
        run = landed[start : start + per_batch]
        assert len({m.partition for m in run}) == 1
        assert [m.offset for m in run] == list(range(run[0].offset, run[0].offset + len(run)))


def test_a_closed_producer_refuses_every_record(shared_node: NodeProcess) -> None:
    """After close, send raises on the direct path too: the topic's sticky batch was
    open (and its lane remembered) just before."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("send-paths-closed", 1, 1)
    producer = Producer(shared_node.address, acks="1", linger_ms=10_000)
    first = producer.send("send-paths-closed", b"before")
    producer.close()
    assert first.result(timeout=10).offset == 0
    for fields in ({}, {"key": b"k"}, {"partition": 0}):
        with pytest.raises(HeadwaterError) as raised:
            producer.send("send-paths-closed", b"after", **fields)
        assert raised.value.code is ErrorCode.INVALID_REQUEST


def test_a_record_no_node_could_take_is_refused_by_send_itself(shared_node: NodeProcess) -> None:
    """Past RECORD_BYTES_MAX (max_message_bytes' ceiling under the default
    request_bytes_max) send raises MESSAGE_TOO_LARGE at once, as Kafka's producer does
    past max.request.size: nothing is queued, copied or sent."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("send-paths-huge", 1, 1)
    huge = bytes(RECORD_BYTES_MAX)
    with Producer(shared_node.address, acks="1") as producer:
        for fields in ({}, {"key": b"k"}, {"partition": 0}):
            began = time.monotonic()
            with pytest.raises(HeadwaterError) as raised:
                producer.send("send-paths-huge", huge, **fields)
            assert raised.value.code is ErrorCode.MESSAGE_TOO_LARGE
            assert str(RECORD_BYTES_MAX) in raised.value.message
            assert time.monotonic() - began < 1.0
        assert producer.send("send-paths-huge", b"fine").result(timeout=10).offset == 0


def test_records_sent_while_closing_all_settle(shared_node: NodeProcess) -> None:
    """A thread keeps sending keyless records while another closes the producer: every
    send either raises (closed) or returns a future that settles; none is left waiting."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("send-paths-closing", 1, 1)
    producer = Producer(shared_node.address, acks="1", linger_ms=5)
    futures: list[RecordFuture] = []
    refusals: list[ErrorCode] = []

    def keep_sending() -> None:
        while True:
            try:
                futures.append(producer.send("send-paths-closing", b"v" * 50))
            except HeadwaterError as error:
                refusals.append(error.code)
                return

    sender = threading.Thread(target=keep_sending)
    sender.start()
    deadline = time.monotonic() + 30
    while len(futures) < 20_000 and time.monotonic() < deadline:
        time.sleep(0.01)
    producer.close(timeout_s=30)  # REQUEST_TIMED_OUT if anything is left waiting
    sender.join(timeout=30)
    assert refusals == [ErrorCode.INVALID_REQUEST]
    offsets = [f.result(timeout=30).offset for f in futures]
    assert offsets == list(range(len(futures)))


def test_flush_returns_after_the_callbacks_of_what_it_waited_for(
    shared_node: NodeProcess,
) -> None:
    """A batch's future is done before its callbacks run (so that they can read it);
    flush returns only once they have run, as it did when it waited for the buffer to
    empty. A slow callback makes the order visible."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("send-paths-callbacks", 1, 1)
    calls: list[int] = []

    def slow_callback(future: RecordFuture) -> None:
        time.sleep(0.2)
        calls.append(future.result().offset)

    with Producer(shared_node.address, acks="1", linger_ms=1000) as producer:
        futures = [producer.send("send-paths-callbacks", b"v") for _ in range(3)]
        for future in futures:
            future.add_done_callback(slow_callback)
        producer.flush()
        assert calls == [0, 1, 2]
