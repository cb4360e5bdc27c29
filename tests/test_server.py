"""A real node process over real gRPC: the API, the client library, and bad input."""

from __future__ import annotations

import threading
import time
import uuid

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from headwater.client import Admin, Consumer, OffsetSpec, Producer, TopicPartition
from headwater.client.partitioner import partition_for_key
from headwater.log import batch as batch_format
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, wait_until


def new_topic(admin: Admin, partitions: int = 1, configs: dict[str, str] | None = None) -> str:
    name = f"t-{uuid.uuid4().hex[:10]}"
    admin.create_topic(name, partitions, configs=configs)
    return name


def broker(node: NodeProcess) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(node.address))


def consume_all(address: str, topic: str, expected: int, deadline_s: float = 20) -> list:
    records = []
    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign(topic)
        end = time.monotonic() + deadline_s
        while len(records) < expected and time.monotonic() < end:
            records.extend(consumer.poll(timeout_ms=500))
    return records


def error_of(call) -> HeadwaterError:
    with pytest.raises(HeadwaterError) as info:
        call()
    return info.value


# --------------------------------------------------------------------------- happy paths


def test_health_and_reflection(shared_node: NodeProcess) -> None:
    channel = grpc.insecure_channel(shared_node.address)
    for service in ("", "headwater.v1.Broker", "headwater.v1.Admin"):
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service)
        )
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")])
    )
    names = {s.name for r in responses for s in r.list_services_response.service}
    assert {"headwater.v1.Broker", "headwater.v1.Admin", "grpc.health.v1.Health"} <= names


def test_topic_lifecycle(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        name = new_topic(admin, partitions=3, configs={"retention_ms": "3600000"})
        assert name in [t.name for t in admin.list_topics()]
        (description,) = admin.describe_topics([name])
        assert [p.partition for p in description.partitions] == [0, 1, 2]
        assert description.configs["retention_ms"] == "3600000"
        assert description.configs["segment_bytes"] == str(1 << 30)
        assert all(p.leader == 1 and list(p.isr) == [1] for p in description.partitions)
        assert error_of(lambda: admin.create_topic(name, 1)).code == ErrorCode.TOPIC_ALREADY_EXISTS
        admin.delete_topic(name)
        assert name not in [t.name for t in admin.list_topics()]
        assert (
            error_of(lambda: admin.describe_topics([name])).code
            == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )
        # A recreated topic is new: new id, empty log.
        admin.create_topic(name, 1)
        (again,) = admin.describe_topics([name])
        assert again.topic_id != description.topic_id
        assert again.partitions[0].log_end_offset == 0


def test_produce_consume_keys_headers_and_codecs(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin, partitions=4)
    sent = []
    for codec in ("none", "lz4", "zstd"):
        with Producer(shared_node.address, acks="all", compression=codec, linger_ms=1) as producer:
            futures = []
            for i in range(300):
                key = f"key-{i % 17}".encode()
                value = f"{codec}-{i}".encode()
                headers = [("h", str(i).encode()), ("empty", None)] if i % 3 == 0 else None
                futures.append(producer.send(topic, value, key=key, headers=headers))
                sent.append((key, value, headers or []))
            metadata = [f.result(timeout=30) for f in futures]
        for (key, _, _), meta in zip(sent[-300:], metadata, strict=True):
            assert meta.partition == partition_for_key(key, 4)
    received = consume_all(shared_node.address, topic, len(sent))
    assert sorted((r.key, r.value, r.headers) for r in received) == sorted(sent)
    # Per partition, offsets are contiguous and in send order.
    for partition in range(4):
        offsets = [r.offset for r in received if r.partition == partition]
        assert offsets == list(range(len(offsets)))
        values = [r.value for r in received if r.partition == partition]
        assert values == [v for k, v, _ in sent if partition_for_key(k, 4) == partition]


def test_send_batch_and_columnar_view(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    values = [f"v{i}".encode() for i in range(5000)]
    with Producer(shared_node.address, acks=1, batch_bytes=16 << 10) as producer:
        futures = producer.send_batch(topic, values)
        assert len(futures) > 1  # cut into several batches by batch_bytes
        results = [f.result(timeout=30) for f in futures]
    assert sum(r.record_count for r in results) == 5000
    assert results[0].base_offset == 0
    with Consumer(shared_node.address, auto_offset_reset="earliest") as consumer:
        consumer.assign(topic)
        got = []
        wait_until(
            lambda: (
                got.extend(consumer.poll(200).batches)
                or sum(b.records.num_rows for b in got) >= 5000
            ),
            20,
            "5000 rows",
        )
    column = [v for b in got for v in b.records.column("value").to_pylist()]
    assert column == values
    assert got[0].records.schema == batch_format.RECORD_SCHEMA


def test_list_offsets_and_seek(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
        with Producer(shared_node.address) as producer:
            for i in range(10):
                producer.send(topic, b"x", timestamp_ms=1_000 * (i + 1)).result(timeout=30)
        assert admin.list_offsets(topic, OffsetSpec.EARLIEST) == {0: 0}
        assert admin.list_offsets(topic, OffsetSpec.LATEST) == {0: 10}
        assert admin.list_offsets(topic, OffsetSpec.TIMESTAMP, 4_500) == {0: 4}
        assert admin.list_offsets(topic, OffsetSpec.TIMESTAMP, 99_000) == {0: 10}
    with Consumer(shared_node.address) as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_timestamp(7_000)
        assert consumer.position(tp) == 6
        consumer.seek(tp, 8)
        records = wait_until(lambda: list(consumer.poll(200)), 10, "records from offset 8")
        assert [r.offset for r in records] == [8, 9]
        assert [r.timestamp_ms for r in records] == [9_000, 10_000]


def test_plain_records_and_decoded_fetch_for_thin_clients(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin, partitions=3)
    stub = broker(shared_node)
    records = [pb.Record(key=f"k{i}".encode(), value=f"v{i}".encode()) for i in range(30)]
    records.append(pb.Record(value=b"keyless", headers=[pb.Header(key="a", value=b"b")]))
    response = stub.Produce(
        pb.ProduceRequest(
            topic=topic, partition=-1, records=pb.RecordList(records=records), acks=pb.ACKS_ALL
        )
    )
    assert sum(r.record_count for r in response.results) == 31
    got = []
    for partition in range(3):
        fetched = stub.Fetch(
            pb.FetchRequest(
                topic=topic, partition=partition, offset=0, format=pb.RECORD_FORMAT_RECORDS
            )
        )
        got += [(r.key if r.HasField("key") else None, r.value) for r in fetched.decoded]
        for r in fetched.decoded:
            if r.HasField("key"):
                assert partition == partition_for_key(r.key, 3)
    assert sorted(got, key=str) == sorted(
        [(f"k{i}".encode(), f"v{i}".encode()) for i in range(30)] + [(None, b"keyless")], key=str
    )


def test_fetch_is_a_long_poll(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    stub = broker(shared_node)
    empty = stub.Fetch(pb.FetchRequest(topic=topic, partition=0, offset=0, max_wait_ms=0))
    assert empty.records == b"" and empty.high_watermark == 0
    future = stub.Fetch.future(
        pb.FetchRequest(topic=topic, partition=0, offset=0, max_wait_ms=20_000)
    )
    threading.Timer(
        0.3, lambda: Producer(shared_node.address).send(topic, b"wake").result(timeout=30)
    ).start()
    response = future.result(timeout=30)
    assert batch_format.decode_batches(response.records)[0].records.column("value").to_pylist() == [
        b"wake"
    ]
    assert response.next_offset == 1 and response.high_watermark == 1


# --------------------------------------------------------------------------- bad input


def test_bad_topic_requests(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        cases = {
            "": "empty",
            "x" * 250: "limit is 249",
            "bad name": "illegal character",
            "a/b": "illegal character",
            "..": "not allowed",
            "__internal": "reserved",
        }
        for name, fragment in cases.items():
            error = error_of(lambda name=name: admin.create_topic(name, 1))
            assert error.code == ErrorCode.INVALID_TOPIC_EXCEPTION, name
            assert fragment in error.message
        for partitions in (0, -3):
            error = error_of(
                lambda partitions=partitions: admin.create_topic("ok-name", partitions)
            )
            assert error.code == ErrorCode.INVALID_PARTITIONS and "[1, 10000]" in error.message
        error = error_of(lambda: admin.create_topic("ok-name", 1, replication_factor=0))
        assert error.code == ErrorCode.INVALID_REPLICATION_FACTOR
        error = error_of(lambda: admin.create_topic("ok-name", 100_001))
        assert error.code == ErrorCode.INVALID_PARTITIONS
        error = error_of(lambda: admin.create_topic("ok-name", 1, replication_factor=3))
        assert error.code == ErrorCode.INVALID_REPLICATION_FACTOR and "[1, 1]" in error.message
        error = error_of(lambda: admin.create_topic("ok-name", 1, configs={"retention_ms": "-5"}))
        assert error.code == ErrorCode.INVALID_CONFIG and "retention_ms" in error.message
        error = error_of(lambda: admin.create_topic("ok-name", 1, configs={"no_such": "1"}))
        assert error.code == ErrorCode.INVALID_CONFIG and "no_such" in error.message
        error = error_of(lambda: admin.create_topic("ok-name", 1, configs={"segment_bytes": "big"}))
        assert "must be an integer" in error.message
        assert "ok-name" not in [t.name for t in admin.list_topics()]
        error = error_of(lambda: admin.delete_topic("nosuchtopic"))
        assert error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION and "nosuchtopic" in error.message


def test_bad_produce_requests_leave_data_intact(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin, partitions=2, configs={"max_message_bytes": "4096"})
    stub = broker(shared_node)
    good = batch_format.encode_batch([b"a", b"b"])
    assert (
        stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=good)).results[0].base_offset
        == 0
    )

    def produce_error(**fields) -> tuple[grpc.StatusCode, str]:
        with pytest.raises(grpc.RpcError) as info:
            stub.Produce(pb.ProduceRequest(**fields))
        return info.value.code(), info.value.details()

    code, details = produce_error(topic="nosuchtopic", partition=0, batch=good)
    assert code == grpc.StatusCode.NOT_FOUND and "nosuchtopic" in details
    code, details = produce_error(topic=topic, partition=7, batch=good)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "PARTITION_OUT_OF_RANGE" in details and "[0, 2)" in details
    code, details = produce_error(
        topic=topic, partition=0, batch=batch_format.encode_batch([b"x" * 5000])
    )
    assert "MESSAGE_TOO_LARGE" in details and "4096" in details
    corrupt = bytearray(good)
    corrupt[-9] ^= 0xFF
    code, details = produce_error(topic=topic, partition=0, batch=bytes(corrupt))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "CRC32C mismatch" in details
    code, details = produce_error(topic=topic, partition=0, batch=good[:50])
    assert "CORRUPT_MESSAGE" in details and "truncated" in details
    code, details = produce_error(topic=topic, partition=0, batch=good + b"\0" * 8)
    assert "CORRUPT_MESSAGE" in details
    code, details = produce_error(topic=topic, partition=0, batch=b"garbage!" * 20)
    assert "CORRUPT_MESSAGE" in details
    code, details = produce_error(topic=topic, partition=0, acks=9, batch=good)
    assert "INVALID_REQUIRED_ACKS" in details
    code, details = produce_error(topic=topic, partition=0)
    assert "neither" in details
    code, details = produce_error(topic=topic, partition=-1, batch=good)
    assert "INVALID_REQUEST" in details
    code, details = produce_error(topic=topic, partition=0, timeout_ms=-1, batch=good)
    assert "timeout_ms" in details
    # Nothing above was appended, and what was appended is intact.
    fetched = stub.Fetch(pb.FetchRequest(topic=topic, partition=0, offset=0))
    assert fetched.high_watermark == 2
    assert batch_format.decode_batches(fetched.records)[0].records.column("value").to_pylist() == [
        b"a",
        b"b",
    ]


def test_bad_fetch_requests_name_the_valid_range(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    stub = broker(shared_node)
    stub.Produce(
        pb.ProduceRequest(topic=topic, partition=0, batch=batch_format.encode_batch([b"a"] * 5))
    )

    def fetch_error(**fields) -> str:
        with pytest.raises(grpc.RpcError) as info:
            stub.Fetch(pb.FetchRequest(topic=topic, partition=0, **fields))
        return info.value.details()

    assert "OFFSET_OUT_OF_RANGE" in fetch_error(offset=-1) and "[0, 5]" in fetch_error(offset=-1)
    assert "[0, 5]" in fetch_error(offset=6)
    assert "INVALID_FETCH_SIZE" in fetch_error(offset=0, max_bytes=-1)
    assert "max_wait_ms" in fetch_error(offset=0, max_wait_ms=-5)
    assert "max_wait_ms" in fetch_error(offset=0, max_wait_ms=10**9)
    with pytest.raises(grpc.RpcError) as info:
        stub.Fetch(pb.FetchRequest(topic=topic, partition=3, offset=0))
    assert "[0, 1)" in info.value.details()
    with Consumer(shared_node.address, auto_offset_reset="none") as consumer:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        assert error_of(lambda: consumer.seek(tp, -1)).code == ErrorCode.OFFSET_OUT_OF_RANGE
        consumer.seek(tp, 50)
        error = error_of(lambda: consumer.poll(5000))
        assert error.code == ErrorCode.OFFSET_OUT_OF_RANGE and "[0, 5]" in error.message
    with Consumer(shared_node.address) as consumer:
        assert (
            error_of(lambda: consumer.assign("nosuchtopic")).code
            == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        )


def test_errors_carry_code_and_retriable_flag(shared_node: NodeProcess) -> None:
    from google.rpc import error_details_pb2
    from grpc_status import rpc_status

    with pytest.raises(grpc.RpcError) as info:
        broker(shared_node).Fetch(pb.FetchRequest(topic="nosuchtopic", partition=0))
    status = rpc_status.from_call(info.value)
    assert status is not None
    detail = error_details_pb2.ErrorInfo()
    status.details[0].Unpack(detail)
    assert detail.reason == "UNKNOWN_TOPIC_OR_PARTITION"
    assert detail.metadata["code"] == "3" and detail.metadata["retriable"] == "true"


# --------------------------------------------------------------------------- streams


def test_produce_stream_answers_every_request_in_order(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    good = batch_format.encode_batch([b"a", b"b"])
    requests = [
        pb.ProduceRequest(topic=topic, partition=0, batch=good),
        pb.ProduceRequest(topic="nosuchtopic", partition=0, batch=good),
        pb.ProduceRequest(topic=topic, partition=0, batch=good[:40]),
        pb.ProduceRequest(topic=topic, partition=0, batch=good),
    ]
    answers = list(broker(shared_node).ProduceStream(iter(requests)))
    assert [a.error_code for a in answers] == [
        pb.NONE,
        pb.UNKNOWN_TOPIC_OR_PARTITION,
        pb.CORRUPT_MESSAGE,
        pb.NONE,
    ]
    assert "nosuchtopic" in answers[1].error_message
    assert [a.results[0].base_offset for a in (answers[0], answers[3])] == [0, 2]


def test_fetch_stream_pushes_new_data_and_ends_on_bad_offsets(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    stub = broker(shared_node)
    stream = stub.FetchStream(pb.FetchRequest(topic=topic, partition=0, offset=0, max_wait_ms=200))
    received: list[bytes] = []
    with Producer(shared_node.address) as producer:
        for i in range(5):
            producer.send(topic, f"m{i}".encode()).result(timeout=30)
            for response in stream:  # heartbeats (empty) come every max_wait_ms
                if response.records:
                    for decoded in batch_format.decode_batches(response.records):
                        received += decoded.records.column("value").to_pylist()
                    break
    stream.cancel()
    assert received == [f"m{i}".encode() for i in range(5)]
    with pytest.raises(grpc.RpcError) as info:
        list(stub.FetchStream(pb.FetchRequest(topic=topic, partition=0, offset=99)))
    assert "OFFSET_OUT_OF_RANGE" in info.value.details() and "[0, 5]" in info.value.details()


def test_producer_recovers_through_a_restart_and_a_stopped_node(node: NodeProcess) -> None:
    import signal

    with Admin(node.address) as admin:
        admin.create_topic("survive", 1)
    with Producer(
        node.address,
        acks="all",
        request_timeout_ms=1000,
        retry_backoff_ms=50,
        retries=10_000,  # bounded by delivery_timeout_ms: a restart under load may be slow
        delivery_timeout_ms=90_000,
    ) as producer:
        assert producer.send("survive", b"before").result(timeout=30).offset == 0
        node.kill(signal.SIGKILL)
        node.start(wait=False)  # same port and data: the producer's new stream finds it
        restarted = producer.send("survive", b"after-restart").result(timeout=60)
        assert restarted.offset == 1, node.log()
        node.process.send_signal(signal.SIGSTOP)  # answers nothing: the stream must expire
        future = producer.send("survive", b"after-stop")
        threading.Timer(2.5, lambda: node.process.send_signal(signal.SIGCONT)).start()
        assert future.result(timeout=60).offset >= 2
    values = [r.value for r in consume_all(node.address, "survive", 3)]
    assert values[:2] == [b"before", b"after-restart"] and b"after-stop" in values


def test_fetch_min_bytes_waits_for_enough_data(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    stub = broker(shared_node)
    small = batch_format.encode_batch([b"x"])
    stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=small))
    request = pb.FetchRequest(
        topic=topic, partition=0, offset=0, min_bytes=len(small) * 3, max_wait_ms=20_000
    )
    future = stub.Fetch.future(request)
    for _ in range(2):
        stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=small))
    response = future.result(timeout=30)
    assert len(response.records) >= len(small) * 3
    assert response.next_offset == 3
    # min_bytes never turns a short wait into a long one.
    quick = stub.Fetch(
        pb.FetchRequest(topic=topic, partition=0, offset=0, min_bytes=10**6, max_wait_ms=50)
    )
    assert quick.next_offset == 3


def test_undecodable_and_oversized_requests_get_clear_errors(tmp_path) -> None:
    env = {"HEADWATER_REQUEST_BYTES_MAX": str(2 << 20), "HEADWATER_MAX_MESSAGE_BYTES": str(1 << 20)}
    node = NodeProcess(tmp_path / "data", env=env)
    node.start()
    try:
        channel = grpc.insecure_channel(
            node.address, options=[("grpc.max_send_message_length", 64 << 20)]
        )
        raw_produce = channel.unary_unary("/headwater.v1.Broker/Produce")
        with pytest.raises(grpc.RpcError) as info:
            raw_produce(b"\xff\xff\xff not a protobuf message")
        assert "parsing message with type 'headwater.v1.ProduceRequest'" in info.value.details()
        with Admin(node.address) as admin:
            topic = new_topic(admin)
        oversized = pb.ProduceRequest(
            topic=topic, partition=0, batch=batch_format.encode_batch([b"x" * (3 << 20)])
        )
        with pytest.raises(grpc.RpcError) as info:
            pb_grpc.BrokerStub(channel).Produce(oversized)
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "larger than max" in info.value.details()
        # The node is unharmed and keeps serving.
        assert (
            broker(node)
            .Produce(
                pb.ProduceRequest(
                    topic=topic, partition=0, batch=batch_format.encode_batch([b"ok"])
                )
            )
            .results[0]
            .base_offset
            == 0
        )
    finally:
        node.kill()


def test_describe_replica_log_names_a_replica_it_does_not_host(shared_node: NodeProcess) -> None:
    address = shared_node.address
    with Admin(address) as admin:
        for topic, partition in (("no-such-topic", 0), ("", 0), ("x", -1)):
            error = error_of(lambda t=topic, p=partition: admin.describe_replica_log(address, t, p))
            assert error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            assert f"hosts no replica of {topic}-{partition}" in error.message
        topic = f"replica-log-{uuid.uuid4().hex[:8]}"
        admin.create_topic(topic, 1)
        # A range beyond the log, or backwards, hashes nothing rather than failing.
        for start, end in ((10, 20), (5, 1), (-7, 0)):
            answer = admin.describe_replica_log(address, topic, 0, start, end)
            assert (answer.covered_start_offset, answer.covered_end_offset) == (-1, -1)
            assert answer.batch_count == 0
        plain = admin.node_metadata(address, include_digest=False)
        assert plain.metadata_digest == b""
        assert len(admin.node_metadata(address).metadata_digest) == 32


def test_hostile_batches_are_refused_and_the_node_stays_up(shared_node: NodeProcess) -> None:
    """Issue 11: a 240-byte batch whose header-key offsets are corrupt (CRC recomputed)
    killed the node; a zstd body declaring 2 GiB stalled it; timestamps of 2^63-1 were
    stored and then broke every records-format fetch of the partition."""
    import struct

    import zstandard

    from tests.fuzz_batch import compressed_batch, rechecksummed

    with Admin(shared_node.address) as admin:
        topic = new_topic(admin)
    stub = broker(shared_node)

    def produce_error(**fields) -> str:
        with pytest.raises(grpc.RpcError) as info:
            stub.Produce(pb.ProduceRequest(topic=topic, partition=0, **fields))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
        return info.value.details()

    crafted = bytearray(
        batch_format.encode_batch(
            [b"v1", b"v2"],
            keys=[b"k", b"k2"],
            headers=[[("hk", b"hv")], [("a", b"b"), ("c", None)]],
        )
    )
    assert len(crafted) == 224
    struct.pack_into("<i", crafted, 172, -(1 << 30))  # a middle header-key offset
    assert "CORRUPT_MESSAGE" in produce_error(batch=rechecksummed(crafted))

    stored = zstandard.ZstdCompressor(level=19).compress(bytes(64 << 20))
    bomb = compressed_batch(batch_format.Compression.ZSTD, stored, (1 << 31) - 8)
    started = time.monotonic()
    details = produce_error(batch=bomb)
    limit = batch_format.MESSAGE_BYTES_DEFAULT
    assert f"exceeds the limit of {limit}" in details and time.monotonic() - started < 2
    assert "MESSAGE_TOO_LARGE" in details  # was CORRUPT_MESSAGE: the bytes were sound

    for stamp in ((1 << 63) - 1, -(1 << 63), int(time.time() * 1000) + 2 * 3600_000):
        details = produce_error(batch=batch_format.encode_batch([b"v"], timestamps_ms=stamp))
        assert "INVALID_TIMESTAMP" in details, details
        records = pb.RecordList(records=[pb.Record(value=b"v", timestamp_ms=stamp)])
        assert "INVALID_TIMESTAMP" in produce_error(records=records)
    records = pb.RecordList(records=[pb.Record(value=b"v", timestamp_ms=0), pb.Record(value=b"w")])
    assert "span 2^31 ms" in produce_error(records=records)
    bits = bytearray(batch_format.encode_batch([b"v"]))
    struct.pack_into("<H", bits, 24, 0x20)  # a control batch
    assert "control" in produce_error(batch=rechecksummed(bits))

    stub.Produce(
        pb.ProduceRequest(topic=topic, partition=0, batch=batch_format.encode_batch([b"ok"]))
    )
    fetched = stub.Fetch(
        pb.FetchRequest(topic=topic, partition=0, offset=0, format=pb.RECORD_FORMAT_RECORDS)
    )
    assert [r.value for r in fetched.decoded] == [b"ok"]


def test_the_timestamp_window_is_a_topic_setting(shared_node: NodeProcess) -> None:
    now = int(time.time() * 1000)
    with Admin(shared_node.address) as admin:
        lax = new_topic(admin, configs={"message_timestamp_after_max_ms": str(365 * 86400_000)})
        strict = new_topic(admin, configs={"message_timestamp_before_max_ms": "60000"})
    stub = broker(shared_node)
    later = batch_format.encode_batch([b"v"], timestamps_ms=now + 30 * 86400_000)
    assert stub.Produce(pb.ProduceRequest(topic=lax, partition=0, batch=later)).results
    old = batch_format.encode_batch([b"v"], timestamps_ms=now - 3600_000)
    with pytest.raises(grpc.RpcError) as info:
        stub.Produce(pb.ProduceRequest(topic=strict, partition=0, batch=old))
    assert "INVALID_TIMESTAMP" in info.value.details()


def test_altered_topic_configs_take_effect_on_the_log(shared_node: NodeProcess) -> None:
    """A topic's overrides change after creation, by the node's names or Kafka's: a
    smaller max.message.bytes refuses a batch the default took, min.insync.replicas 2
    refuses acks=all on one node, and removing the overrides restores both."""
    stub = broker(shared_node)
    big = batch_format.encode_batch([b"x" * 20_000])
    with Admin(shared_node.address) as admin:
        name = new_topic(admin)
        assert stub.Produce(pb.ProduceRequest(topic=name, partition=0, batch=big, acks=pb.ACKS_ALL))
        overrides = admin.alter_topic_configs(
            name, {"max.message.bytes": "10000", "min_insync_replicas": "2"}
        )
        assert overrides == {"max_message_bytes": "10000", "min_insync_replicas": "2"}
        assert admin.describe_topics([name])[0].configs["max_message_bytes"] == "10000"
        with pytest.raises(grpc.RpcError) as too_big:
            stub.Produce(pb.ProduceRequest(topic=name, partition=0, batch=big, acks=pb.ACKS_LEADER))
        assert "MESSAGE_TOO_LARGE" in too_big.value.details()
        small = batch_format.encode_batch([b"x"])
        with pytest.raises(grpc.RpcError) as too_few:
            stub.Produce(pb.ProduceRequest(topic=name, partition=0, batch=small, acks=pb.ACKS_ALL))
        assert "NOT_ENOUGH_REPLICAS" in too_few.value.details()
        bad = error_of(lambda: admin.alter_topic_configs(name, {"retention.ms": "soon"}))
        assert bad.code is ErrorCode.INVALID_CONFIG and "retention_ms" in bad.message
        unknown = error_of(lambda: admin.alter_topic_configs(name, {"retention": "1"}))
        assert unknown.code is ErrorCode.INVALID_CONFIG and "retention.ms" in unknown.message
        checked = admin.alter_topic_configs(name, {"segment.ms": "60000"}, validate_only=True)
        assert checked["segment_ms"] == "60000"
        assert admin.describe_topics([name])[0].configs["segment_ms"] != "60000"
        assert (
            admin.alter_topic_configs(name, {}, ["max_message_bytes", "min.insync.replicas"]) == {}
        )
        assert stub.Produce(pb.ProduceRequest(topic=name, partition=0, batch=big, acks=pb.ACKS_ALL))
