"""Kafka clients against a real 3-node cluster: Metadata from any node names every
broker's Kafka address and the partition leaders; an idempotent acks=all librdkafka
producer loses and duplicates nothing while a partition leader is SIGKILLed (the client
moves on after NOT_LEADER_OR_FOLLOWER and a metadata refresh); a consumer group finds its
coordinator through any node and carries on after the coordinator is killed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headwater.client import Admin
from headwater.tools.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster

pytestmark = pytest.mark.slow
DEADLINE_S = 60.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, 3, kafka_ports={i: free_port() for i in (1, 2, 3)})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def servers(cluster: LocalCluster) -> str:
    return ",".join(
        n.kafka_address for n in cluster.nodes.values() if n.kafka_address and n.running
    )


def test_metadata_from_any_node_names_every_broker_and_leader(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    admin.create_topics([NewTopic("spread", 6, 3)])["spread"].result(DEADLINE_S)
    with Admin(cluster.bootstrap()) as grpc_admin:
        (described,) = grpc_admin.describe_topics(["spread"])
        leaders = {p.partition: p.leader for p in described.partitions}
    for node in cluster.nodes.values():
        assert node.kafka_address is not None
        metadata = AdminClient({"bootstrap.servers": node.kafka_address}).list_topics(
            "spread", timeout=DEADLINE_S
        )
        assert {b.id: f"{b.host}:{b.port}" for b in metadata.brokers.values()} == {
            n.node_id: n.kafka_address for n in cluster.nodes.values()
        }
        topic = metadata.topics["spread"]
        assert {p.id: p.leader for p in topic.partitions.values()} == leaders
        assert all(sorted(p.replicas) == [1, 2, 3] for p in topic.partitions.values())


def test_an_idempotent_producer_loses_and_duplicates_nothing_when_a_leader_dies(
    cluster: LocalCluster,
) -> None:
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    admin.create_topics([NewTopic("steady", 1, 3, config={"min.insync.replicas": "2"})])[
        "steady"
    ].result(DEADLINE_S)
    with Admin(cluster.bootstrap()) as grpc_admin:
        (described,) = grpc_admin.describe_topics(["steady"])
        (partition,) = described.partitions
    victim = partition.leader
    acked: list[bytes] = []
    failed: list[object] = []
    stop = threading.Event()
    producer = Producer(
        {
            "bootstrap.servers": servers(cluster),
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 2,
            "message.timeout.ms": 60_000,
        }
    )

    def report(error: object, message: object) -> None:
        if error is None:
            acked.append(message.value())  # type: ignore[attr-defined]
        else:
            failed.append(error)

    def produce() -> None:
        n = 0
        while not stop.is_set():
            producer.produce("steady", value=b"%d" % n, on_delivery=report)
            producer.poll(0)
            n += 1
            if n % 100 == 0:
                time.sleep(0.01)

    writer = threading.Thread(target=produce)
    writer.start()
    try:
        deadline = time.monotonic() + DEADLINE_S
        while len(acked) < 2000:
            assert time.monotonic() < deadline, "no progress before the kill"
            time.sleep(0.05)
        cluster.nodes[victim].kill()
        before = len(acked)
        while len(acked) < before + 2000:
            assert time.monotonic() < deadline + DEADLINE_S, "no progress after the kill"
            time.sleep(0.05)
    finally:
        stop.set()
        writer.join()
    assert producer.flush(DEADLINE_S) == 0
    assert not failed, failed[:3]
    consumer = Consumer({"bootstrap.servers": servers(cluster), "group.id": "check"})
    consumer.assign([TopicPartition("steady", 0, 0)])
    read: list[bytes] = []
    _low, high = consumer.get_watermark_offsets(TopicPartition("steady", 0), DEADLINE_S)
    deadline = time.monotonic() + DEADLINE_S
    while len(read) < high and time.monotonic() < deadline:
        read += [m.value() for m in consumer.consume(1000, 0.5) if m.error() is None]
    consumer.close()
    assert len(read) == len(set(read)), "duplicates"
    assert set(acked) <= set(read), "acknowledged records lost"
    order = [int(v) for v in read]
    assert order == sorted(order), "records out of the order they were produced in"


def test_a_group_moves_to_a_new_coordinator_when_the_old_one_dies(cluster: LocalCluster) -> None:
    admin = AdminClient({"bootstrap.servers": servers(cluster)})
    admin.create_topics([NewTopic("work", 4, 3)])["work"].result(DEADLINE_S)
    producer = Producer({"bootstrap.servers": servers(cluster), "acks": "all"})
    for i in range(400):
        producer.produce("work", value=b"%d" % i)
    assert producer.flush(DEADLINE_S) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": servers(cluster),
            "group.id": "movers",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe(["work"])
    seen: set[bytes] = set()
    deadline = time.monotonic() + DEADLINE_S
    while len(seen) < 200 and time.monotonic() < deadline:
        seen.update(m.value() for m in consumer.consume(50, 0.5) if m.error() is None)
    consumer.commit(asynchronous=False)
    with grpc.insecure_channel(cluster.nodes[1].address) as channel:
        coordinator = (
            pb_grpc.GroupsStub(channel)
            .FindCoordinator(pb.FindCoordinatorRequest(group_id="movers"), timeout=10)
            .node_id
        )
    cluster.nodes[coordinator].kill()
    for i in range(400, 600):
        producer.produce("work", value=b"%d" % i)
    assert producer.flush(DEADLINE_S) == 0
    deadline = time.monotonic() + 2 * DEADLINE_S
    while len(seen) < 600 and time.monotonic() < deadline:
        seen.update(m.value() for m in consumer.consume(50, 0.5) if m.error() is None)
    consumer.commit(asynchronous=False)
    consumer.close()
    assert seen == {b"%d" % i for i in range(600)}
