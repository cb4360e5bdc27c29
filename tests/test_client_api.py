"""What the Spark connector and the benchmarks need from the client API: offsets
of partitions across topics, one-shot range fetches, pre-encoded batches, many topics per
request, and a health probe. Against a real node."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from headwater.client import (
    Admin,
    LogReader,
    NewTopic,
    Producer,
    node_serving,
)
from headwater.log.batch import decode_batches, encode_batch, iter_headers
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.ports import free_port
from tests.node_process import NodeProcess


def test_offsets_across_topics_earliest_latest_and_by_time(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin, Producer(shared_node.address, acks="1") as producer:
        ids = admin.create_topics([NewTopic("api-a", 2, 1), NewTopic("api-b", 1, 1)])
        assert set(ids) == {"api-a", "api-b"} and all(ids.values())
        for partition, count in ((0, 3), (1, 5)):
            for i in range(count):
                producer.send("api-a", b"v", partition=partition, timestamp_ms=1000 + i)
        producer.send("api-b", b"v", partition=0, timestamp_ms=5000)
        producer.flush()
        keys = [("api-a", 0), ("api-a", 1), ("api-b", 0)]
        assert admin.beginning_offsets(keys) == dict.fromkeys(keys, 0)
        assert admin.end_offsets(keys) == {("api-a", 0): 3, ("api-a", 1): 5, ("api-b", 0): 1}
        by_time = admin.offsets_for_times({("api-a", 1): 1002, ("api-b", 0): 9999})
        assert by_time == {("api-a", 1): 2, ("api-b", 0): 1}  # none that late: the end
        assert admin.partition_counts(["api-a", "api-b"]) == {"api-a": 2, "api-b": 1}
        with pytest.raises(HeadwaterError) as raised:
            admin.create_topics([NewTopic("api-c", 1, 1), NewTopic("api-a", 1, 1)])
        assert raised.value.code is ErrorCode.TOPIC_ALREADY_EXISTS
        assert "api-c" in admin.partition_counts()  # the others were created


def test_records_a_month_apart_are_each_sent(shared_node: NodeProcess) -> None:
    """A batch holds int32 timestamp deltas: a record stamped a month before the one
    queued with it made the batch unencodable, and both failed with INVALID_RECORD. The
    producer now starts a new batch for it."""
    month_ms = 30 * 86_400_000
    now = int(time.time() * 1000)
    with Admin(shared_node.address) as admin:
        admin.create_topic("api-month-apart", 1)
    with Producer(shared_node.address, acks="1", linger_ms=50) as producer:
        futures = [
            producer.send("api-month-apart", b"old", timestamp_ms=now - month_ms),
            producer.send("api-month-apart", b"new"),
            producer.send("api-month-apart", b"older", timestamp_ms=now - 2 * month_ms),
        ]
        sent = [future.result(timeout=30) for future in futures]
    assert [m.offset for m in sent] == [0, 1, 2]
    assert sent[0].timestamp_ms == now - month_ms and sent[2].timestamp_ms == now - 2 * month_ms


def test_done_callbacks_get_the_future_once(shared_node: NodeProcess) -> None:
    """As concurrent.futures: the callback is called with the future itself (it was
    given the batch's internal result object), once, also when added after the batch
    was done."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("api-callbacks", 1)
    calls: list[object] = []
    with Producer(shared_node.address, acks="1") as producer:
        future = producer.send("api-callbacks", b"v")
        future.add_done_callback(calls.append)
        (batch,) = producer.send_batch("api-callbacks", [b"a", b"b"])
        batch.add_done_callback(calls.append)
        producer.flush()
        assert future.result(timeout=30).offset == 0
        future.add_done_callback(calls.append)  # already done: called at once
    assert calls == [future, batch, future]
    assert all(c is o for c, o in zip(calls, [future, batch, future], strict=True))


def test_log_reader_fetches_whole_batches_from_an_offset(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        admin.create_topic("api-read", 1, 1)
    with Producer(shared_node.address, acks="1") as producer:
        producer.send_batch("api-read", [b"a", b"b", b"c"], partition=0)[0].result(10)
        producer.send_batch("api-read", [b"d", b"e"], partition=0)[0].result(10)
    with LogReader(shared_node.address) as reader:
        fetched = reader.fetch("api-read", 0, 1)
        assert (fetched.offset, fetched.next_offset, fetched.high_watermark) == (1, 5, 5)
        assert fetched.log_start_offset == 0
        batches = decode_batches(fetched.records)
        assert [b.header.base_offset for b in batches] == [0, 3]  # the first starts before
        began = time.monotonic()
        empty = reader.fetch("api-read", 0, 5, max_wait_ms=300)  # at the end: waits
        assert time.monotonic() - began >= 0.25
        assert (empty.records, empty.next_offset) == (b"", 5)
        with pytest.raises(HeadwaterError) as raised:
            reader.fetch("api-read", 0, 6)
        assert raised.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
        with pytest.raises(HeadwaterError) as missing:
            reader.fetch("api-no-such-topic", 0, 0)
        assert missing.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_send_encoded_keeps_the_batch_and_its_order(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        admin.create_topic("api-encoded", 2, 1)
    encoded = encode_batch([b"x", b"y"], producer_id=77, producer_epoch=0, base_sequence=9)
    with Producer(shared_node.address, acks="all", linger_ms=50) as producer:
        before = producer.send("api-encoded", b"first", partition=1)  # still lingering
        future = producer.send_encoded("api-encoded", 1, encoded)
        after = producer.send("api-encoded", b"last", partition=1)
        landed = future.result(10)
        assert future.exception() is None
        assert (landed.partition, landed.record_count) == (1, 2)
        assert before.result(10).offset < landed.base_offset < after.result(10).offset
        with pytest.raises(HeadwaterError) as torn:
            producer.send_encoded("api-encoded", 0, encoded[:-8])
        assert torn.value.code is ErrorCode.CORRUPT_MESSAGE
        with pytest.raises(HeadwaterError) as two:
            producer.send_encoded("api-encoded", 0, encoded + encoded)
        assert two.value.code is ErrorCode.CORRUPT_MESSAGE and "one batch" in two.value.message
        with pytest.raises(HeadwaterError) as bad_partition:
            producer.send_encoded("api-encoded", 2, encoded)
        assert bad_partition.value.code is ErrorCode.PARTITION_OUT_OF_RANGE
        assert not bad_partition.value.retriable
    with LogReader(shared_node.address) as reader:
        records = reader.fetch("api-encoded", 1, landed.base_offset).records
    (_, header), *_ = iter_headers(records)
    # An idempotent producer (the default with acks=all) stamps its own producer id,
    # epoch and sequence on an encoded batch: "first" took sequence 0.
    assert header.producer_id >= 0
    assert (header.producer_epoch, header.base_sequence) == (0, 1)
    # Without idempotence the batch is stored as it came, byte for byte.
    plain = encode_batch([b"x", b"y"])
    with Producer(shared_node.address, acks="1") as producer:
        kept = producer.send_encoded("api-encoded", 0, plain).result(10)
    with LogReader(shared_node.address) as reader:
        stored = reader.fetch("api-encoded", 0, kept.base_offset).records
    assert stored[16:] == plain[16:]  # all but base offset and leader epoch


def test_node_serving_answers_for_a_node_and_not_for_a_closed_port(
    shared_node: NodeProcess,
) -> None:
    assert node_serving(shared_node.address)
    assert not node_serving(f"127.0.0.1:{free_port()}", timeout_s=0.5)


def test_the_container_health_probe_exits_by_the_answer_and_loads_only_grpc(
    shared_node: NodeProcess,
) -> None:
    """``headwater-healthcheck`` is what Docker starts in every container at every check:
    0 for a serving node, 1 for a closed port, 2 with a usage line for bad arguments, and
    none of the project's heavy modules loaded (the full CLI cost 0.34 s of CPU a check)."""
    probe = [sys.executable, "-m", "headwater.healthcheck"]
    serving = subprocess.run(
        [*probe, shared_node.address], check=False, capture_output=True, text=True
    )
    assert serving.returncode == 0 and "is serving" in serving.stdout
    closed = f"127.0.0.1:{free_port()}"
    refused = subprocess.run(
        [*probe, closed, "--timeout-ms", "500"], check=False, capture_output=True
    )
    assert refused.returncode == 1
    for bad, problem in (
        (["--timeout-ms", "0"], "not an integer in 1..600000"),
        (["127.0.0.1:99999"], "port in 1..65535"),
        (["--verbose"], "unknown option"),
        (["a:1", "b:2"], "one address expected"),
    ):
        answer = subprocess.run([*probe, *bad], check=False, capture_output=True, text=True)
        assert answer.returncode == 2 and problem in answer.stderr and "usage:" in answer.stderr
    loaded = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, headwater.healthcheck; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('headwater', 'pyarrow', 'click', 'pysyncobj')))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    assert loaded.stdout.strip() == (
        "['headwater', 'headwater.healthcheck', 'headwater.shared', "
        "'headwater.shared.credentials', 'headwater.shared.errors', "
        "'headwater.shared.grpc_channels', 'headwater.shared.tls']"
    )
