"""One broker core under two fronts: the same request over gRPC and over Kafka's protocol
meets the same rule, written once in ``BrokerCore`` and ``TopicAdmin``, and each front
answers it in its protocol's way (gRPC: the call's status and message; Kafka: the
partition's or topic's error code and message, or, for a request over a limit checked
while its frame is walked, the connection closed, as Kafka closes a connection whose
request it cannot take).

One node with both listeners and small limits (``topics_max`` 4, ``partitions_max`` 6),
so that a request over each is small.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from headwater.client import Admin
from headwater.log import batch as batch_format
from headwater.node.kafka import protocol
from headwater.shared.errors import ErrorCode
from headwater.shared.grpc_errors import from_rpc_error
from headwater.tools.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests import kafka_raw
from tests.kafka_raw import DEADLINE_S
from tests.node_process import NodeProcess

TOPICS_MAX = 4
PARTITIONS_MAX = 6


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = NodeProcess(
        Path(tmp_path_factory.mktemp("fronts")) / "data",
        kafka_port=free_port(),
        env={
            "HEADWATER_TOPICS_MAX": str(TOPICS_MAX),
            "HEADWATER_PARTITIONS_MAX": str(PARTITIONS_MAX),
            "HEADWATER_OFFSETS_TOPIC_PARTITIONS": "2",
        },
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("t", 2)
        yield node
    finally:
        node.kill()


@pytest.fixture
def broker(both: NodeProcess) -> Iterator[Any]:
    with grpc.insecure_channel(both.address) as channel:
        yield pb_grpc.BrokerStub(channel)


@pytest.fixture
def kafka(both: NodeProcess) -> Iterator[socket.socket]:
    assert both.kafka_address is not None
    with kafka_raw.connect(both.kafka_address) as sock:
        yield sock


def grpc_refusal(call: Any) -> tuple[ErrorCode, str]:
    """The Headwater code and message of a refused gRPC call."""
    with pytest.raises(grpc.RpcError) as refused:
        call()
    error = from_rpc_error(refused.value, "node")
    return error.code, error.message


def kafka_produce(sock: socket.socket, topic: str, records: bytes) -> tuple[int, str | None]:
    """A Produce v8 (acks=1) of ``records`` to ``topic``'s partition 0: its code and
    message."""
    (answered,) = kafka_raw.exchange(
        sock,
        protocol.PRODUCE,
        8,
        acks=1,
        timeout=10_000,
        topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": records}]}],
    ).responses
    (partition,) = answered.partition_responses
    return int(partition.error_code), partition.error_message


def test_a_write_to_an_internal_topic_is_refused_alike(broker: Any, kafka: socket.socket) -> None:
    code, message = grpc_refusal(
        lambda: broker.Produce(
            pb.ProduceRequest(
                topic="__consumer_offsets",
                partition=0,
                batch=batch_format.encode_batch([b"v"]),
            ),
            timeout=10,
        )
    )
    assert code is ErrorCode.INVALID_TOPIC_EXCEPTION
    kafka_code, kafka_message = kafka_produce(
        kafka, "__consumer_offsets", kafka_raw.record_batch([(None, b"v")])
    )
    assert (kafka_code, kafka_message) == (ErrorCode.INVALID_TOPIC_EXCEPTION, message)


def test_a_missing_topic_is_refused_alike(broker: Any, kafka: socket.socket) -> None:
    code, message = grpc_refusal(
        lambda: broker.Produce(
            pb.ProduceRequest(
                topic="missing", partition=0, batch=batch_format.encode_batch([b"v"])
            ),
            timeout=10,
        )
    )
    assert code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert kafka_produce(kafka, "missing", kafka_raw.record_batch([(None, b"v")])) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        message,
    )


def test_a_corrupt_batch_is_refused_alike(broker: Any, kafka: socket.socket) -> None:
    """A batch whose bytes do not match its CRC is CORRUPT_MESSAGE on both fronts (the
    columnar format over gRPC, Kafka's over Kafka's protocol: each checked by the core
    against the same topic settings)."""
    columnar = bytearray(batch_format.encode_batch([b"value"]))
    columnar[-1] ^= 0xFF
    code, _message = grpc_refusal(
        lambda: broker.Produce(
            pb.ProduceRequest(topic="t", partition=0, batch=bytes(columnar)), timeout=10
        )
    )
    assert code is ErrorCode.CORRUPT_MESSAGE
    kafka_batch = bytearray(kafka_raw.record_batch([(None, b"value")]))
    kafka_batch[-1] ^= 0xFF
    assert kafka_produce(kafka, "t", bytes(kafka_batch))[0] == ErrorCode.CORRUPT_MESSAGE


def test_an_offset_past_the_log_is_refused_alike(broker: Any, kafka: socket.socket) -> None:
    code, _message = grpc_refusal(
        lambda: broker.Fetch(pb.FetchRequest(topic="t", partition=1, offset=1000), timeout=10)
    )
    assert code is ErrorCode.OFFSET_OUT_OF_RANGE
    fetched = kafka_raw.exchange(
        kafka,
        protocol.FETCH,
        4,
        replica_id=-1,
        max_wait_ms=0,
        min_bytes=0,
        max_bytes=1 << 20,
        isolation_level=0,
        topics=[
            {
                "topic": "t",
                "partitions": [
                    {"partition": 1, "fetch_offset": 1000, "partition_max_bytes": 1 << 20}
                ],
            }
        ],
    )
    assert fetched.responses[0].partitions[0].error_code == ErrorCode.OFFSET_OUT_OF_RANGE


def test_more_topics_than_topics_max_are_refused_by_both(broker: Any, kafka: socket.socket) -> None:
    names = [f"n{i}" for i in range(TOPICS_MAX + 1)]
    code, message = grpc_refusal(
        lambda: broker.Metadata(pb.MetadataRequest(topics=names), timeout=10)
    )
    assert code is ErrorCode.INVALID_REQUEST and "topics_max" in message
    kafka.sendall(kafka_raw.frame(protocol.METADATA, 4, topics=[{"name": n} for n in names]))
    assert kafka_raw.closed(kafka)


def test_topics_max_topics_are_answered_by_both(broker: Any, kafka: socket.socket) -> None:
    names = ["t", *(f"n{i}" for i in range(TOPICS_MAX - 1))]
    code, _message = grpc_refusal(
        lambda: broker.Metadata(pb.MetadataRequest(topics=names), timeout=10)
    )
    assert code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION  # n0 does not exist
    answered = kafka_raw.exchange(kafka, protocol.METADATA, 4, topics=[{"name": n} for n in names])
    assert [t.name for t in answered.topics] == names


def test_more_partitions_than_partitions_max_are_refused_by_both(
    broker: Any, kafka: socket.socket
) -> None:
    indexes = list(range(PARTITIONS_MAX + 1))
    code, message = grpc_refusal(
        lambda: broker.ListOffsets(pb.ListOffsetsRequest(topic="t", partitions=indexes), timeout=10)
    )
    assert code is ErrorCode.INVALID_REQUEST and "partitions_max" in message
    kafka.sendall(
        kafka_raw.frame(
            protocol.LIST_OFFSETS,
            1,
            replica_id=-1,
            topics=[
                {
                    "name": "t",
                    "partitions": [{"partition_index": i, "timestamp": -1} for i in indexes],
                }
            ],
        )
    )
    assert kafka_raw.closed(kafka)


def test_a_partition_the_topic_lacks_is_refused_alike(broker: Any, kafka: socket.socket) -> None:
    code, _message = grpc_refusal(
        lambda: broker.ListOffsets(pb.ListOffsetsRequest(topic="t", partitions=[5]), timeout=10)
    )
    assert code is ErrorCode.PARTITION_OUT_OF_RANGE
    listed = kafka_raw.exchange(
        kafka,
        protocol.LIST_OFFSETS,
        1,
        replica_id=-1,
        topics=[{"name": "t", "partitions": [{"partition_index": 5, "timestamp": -1}]}],
    )
    # Kafka has no code of its own for it: UNKNOWN_TOPIC_OR_PARTITION, as Kafka answers.
    assert listed.topics[0].partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def _until_coordinated(attempt: Any) -> Any:
    """``attempt()``'s answer once it is not a coordinator still being made
    (``__consumer_offsets`` is created on the first use of any group)."""
    retriable = {ErrorCode.COORDINATOR_NOT_AVAILABLE, ErrorCode.NOT_COORDINATOR}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        answer, code = attempt()
        if code not in retriable or time.monotonic() > deadline:
            return answer, code
        time.sleep(0.1)


def test_a_group_is_one_group_over_both_fronts(both: NodeProcess, kafka: socket.socket) -> None:
    """Offsets committed over one front are fetched, listed and described over the
    other: both translate to the one group core."""
    with grpc.insecure_channel(both.address) as channel:
        groups = pb_grpc.GroupsStub(channel)

        def kafka_commit() -> tuple[Any, int]:
            answered = kafka_raw.exchange(
                kafka,
                protocol.OFFSET_COMMIT,
                2,
                group_id="over-kafka",
                generation_id_or_member_epoch=-1,
                member_id="",
                topics=[
                    {
                        "name": "t",
                        "partitions": [
                            {"partition_index": 0, "committed_offset": 5, "committed_metadata": "m"}
                        ],
                    }
                ],
            )
            return answered, int(answered.topics[0].partitions[0].error_code)

        assert _until_coordinated(kafka_commit)[1] == 0
        fetched = groups.OffsetFetch(pb.OffsetFetchRequest(group_id="over-kafka"), timeout=10)
        assert [(o.topic, o.partition, o.offset, o.metadata) for o in fetched.offsets] == [
            ("t", 0, 5, "m")
        ]
        committed = groups.OffsetCommit(
            pb.OffsetCommitRequest(
                group_id="over-grpc",
                member_epoch=-1,
                offsets=[pb.OffsetCommitPartition(topic="t", partition=1, offset=7, metadata="n")],
            ),
            timeout=10,
        )
        assert [r.error_code for r in committed.results] == [0]
        answered = kafka_raw.exchange(
            kafka, protocol.OFFSET_FETCH, 2, group_id="over-grpc", topics=None
        )
        assert [
            (t.name, p.partition_index, p.committed_offset, p.metadata)
            for t in answered.topics
            for p in t.partitions
        ] == [("t", 1, 7, "n")]
        listed_by_kafka = kafka_raw.exchange(kafka, protocol.LIST_GROUPS, 0)
        listed_by_grpc = groups.ListGroups(pb.ListGroupsRequest(), timeout=10)
        assert {g.group_id for g in listed_by_kafka.groups} == {"over-kafka", "over-grpc"}
        assert {g.group_id for g in listed_by_grpc.groups} == {"over-kafka", "over-grpc"}
        described = kafka_raw.exchange(
            kafka, protocol.DESCRIBE_GROUPS, 0, groups=["over-grpc"]
        ).groups[0]
        grpc_described = groups.DescribeGroup(
            pb.DescribeGroupRequest(group_id="over-grpc"), timeout=10
        )
        assert (described.error_code, described.group_state) == (0, grpc_described.state)


def test_an_invalid_group_id_is_refused_alike(both: NodeProcess, kafka: socket.socket) -> None:
    with grpc.insecure_channel(both.address) as channel:
        code, message = grpc_refusal(
            lambda: pb_grpc.GroupsStub(channel).FindCoordinator(
                pb.FindCoordinatorRequest(group_id=""), timeout=10
            )
        )
    answered = kafka_raw.exchange(kafka, protocol.FIND_COORDINATOR, 1, key="", key_type=0)
    assert (answered.error_code, answered.error_message) == (code, message)
