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
from headwater.node.groups.records import OFFSETS_TOPIC, coordinator_partition
from headwater.tools.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster
from tests.node_process import wait_until

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


def _coordinator(cluster: LocalCluster, group: str) -> int:
    """The node that coordinates ``group`` now (asked of any live node)."""
    for node in cluster.alive():
        with grpc.insecure_channel(node.address) as channel:
            try:
                return int(
                    pb_grpc.GroupsStub(channel)
                    .FindCoordinator(pb.FindCoordinatorRequest(group_id=group), timeout=5)
                    .node_id
                )
            except grpc.RpcError:
                continue
    raise AssertionError(f"no node names the coordinator of {group}")


def test_a_new_coordinator_serves_no_member_that_left_before_it_took_over(
    cluster: LocalCluster,
) -> None:
    """Members A and B complete a generation of a classic group (raw requests, sessions of
    30 s); B leaves and A has not joined again when the coordinator is killed. The new
    coordinator serves A alone and rebalances at once: B is not taken over to wait out its
    session. (Were the last generation, A and B, reloaded and B given a fresh 30 s, each
    move of the coordinator would keep a group from reading for a session timeout.)"""
    from headwater.node.kafka import protocol
    from tests import kafka_raw

    group = "leavers"
    coordinator = _coordinator(cluster, group)
    address = cluster.nodes[coordinator].kafka_address
    assert address is not None
    join = {
        "group_id": group,
        "session_timeout": 30_000,
        "rebalance_timeout": 30_000,
        "member_id": "",
        "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": b"\0\0\0\0\0\0\xff\xff\xff\xff"}],
    }
    with kafka_raw.connect(address) as a, kafka_raw.connect(address) as b:
        for sock in (a, b):  # both join within the new group's first wait
            sock.sendall(kafka_raw.frame(protocol.JOIN_GROUP, 3, **join))
        joined = [kafka_raw.answer(sock, protocol.JOIN_GROUP, 3) for sock in (a, b)]
        assert [j.error_code for j in joined] == [0, 0], joined
        generation = joined[0].generation_id
        by_id = {j.member_id: sock for j, sock in zip(joined, (a, b), strict=True)}
        leader = joined[0].leader
        for member_id, sock in by_id.items():
            sock.sendall(
                kafka_raw.frame(
                    protocol.SYNC_GROUP,
                    1,
                    group_id=group,
                    generation_id=generation,
                    member_id=member_id,
                    assignments=[{"member_id": m, "assignment": b""} for m in by_id]
                    if member_id == leader
                    else [],
                )
            )
        for sock in by_id.values():
            assert kafka_raw.answer(sock, protocol.SYNC_GROUP, 1).error_code == 0
        staying, leaving = sorted(by_id, key=lambda m: m != leader)
        with Admin(cluster.nodes[coordinator].address) as admin:
            (offsets_topic,) = admin.describe_topics([OFFSETS_TOPIC])
            key = (OFFSETS_TOPIC, coordinator_partition(group, len(offsets_topic.partitions)))
            before = admin.end_offsets([key])[key]
            left = kafka_raw.exchange(
                by_id[leaving], protocol.LEAVE_GROUP, 1, group_id=group, member_id=leaving
            )
            assert left.error_code == 0
            # The leave is written in the background of its answer: until it is committed.
            wait_until(lambda: admin.end_offsets([key])[key] > before, DEADLINE_S, "the leave")
    cluster.nodes[coordinator].kill()
    deadline = time.monotonic() + DEADLINE_S
    while True:
        now_at = _coordinator(cluster, group)
        if now_at != coordinator:
            address = cluster.nodes[now_at].kafka_address
            assert address is not None
            with kafka_raw.connect(address) as sock:
                (described,) = kafka_raw.exchange(
                    sock, protocol.DESCRIBE_GROUPS, 1, groups=[group]
                ).groups
            if described.error_code == 0 and described.members:
                break
        assert time.monotonic() < deadline, "no new coordinator served the group"
        time.sleep(0.2)
    assert [m.member_id for m in described.members] == [staying]
    assert described.group_state == "PreparingRebalance"


def test_an_offset_commit_is_answered_within_the_commit_timeout(tmp_path: Path) -> None:
    """One follower of the group's __consumer_offsets partition is paused, so that the
    commit's records cannot reach every in-sync replica until it is dropped from the ISR
    (here 30 s): the commit is answered REQUEST_TIMED_OUT (7, retried by clients) after
    offsets_commit_timeout_ms (5 s), as Kafka's offsets.commit.timeout.ms. (Were it to wait
    for the ISR to shrink, 30 s, librdkafka would see its heartbeats, queued behind the
    commit, time out, and members would fall out of their groups.)"""
    # A paused broker is neither fenced nor dropped from the ISR for 30 s here.
    slow_to_fence = {
        "HEADWATER_BROKER_SESSION_TIMEOUT_MS": "30000",
        "HEADWATER_REPLICA_LAG_MS_MAX": "30000",
    }
    cluster = LocalCluster(
        tmp_path, 3, env=slow_to_fence, kafka_ports={i: free_port() for i in (1, 2, 3)}
    )
    cluster.start()
    try:
        _commit_while_a_follower_is_paused(cluster)
    finally:
        cluster.close()


def _commit_while_a_follower_is_paused(cluster: LocalCluster) -> None:
    from headwater.node.groups.records import OFFSETS_TOPIC, coordinator_partition
    from headwater.node.kafka import protocol
    from tests import kafka_raw

    controller = cluster.wait_controller()
    _coordinator(cluster, "warm-up")  # the first group made the offsets topic
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topic("commits", partitions=1, replication_factor=3)
        (offsets,) = admin.describe_topics([OFFSETS_TOPIC])
    isr_of = {p.partition: p.isr for p in offsets.partitions}
    # A group whose coordinator partition has a follower in its ISR that is not the
    # controller (the topic's replication factor is capped by the brokers live at its
    # creation).
    group = next(
        g
        for g in (f"slow-commits-{n}" for n in range(1000))
        if len(set(isr_of[coordinator_partition(g)]) - {controller}) >= 2
    )
    coordinator = _coordinator(cluster, group)
    paused = next(
        i for i in isr_of[coordinator_partition(group)] if i not in (coordinator, controller)
    )
    address = cluster.nodes[coordinator].kafka_address
    assert address is not None
    commit: dict[str, object] = {
        "group_id": group,
        "generation_id": -1,
        "member_id": "",
        "retention_time": -1,
        "topics": [{"name": "commits", "partitions": [{"partition_index": 0}]}],
    }
    with kafka_raw.connect(address) as sock:
        first = kafka_raw.exchange(sock, protocol.OFFSET_COMMIT, 2, **commit)
        assert first.topics[0].partitions[0].error_code == 0
        cluster.nodes[paused].pause()
        try:
            began = time.monotonic()
            commit["topics"] = [
                {"name": "commits", "partitions": [{"partition_index": 0, "committed_offset": 1}]}
            ]
            answer = kafka_raw.exchange(sock, protocol.OFFSET_COMMIT, 2, **commit)
            took = time.monotonic() - began
        finally:
            cluster.nodes[paused].resume()
    assert answer.topics[0].partitions[0].error_code == 7  # REQUEST_TIMED_OUT
    assert 4.5 < took < 8, f"answered after {took:.1f} s"
