"""Replication across real node processes: acks=all under leader kills, ISR shrink and
expand with SIGSTOP/SIGCONT, truncation of a deposed leader's tail, and the high
watermark as every replica reports it. Waits have deadlines; no fixed sleeps."""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from headwater.client import Admin
from headwater.log.api import LogConfig
from headwater.log.file_log import FileLog
from headwater.node.cluster.peers import LOCAL_ONLY_KEY
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, wait_until

DEADLINE_S = 45


def produce_one(address: str, topic: str, value: bytes, acks: int, timeout_s: float = 5) -> int:
    """Send one record through ``address``; return its offset (raises grpc.RpcError)."""
    with grpc.insecure_channel(address) as channel:
        response = pb_grpc.BrokerStub(channel).Produce(
            pb.ProduceRequest(
                topic=topic,
                partition=0,
                records=pb.RecordList(records=[pb.Record(value=value)]),
                acks=acks,  # type: ignore[arg-type]
            ),
            timeout=timeout_s,
        )
    return int(response.results[0].base_offset)


def local_view(node: NodeProcess, topic: str) -> Any:
    """The node's own replica of partition 0: log end offset and high watermark."""
    with grpc.insecure_channel(node.address) as channel:
        response = pb_grpc.AdminStub(channel).DescribeTopics(
            pb.DescribeTopicsRequest(names=[topic]), metadata=((LOCAL_ONLY_KEY, "1"),), timeout=2
        )
    return response.topics[0].partitions[0]


def partition_state(cluster: LocalCluster, topic: str, via: NodeProcess | None = None) -> Any:
    """Partition 0 as the metadata says, asked of ``via`` (default: a running node)."""
    return cluster.partitions(via or cluster.alive()[0], topic)[0]


def read_decoded(address: str, topic: str) -> list[tuple[int, bytes]]:
    """Every committed record of partition 0, checking that no response carries a record
    at or above its own high watermark."""
    out: list[tuple[int, bytes]] = []
    offset = 0
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        while True:
            response = stub.Fetch(
                pb.FetchRequest(
                    topic=topic, partition=0, offset=offset, format=pb.RECORD_FORMAT_RECORDS
                ),
                timeout=10,
            )
            assert all(r.offset < response.high_watermark for r in response.decoded)
            out += [(r.offset, r.value) for r in response.decoded]
            if response.next_offset == offset:
                return out
            offset = response.next_offset


def replica_bytes(node: NodeProcess, topic: str) -> bytes:
    """The whole log of the node's replica of partition 0, read from its files."""
    log = FileLog(node.data_dir / f"{topic}-0", LogConfig(), now_ms=0)
    try:
        return (
            log.read(log.log_start_offset, 1 << 30).data
            if log.log_end_offset > log.log_start_offset
            else b""
        )
    finally:
        log.abandon()


class HighWatermarkWatch:
    """Polls every live node's own high watermark and records any step back (per process)."""

    def __init__(self, cluster: LocalCluster, topic: str) -> None:
        self.cluster = cluster
        self.topic = topic
        self.seen: dict[tuple[int, int], int] = {}
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HighWatermarkWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            for node in self.cluster.alive():
                assert node.process is not None
                try:
                    hw = local_view(node, self.topic).high_watermark
                except (grpc.RpcError, IndexError):
                    continue
                if hw < 0:
                    continue
                key = (node.node_id, node.process.pid)
                if hw < self.seen.get(key, -1):
                    self.violations.append(f"node {node.node_id}: {self.seen[key]} -> {hw}")
                self.seen[key] = max(hw, self.seen.get(key, -1))


@pytest.fixture
def cluster3(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    env = getattr(request, "param", {})
    cluster = LocalCluster(tmp_path, 3, env=env)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def in_sync(cluster: LocalCluster, topic: str, size: int = 3) -> bool:
    """Every replica in the ISR, as every replica's own metadata says, with the leader's
    log end offset and high watermark."""
    state = partition_state(cluster, topic)
    if state.leader < 0:
        return False
    replicas = [cluster.nodes[r] for r in state.replicas]
    if any(len(partition_state(cluster, topic, node).isr) != size for node in replicas):
        return False
    views = [local_view(node, topic) for node in replicas]
    return len({(v.log_end_offset, v.high_watermark) for v in views}) == 1


@pytest.mark.slow
def test_acks_all_loses_nothing_while_leaders_are_killed(cluster3: LocalCluster) -> None:
    topic = "safe"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(
            topic, partitions=1, replication_factor=3, configs={"min_insync_replicas": "2"}
        )
    acked: dict[bytes, int] = {}
    attempts = itertools.count()
    stop = threading.Event()

    def produce() -> None:
        rng = random.Random(5)
        while not stop.is_set():
            value = b"v%07d" % next(attempts)  # never resent: acknowledged values are unique
            node = rng.choice(list(cluster3.nodes.values()))
            with contextlib.suppress(grpc.RpcError):
                acked[value] = produce_one(node.address, topic, value, pb.ACKS_ALL)

    producer = threading.Thread(target=produce, daemon=True)
    with HighWatermarkWatch(cluster3, topic) as watch:
        producer.start()
        try:
            for _ in range(3):
                floor = len(acked)
                wait_until(
                    lambda floor=floor: len(acked) >= floor + 20, DEADLINE_S, "acknowledged writes"
                )
                leader = partition_state(cluster3, topic).leader
                cluster3.nodes[leader].kill()
                wait_until(
                    lambda leader=leader: (
                        partition_state(cluster3, topic).leader not in (-1, leader)
                    ),
                    DEADLINE_S,
                    "a new leader",
                )
                floor = len(acked)
                wait_until(
                    lambda floor=floor: len(acked) >= floor + 20,
                    DEADLINE_S,
                    "writes to the new leader",
                )
                cluster3.nodes[leader].start()
                wait_until(
                    lambda: len(partition_state(cluster3, topic).isr) == 3,
                    DEADLINE_S,
                    "the ISR to heal",
                )
        finally:
            stop.set()
            producer.join(timeout=30)
        wait_until(lambda: in_sync(cluster3, topic), DEADLINE_S, "every replica to catch up")
    assert not watch.violations, watch.violations
    assert len(watch.seen) >= 6  # three original processes and three restarted ones
    records = read_decoded(cluster3.alive()[0].address, topic)
    offsets_of: dict[bytes, list[int]] = {}
    for offset, value in records:
        offsets_of.setdefault(value, []).append(offset)
    lost = [v for v in acked if v not in offsets_of]
    assert not lost, f"{len(lost)} acknowledged values lost, e.g. {lost[:3]}"
    for value, offset in acked.items():
        assert offsets_of[value] == [offset], value
    assert [o for o, _ in records] == list(range(len(records)))
    for node in cluster3.nodes.values():
        node.stop()
    logs = {node.node_id: replica_bytes(node, topic) for node in cluster3.nodes.values()}
    assert len(set(logs.values())) == 1, {k: len(v) for k, v in logs.items()}


@pytest.fixture
def cluster5(tmp_path: Path) -> Iterator[LocalCluster]:
    """Five voters: two stopped followers still leave a metadata quorum of three."""
    cluster = LocalCluster(tmp_path, 5, env={"HEADWATER_REPLICA_LAG_MS_MAX": "1500"})
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow
def test_a_stopped_follower_leaves_the_isr_and_rejoins(cluster5: LocalCluster) -> None:
    cluster3 = cluster5
    topic = "lagging"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(
            topic, partitions=1, replication_factor=3, configs={"min_insync_replicas": "2"}
        )
    state = partition_state(cluster3, topic)
    leader = cluster3.nodes[state.leader]
    first, second = (f for f in state.replicas if f != state.leader)
    counter = itertools.count()

    def write(acks: int) -> int:
        return produce_one(leader.address, topic, b"w%d" % next(counter), acks, timeout_s=4)

    def write_accepted(acks: int) -> None:
        """A write that must be accepted: retried while the leader briefly may not lead
        (a heartbeat answered late on a loaded machine ends its lease for a moment, a
        retriable refusal), but never past a NOT_ENOUGH_REPLICAS refusal."""
        refusals: list[HeadwaterError] = []

        def accepted() -> bool:
            try:
                write(acks)
            except grpc.RpcError as error:
                problem = from_rpc_error(error, leader.address)
                if not problem.retriable or problem.code in (
                    ErrorCode.NOT_ENOUGH_REPLICAS,
                    ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
                ):
                    refusals.append(problem)
                    return True
                raise problem from None  # retriable: tried again, and named at the deadline
            return True

        wait_until(accepted, DEADLINE_S, f"an acks={acks} write to be accepted")
        assert not refusals, refusals

    write_accepted(pb.ACKS_ALL)
    cluster3.pause(first)
    try:

        def first_dropped() -> bool:
            # A write may time out while the stopped follower is still in the ISR.
            with contextlib.suppress(grpc.RpcError):
                write(pb.ACKS_ALL)
            return first not in partition_state(cluster3, topic, leader).isr

        wait_until(first_dropped, DEADLINE_S, f"node {first} to leave the ISR")
        for _ in range(5):
            write_accepted(pb.ACKS_ALL)  # two in-sync replicas satisfy min_insync_replicas=2
        cluster3.pause(second)

        def refused() -> bool:
            try:
                write(pb.ACKS_ALL)
            except grpc.RpcError as error:
                return "NOT_ENOUGH_REPLICAS" in (error.details() or "")
            return False

        wait_until(refused, DEADLINE_S, "acks=all to fail with NOT_ENOUGH_REPLICAS")
        assert partition_state(cluster3, topic, leader).isr == [state.leader]
        write_accepted(pb.ACKS_LEADER)  # acks=1 still works
    finally:
        cluster3.resume(first)
        cluster3.resume(second)
    wait_until(
        lambda: in_sync(cluster3, topic), DEADLINE_S, "both followers to catch up and rejoin"
    )
    write_accepted(pb.ACKS_ALL)
    described = Admin(cluster3.bootstrap())
    try:
        (d,) = described.describe_topics([topic])
        followers = {f.node_id: f for f in d.partitions[0].followers}
        assert set(followers) == {first, second}
    finally:
        described.close()


@pytest.mark.slow
@pytest.mark.parametrize("cluster3", [{"HEADWATER_REPLICA_LAG_MS_MAX": "60000"}], indirect=True)
def test_a_deposed_leader_truncates_its_unreplicated_tail(cluster3: LocalCluster) -> None:
    topic = "diverge"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(
            topic, partitions=1, replication_factor=3, configs={"min_insync_replicas": "2"}
        )
    state = partition_state(cluster3, topic)
    old = state.leader
    followers = [f for f in state.replicas if f != old]
    old_address = cluster3.nodes[old].address
    committed = [b"c%d" % i for i in range(10)]
    for value in committed:
        produce_one(old_address, topic, value, pb.ACKS_ALL)
    # Followers stop (briefly: no fencing, no ISR change); the leader takes writes that
    # only it has; then the leader is cut off and the followers resume.
    for f in followers:
        cluster3.pause(f)
    tail = [b"tail%d" % i for i in range(5)]
    try:
        for value in tail:
            produce_one(old_address, topic, value, pb.ACKS_LEADER)
    finally:
        cluster3.pause(old)
        for f in followers:
            cluster3.resume(f)
    try:
        survivors = [cluster3.nodes[f] for f in followers]
        new = int(
            wait_until(
                lambda: next(
                    (
                        p.leader
                        for p in [cluster3.partitions(survivors[0], topic)[0]]
                        if p.leader in followers
                    ),
                    None,
                ),
                DEADLINE_S,
                "a follower to take over",
            )
        )
        later = [b"n%d" % i for i in range(10)]
        for value in later:
            produce_one(cluster3.nodes[new].address, topic, value, pb.ACKS_ALL, timeout_s=15)
    finally:
        cluster3.resume(old)
    wait_until(lambda: in_sync(cluster3, topic), DEADLINE_S, "the deposed leader to rejoin")
    values = [v for _, v in read_decoded(cluster3.alive()[0].address, topic)]
    # A follower may have had the first tail batch in its socket when it stopped (its fetch
    # was parked at the leader): such a prefix of the tail is replicated and survives.
    kept = len(values) - len(committed) - len(later)
    assert 0 <= kept < len(tail)
    assert values == committed + tail[:kept] + later
    assert "truncated from" in cluster3.nodes[old].log()
    for node in cluster3.nodes.values():
        node.stop()
    logs = {n.node_id: replica_bytes(n, topic) for n in cluster3.nodes.values()}
    assert len(set(logs.values())) == 1


@pytest.mark.slow
def test_followers_hold_the_leaders_bytes(cluster3: LocalCluster) -> None:
    """A plain run: batches of every codec reach every replica byte for byte."""
    from headwater.client import Producer

    topic = "copies"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3)
    for compression in ("none", "lz4", "zstd"):
        with Producer(cluster3.bootstrap(), acks="all", compression=compression) as producer:
            producer.send_batch(topic, [os.urandom(50) for _ in range(500)], partition=0)
            producer.flush()
    wait_until(lambda: in_sync(cluster3, topic), DEADLINE_S, "replicas to catch up")
    for node in cluster3.nodes.values():
        node.stop()
    logs = {n.node_id: replica_bytes(n, topic) for n in cluster3.nodes.values()}
    assert len(set(logs.values())) == 1 and len(logs[1]) > 75_000


STREAM_BUDGET_BYTES = 2 << 20


# The stopped follower stays in the ISR (and its broker unfenced) for the whole test.
@pytest.mark.parametrize(
    "cluster3",
    [
        {
            "HEADWATER_REPLICA_LAG_MS_MAX": "120000",
            "HEADWATER_BROKER_SESSION_TIMEOUT_MS": "120000",
            "HEADWATER_STREAM_BUFFER_BYTES_MAX": str(STREAM_BUDGET_BYTES),
        }
    ],
    indirect=True,
)
def test_a_produce_stream_holds_at_most_its_byte_budget_in_progress(
    cluster3: LocalCluster,
) -> None:
    """Issue 11 (limits on bytes buffered per stream): a ProduceStream took up to 32
    requests in progress whatever their size (32 x 256 MiB). With acks=all held up by a
    stopped follower, the leader now appends only what fits in stream_buffer_bytes_max
    (one request more at most) and reads nothing further until answers go out."""
    topic = "budget"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(topic, partitions=1, replication_factor=3)
    (state,) = cluster3.partitions(cluster3.alive()[0], topic)
    leader = cluster3.nodes[state.leader]
    controller = cluster3.wait_controller()
    stopped = next(i for i in cluster3.nodes if i not in (state.leader, controller))
    value = b"x" * (700 << 10)  # three requests pass 2 MiB
    requests = [
        pb.ProduceRequest(
            topic=topic,
            partition=0,
            records=pb.RecordList(records=[pb.Record(value=value)]),
            acks=pb.ACKS_ALL,
            timeout_ms=DEADLINE_S * 1000,
        )
        for _ in range(12)
    ]

    def log_end() -> int:
        with grpc.insecure_channel(leader.address) as channel:
            response = pb_grpc.AdminStub(channel).DescribeTopics(
                pb.DescribeTopicsRequest(names=[topic]),
                metadata=((LOCAL_ONLY_KEY, "1"),),
                timeout=2,
            )
        return int(response.topics[0].partitions[0].log_end_offset)

    cluster3.pause(stopped)
    try:
        with grpc.insecure_channel(leader.address) as channel:
            answers = pb_grpc.BrokerStub(channel).ProduceStream(
                iter(requests), timeout=DEADLINE_S * 2
            )
            wait_until(lambda: log_end() >= 2, DEADLINE_S / 3, "the first appends")
            # Whatever the client has sent, the leader holds at most the budget (plus the
            # one request it always takes) until the stopped follower comes back.
            held = [log_end() for _ in range(10)]
            assert max(held) <= STREAM_BUDGET_BYTES // len(value) + 1, held
            cluster3.resume(stopped)
            answered = list(answers)
    finally:
        cluster3.resume(stopped)
    assert [a.error_code for a in answered] == [pb.NONE] * len(requests)
    assert log_end() == len(requests)


# The stopped follower stays in the ISR (and its broker unfenced) for the whole test.
@pytest.mark.parametrize(
    "cluster3",
    [{"HEADWATER_REPLICA_LAG_MS_MAX": "120000", "HEADWATER_BROKER_SESSION_TIMEOUT_MS": "120000"}],
    indirect=True,
)
def test_a_produce_stream_appends_while_an_earlier_request_waits_for_replicas(
    cluster3: LocalCluster,
) -> None:
    """ProduceStream pipelines: an acks=all request held up by a stopped follower does not
    hold up the appends of the requests after it, and answers keep the stream's order."""
    topic = "pipelined"
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(topic, partitions=6, replication_factor=3)
    states = cluster3.partitions(cluster3.alive()[0], topic)
    leader_id = states[0].leader
    waiting, then = [s.partition for s in states if s.leader == leader_id][:2]
    leader = cluster3.nodes[leader_id]
    controller = cluster3.wait_controller()
    stopped = next(i for i in cluster3.nodes if i not in (leader_id, controller))

    def log_end(partition: int) -> int:
        with grpc.insecure_channel(leader.address) as channel:
            response = pb_grpc.AdminStub(channel).DescribeTopics(
                pb.DescribeTopicsRequest(names=[topic]),
                metadata=((LOCAL_ONLY_KEY, "1"),),
                timeout=2,
            )
        (view,) = (p for p in response.topics[0].partitions if p.partition == partition)
        return int(view.log_end_offset)

    def request(partition: int, acks: int) -> pb.ProduceRequest:
        return pb.ProduceRequest(
            topic=topic,
            partition=partition,
            records=pb.RecordList(records=[pb.Record(value=b"v%d" % partition)]),
            acks=acks,  # type: ignore[arg-type]
            timeout_ms=DEADLINE_S * 1000,
        )

    cluster3.pause(stopped)
    try:
        with grpc.insecure_channel(leader.address) as channel:
            answers = pb_grpc.BrokerStub(channel).ProduceStream(
                iter([request(waiting, pb.ACKS_ALL), request(then, pb.ACKS_LEADER)]),
                timeout=DEADLINE_S * 2,
            )
            wait_until(
                lambda: log_end(then) == 1 and log_end(waiting) == 1,
                DEADLINE_S / 3,
                f"the second request's append while the first waits for node {stopped}",
            )
            cluster3.resume(stopped)
            first, second = list(answers)
    finally:
        cluster3.resume(stopped)
    assert first.error_code == pb.NONE, first.error_message
    assert [r.partition for r in first.results] == [waiting]
    assert second.error_code == pb.NONE, second.error_message
    assert [r.partition for r in second.results] == [then]
