"""Unchanged Kafka clients against a real node's Kafka listener: librdkafka
(confluent-kafka) and kafka-python produce and consume, with keys, headers, every
compression, acks 0/1/all and idempotence; records cross between the Kafka and gRPC
protocols both ways unchanged; hostile connections are closed without harm to others."""

from __future__ import annotations

import asyncio
import datetime
import io
import json
import shutil
import signal
import socket
import struct
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headwater.client import Admin
from headwater.client import Consumer as GrpcConsumer
from headwater.client import Producer as GrpcProducer
from headwater.node.config import NodeConfig
from headwater.shared.partitioning import partition_for_key
from headwater.tools.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests import kafka_raw
from tests.kafka_raw import exchange
from tests.node_process import NodeProcess, run_cli

DEADLINE_S = 30.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path_factory.mktemp("kafka") / "data", kafka_port=free_port())
    process.start()
    try:
        yield process
    finally:
        process.stop()


def kafka(node: NodeProcess) -> str:
    assert node.kafka_address is not None
    return node.kafka_address


def create(node: NodeProcess, name: str, partitions: int = 3, **configs: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka(node)})
    result = admin.create_topics([NewTopic(name, partitions, 1, config=configs)])
    result[name].result(DEADLINE_S)


def produce(
    node: NodeProcess, topic: str, records: list[tuple[bytes | None, bytes]], **settings: object
) -> list[tuple[int, int]]:
    """(partition, offset) of each record, in order; every record must be delivered."""
    delivered: dict[int, tuple[int, int]] = {}
    errors: list[object] = []
    producer = Producer({"bootstrap.servers": kafka(node), "linger.ms": 5, **settings})
    for i, (key, value) in enumerate(records):

        def report(error: object, message: object, i: int = i) -> None:
            if error is not None:
                errors.append(error)
            else:
                delivered[i] = (message.partition(), message.offset())  # type: ignore[attr-defined]

        producer.produce(topic, key=key, value=value, on_delivery=report)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0
    assert not errors, errors[:3]
    return [delivered[i] for i in range(len(records))]


def consume_all(node: NodeProcess, topic: str, partitions: int, count: int) -> list[object]:
    consumer = Consumer(
        {"bootstrap.servers": kafka(node), "group.id": "unused", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[object] = []
    deadline = time.monotonic() + DEADLINE_S
    try:
        while len(got) < count and time.monotonic() < deadline:
            for message in consumer.consume(1000, 0.5):
                assert message.error() is None, message.error()
                got.append(message)
    finally:
        consumer.close()
    assert len(got) == count
    return got


def test_librdkafka_idempotent_keyed_records_land_where_kafka_puts_them(node: NodeProcess) -> None:
    create(node, "keyed", partitions=6, **{"retention.ms": "3600000"})
    records = [(b"key-%d" % (i % 40), b"value-%d" % i) for i in range(3000)]
    placed = produce(
        node,
        "keyed",
        records,
        acks="all",
        **{"enable.idempotence": True, "partitioner": "murmur2_random"},
    )
    for (key, _), (partition, _) in zip(records, placed, strict=True):
        assert partition == partition_for_key(key, 6)
    got = consume_all(node, "keyed", 6, len(records))
    assert sorted(m.value() for m in got) == sorted(v for _, v in records)  # type: ignore[attr-defined]
    offsets = {(m.partition(), m.offset()) for m in got}  # type: ignore[attr-defined]
    assert offsets == set(placed)  # each once: no duplicates
    with Admin(node.address) as admin:
        (described,) = admin.describe_topics(["keyed"])
        assert described.configs["retention_ms"] == "3600000"


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_every_compression_round_trips(node: NodeProcess, codec: str) -> None:
    topic = f"codec-{codec}"
    create(node, topic, partitions=1)
    records = [(None, b"%s-%d-" % (codec.encode(), i) + b"x" * 200) for i in range(2000)]
    produce(node, topic, records, **{"compression.type": codec, "acks": "1"})
    got = consume_all(node, topic, 1, len(records))
    assert [m.value() for m in got] == [v for _, v in records]  # type: ignore[attr-defined]


@pytest.mark.parametrize("acks", ["0", "1", "all"])
def test_each_acks_level_delivers(node: NodeProcess, acks: str) -> None:
    topic = f"acks-{acks}"
    create(node, topic, partitions=2)
    records = [(b"k%d" % i, b"v%d" % i) for i in range(500)]
    produce(node, topic, records, acks=acks)
    got = consume_all(node, topic, 2, len(records))
    assert sorted(m.value() for m in got) == sorted(v for _, v in records)  # type: ignore[attr-defined]


def test_a_record_reads_back_the_same_over_the_other_protocol(node: NodeProcess) -> None:
    create(node, "across", partitions=1)
    stamp = int(time.time() * 1000) - 5000
    producer = Producer({"bootstrap.servers": kafka(node)})
    producer.produce(
        "across", key=b"k", value=b"from kafka", headers=[("h", b"1")], timestamp=stamp
    )
    assert producer.flush(DEADLINE_S) == 0
    with GrpcProducer(node.address, acks="all") as grpc_producer:
        grpc_producer.send(
            "across", b"from grpc", key=b"g", headers=[("x", b"2")], timestamp_ms=stamp + 1
        ).result(DEADLINE_S)
    with GrpcConsumer(node.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([("across", 0)])
        seen: list[object] = []
        deadline = time.monotonic() + DEADLINE_S
        while len(seen) < 2 and time.monotonic() < deadline:
            seen.extend(consumer.poll(500))
    over_grpc = [(r.offset, r.timestamp_ms, r.key, r.value, r.headers) for r in seen]  # type: ignore[attr-defined]
    assert over_grpc == [
        (0, stamp, b"k", b"from kafka", [("h", b"1")]),
        (1, stamp + 1, b"g", b"from grpc", [("x", b"2")]),
    ]
    over_kafka = [
        (m.offset(), m.timestamp()[1], m.key(), m.value(), m.headers())  # type: ignore[attr-defined]
        for m in consume_all(node, "across", 1, 2)
    ]
    assert over_kafka == over_grpc


def test_offsets_by_time_and_the_watermarks(node: NodeProcess) -> None:
    create(node, "times", partitions=1)
    base = int(time.time() * 1000) - 60_000
    producer = Producer({"bootstrap.servers": kafka(node)})
    for i in range(10):
        producer.produce("times", value=b"%d" % i, timestamp=base + i * 1000)
    assert producer.flush(DEADLINE_S) == 0
    consumer = Consumer({"bootstrap.servers": kafka(node), "group.id": "unused"})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("times", 0), DEADLINE_S) == (0, 10)
        (found,) = consumer.offsets_for_times([TopicPartition("times", 0, base + 4500)], DEADLINE_S)
        assert found.offset == 5
        (after,) = consumer.offsets_for_times(
            [TopicPartition("times", 0, base + 99_000)], DEADLINE_S
        )
        assert after.offset in (-1, 10)  # Kafka's "none": -1 (librdkafka) or the end
    finally:
        consumer.close()


def test_producing_to_a_missing_topic_fails_with_kafkas_code(node: NodeProcess) -> None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            "bootstrap.servers": kafka(node),
            "message.timeout.ms": 3000,
            "allow.auto.create.topics": False,
        }
    )
    producer.produce("nowhere", value=b"x", on_delivery=lambda e, _m: errors.append(e))
    producer.flush(DEADLINE_S)
    assert errors and errors[0].code() in (
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._MSG_TIMED_OUT,
    )
    # Nor does a producer that allows auto-creation (librdkafka's default) create it on
    # a node that does not (kafka_auto_create_topics false, the default).
    errors.clear()
    producer = Producer({"bootstrap.servers": kafka(node), "message.timeout.ms": 3000})
    producer.produce("nowhere", value=b"x", on_delivery=lambda e, _m: errors.append(e))
    producer.flush(DEADLINE_S)
    assert errors and errors[0] is not None
    with Admin(node.address) as admin:
        assert "nowhere" not in {t.name for t in admin.list_topics()}


def test_a_node_that_auto_creates_topics_creates_what_producers_name(tmp_path: Path) -> None:
    """kafka_auto_create_topics true: a producer's Metadata creates its topic with the
    node's defaults; a consumer's (allow.auto.create.topics false) creates nothing."""
    node = NodeProcess(
        tmp_path / "data",
        kafka_port=free_port(),
        env={"HEADWATER_KAFKA_AUTO_CREATE_TOPICS": "true", "HEADWATER_DEFAULT_PARTITIONS": "3"},
    )
    node.start()
    try:
        delivered: list[object] = []
        producer = Producer({"bootstrap.servers": kafka(node)})
        producer.produce(
            "made-on-demand",
            value=b"first",
            on_delivery=lambda e, m: delivered.append(e or m.offset()),
        )
        producer.flush(DEADLINE_S)
        assert delivered == [0]
        consumer = Consumer({"bootstrap.servers": kafka(node), "group.id": "on-demand"})
        consumer.subscribe(["never-made"])
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            consumer.poll(0.2)
        consumer.close()
        with Admin(node.address) as admin:
            topics = {t.name for t in admin.list_topics()}
            (described,) = admin.describe_topics(["made-on-demand"])
        assert "never-made" not in topics
        assert len(described.partitions) == 3
    finally:
        node.stop()


def test_a_client_that_connects_while_the_node_starts_is_answered_once_it_can_be(
    tmp_path: Path,
) -> None:
    """The Kafka port is bound before the node has registered as a broker: a client that
    connects then (librdkafka's AdminClient right after the gRPC port answers) waits and
    gets a Metadata naming this broker, never an empty broker list (which librdkafka
    takes as a partial answer and stays without a controller)."""
    from headwater.node.kafka import protocol

    node = NodeProcess(tmp_path / "data", kafka_port=free_port())
    node.start(wait=False)
    try:
        host, port = kafka(node).rsplit(":", 1)
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                sock = socket.create_connection((host, int(port)), timeout=DEADLINE_S)
                break
            except OSError:
                assert time.monotonic() < deadline, "the Kafka port never accepted"
                time.sleep(0.01)
        with sock:
            answer = exchange(sock, protocol.METADATA, 12, topics=[])
        assert [(b.node_id, b.host, b.port) for b in answer.brokers] == [(1, host, int(port))]
        admin = AdminClient({"bootstrap.servers": kafka(node)})
        admin.create_topics([NewTopic("early", 2, 1)])["early"].result(DEADLINE_S)
    finally:
        node.stop()


# kafka-python reads its message schemas with importlib.resources.read_text.
@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_kafka_python_produces_and_consumes(node: NodeProcess) -> None:
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaPythonPartition

    create(node, "kafka-python", partitions=2)
    producer = KafkaProducer(bootstrap_servers=kafka(node), acks="all", linger_ms=5)
    futures = [producer.send("kafka-python", key=b"k%d" % i, value=b"v%d" % i) for i in range(300)]
    producer.flush(DEADLINE_S)
    assert all(f.get(DEADLINE_S).offset >= 0 for f in futures)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=kafka(node), enable_auto_commit=False)
    consumer.assign([KafkaPythonPartition("kafka-python", p) for p in range(2)])
    consumer.seek_to_beginning()
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < 300 and time.monotonic() < deadline:
        for batch in consumer.poll(500).values():
            values.extend(r.value for r in batch)
    consumer.close()
    assert sorted(values) == sorted(b"v%d" % i for i in range(300))


# ----------------------------------------------------------------------------- hostile


def _raw(node: NodeProcess) -> socket.socket:
    host, port = kafka(node).rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=DEADLINE_S)


def _closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    "frame",
    [
        struct.pack(">i", 1 << 30),  # a frame over the limit (request_bytes_max, 256 MiB)
        struct.pack(">i", -1),
        struct.pack(">i", 12) + struct.pack(">hhi", 999, 0, 1) + b"\0\0\0\0",  # unknown api
        struct.pack(">i", 14) + struct.pack(">hhi", 3, 8, 1) + b"\xff\xff\x00\x00\x00\x09",
    ],
    ids=["huge", "negative", "unknown-api", "garbage-body"],
)
def test_a_hostile_frame_closes_its_connection_and_nothing_else(
    node: NodeProcess, frame: bytes, request: pytest.FixtureRequest
) -> None:
    with _raw(node) as bystander, _raw(node) as sock:
        sock.sendall(frame)
        assert _closed(sock)
        # Another connection is unharmed (ApiVersions v0 answered), and so is the node.
        bystander.sendall(struct.pack(">i", 10) + struct.pack(">hhih", 18, 0, 5, -1))
        assert struct.unpack(">ii", bystander.recv(8, socket.MSG_WAITALL))[1] == 5
    create(node, f"after-{request.node.callspec.id}", partitions=1)


def test_an_api_not_served_is_answered_not_dropped(node: NodeProcess) -> None:
    with _raw(node) as sock:
        # DescribeConfigs v1 with no resources: answered with UNSUPPORTED_VERSION (35).
        body = struct.pack(">hhih", 32, 1, 42, -1) + struct.pack(">i", 0) + b"\0"
        sock.sendall(struct.pack(">i", len(body)) + body)
        size, correlation_id = struct.unpack(">ii", sock.recv(8, socket.MSG_WAITALL))
        assert correlation_id == 42
        rest = sock.recv(size - 4, socket.MSG_WAITALL)
        assert len(rest) == size - 4


def test_many_pipelined_requests_are_answered_in_order(node: NodeProcess) -> None:
    with _raw(node) as sock:
        frames = b"".join(
            struct.pack(">i", 10) + struct.pack(">hhih", 18, 0, n, -1) for n in range(200)
        )
        sock.sendall(frames)
        for n in range(200):
            size, correlation_id = struct.unpack(">ii", sock.recv(8, socket.MSG_WAITALL))
            assert correlation_id == n
            sock.recv(size - 4, socket.MSG_WAITALL)


def test_the_node_log_has_no_traceback(node: NodeProcess, tmp_path: Path) -> None:
    del tmp_path
    assert "Traceback" not in node.log()


# ----------------------------------------------------------------------------- groups


def _group_consumer(node: NodeProcess, group: str, **settings: object) -> Consumer:
    return Consumer(
        {
            "bootstrap.servers": kafka(node),
            "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 500,
            **settings,
        }
    )


def _poll_until(consumers: list[Consumer], done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not done():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for consumer in consumers:
            consumer.poll(0.05)


def _owned(consumers: list[Consumer]) -> list[set[int]]:
    return [{tp.partition for tp in c.assignment()} for c in consumers]


def test_a_group_shares_partitions_and_rebalances_when_a_member_leaves(node: NodeProcess) -> None:
    create(node, "shared", partitions=6)
    consumers = [_group_consumer(node, "sharing") for _ in range(3)]
    for consumer in consumers:
        consumer.subscribe(["shared"])

    def split(among: list[Consumer]) -> Callable[[], bool]:
        def check() -> bool:
            owned = _owned(among)
            return all(owned) and sorted(p for o in owned for p in o) == list(range(6))

        return check

    try:
        _poll_until(consumers, split(consumers), "3 members to share 6 partitions")
        # The gRPC DescribeGroup and `headwater groups describe` show the classic members
        # with what their leader assigned them.
        with Admin(node.address) as admin:
            described = admin.describe_group("sharing")
        assert described.protocol == "classic" and described.state == "Stable"
        assert described.assignor == "range"
        assert sorted(m.member_id for m in described.members) == sorted(
            c.memberid() for c in consumers
        )
        assert all(m.host == "127.0.0.1" and m.client_id == "rdkafka" for m in described.members)
        assert all(list(m.subscribed_topics) == ["shared"] for m in described.members)
        assigned = [p for m in described.members for a in m.assigned for p in a.partitions]
        assert sorted(assigned) == list(range(6))
        table = run_cli("groups", "describe", "sharing", "--bootstrap", node.address)
        assert table.returncode == 0, table.stderr
        assert b"(classic protocol): Stable" in table.stdout
        assert b"127.0.0.1" in table.stdout
        listed = run_cli("groups", "list", "--json", "--bootstrap", node.address)
        assert {"sharing": ("Stable", 3)}.items() <= {
            g["group_id"]: (g["state"], g["members"]) for g in json.loads(listed.stdout)["groups"]
        }.items()
        consumers.pop().close()  # LeaveGroup: the others take its partitions at once
        _poll_until(consumers, split(consumers), "2 members to share 6 partitions")
    finally:
        for consumer in consumers:
            consumer.close()


def test_consumer_protocol_members_share_partitions_commit_and_rebalance(
    node: NodeProcess,
) -> None:
    """librdkafka's ``group.protocol=consumer`` (KIP-848): the coordinator assigns, the
    members read everything between them, commit at their member epochs, and the
    others take a leaving member's partitions; gRPC sees the same group and offsets."""
    create(node, "next-gen", partitions=6)
    ends = dict.fromkeys(range(6), 0)
    for partition, offset in produce(node, "next-gen", [(None, b"%d" % i) for i in range(60)]):
        ends[partition] = max(ends[partition], offset + 1)
    consumers = [
        Consumer(
            {
                "bootstrap.servers": kafka(node),
                "group.id": "next-gen-group",
                "group.protocol": "consumer",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": False,
            }
        )
        for _ in range(3)
    ]
    for consumer in consumers:
        consumer.subscribe(["next-gen"])
    # At least once: a partition that moves before its records are committed is read
    # again by its next owner, so records are kept by (partition, offset).
    read: dict[tuple[int, int], bytes] = {}

    def shared_by(among: list[Consumer]) -> Callable[[], bool]:
        def check() -> bool:
            owned = _owned(among)
            return all(owned) and sorted(p for o in owned for p in o) == list(range(6))

        return check

    def owners_read_to_the_end() -> bool:
        return shared_by(consumers)() and all(
            tp.offset == ends[tp.partition]
            for consumer in consumers
            for tp in consumer.position(consumer.assignment())
            if ends[tp.partition]
        )

    try:
        deadline = time.monotonic() + DEADLINE_S
        while not (owners_read_to_the_end() and len(read) == 60):
            assert time.monotonic() < deadline, f"{_owned(consumers)}, {len(read)} read"
            for consumer in consumers:
                message = consumer.poll(0.05)
                if message is not None and message.error() is None:
                    read[(message.partition(), message.offset())] = message.value()
        assert sorted(read.values()) == sorted(b"%d" % i for i in range(60))
        for consumer in consumers:  # each commits the ends of its partitions
            mine = [
                TopicPartition("next-gen", tp.partition, ends[tp.partition])
                for tp in consumer.assignment()
                if ends[tp.partition]
            ]
            if mine:
                consumer.commit(offsets=mine, asynchronous=False)
        with Admin(node.address) as admin:
            described = admin.describe_group("next-gen-group")
        assert described.protocol == "consumer"
        assert sorted(m.member_id for m in described.members) == sorted(
            c.memberid() for c in consumers
        )
        with grpc.insecure_channel(node.address) as channel:
            fetched = pb_grpc.GroupsStub(channel).OffsetFetch(
                pb.OffsetFetchRequest(group_id="next-gen-group"), timeout=10
            )
        assert sum(o.offset for o in fetched.offsets) == 60
        consumers.pop().close()  # a leave heartbeat: the others take its partitions
        _poll_until(consumers, shared_by(consumers), "2 members to share 6 partitions")
        # A gRPC member joins the same group: the coordinator shares among all three.
        with GrpcConsumer(node.address, auto_offset_reset="earliest") as grpc_member:
            grpc_member.subscribe("next-gen", group_id="next-gen-group")

            def three_share() -> bool:
                grpc_member.poll(timeout_ms=20)
                owned = [*_owned(consumers), {tp.partition for tp in grpc_member.assignment()}]
                return all(owned) and sorted(p for o in owned for p in o) == list(range(6))

            _poll_until(consumers, three_share, "2 Kafka members and 1 gRPC member to share")
    finally:
        for consumer in consumers:
            consumer.close()


def _join_group(sock: socket.socket, group: str, member_id: str) -> tuple[int, str]:
    """A raw JoinGroup v5 on ``sock``: (error code, member id) of its answer."""
    from headwater.node.kafka import protocol

    decoded = exchange(
        sock,
        protocol.JOIN_GROUP,
        5,
        group_id=group,
        session_timeout=6000,
        rebalance_timeout=6000,
        member_id=member_id,
        protocol_type="consumer",
        protocols=[{"name": "range", "metadata": b"\0\0\0\0\0\0\xff\xff\xff\xff"}],
    )
    return int(decoded.error_code), str(decoded.member_id)


def test_metadata_names_topics_by_id_and_looks_them_up_by_id(node: NodeProcess) -> None:
    """Metadata v12: each topic's id (the one ``headwater topics describe`` shows), a
    lookup by id, and UNKNOWN_TOPIC_ID (100) for an id no topic has."""
    from headwater.node.kafka import protocol

    create(node, "by-id", partitions=2)
    with _raw(node) as sock:
        by_name = exchange(sock, protocol.METADATA, 12, topics=[{"name": "by-id"}])
        (topic,) = by_name.topics
        assert int(topic.error_code) == 0 and topic.topic_id is not None
        stranger = uuid.uuid4()
        by_id = exchange(
            sock,
            protocol.METADATA,
            12,
            topics=[{"topic_id": topic.topic_id, "name": None}, {"topic_id": stranger}],
        )
    found, unknown = by_id.topics
    assert (found.name, found.topic_id, len(found.partitions)) == ("by-id", topic.topic_id, 2)
    assert (unknown.name, unknown.topic_id, int(unknown.error_code)) == (None, stranger, 100)
    with Admin(node.address) as admin:
        (described,) = admin.describe_topics(["by-id"])
    assert described.topic_id == topic.topic_id.hex


def test_a_join_without_a_member_id_gets_one_first(node: NodeProcess) -> None:
    """JoinGroup v4+ (KIP-394): MEMBER_ID_REQUIRED with an id, then a join with it is a
    member; an id handed out and never used makes no member."""
    with _raw(node) as sock:
        code, member_id = _join_group(sock, "raw-joiners", "")
        assert code == 79 and member_id.startswith("raw-")
        code, lost = _join_group(sock, "raw-joiners", "")  # an answer the client lost
        assert code == 79 and lost != member_id
        code, joined = _join_group(sock, "raw-joiners", member_id)
        assert (code, joined) == (0, member_id)
    with Admin(node.address) as admin:
        members = admin.describe_group("raw-joiners").members
    assert [m.member_id for m in members] == [member_id]


def test_a_static_member_that_restarts_is_back_before_its_session_ends(
    node: NodeProcess,
) -> None:
    """A consumer with group.instance.id killed and started again takes its old place at
    once, without a rebalance (KIP-345: the generation stays, and its partitions come back
    to it): the group does not wait out the old incarnation's 30 s session. (Its return
    started a new generation.)"""
    create(node, "static", partitions=2)
    script = (
        "import sys\n"
        "from confluent_kafka import Consumer\n"
        "c = Consumer({'bootstrap.servers': sys.argv[1], 'group.id': 'statics', "
        "'group.instance.id': 'worker-1', 'session.timeout.ms': 30000, "
        "'heartbeat.interval.ms': 500})\n"
        "c.subscribe(['static'])\n"
        "while True:\n"
        "    c.poll(0.1)\n"
        "    if c.assignment():\n"
        "        print('assigned', flush=True)\n"
    )

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", script, kafka(node)], stdout=subprocess.PIPE, text=True
        )

    first = start()
    second: subprocess.Popen[str] | None = None
    try:
        assert first.stdout is not None and first.stdout.readline().startswith("assigned")
        with Admin(node.address) as admin:
            generation = admin.describe_group("statics").group_epoch
        first.send_signal(signal.SIGKILL)
        first.wait()
        began = time.monotonic()
        second = start()
        assert second.stdout is not None and second.stdout.readline().startswith("assigned")
        assert time.monotonic() - began < 20  # well before the old session's 30 s
        with Admin(node.address) as admin:
            described = admin.describe_group("statics")
        assert len(described.members) == 1 and described.members[0].instance_id == "worker-1"
        assert described.group_epoch == generation
    finally:
        for process in (first, second):
            if process is not None:
                process.kill()
                process.wait()
                assert process.stdout is not None
                process.stdout.close()


def test_a_killed_member_is_replaced_after_its_session(node: NodeProcess) -> None:
    create(node, "orphaned", partitions=4)
    script = (
        "import sys, time\n"
        "from confluent_kafka import Consumer\n"
        "c = Consumer({'bootstrap.servers': sys.argv[1], 'group.id': 'survivors', "
        "'session.timeout.ms': 6000, 'heartbeat.interval.ms': 500})\n"
        "c.subscribe(['orphaned'])\n"
        "while True:\n"
        "    c.poll(0.1)\n"
        "    if c.assignment():\n"
        "        print('assigned', flush=True)\n"
    )
    doomed = subprocess.Popen(
        [sys.executable, "-c", script, kafka(node)], stdout=subprocess.PIPE, text=True
    )
    survivor = _group_consumer(node, "survivors")
    try:
        assert doomed.stdout is not None and doomed.stdout.readline().startswith("assigned")
        survivor.subscribe(["orphaned"])
        _poll_until(
            [survivor],
            lambda: len(_owned([survivor])[0]) in (1, 2, 3),
            "the survivor to share the partitions",
        )
        doomed.send_signal(signal.SIGKILL)
        doomed.wait()
        began = time.monotonic()
        _poll_until([survivor], lambda: _owned([survivor])[0] == {0, 1, 2, 3}, "every partition")
        assert time.monotonic() - began < 6 + 10  # the session, then one rebalance
    finally:
        doomed.kill()
        doomed.wait()
        if doomed.stdout is not None:
            doomed.stdout.close()
        survivor.close()


def test_commits_are_seen_over_both_protocols(node: NodeProcess) -> None:
    create(node, "committed", partitions=2)
    produce(node, "committed", [(None, b"%d" % i) for i in range(20)])
    consumer = _group_consumer(node, "kafka-side", **{"enable.auto.commit": False})
    consumer.subscribe(["committed"])
    got = 0
    deadline = time.monotonic() + DEADLINE_S
    while got < 20 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and message.error() is None:
            got += 1
    consumer.commit(asynchronous=False)
    consumer.close()
    with grpc.insecure_channel(node.address) as channel:
        groups = pb_grpc.GroupsStub(channel)
        fetched = groups.OffsetFetch(pb.OffsetFetchRequest(group_id="kafka-side"), timeout=10)
        assert sum(o.offset for o in fetched.offsets) == 20
        groups.OffsetCommit(
            pb.OffsetCommitRequest(
                group_id="grpc-side",
                member_epoch=-1,
                offsets=[pb.OffsetCommitPartition(topic="committed", partition=1, offset=7)],
            ),
            timeout=10,
        )
    reader = _group_consumer(node, "grpc-side")
    try:
        (committed,) = reader.committed([TopicPartition("committed", 1)], DEADLINE_S)
        assert committed.offset == 7
    finally:
        reader.close()


@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_kafka_python_consumes_in_a_group(node: NodeProcess) -> None:
    from kafka import KafkaConsumer

    create(node, "kp-group", partitions=3)
    produce(node, "kp-group", [(b"k%d" % i, b"v%d" % i) for i in range(90)])
    consumer = KafkaConsumer(
        "kp-group",
        bootstrap_servers=kafka(node),
        group_id="kp",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while len(values) < 90 and time.monotonic() < deadline:
        for batch in consumer.poll(500).values():
            values.extend(r.value for r in batch)
    consumer.commit()
    consumer.close()
    assert sorted(values) == sorted(b"v%d" % i for i in range(90))


# ----------------------------------------------------------------------------- kcat


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed (Debian: kcat)")
def test_kcat_lists_produces_and_consumes(node: NodeProcess) -> None:
    create(node, "kcat", partitions=2)
    listed = subprocess.run(
        ["kcat", "-b", kafka(node), "-L", "-t", "kcat"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    ).stdout
    assert "2 partitions" in listed and f"broker 1 at {kafka(node)}" in listed, listed
    lines = "".join(f"key{i % 3}:value-{i}\n" for i in range(30))
    # murmur2_random: the Java client's partitioner (librdkafka's default is CRC32).
    settings = ["-X", "acks=all", "-X", "partitioner=murmur2_random"]
    subprocess.run(
        ["kcat", "-b", kafka(node), "-t", "kcat", "-K:", "-P", *settings],
        input=lines,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    )
    consumed = subprocess.run(
        ["kcat", "-b", kafka(node), "-t", "kcat", "-C", "-e", "-f", "%k %s %p\\n"],
        capture_output=True,
        text=True,
        timeout=DEADLINE_S,
        check=True,
    ).stdout.split("\n")
    rows = [row.split() for row in consumed if row]
    assert sorted(value for _, value, _ in rows) == sorted(f"value-{i}" for i in range(30))
    for key, _, partition in rows:  # a key's records share a partition, Kafka's murmur2
        assert int(partition) == partition_for_key(key.encode(), 2)


# ----------------------------------------------------------------------------- aiokafka


def test_aiokafka_produces_and_consumes_in_a_group(node: NodeProcess) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

    create(node, "aio", partitions=2)

    async def scenario() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=kafka(node), acks="all")
        await producer.start()
        try:
            for i in range(200):
                await producer.send("aio", key=b"k%d" % (i % 7), value=b"v%d" % i)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(
            "aio",
            bootstrap_servers=kafka(node),
            group_id="aio-group",
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        values: list[bytes] = []
        try:
            deadline = time.monotonic() + DEADLINE_S
            while len(values) < 200 and time.monotonic() < deadline:
                for batch in (await consumer.getmany(timeout_ms=500)).values():
                    values.extend(r.value for r in batch)
            await consumer.commit()
        finally:
            await consumer.stop()
        return values

    values = asyncio.run(scenario())
    assert sorted(values) == sorted(b"v%d" % i for i in range(200))


# ----------------------------------------------------------------------------- quotas


def test_quotas_hold_kafka_clients_as_they_hold_grpc_ones(node: NodeProcess) -> None:
    """A client id with a 100 KB/s producer quota: 400 KB through librdkafka take about
    3 s more than the first burst the bucket allows, and the answers carry the throttle
    time (librdkafka reports it in its statistics)."""
    create(node, "throttled", partitions=1)
    with Admin(node.address) as admin:
        admin.alter_quotas("client-id", "slow-writer", {"producer_byte_rate": 100_000})
    throttles: list[int] = []

    def stats(raw: str) -> None:
        brokers = json.loads(raw).get("brokers", {}).values()
        throttles.extend(int(b.get("throttle", {}).get("max", 0)) for b in brokers)

    producer = Producer(
        {
            "bootstrap.servers": kafka(node),
            "client.id": "slow-writer",
            "acks": "1",
            "linger.ms": 5,
            "batch.size": 20_000,
            "statistics.interval.ms": 500,
            "stats_cb": stats,
        }
    )
    began = time.monotonic()
    for _ in range(400):
        producer.produce("throttled", value=b"x" * 1000)
        producer.poll(0)
    assert producer.flush(DEADLINE_S) == 0
    took = time.monotonic() - began
    producer.poll(1.0)
    with Admin(node.address) as admin:
        admin.alter_quotas("client-id", "slow-writer", remove=["producer_byte_rate"])
    assert took > 2.0, f"400 KB at 100 KB/s took {took:.2f} s"
    assert max(throttles, default=0) > 0, "no throttle time in the answers"


# ----------------------------------------------------------------------------- admin


def test_admin_describes_configs_grows_partitions_and_describes_the_cluster(
    node: NodeProcess,
) -> None:
    from confluent_kafka.admin import ConfigResource, NewPartitions

    create(node, "administered", partitions=1, **{"retention.ms": "3600000"})
    admin = AdminClient({"bootstrap.servers": kafka(node)})
    resource = ConfigResource(ConfigResource.Type.TOPIC, "administered")
    configs = admin.describe_configs([resource])[resource].result(DEADLINE_S)
    assert configs["retention.ms"].value == "3600000"
    assert not configs["retention.ms"].is_default
    assert configs["cleanup.policy"].value == "delete" and configs["cleanup.policy"].is_default
    admin.create_partitions([NewPartitions("administered", 3)])["administered"].result(DEADLINE_S)
    metadata = admin.list_topics("administered", timeout=DEADLINE_S)
    assert len(metadata.topics["administered"].partitions) == 3
    cluster = admin.describe_cluster().result(DEADLINE_S)
    assert [(n.id, f"{n.host}:{n.port}") for n in cluster.nodes] == [(1, kafka(node))]
    assert cluster.controller is not None and cluster.controller.id == 1


@pytest.mark.filterwarnings("ignore:(read|open)_text is deprecated:DeprecationWarning")
def test_admin_alters_configs_incrementally_and_wholly(node: NodeProcess) -> None:
    """IncrementalAlterConfigs (set, delete, append to cleanup.policy) and AlterConfigs
    (the given configs become the whole set) from librdkafka; kafka-python's AlterConfigs
    too; each change is seen by DescribeConfigs and by the gRPC Admin."""
    from confluent_kafka.admin import (
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
    )

    create(node, "altered", partitions=1, **{"retention.ms": "3600000"})
    admin = AdminClient({"bootstrap.servers": kafka(node)})

    def described() -> dict[str, tuple[str, bool]]:
        resource = ConfigResource(ConfigResource.Type.TOPIC, "altered")
        found = admin.describe_configs([resource])[resource].result(DEADLINE_S)
        return {name: (entry.value, entry.is_default) for name, entry in found.items()}

    def overrides() -> dict[str, str]:
        with Admin(node.address) as grpc_admin:
            (topic,) = grpc_admin.describe_topics(["altered"])
        defaults = NodeConfig().topic_defaults()
        return {k: v for k, v in topic.configs.items() if v != defaults[k]}

    incremental = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        incremental_configs=[
            ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET),
            ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
            ConfigEntry(
                "cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND
            ),
        ],
    )
    admin.incremental_alter_configs([incremental])[incremental].result(DEADLINE_S)
    seen = described()
    assert seen["segment.ms"] == ("60000", False)
    assert seen["retention.ms"][1] is True
    assert seen["cleanup.policy"] == ("compact,delete", False)
    assert overrides() == {"segment_ms": "60000", "cleanup_policy": "compact,delete"}

    whole = ConfigResource(
        ConfigResource.Type.TOPIC, "altered", set_config={"max.message.bytes": "500000"}
    )
    with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):
        altering = admin.alter_configs([whole])
    altering[whole].result(DEADLINE_S)
    assert overrides() == {"max_message_bytes": "500000"}

    # Every described config given back, as librdkafka's tests alter one config, is taken;
    # with a Kafka 3.x config the node does not keep, it is refused by that config's name.
    every = {name: value for name, (value, _) in described().items()}
    again = ConfigResource(ConfigResource.Type.TOPIC, "altered", set_config=every)
    with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):
        admin.alter_configs([again])[again].result(DEADLINE_S)
    assert overrides() == {"max_message_bytes": "500000"}
    older = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        set_config={**every, "message.format.version": "0.10.0"},
    )
    with pytest.raises(KafkaException) as not_kept:
        with pytest.warns(DeprecationWarning, match="alter_configs has been deprecated"):
            admin.alter_configs([older])[older].result(DEADLINE_S)
    assert not_kept.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "message.format.version is not kept" in not_kept.value.args[0].str()

    bad = ConfigResource(
        ConfigResource.Type.TOPIC,
        "altered",
        incremental_configs=[
            ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    with pytest.raises(KafkaException) as refused:
        admin.incremental_alter_configs([bad])[bad].result(DEADLINE_S)
    assert refused.value.args[0].code() == KafkaError.INVALID_CONFIG
    assert "retention_ms" in refused.value.args[0].str()

    from kafka.admin import ConfigResource as PyConfigResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    py_admin = KafkaAdminClient(bootstrap_servers=kafka(node), request_timeout_ms=10_000)
    try:
        # kafka-python alters incrementally where the broker lists IncrementalAlterConfigs.
        retention = PyConfigResource(
            ConfigResourceType.TOPIC, "altered", {"retention.ms": "7200000"}
        )
        py_admin.alter_configs([retention])
        assert overrides() == {"max_message_bytes": "500000", "retention_ms": "7200000"}
        segment = PyConfigResource(ConfigResourceType.TOPIC, "altered", {"segment.ms": "90000"})
        # Over AlterConfigs it sends the other overrides too (they would be removed).
        py_admin.alter_configs([segment], incremental=False)
        assert overrides() == {
            "max_message_bytes": "500000",
            "retention_ms": "7200000",
            "segment_ms": "90000",
        }
        py_admin.reset_configs(
            [PyConfigResource(ConfigResourceType.TOPIC, "altered", ["segment.ms"])]
        )
        assert overrides() == {"max_message_bytes": "500000", "retention_ms": "7200000"}
    finally:
        py_admin.close()


def test_a_failed_acks_0_produce_closes_its_connection(node: NodeProcess) -> None:
    """acks=0 has no answer to carry an error: the connection closes, so that the client
    asks for metadata again rather than keep writing where nothing is appended."""

    from kio.schema.produce.v7.request import (
        PartitionProduceData,
        ProduceRequest,
        TopicProduceData,
    )
    from kio.schema.request_header.v1.header import RequestHeader
    from kio.serial import entity_writer

    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out,
        RequestHeader(request_api_key=0, request_api_version=7, correlation_id=3, client_id="t"),
    )
    entity_writer(ProduceRequest)(
        out,
        ProduceRequest(
            transactional_id=None,
            acks=0,
            timeout=datetime.timedelta(seconds=5),
            topic_data=(
                TopicProduceData(
                    name="no-such-topic",
                    partition_data=(PartitionProduceData(index=0, records=b"\0" * 70),),
                ),
            ),
        ),
    )
    frame = out.getvalue()
    with _raw(node) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        assert _closed(sock)


def test_topics_named_in_one_request_are_created_and_deleted_together(node: NodeProcess) -> None:
    admin = AdminClient({"bootstrap.servers": kafka(node)})
    names = ["together-a", "together-b", "together-c"]
    for future in admin.create_topics([NewTopic(n, 2, 1) for n in names]).values():
        future.result(DEADLINE_S)
    with Admin(node.address) as grpc_admin:
        listed = {t.name for t in grpc_admin.list_topics()}
    assert set(names) <= listed
    for future in admin.delete_topics(names).values():
        future.result(DEADLINE_S)
    with Admin(node.address) as grpc_admin:
        assert not set(names) & {t.name for t in grpc_admin.list_topics()}


def test_a_node_stopping_with_kafka_connections_open_stops_cleanly(tmp_path: Path) -> None:
    """Connections still open when the node stops end with the listener: exit 0 and no
    error in the log."""
    node = NodeProcess(tmp_path / "data", kafka_port=free_port(), log_path=tmp_path / "n.log")
    node.start()
    try:
        with _raw(node) as sock:
            from headwater.node.kafka import protocol

            exchange(sock, protocol.METADATA, 12, topics=None)
            assert node.stop() == 0
    finally:
        node.kill()
    assert " ERROR " not in node.log() and "Traceback" not in node.log(), node.log()[-3000:]


def test_a_transactional_producer_is_refused_at_once(node: NodeProcess) -> None:
    """Transactions are not served: librdkafka's init_transactions fails at once with
    Kafka's non-retriable TRANSACTIONAL_ID_AUTHORIZATION_FAILED. (FindCoordinator for a
    transactional id answered INVALID_REQUEST, which librdkafka retried every 500 ms
    until its timeout.)"""
    producer = Producer({"bootstrap.servers": kafka(node), "transactional.id": "refused"})
    began = time.monotonic()
    with pytest.raises(KafkaException) as failed:
        producer.init_transactions(30)
    assert time.monotonic() - began < 10
    error = failed.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal(), error


def test_a_refused_batch_names_each_record_at_fault(node: NodeProcess) -> None:
    """Produce v8's per-record errors (KIP-467): a batch with keyless records sent to a
    compacted topic is refused INVALID_RECORD naming records 1 and 3, as Kafka does, so
    that the client can tell which records failed."""
    from headwater.node.kafka import protocol

    create(node, "keyed-only", partitions=1, cleanup_policy="compact")
    batch = kafka_raw.record_batch([(key, b"v") for key in (b"k0", None, b"k2", None)])
    with _raw(node) as sock:
        answer = exchange(
            sock,
            protocol.PRODUCE,
            8,
            acks=-1,
            timeout=10_000,
            topic_data=[
                {
                    "name": "keyed-only",
                    "partition_data": [{"index": 0, "records": batch}],
                }
            ],
        )
    (partition,) = answer.responses[0].partition_responses
    assert partition.error_code == 87  # INVALID_RECORD
    assert [e.batch_index for e in partition.record_errors] == [1, 3]
    assert "no key" in partition.record_errors[0].batch_index_error_message


def test_the_committed_leader_epoch_is_kept_and_returned(node: NodeProcess) -> None:
    """KIP-320: OffsetCommit v6+ carries the leader epoch of the record before the offset
    committed; OffsetFetch v5+ answers it, so a consumer resuming there can check the log
    was not truncated under it."""
    from headwater.node.kafka import protocol

    create(node, "epochs", partitions=1)
    with _raw(node) as sock:
        committed = exchange(
            sock,
            protocol.OFFSET_COMMIT,
            7,
            group_id="epoch-keepers",
            generation_id=-1,
            member_id="",
            topics=[
                {
                    "name": "epochs",
                    "partitions": [
                        {"partition_index": 0, "committed_offset": 3, "committed_leader_epoch": 5}
                    ],
                }
            ],
        )
        assert committed.topics[0].partitions[0].error_code == 0
        fetched = exchange(
            sock,
            protocol.OFFSET_FETCH,
            5,
            group_id="epoch-keepers",
            topics=[{"name": "epochs", "partition_indexes": [0]}],
        )
    (partition,) = fetched.topics[0].partitions
    assert (partition.committed_offset, partition.committed_leader_epoch) == (3, 5)


def batch_sizes(records: bytes) -> list[int]:
    """The size of each record batch in a Fetch answer's records, in order."""
    sizes = []
    while records:
        (length,) = struct.unpack_from(">i", records, 8)
        sizes.append(12 + length)
        records = records[12 + length :]
    return sizes


def test_a_fetch_keeps_to_its_limits_but_for_the_first_batch(node: NodeProcess) -> None:
    """Fetch's limits as KIP-74 sets them: the answer holds whole batches within
    max_bytes, each partition's within its partition_max_bytes, and only the first batch
    of the first partition with records passes either limit, so a consumer always moves."""
    from headwater.node.kafka import protocol

    create(node, "sized", partitions=2)
    producer = Producer({"bootstrap.servers": kafka(node), "linger.ms": 0, "batch.num.messages": 1})
    for partition in (0, 1, 0, 1, 0, 1):  # three batches of one record in each partition
        producer.produce("sized", b"v" * 10_000, partition=partition)
        assert producer.flush(DEADLINE_S) == 0

    def fetched(max_bytes: int, partition_max_bytes: int) -> list[list[int]]:
        with socket.create_connection(kafka(node).rsplit(":", 1), timeout=DEADLINE_S) as sock:
            answer = exchange(
                sock,
                protocol.FETCH,
                11,
                replica_id=-1,
                max_wait=0,
                min_bytes=1,
                max_bytes=max_bytes,
                topics=[
                    {
                        "topic": "sized",
                        "partitions": [
                            {"partition": p, "fetch_offset": 0, "partition_max_bytes": limit}
                            for p, limit in ((0, partition_max_bytes), (1, partition_max_bytes))
                        ],
                    }
                ],
            )
        (topic,) = answer.responses
        assert all(int(p.error_code) == 0 for p in topic.partitions)
        return [batch_sizes(p.records or b"") for p in topic.partitions]

    whole = fetched(1 << 20, 1 << 20)
    assert [len(sizes) for sizes in whole] == [3, 3]
    size = max(max(sizes) for sizes in whole)
    assert min(min(sizes) for sizes in whole) > 10_000, whole
    first = whole[0][0]
    assert fetched(1, 1) == [[first], []]  # over both limits: the first batch only
    assert fetched(1 << 20, 1) == [[first], []]  # past a partition's limit likewise
    assert fetched(2 * size + 100, 1 << 20) == [whole[0][:2], []]  # whole batches within
    per_partition = fetched(1 << 20, size + 100)
    assert per_partition == [whole[0][:1], whole[1][:1]]


def test_a_batch_of_megabytes_is_checked_off_the_loop_and_kept(node: NodeProcess) -> None:
    """A Produce of one 3 MiB batch (checked in a worker thread, as every batch over
    1 MiB) is appended whole and in order with the small ones sent after it on the same
    connection, and reads back the same."""
    from headwater.node.kafka import protocol

    create(node, "large", partitions=1, **{"max.message.bytes": str(8 << 20)})

    def batch(values: list[bytes]) -> bytes:
        return kafka_raw.record_batch([(None, value) for value in values])

    large = [bytes([n]) * (1 << 20) for n in range(3)]
    sent = [large, [b"after-1"], [b"after-2"]]
    with socket.create_connection(kafka(node).rsplit(":", 1), timeout=DEADLINE_S) as sock:
        for correlation_id, values in enumerate(sent):
            sock.sendall(
                kafka_raw.frame(
                    protocol.PRODUCE,
                    3,
                    correlation_id,
                    acks=1,
                    timeout=10_000,
                    topic_data=[
                        {
                            "name": "large",
                            "partition_data": [{"index": 0, "records": batch(values)}],
                        }
                    ],
                )
            )
        offsets = []
        for _ in sent:
            (topic,) = kafka_raw.answer(sock, protocol.PRODUCE, 3).responses
            (answered,) = topic.partition_responses
            assert int(answered.error_code) == 0
            offsets.append(int(answered.base_offset))
    assert offsets == [0, 3, 4]
    got = consume_all(node, "large", 1, 5)
    assert [m.value() for m in got] == [*large, b"after-1", b"after-2"]  # type: ignore[attr-defined]
