"""The Kafka listener under attack, on a node with SASL_PLAINTEXT logins and ACLs (alice
may use topic ``a``; bob may do nothing): nothing a stranger or a user without rights
sends before or after a login holds up other clients, and one host cannot take every
connection. Strangers connect from 127.0.0.2 and 127.0.0.3 (loopback addresses too), the
clients that must keep working from 127.0.0.1."""

from __future__ import annotations

import socket
import statistics
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import grpc
import pytest
from confluent_kafka.admin import AdminClient

from headwater.client import Admin
from headwater.node.kafka import protocol
from headwater.shared.acls import parse_acl
from headwater.shared.tls import ClientSecurity
from headwater.tools.benchmarks.kafka_attacks import metadata_latencies_ms
from headwater.tools.ports import free_port
from headwater.tools.tls_certs import create_named_pki
from tests import kafka_raw
from tests.node_process import NodeProcess, wait_until

DEADLINE_S = 30.0
CONNECTIONS_MAX = 120
PER_HOST_MAX = 80
PRELOGIN_RATE = 50
STRANGER = "127.0.0.2"
OTHER_STRANGER = "127.0.0.3"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    node = NodeProcess(
        tmp_path_factory.mktemp("kafka-attacks") / "data",
        env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"},
        kafka_port=free_port(),
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            for user in ("admin", "alice", "bob"):
                admin.upsert_user(user, f"{user}-secret")
            for topic in ("a", "b"):
                admin.create_topic(topic, 1)
            admin.create_acls(
                [parse_acl("topic", "a", "User:alice", op) for op in ("read", "write", "describe")]
                + [parse_acl("group", "mixed", "User:alice", "describe")]
            )
        node.stop()
        node.env.update(
            {
                "HEADWATER_AUTHORIZER": "acl",
                "HEADWATER_SUPER_USERS": "User:admin",
                "HEADWATER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
                "HEADWATER_KAFKA_CONNECTIONS_MAX": str(CONNECTIONS_MAX),
                "HEADWATER_KAFKA_CONNECTIONS_PER_HOST_MAX": str(PER_HOST_MAX),
                "HEADWATER_KAFKA_PRELOGIN_REQUEST_RATE_PER_HOST_MAX": str(PRELOGIN_RATE),
            }
        )
        node.start()
        yield node
    finally:
        node.kill()


def alice(node: NodeProcess) -> AdminClient:
    """A librdkafka client logged in as alice, its connections made (from 127.0.0.1)."""
    assert node.kafka_address is not None
    client = AdminClient(
        {
            "bootstrap.servers": node.kafka_address,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        }
    )
    client.list_topics(timeout=DEADLINE_S)
    return client


def raw(node: NodeProcess, source: str | None = None) -> socket.socket:
    assert node.kafka_address is not None
    return kafka_raw.connect(node.kafka_address, source)


def bob(node: NodeProcess, source: str = STRANGER) -> socket.socket:
    """A raw connection logged in as bob (who may do nothing). The node checks at most 8
    passwords of one host at once and refuses more, so a refused login is tried again."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        sock = raw(node, source)
        if kafka_raw.plain_login(sock, "bob", "bob-secret") == 0:
            return sock
        sock.close()
        assert time.monotonic() < deadline, "bob could not log in"
        time.sleep(0.1)


class Repeating:
    """``attack(stop)`` run over and over in a thread of its own, until the block ends."""

    def __init__(self, attack: object, threads: int = 1) -> None:
        self.attack = attack
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]
        self.rounds = 0

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.attack(self.stop)  # type: ignore[operator]
                self.rounds += 1
            except OSError:
                time.sleep(0.05)

    def __enter__(self) -> Repeating:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(DEADLINE_S)


def _hold_until_closed(sock: socket.socket, stop: threading.Event) -> None:
    sock.settimeout(0.5)
    while not stop.is_set():
        try:
            if not sock.recv(1):
                return
        except TimeoutError:
            continue


@pytest.mark.parametrize(
    ("api_key", "size", "connections"),
    [(protocol.PRODUCE, 256 << 20, 1), (protocol.METADATA, 4 << 20, 64)],
    ids=["one-256MiB-produce", "64-4MiB-metadata"],
)
def test_a_stalled_frame_of_a_user_without_rights_holds_up_nobody(
    node: NodeProcess, api_key: int, size: int, connections: int
) -> None:
    """bob logs in on ``connections`` connections, each announcing a frame of ``size``
    bytes and sending nothing more, again each time it is closed. Nothing of those frames
    is held in the node's budget of 256 MiB, so alice's Metadata is answered as fast as
    before. (Were each frame reserved whole as it was announced, every other client would
    wait out the 30 s frame timeout.)"""
    client = alice(node)
    quiet = metadata_latencies_ms(client, 2)
    announced = threading.Semaphore(0)

    def stall(stop: threading.Event) -> None:
        with bob(node) as sock:
            version = 3 if api_key == protocol.PRODUCE else 1
            sock.sendall(struct.pack(">ihhi", size, api_key, version, 1))
            announced.release()
            _hold_until_closed(sock, stop)

    with Repeating(stall, threads=connections):
        for _ in range(connections):
            assert announced.acquire(timeout=DEADLINE_S)
        attacked = metadata_latencies_ms(client, 5)
    assert max(attacked) < 1000, attacked
    assert statistics.median(attacked) < max(100.0, 2 * statistics.median(quiet)), (
        quiet,
        attacked,
    )


def produce_frame(topic: str, value_bytes: int) -> bytes:
    """A Produce (v3, acks=1) of one record of ``value_bytes`` to ``topic``'s partition 0."""
    batch = kafka_raw.record_batch([(None, bytes(value_bytes))])
    return kafka_raw.frame(
        protocol.PRODUCE,
        3,
        acks=1,
        timeout=10_000,
        topic_data=[{"name": topic, "partition_data": [{"index": 0, "records": batch}]}],
    )


def logged_in(node: NodeProcess, user: str, source: str | None = None) -> socket.socket:
    sock = raw(node, source)
    assert kafka_raw.plain_login(sock, user, f"{user}-secret") == 0
    return sock


def produce_answered_s(node: NodeProcess, frame: bytes) -> float:
    """Seconds from alice sending ``frame`` (a Produce v3) to its answer."""
    with logged_in(node, "alice") as sock:
        sock.settimeout(90)
        started = time.monotonic()
        sock.sendall(frame)
        answer = kafka_raw.answer(sock, protocol.PRODUCE, 3)
        assert len(answer.responses) == 1
        return time.monotonic() - started


def test_a_frame_that_stops_arriving_gives_way_to_one_that_waits(node: NodeProcess) -> None:
    """bob sends 250 MiB of a 255 MiB Produce and stops: of the node's budget of 256 MiB
    for request bytes, less than alice's 16 MiB Produce needs is left. Once alice's frame
    waits for room, bob's, which brings nothing more, is closed and alice is answered in
    seconds, not after bob's 30 s to finish his frame."""
    with bob(node) as stalled:
        stalled.sendall(struct.pack(">ihhi", 255 << 20, protocol.PRODUCE, 3, 1))
        stalled.sendall(bytes(250 << 20))
        assert produce_answered_s(node, produce_frame("a", 16 << 20)) < 15
        assert kafka_raw.closed(stalled, timeout=5)


TCP_ESTABLISHED = 1
TCP_CLOSE = 7


def tcp_state(sock: socket.socket) -> int:
    """The socket's TCP state (Linux's ``tcpi_state``), seen without reading from it."""
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]


def fetch_frame(topic: str, offset: int, max_wait_ms: int, min_bytes: int) -> bytes:
    """A Fetch (v4) of up to 1 MiB of ``topic``'s partition 0 from ``offset``."""
    return kafka_raw.frame(
        protocol.FETCH,
        4,
        replica_id=-1,
        max_wait=max_wait_ms,
        min_bytes=min_bytes,
        max_bytes=1 << 20,
        topics=[
            {
                "topic": topic,
                "partitions": [
                    {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}
                ],
            }
        ],
    )


def latest_offset(sock: socket.socket, topic: str) -> int:
    listed = kafka_raw.exchange(
        sock,
        protocol.LIST_OFFSETS,
        1,
        replica_id=-1,
        topics=[{"name": topic, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
    )
    return int(listed.topics[0].partitions[0].offset)


def test_a_request_whose_answer_waits_holds_no_request_bytes(node: NodeProcess) -> None:
    """alice's connection waits 20 s on a long poll, with 16 requests behind it, and then
    sends a Produce of 250 MiB: its answer cannot be queued until the long poll ends, but
    its bytes are freed once it is handled, so another client's 16 MiB Produce is
    answered at once."""
    with logged_in(node, "alice") as waiting:
        end = latest_offset(waiting, "a")
        waiting.sendall(fetch_frame("a", end, max_wait_ms=20_000, min_bytes=1 << 30))
        waiting.sendall(kafka_raw.frame(protocol.API_VERSIONS, 0) * 16)
        waiting.sendall(produce_frame("a", 250 << 20))
        assert produce_answered_s(node, produce_frame("a", 16 << 20)) < 15


@pytest.mark.slow
def test_a_client_that_takes_no_answers_is_closed(node: NodeProcess) -> None:
    """alice asks for 40 fetches of 1 MiB and reads none of the answers: once her client
    has taken no byte for 30 s, the connection is closed and its answers dropped."""
    assert produce_answered_s(node, produce_frame("a", 900 << 10)) < 15
    with logged_in(node, "alice") as deaf:
        deaf.sendall(fetch_frame("a", 0, max_wait_ms=0, min_bytes=1) * 40)
        assert tcp_state(deaf) == TCP_ESTABLISHED
        wait_until(lambda: tcp_state(deaf) == TCP_CLOSE, 60, "the deaf connection closed")


def test_before_a_login_a_large_frame_is_refused_on_its_first_bytes(node: NodeProcess) -> None:
    """A SaslAuthenticate announced at 64 KiB and a byte before any login closes its
    connection after its first 12 bytes (Kafka caps such frames at 512 KiB, for tokens of
    mechanisms not served here); one at 64 KiB is read."""
    with raw(node, STRANGER) as sock:
        sock.sendall(struct.pack(">ihhi", (64 << 10) + 1, protocol.SASL_AUTHENTICATE, 1, 1))
        assert kafka_raw.closed(sock, timeout=5)
    with raw(node, STRANGER) as sock:
        sock.sendall(struct.pack(">ihhi", 64 << 10, protocol.SASL_AUTHENTICATE, 1, 1))
        assert not kafka_raw.closed(sock, timeout=1)


def test_a_connection_gets_one_handshake_and_a_few_requests_before_its_login(
    node: NodeProcess,
) -> None:
    """An unsupported mechanism and a second handshake are answered and close the
    connection, as Kafka does; so does a ninth request before a login."""
    with raw(node, STRANGER) as sock:
        refused = kafka_raw.exchange(sock, protocol.SASL_HANDSHAKE, 1, mechanism="GSSAPI")
        assert refused.error_code == 33  # UNSUPPORTED_SASL_MECHANISM
        assert kafka_raw.closed(sock, timeout=5)
    with raw(node, STRANGER) as sock:
        first = kafka_raw.exchange(sock, protocol.SASL_HANDSHAKE, 1, mechanism="PLAIN")
        assert first.error_code == 0
        again = kafka_raw.exchange(sock, protocol.SASL_HANDSHAKE, 1, mechanism="PLAIN")
        assert again.error_code == 34  # ILLEGAL_SASL_STATE
        assert kafka_raw.closed(sock, timeout=5)
    with raw(node, STRANGER) as sock:
        for _ in range(8):
            assert kafka_raw.exchange(sock, protocol.API_VERSIONS, 0).error_code == 0
        sock.sendall(kafka_raw.frame(protocol.API_VERSIONS, 0))
        assert kafka_raw.closed(sock, timeout=5)


def test_one_host_cannot_take_every_connection(node: NodeProcess) -> None:
    """One host holds at most ``PER_HOST_MAX`` connections; past the node's cap, idle
    sockets that never logged in give way to new connections, so a client logs in while
    two hosts keep the node full. (Without these, 4,200 idle sockets from one host would
    shut everyone else out.)"""
    with ExitStack() as held:
        socks = [held.enter_context(raw(node, STRANGER)) for _ in range(PER_HOST_MAX + 10)]
        refused = [s for s in socks[PER_HOST_MAX:] if kafka_raw.closed(s, timeout=5)]
        assert len(refused) == 10
        for _ in range(CONNECTIONS_MAX - PER_HOST_MAX + 10):
            held.enter_context(raw(node, OTHER_STRANGER))
        client = alice(node)  # its connections take the place of the oldest idle ones
        assert max(metadata_latencies_ms(client, 1)) < 1000
        assert kafka_raw.closed(socks[0], timeout=5)


def test_requests_before_a_login_are_rate_limited_per_host(node: NodeProcess) -> None:
    """16 connections from one host flood ApiVersions before any login, reconnecting as
    they are closed: the host gets about ``PRELOGIN_RATE`` answers a second, and alice's
    Metadata is not slowed. (Unlimited, the flood would take 2,800 answers a second and
    most of the node's CPU.)"""
    answered = [0]
    lock = threading.Lock()

    def flood(stop: threading.Event) -> None:
        with raw(node, STRANGER) as sock:
            for _ in range(8):
                if stop.is_set():
                    return
                kafka_raw.exchange(sock, protocol.API_VERSIONS, 0)
                with lock:
                    answered[0] += 1

    client = alice(node)
    with Repeating(flood, threads=16):
        wait_until(lambda: answered[0] >= PRELOGIN_RATE, DEADLINE_S, "the flood")
        before = answered[0]
        attacked = metadata_latencies_ms(client, 4)
        during = answered[0] - before
    assert during <= PRELOGIN_RATE * 6, during  # 4 s at the rate, and slack for the burst
    assert max(attacked) < 1000, attacked


def test_describe_groups_shows_a_caller_only_the_topics_it_may_describe(
    node: NodeProcess,
) -> None:
    """The admin's member of group ``mixed`` is subscribed to topics a and b and assigned
    both; alice may describe a only: over Kafka's DescribeGroups she sees a subscription
    to a and a's partitions, as the gRPC DescribeGroup shows her, and the member's
    instance id (v4). (Raw consumer-protocol bytes would name b to her.) A group named
    a thousand times is described once."""
    from confluent_kafka import Consumer

    from headwater.node.groups import consumer_protocol

    assert node.kafka_address is not None
    member = Consumer(
        {
            "bootstrap.servers": node.kafka_address,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "admin",
            "sasl.password": "admin-secret",
            "group.id": "mixed",
            "group.instance.id": "admin-1",
        }
    )
    try:
        member.subscribe(["a", "b"])
        deadline = time.monotonic() + DEADLINE_S
        while len(member.assignment()) < 2:
            assert time.monotonic() < deadline, "the member got no assignment"
            member.poll(0.2)
        with raw(node) as sock:
            assert kafka_raw.plain_login(sock, "alice", "alice-secret") == 0
            (group,) = kafka_raw.exchange(
                sock, protocol.DESCRIBE_GROUPS, 4, groups=["mixed"]
            ).groups
            repeated = kafka_raw.exchange(
                sock, protocol.DESCRIBE_GROUPS, 4, groups=["mixed"] * 1000
            ).groups
        assert len(repeated) == 1 and len(repeated[0].members) == 1
        assert group.error_code == 0
        (seen,) = group.members
        assert seen.group_instance_id == "admin-1"
        assert consumer_protocol.subscribed_topics(bytes(seen.member_metadata)) == ("a",)
        assert consumer_protocol.assigned_partitions(bytes(seen.member_assignment)) == (
            ("a", (0,)),
        )
    finally:
        member.close()


def test_authorization_comes_before_existence_on_every_api(node: NodeProcess) -> None:
    """bob may do nothing: every API answers him the same for a topic or group that
    exists and for one that does not, and shows him no config value. (IncrementalAlter-
    Configs answered UNKNOWN_TOPIC_OR_PARTITION for a missing topic, and a SUBTRACT that
    emptied cleanup.policy told him its value; Metadata by topic id named the topic.)"""
    topic_failed, group_failed, cluster_failed = 29, 30, 31

    def answers(name: str, group: str) -> list[object]:
        with bob(node) as sock:
            found: list[object] = []

            def ask(api: int, version: int, **fields: object) -> object:
                return kafka_raw.exchange(sock, api, version, **fields)

            found.append(ask(protocol.METADATA, 4, topics=[{"name": name}]).topics[0].error_code)
            subtract = {
                "resource_type": 2,
                "resource_name": name,
                "configs": [{"name": "cleanup.policy", "config_operation": 3, "value": "delete"}],
            }
            altered = ask(protocol.INCREMENTAL_ALTER_CONFIGS, 0, resources=[subtract])
            message = (altered.responses[0].error_message or "").replace(repr(name), "NAME")
            found.append((altered.responses[0].error_code, message))
            whole = {"resource_type": 2, "resource_name": name, "configs": []}
            found.append(ask(protocol.ALTER_CONFIGS, 0, resources=[whole]).responses[0].error_code)
            described = ask(
                protocol.DESCRIBE_CONFIGS,
                1,
                resources=[{"resource_type": 2, "resource_name": name}],
            )
            found.append((described.results[0].error_code, described.results[0].configs))
            grown = ask(protocol.CREATE_PARTITIONS, 0, topics=[{"name": name, "count": 9}])
            found.append(grown.results[0].error_code)
            found.append(ask(protocol.DELETE_TOPICS, 1, topic_names=[name]).responses[0].error_code)
            offsets = ask(
                protocol.LIST_OFFSETS,
                1,
                replica_id=-1,
                topics=[{"name": name, "partitions": [{"partition_index": 0, "timestamp": -1}]}],
            )
            found.append(offsets.topics[0].partitions[0].error_code)
            found.append(ask(protocol.DESCRIBE_GROUPS, 0, groups=[group]).groups[0].error_code)
            found.append(
                ask(protocol.OFFSET_FETCH, 3, group_id=group, topics=[{"name": name}]).error_code
            )
            return found

    existing = answers("a", "mixed")
    assert existing == answers("missing-topic", "missing-group")
    assert existing[0] == topic_failed and existing[1][0] == topic_failed
    assert "delete" not in (existing[1][1] or "") and existing[3][1] == ()
    assert existing[7] == group_failed
    with bob(node) as sock:
        broker = {"resource_type": 4, "resource_name": "1"}
        described = kafka_raw.exchange(sock, protocol.DESCRIBE_CONFIGS, 1, resources=[broker])
        assert described.results[0].error_code == cluster_failed
    with raw(node) as sock:
        assert kafka_raw.plain_login(sock, "admin", "admin-secret") == 0
        every = kafka_raw.exchange(sock, protocol.METADATA, 12, topics=None).topics
        topic_id = next(t.topic_id for t in every if t.name == "a")
    with bob(node) as sock:
        (by_id,) = kafka_raw.exchange(
            sock, protocol.METADATA, 12, topics=[{"topic_id": topic_id}]
        ).topics
        assert (by_id.name, by_id.error_code) == (None, topic_failed)


def test_silent_tls_sockets_hold_no_tls_state_and_are_closed_after_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    """1,000 sockets connect to a SASL_SSL listener and say nothing: the node's memory
    grows by far less than a TLS connection each (asyncio's TLS protocol allocates 256 KiB
    per connection at once; each was about 300 KB), logins keep working, and a silent
    socket is closed when its handshake time is up."""
    pki = create_named_pki(tmp_path / "pki", ("node-1",), ("admin",))
    node = NodeProcess(
        tmp_path / "data",
        env={
            "HEADWATER_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "HEADWATER_KAFKA_CONNECTIONS_PER_HOST_MAX": "2000",
        },
        kafka_port=free_port(),
        tls=pki.nodes["node-1"],
    )
    node.start()
    try:
        admin_files = pki.clients["admin"]
        security = ClientSecurity(
            "SSL", str(pki.ca_file), str(admin_files.cert_file), str(admin_files.key_file)
        )
        with Admin(node.address, security=security) as admin:
            admin.upsert_user("carol", "carol-secret")
        assert node.kafka_address is not None
        login = {
            "bootstrap.servers": node.kafka_address,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": str(pki.ca_file),
            "ssl.endpoint.identification.algorithm": "none",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "carol",
            "sasl.password": "carol-secret",
        }
        AdminClient(login).list_topics(timeout=DEADLINE_S)
        before = node.rss_bytes()
        with ExitStack() as held:
            first = held.enter_context(raw(node, STRANGER))
            started = time.monotonic()
            for _ in range(999):
                held.enter_context(raw(node, STRANGER))
            wait_until(lambda: node.rss_bytes() > before, 5, "the node to take the sockets")
            AdminClient(login).list_topics(timeout=DEADLINE_S)
            grown = node.rss_bytes() - before
            assert grown < 30 << 20, f"{grown} bytes for 1,000 silent sockets"
            assert kafka_raw.closed(first, timeout=20)
            assert 9 < time.monotonic() - started < 20
    finally:
        node.stop()


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node with a PLAINTEXT Kafka listener and its metrics served."""
    node = NodeProcess(
        tmp_path_factory.mktemp("metered") / "data",
        kafka_port=free_port(),
        metrics_port=free_port(),
    )
    node.start()
    try:
        yield node
    finally:
        node.kill()


def produce(sock: socket.socket, topic: str, partitions: list[dict[str, object]]) -> list[int]:
    """One Produce v3 (acks=1) of ``partitions`` of ``topic``: each partition's error code."""
    (answered,) = kafka_raw.exchange(
        sock,
        protocol.PRODUCE,
        3,
        acks=1,
        timeout=10_000,
        topic_data=[{"name": topic, "partition_data": partitions}],
    ).responses
    return [p.error_code for p in answered.partition_responses]


def test_refused_partitions_of_a_produce_leave_no_garbage_for_the_cyclic_collector(
    metered: NodeProcess,
) -> None:
    """A Produce naming 10,000 partitions the node does not have is refused partition by
    partition, and the refusals are freed as the answer goes: none waits for the cyclic
    garbage collector, a full collection of which held a node's loop for over a second
    (every refusal kept as an exception beside the frames of its traceback)."""
    from tests.test_metrics import scrape

    assert metered.metrics_address is not None
    address = metered.metrics_address
    with Admin(metered.address) as admin:
        admin.create_topic("one", 1)
    batch = kafka_raw.record_batch([(None, b"value")])
    partitions: list[dict[str, object]] = [
        {"index": index, "records": batch} for index in range(10_000)
    ]

    def collected() -> float:
        return sum(
            value
            for (name, _), value in scrape(address).items()
            if name == "python_gc_objects_collected_total"
        )

    before = collected()
    with raw(metered) as sock:
        for _ in range(20):
            codes = produce(sock, "one", partitions)
            assert codes[0] == 0 and set(codes[1:]) == {3}  # UNKNOWN_TOPIC_OR_PARTITION
    freed_by_the_collector = collected() - before
    assert freed_by_the_collector < 20_000, freed_by_the_collector


def test_a_fetch_of_many_small_batches_gives_the_loop_back_as_it_reads(
    metered: NodeProcess,
) -> None:
    """A Fetch over 100 partitions of 200 one-record batches each (20,000 batches, each
    read and cut on the event loop): the loop is given back as the bytes are read, not
    only every 100 partitions, so its longest stall stays far below the 0.3 s that one
    slice of them took."""
    from headwater.tools.benchmarks.kafka_requests import longest_stall_ms, stall_buckets

    assert metered.metrics_address is not None
    with Admin(metered.address) as admin:
        admin.create_topic("small", 100)
    batch = kafka_raw.record_batch([(None, b"value")])
    every_partition: list[dict[str, object]] = [
        {"index": index, "records": batch} for index in range(100)
    ]
    with raw(metered) as sock:
        for _ in range(200):
            assert set(produce(sock, "small", every_partition)) == {0}
        before = stall_buckets(metered.metrics_address)
        for _ in range(3):
            (topic,) = kafka_raw.exchange(
                sock,
                protocol.FETCH,
                4,
                replica_id=-1,
                max_wait_ms=0,
                min_bytes=0,
                max_bytes=64 << 20,
                isolation_level=0,
                topics=[
                    {
                        "topic": "small",
                        "partitions": [
                            {"partition": index, "fetch_offset": 0, "partition_max_bytes": 1 << 20}
                            for index in range(100)
                        ],
                    }
                ],
            ).responses
            assert all(p.records for p in topic.partitions)
        stall_ms = longest_stall_ms(before, stall_buckets(metered.metrics_address))
    assert stall_ms <= 100, stall_ms


def test_reading_one_partition_of_many_small_kafka_batches_holds_the_loop_on_neither_front(
    metered: NodeProcess,
) -> None:
    """One partition holding 10,000 one-record batches produced over Kafka, read from its
    start over each front: Kafka's Fetch (1 MiB of the partition, its stored batches cut
    to Kafka batches, read on while they fit) and gRPC's (the same batches transcoded to
    columnar ones, 4 MiB); and 40,000 records read over gRPC as decoded messages. Each
    batch costs microseconds to cut or transcode, each record to decode: shaped in one
    piece, one such read holds the loop 100 ms over Kafka and 250 ms over gRPC. On a
    quiet machine the longest stall is 20-30 ms (BENCHMARKS.md); the bound here leaves
    room for a loaded one."""
    from headwater.log import batch as batch_format
    from headwater.tools.benchmarks.kafka_requests import (
        longest_stall_ms,
        measure_reads,
        stall_buckets,
    )
    from headwater.v1 import headwater_pb2 as pb
    from headwater.v1 import headwater_pb2_grpc as pb_grpc

    assert metered.metrics_address is not None and metered.kafka_address is not None
    stalls = measure_reads(metered.address, metered.kafka_address, metered.metrics_address)
    with grpc.insecure_channel(metered.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        # Records decoded into messages: 40,000 of 90 bytes, in batches of 1,000.
        with Admin(metered.address) as admin:
            admin.create_topic("many-records", 1)
        for _ in range(40):
            stub.Produce(
                pb.ProduceRequest(
                    topic="many-records",
                    partition=0,
                    batch=batch_format.encode_batch([bytes(90)] * 1_000),
                ),
                timeout=60,
            )
        before = stall_buckets(metered.metrics_address)
        for _ in range(3):
            fetched = stub.Fetch(
                pb.FetchRequest(
                    topic="many-records",
                    partition=0,
                    offset=0,
                    max_wait_ms=0,
                    max_bytes=4 << 20,
                    format=pb.RECORD_FORMAT_RECORDS,
                ),
                timeout=60,
            )
            assert len(fetched.decoded) == 40_000
        stalls["grpc records"] = longest_stall_ms(before, stall_buckets(metered.metrics_address))
    assert max(stalls.values()) < 100, stalls  # the histogram's buckets: at most 75 ms
