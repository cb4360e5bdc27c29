"""Issue 11's findings about who may call what, each against real node processes.

- ``test_a_plain_client_cannot_pose_as_a_broker``: the controller and replica services
  shared the client port; a client registered as an existing node id, heartbeated, and
  fetched past the log end, and the leader put that "replica" in the ISR and acknowledged
  acks=all writes no real follower held.
- ``test_a_single_node_runs_no_pickle_from_its_raft_port``: a lone node (``make run``)
  had no Raft secret, so anyone reaching its Raft port could run code in it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import signal
import socket
import stat
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from headwater.client import Admin, Producer
from headwater.log import batch as batch_format
from headwater.node.security import cluster_auth
from headwater.shared.errors import HeadwaterError
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import CLUSTER_SECRET, LocalCluster
from tests.node_process import NodeProcess, run_cli, wait_until

DEADLINE_S = 60


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def _code_and_details(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details() or ""


def _signed(secret: str, node_id: int, method: str) -> tuple[tuple[str, str], ...]:
    value = cluster_auth.token(secret.encode(), node_id, method, int(time.time() * 1000))
    return ((cluster_auth.AUTH_KEY, value),)


REGISTER = "/headwater.v1.Controller/RegisterBroker"
FETCH = "/headwater.v1.Replica/Fetch"


@pytest.mark.slow
def test_a_plain_client_cannot_pose_as_a_broker(cluster3: LocalCluster) -> None:
    victim = cluster3.nodes[2]
    epoch_of_2 = {b.node_id: b for b in cluster3.metadata(victim).brokers}[2].broker_epoch
    impostor = pb.RegisterBrokerRequest(
        node_id=2, incarnation_id="impostor", address="127.0.0.1:1", internal_address="x:1"
    )
    for node in cluster3.nodes.values():
        # The client listener does not serve the internal services at all.
        with grpc.insecure_channel(node.address) as channel:
            code, _ = _code_and_details(
                lambda c=channel: pb_grpc.ControllerStub(c).RegisterBroker(impostor, timeout=5)
            )
            assert code == grpc.StatusCode.UNIMPLEMENTED
            code, _ = _code_and_details(
                lambda c=channel: list(
                    pb_grpc.ReplicaStub(c).Fetch(iter([pb.ReplicaFetchRequest()]), timeout=5)
                )
            )
            assert code == grpc.StatusCode.UNIMPLEMENTED
        # The inter-broker listener refuses a call without the cluster secret's proof ...
        with grpc.insecure_channel(node.internal_address) as channel:
            stub = pb_grpc.ControllerStub(channel)
            code, details = _code_and_details(lambda s=stub: s.RegisterBroker(impostor, timeout=5))
            assert code == grpc.StatusCode.UNAUTHENTICATED and "lacks" in details, details
            # ... one signed with another secret, or for another method ...
            for metadata in (_signed("guess", 2, REGISTER), _signed(CLUSTER_SECRET, 2, FETCH)):
                code, details = _code_and_details(
                    lambda s=stub, m=metadata: s.RegisterBroker(impostor, metadata=m, timeout=5)
                )
                assert code == grpc.StatusCode.UNAUTHENTICATED and "not signed" in details
            # ... and an old token.
            stale = cluster_auth.token(CLUSTER_SECRET.encode(), 2, REGISTER, 1_000)
            code, details = _code_and_details(
                lambda s=stub, t=stale: s.RegisterBroker(
                    impostor, metadata=((cluster_auth.AUTH_KEY, t),), timeout=5
                )
            )
            assert code == grpc.StatusCode.UNAUTHENTICATED and "clock" in details
    # Node 2's registration is untouched and acks=all writes go on.
    after = {b.node_id: b for b in cluster3.metadata(victim).brokers}[2]
    assert after.broker_epoch == epoch_of_2 and after.state == "running"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("guarded", partitions=1, replication_factor=3)
    with Producer(cluster3.bootstrap(), acks="all") as producer:
        producer.send("guarded", b"v", partition=0).result(timeout=30)


@pytest.mark.slow
def test_a_fetch_from_another_registration_or_past_the_log_end_never_counts(
    cluster3: LocalCluster,
) -> None:
    """Even with the secret, a replica fetch counts only from the replica's current
    registration and never past the leader's log end."""
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("fenced", partitions=1, replication_factor=3)
    [partition] = cluster3.partitions(cluster3.alive()[0], "fenced")
    leader = cluster3.nodes[partition.leader]
    follower = next(r for r in partition.replicas if r != partition.leader)
    brokers = {b.node_id: b for b in cluster3.metadata(leader).brokers}
    with grpc.insecure_channel(leader.internal_address) as channel:
        stub = pb_grpc.ReplicaStub(channel)

        def fetch(broker_epoch: int, offset: int) -> pb.ReplicaFetchData:
            request = pb.ReplicaFetchRequest(
                replica_id=follower,
                broker_epoch=broker_epoch,
                positions=[
                    pb.ReplicaFetchPosition(
                        topic="fenced",
                        partition=0,
                        leader_epoch=partition.leader_epoch,
                        fetch_offset=offset,
                    )
                ],
                max_wait_ms=10,
            )
            [response] = list(
                stub.Fetch(iter([request]), metadata=_signed(CLUSTER_SECRET, follower, FETCH))
            )
            return response.partitions[0]

        stale = fetch(brokers[follower].broker_epoch - 1, 0)
        assert stale.error_code == pb.STALE_BROKER_EPOCH, stale
        past = fetch(brokers[follower].broker_epoch, 1_000_000)
        assert past.error_code == pb.OFFSET_OUT_OF_RANGE and "past the leader" in (
            past.error_message
        )


def test_a_single_node_runs_no_pickle_from_its_raft_port(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data")
    node.start()
    try:
        secret_file = node.data_dir / "cluster.secret"
        assert stat.S_IMODE(secret_file.stat().st_mode) == 0o600
        assert len(secret_file.read_text().strip()) == 64
        marker = tmp_path / "ran"

        class Payload:
            def __reduce__(self):
                return (open, (str(marker), "w"))

        data = zlib.compress(pickle.dumps(Payload()), 3)
        host, port = node.quorum.split("@")[1].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(struct.pack("i", len(data)) + data)
            sock.settimeout(5)
            with contextlib.suppress(TimeoutError, ConnectionResetError):
                sock.recv(1)  # the node drops the connection
        # The node still serves, and nothing ran.
        wait_until(node.serving, DEADLINE_S, "the node to serve")
        assert not marker.exists()
        # The same secret on the next start.
        first = secret_file.read_text()
        node.kill()
        node.start()
        assert secret_file.read_text() == first
    finally:
        node.kill()


def test_a_raft_peer_announcing_a_huge_message_is_dropped(node: NodeProcess) -> None:
    """A peer that sent a 2^31-1 length prefix and junk was buffered before anything
    could be authenticated: metadata changes stopped for 32 s."""
    host, port = node.quorum.split("@")[1].rsplit(":", 1)
    junk = os.urandom(1 << 20)
    dropped = False
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(struct.pack("i", (1 << 31) - 1))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                sock.sendall(junk)
            except (BrokenPipeError, ConnectionResetError, TimeoutError):
                dropped = True
                break
        assert dropped, "the node kept reading a message announced as 2 GiB"
    started = time.monotonic()
    with Admin(node.address) as admin:
        admin.create_topic("after-junk", partitions=1)
    assert time.monotonic() - started < 10
    assert "announced a 2147483647-byte message" in node.log()


def test_long_call_slots_cap_each_connection_and_the_node() -> None:
    from headwater.node.core.limits import LongCallSlots
    from headwater.shared.errors import ErrorCode, HeadwaterError

    slots = LongCallSlots(per_connection_max=2, node_max=3)
    with slots.hold("a", False), slots.hold("a", False):
        with pytest.raises(HeadwaterError) as info, slots.hold("a", False):
            pass
        assert info.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert "streams_per_connection_max 2" in info.value.message
        with slots.hold("b", False):
            with pytest.raises(HeadwaterError, match="streams_max 3"), slots.hold("c", False):
                pass
        # A forwarded call counts for the node, not for the forwarding node's connection.
        with slots.hold("a", True):
            assert slots.open == 3 and slots.open_on("a") == 2
    assert slots.open == 0 and slots.open_on("a") == 0


def test_idle_streams_cannot_take_every_call_of_a_node(tmp_path: Path) -> None:
    """300 idle FetchStreams on one node used up its call limit for everyone, heartbeats
    included. (Small limits here, so that the node-wide one is reached quickly.)"""
    node = NodeProcess(
        tmp_path / "data",
        env={
            "HEADWATER_CONCURRENT_CALLS_MAX": "200",
            "HEADWATER_STREAMS_MAX": "150",
            "HEADWATER_STREAMS_PER_CONNECTION_MAX": "100",
        },
    )
    node.start()
    with Admin(node.address) as admin:
        admin.create_topic("idle", partitions=1)
    request = pb.FetchRequest(topic="idle", partition=0, offset=0, max_wait_ms=10_000)
    # Channels to one address share a connection unless told not to.
    own = [("grpc.use_local_subchannel_pool", 1)]
    one = grpc.insecure_channel(node.address, options=own)
    many = [grpc.insecure_channel(node.address, options=own) for _ in range(10)]
    calls = [pb_grpc.BrokerStub(one).FetchStream(request) for _ in range(150)]

    def refused() -> list[grpc.Future]:
        return [c for c in calls if c.done() and c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED]

    try:
        wait_until(
            lambda: len(refused()) == 50, DEADLINE_S, "the streams over the connection's cap"
        )
        assert all("streams_per_connection_max 100" in c.details() for c in refused())
        # Other clients are untouched: a producer's stream, its acks=all writes.
        with Producer(node.address, acks="all") as producer:
            producer.send("idle", b"v", partition=0).result(timeout=10)
        # Up to the node's cap: 150 open streams, 100 of them on the first connection.
        calls += [pb_grpc.BrokerStub(c).FetchStream(request) for c in many for _ in range(15)]
        wait_until(
            lambda: len(refused()) == 50 + 100, DEADLINE_S, "the streams over the node's cap"
        )
        assert any("streams_max 150" in c.details() for c in refused())
        # Short calls still go through, and the node stays up and registered.
        stub = pb_grpc.BrokerStub(grpc.insecure_channel(node.address, options=own))
        batch = batch_format.encode_batch([b"w"])
        assert stub.Produce(pb.ProduceRequest(topic="idle", partition=0, batch=batch)).results
        with Admin(node.address) as admin:
            admin.create_topic("still-works", partitions=1)
        assert node.serving()
    finally:
        for call in calls:
            call.cancel()
        for channel in [one, *many]:
            channel.close()
    try:
        # The slots come back once the streams close.
        def fresh_stream_answers() -> bool:
            with grpc.insecure_channel(node.address, options=own) as channel:
                stream = pb_grpc.BrokerStub(channel).FetchStream(request)
                try:
                    return next(stream).high_watermark == 2
                finally:
                    stream.cancel()

        wait_until(fresh_stream_answers, DEADLINE_S, "a new stream to be admitted")
    finally:
        node.kill()


def test_a_damaged_partition_metadata_file_sets_the_partition_aside(tmp_path: Path) -> None:
    """A 1-byte corruption of partition.metadata deleted the whole partition at start-up,
    logged as a warning."""
    node = NodeProcess(tmp_path / "data")
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("kept", partitions=1)
        with Producer(node.address, acks="all") as producer:
            for i in range(40):
                producer.send("kept", f"v{i}".encode(), partition=0)
            producer.flush()
        node.kill(signal.SIGTERM)
        node.process.wait(timeout=30)
        meta = node.data_dir / "kept-0" / "partition.metadata"
        data = bytearray(meta.read_bytes())
        data[data.index(b'"topic_id": "') + 14] ^= 0x01  # one character of the id
        meta.write_bytes(bytes(data))
        node.start()
        [aside] = (node.data_dir / "damaged").glob("kept-0.*")
        kept = b"".join(p.read_bytes() for p in sorted(aside.glob("*.log")))
        values = [
            v
            for d in batch_format.decode_batches(kept)
            for v in d.records.column("value").to_pylist()
        ]
        assert values == [f"v{i}".encode() for i in range(40)]
        assert "partition metadata of kept-0 is unreadable" in node.log()
        # The node serves on, with the replica started again (empty: it had no other copy),
        # and says what it set aside.
        with Admin(node.address) as admin:
            admin.create_topic("other", partitions=1)
            described = admin.describe_replica_log(node.address, "kept", 0)
        assert "unreadable partition metadata" in described.damage
        assert str(aside) in described.damage
        shown = run_cli("topics", "describe", "kept", "--json", "--bootstrap", node.address)
        assert shown.returncode == 0, shown.stderr
        [partition] = json.loads(shown.stdout)["partitions"]
        assert partition["damaged_replicas"] == [{"node_id": 1, "damage": described.damage}]
    finally:
        node.kill()


@pytest.mark.slow
def test_a_follower_sets_a_damaged_segment_aside_and_fetches_it_again(
    cluster3: LocalCluster,
) -> None:
    """A byte flip in the middle of a replica's segment cut that segment at start-up and
    deleted the rest, with only a warning. Now the rest is set aside (kept), the follower
    fetches what it lost from its leader, `topics describe` names the damaged replica
    through any node, and the replicas end identical."""
    bootstrap = cluster3.bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topic("mended", partitions=1, replication_factor=3)
    with Producer(bootstrap, acks="all", linger_ms=0) as producer:
        for i in range(40):  # one batch each
            producer.send("mended", f"v{i}".encode(), partition=0).result(timeout=30)
    survivor = cluster3.nodes[1]
    (p,) = cluster3.partitions(survivor, "mended")
    follower_id = next(r for r in p.replicas if r != p.leader)
    follower = cluster3.nodes[follower_id]
    with Admin(follower.address) as admin:
        wait_until(
            lambda: admin.describe_replica_log(follower.address, "mended", 0).log_end_offset == 40,
            DEADLINE_S,
            "the follower to hold every record",
        )
    follower.kill()  # SIGKILL: the next start recovers the active segment
    segment = follower.data_dir / "mended-0" / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF
    segment.write_bytes(bytes(data))
    follower.start()
    [aside] = (follower.data_dir / "mended-0" / "damaged").iterdir()
    assert sum(f.stat().st_size for f in aside.iterdir()) > 0
    assert "set aside in" in follower.log()
    with Admin(follower.address) as admin:
        wait_until(
            lambda: admin.describe_replica_log(follower.address, "mended", 0).high_watermark == 40,
            DEADLINE_S,
            "the follower to fetch what it lost",
        )
    via = next(n for i, n in cluster3.nodes.items() if i != follower_id)
    shown = run_cli("topics", "describe", "mended", "--json", "--bootstrap", via.address)
    assert shown.returncode == 0, shown.stderr
    [partition] = json.loads(shown.stdout)["partitions"]
    [damaged] = partition["damaged_replicas"]
    assert damaged["node_id"] == follower_id and str(aside) in damaged["damage"]
    compared = run_cli("debug", "compare-replicas", "mended", "--bootstrap", via.address)
    assert compared.returncode == 0, compared.stdout + compared.stderr


def test_one_create_topics_of_100000_partitions_is_refused_and_the_node_stays_up(
    tmp_path: Path,
) -> None:
    """One CreateTopics of 100,000 partitions exhausted file descriptors (3 per
    partition): the node accepted no connection, ignored SIGTERM, and failed the same way
    on every restart."""
    node = NodeProcess(tmp_path / "data", env={"HEADWATER_PARTITIONS_PER_NODE_MAX": "500"})
    node.start()
    try:
        started = time.monotonic()
        with grpc.insecure_channel(node.address) as channel:
            response = pb_grpc.AdminStub(channel).CreateTopics(
                pb.CreateTopicsRequest(
                    topics=[pb.NewTopic(name=f"huge{i}", partitions=10_000) for i in range(10)]
                ),
                timeout=60,
            )
        errors = [r.error_message for r in response.results]
        assert all(errors) and "over its capacity of 500" in errors[0], errors[:2]
        assert time.monotonic() - started < 30
        with Admin(node.address) as admin:
            assert not [t for t in admin.list_topics() if t.name.startswith("huge")]
            admin.create_topic("fits", partitions=400)
            with pytest.raises(HeadwaterError, match="capacity of 500"):
                admin.create_topic("too-many", partitions=200)
        node.kill(signal.SIGTERM)
        assert node.process.wait(timeout=30) == 0
    finally:
        node.kill()


def _flip_in_a_batch(journal: Path, needle: bytes) -> None:
    data = bytearray(journal.read_bytes())
    data[data.index(needle)] ^= 0x40  # "t3" becomes "43": a valid name, another topic
    journal.write_bytes(bytes(data))


def test_a_damaged_journal_of_a_lone_node_is_never_replayed(tmp_path: Path) -> None:
    """A 1-byte change in the metadata journal renamed a topic on replay, and the node
    removed the real topic's partition folders as strays."""
    node = NodeProcess(tmp_path / "data")
    node.start()
    with Admin(node.address) as admin:
        for i in range(5):
            admin.create_topic(f"t{i}", partitions=2)
    node.kill(signal.SIGTERM)
    node.process.wait(timeout=30)
    folders = sorted(p.name for p in node.data_dir.iterdir())
    _flip_in_a_batch(node.data_dir / "raft" / "journal", b'"t3"')
    node.start(wait=False)
    assert node.process.wait(timeout=60) != 0
    assert "journal" in node.log() and "is damaged" in node.log()
    assert "restore" in node.log().splitlines()[-1]
    assert sorted(p.name for p in node.data_dir.iterdir()) == folders  # nothing removed


@pytest.mark.slow
def test_a_voter_with_a_damaged_journal_sets_it_aside_and_catches_up(
    cluster3: LocalCluster,
) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        for i in range(5):
            admin.create_topic(f"t{i}", partitions=2, replication_factor=3)
    victim = cluster3.nodes[3]
    victim.kill(signal.SIGTERM)
    victim.process.wait(timeout=60)
    _flip_in_a_batch(victim.data_dir / "raft" / "journal", b'"t3"')
    victim.start()
    [aside] = (victim.data_dir / "damaged").glob("raft.*")
    assert (aside / "journal").exists()
    assert "is damaged" in victim.log() and "copies the metadata from the other voters" in (
        victim.log()
    )
    wait_until(
        lambda: {t.name for t in cluster3.metadata(victim).topics} >= {f"t{i}" for i in range(5)},
        DEADLINE_S,
        "the voter to copy the metadata again",
    )
    assert (victim.data_dir / "t3-0").exists() and (victim.data_dir / "t3-1").exists()


def test_replica_hashing_is_capped_at_two_calls_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    """DescribeReplicaLog hashes in worker threads, at most REPLICA_HASHES_AT_ONCE (2) at
    a time per node: a third call is refused with THROTTLING_QUOTA_EXCEEDED naming the
    limit, and the slot comes back when a hash ends (its thread, not its call)."""

    from headwater.log.api import LogConfig
    from headwater.log.memory_log import MemoryLog
    from headwater.node.config import NodeConfig
    from headwater.node.replicas.partition import Partition
    from headwater.node.rpc import admin_service
    from headwater.node.security.authorizer import Authorizer
    from headwater.raft.metadata.image import MetadataImage
    from headwater.shared.errors import ErrorCode

    release = threading.Event()
    real_hash = admin_service.hash_log_range

    def slow_hash(*args: Any) -> Any:
        release.wait(30)
        return real_hash(*args)

    monkeypatch.setattr(admin_service, "hash_log_range", slow_hash)
    log = MemoryLog()
    log.append(batch_format.encode_batch([b"v"]), 0, 0)
    partition = Partition("t", 0, log, LogConfig())

    class Logs:
        def partition(self, topic: str, index: int) -> Partition | None:
            return partition if (topic, index) == ("t", 0) else None

    class Aborted(Exception):
        pass

    class Context:
        async def abort(self, code: Any, details: str, metadata: Any = None) -> None:
            raise Aborted(details)

    service = object.__new__(admin_service.AdminService)
    service.config = NodeConfig()
    service.auth = Authorizer(service.config, MetadataImage)
    service.logs = Logs()  # type: ignore[assignment]
    service._hashing = 0
    request = pb.DescribeReplicaLogRequest(topic="t", partition=0, start_offset=0, end_offset=1)

    async def run() -> tuple[list[Any], str]:
        first = asyncio.ensure_future(service.DescribeReplicaLog(request, Context()))
        second = asyncio.ensure_future(service.DescribeReplicaLog(request, Context()))
        while service._hashing < 2:
            await asyncio.sleep(0.01)
        with pytest.raises(Aborted) as refused:
            await service.DescribeReplicaLog(request, Context())
        release.set()
        answers = await asyncio.gather(first, second)
        while service._hashing:
            await asyncio.sleep(0.01)
        answers.append(await service.DescribeReplicaLog(request, Context()))  # a slot again
        return answers, str(refused.value)

    answers, refusal = asyncio.run(run())
    assert ErrorCode.THROTTLING_QUOTA_EXCEEDED.name in refusal
    assert "the most it hashes at once (2)" in refusal
    assert [a.batch_count for a in answers] == [1, 1, 1]


def test_a_read_is_shaped_in_pieces_of_whole_batches_and_the_loop_runs_between() -> None:
    """``stored_slices``: pieces of at most the count of whole batches and, past a piece's
    first batch, of records, together the read; another task runs between pieces; a read
    of one piece is passed on as it is."""
    from headwater.log import batch as batch_format
    from headwater.node.core.limits import StoredPiece, stored_slices

    sizes = [1, 1, 1, 1, 1, 1, 1, 1, 50, 1]
    data = b"".join(
        batch_format.encode_batch([b"v"] * count, base_offset=sum(sizes[:i]))
        for i, count in enumerate(sizes)
    )
    ticks = 0

    async def ticking() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    async def pieces(batches: int, records: int) -> list[tuple[StoredPiece, int]]:
        ticker = asyncio.ensure_future(ticking())
        try:
            return [
                (piece, ticks)
                async for piece in stored_slices(
                    data, records_of_kafka=False, batches=batches, records=records
                )
            ]
        finally:
            ticker.cancel()

    got = asyncio.run(pieces(4, 10))
    assert b"".join(bytes(piece.data) for piece, _ in got) == data
    shapes = [
        (sum(1 for _ in batch_format.iter_headers(piece.data)), piece.records) for piece, _ in got
    ]
    # four batches a piece; the batch of 50 records alone past its bound, as a piece's first
    assert shapes == [(4, 4), (4, 4), (1, 50), (1, 1)]
    assert [t for _, t in got] == sorted({t for _, t in got})  # the loop ran between pieces

    async def whole() -> list[StoredPiece]:
        return [piece async for piece in stored_slices(data, records_of_kafka=False, batches=10)]

    (only,) = asyncio.run(whole())
    assert only.data is data and only.records == 59


def test_a_grpc_fetch_of_kafka_and_columnar_batches_keeps_to_its_bytes() -> None:
    """A read of compressed Kafka batches (which grow when transcoded) followed by
    columnar ones, shaped in pieces: the answer stays within its bytes and names where
    the next fetch goes on, whichever piece the budget runs out in."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    from headwater.log import batch as batch_format
    from headwater.log.kafka_records import to_stored
    from headwater.log.memory_log import MemoryLog
    from headwater.node.rpc.broker_service import _columnar

    log = MemoryLog()
    for n in range(300):
        builder = DefaultRecordBatchBuilder(2, 1, 0, -1, -1, -1, 1 << 20)  # gzip
        for i in range(5):
            builder.append(i, 1_767_225_600_000, None, b"%d-%d" % (n, i) * 20, [])
        log.append(to_stored(bytes(builder.build()), 1 << 20).stored, 0, 0)
    for n in range(300):
        log.append(batch_format.encode_batch([b"c%d" % n * 20] * 5), 0, 0)
    data = log.read(0, 1 << 30).data
    for budget in (20_000, 91_296, 150_000, 200_000):
        answer, cut_at = asyncio.run(_columnar(data, budget))
        assert len(answer) <= budget, budget
        assert cut_at is not None, budget
        kept = [header for _, header in batch_format.iter_headers(answer)]
        assert kept[-1].next_offset == cut_at, budget
    whole, cut_at = asyncio.run(_columnar(data, 1 << 20))
    assert cut_at is None
    assert sum(h.record_count for _, h in batch_format.iter_headers(whole)) == 3_000
