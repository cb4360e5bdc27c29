"""Multi-process clusters on loopback: real nodes, real Raft, real gRPC, real SIGKILL and
SIGSTOP. Every wait has a deadline; no test sleeps for a fixed time."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from headwater.client import Admin, Consumer, Producer
from headwater.client.admin_types import OffsetSpec
from headwater.client.aio import AsyncConsumer, AsyncProducer
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, run_cli, wait_until

# Fencing takes broker_session_timeout_ms (3 s by default) after the last heartbeat.
FAILOVER_DEADLINE_S = 30
# A Raft follower stopped this long (past the transport's 2 s connection timeout) wakes
# with its election timer lapsed and campaigns at once: pysyncobj has no pre-vote.
SLEEPER_STOP_S = 5


@pytest.fixture
def cluster3(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def produce_values(
    bootstrap: str, topic: str, values: list[bytes], partition: int | None = None
) -> None:
    with Producer(bootstrap, acks=1, linger_ms=0) as producer:
        futures = [producer.send(topic, v, partition=partition) for v in values]
        producer.flush()
        for future in futures:
            future.result(timeout=30)


def consume_all(bootstrap: str, topic: str, expected: int, deadline_s: float = 30) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(bootstrap) as consumer:
        with Admin(bootstrap) as admin:
            partitions = len(admin.describe_topics([topic])[0].partitions)
        consumer.assign([(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()

        def enough() -> bool:
            values.extend(r.value for r in consumer.poll(timeout_ms=500))
            return len(values) >= expected

        wait_until(enough, deadline_s, f"{expected} records of {topic}")
    return values


def leaders_live(cluster: LocalCluster, via: NodeProcess, topic: str, dead: set[int]) -> bool:
    return all(p.leader >= 0 and p.leader not in dead for p in cluster.partitions(via, topic))


# --------------------------------------------------------------------------- controller


def test_controller_failover_keeps_metadata(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        for i in range(3):
            admin.create_topic(
                f"keep-{i}", partitions=4, replication_factor=3, configs={"retention_ms": "3600000"}
            )
        before = {t.name: (t.topic_id, t.partitions) for t in admin.list_topics()}
    old = cluster3.wait_controller()
    cluster3.nodes[old].kill()
    new = cluster3.wait_controller(excluding=(old,))
    assert new != old
    for node in cluster3.alive():
        with Admin(node.address) as admin:
            assert {t.name: (t.topic_id, t.partitions) for t in admin.list_topics()} == before
            (described,) = admin.describe_topics(["keep-0"])
            assert described.configs["retention_ms"] == "3600000"
    # The new controller makes changes; the old node rejoins and sees them.
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("after-failover", partitions=2, replication_factor=2)
    cluster3.nodes[old].start()
    wait_until(
        lambda: "after-failover" in {t.name for t in cluster3.metadata(cluster3.nodes[old]).topics},
        FAILOVER_DEADLINE_S,
        "the restarted node to catch up",
    )
    wait_until(
        lambda: cluster3.broker_states(cluster3.nodes[new]).get(old) == "running",
        FAILOVER_DEADLINE_S,
        "the restarted broker to be unfenced",
    )


def test_paused_controller_cannot_change_metadata_when_it_wakes(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("paused", partitions=6, replication_factor=3)
    old = cluster3.wait_controller()
    others = [n for i, n in cluster3.nodes.items() if i != old]
    cluster3.pause(old)
    try:
        new = int(
            wait_until(
                lambda: next(
                    (c for c in {cluster3.controller_id(n) for n in others} if c not in (-1, old)),
                    None,
                ),
                FAILOVER_DEADLINE_S,
                "a new controller while the old one is stopped",
            )
        )
        with Admin(cluster3.bootstrap(others)) as admin:
            admin.create_topic("while-paused", partitions=1, replication_factor=2)
        term_while_paused = cluster3.metadata(others[0]).raft_term
    finally:
        cluster3.resume(old)

    # The old controller wakes up believing it leads, with stale broker sessions; it must
    # neither fence anyone nor write anything: every node converges on the new metadata.
    def converged() -> bool:
        views = [cluster3.metadata(n) for n in cluster3.nodes.values()]
        return (
            all(v.controller_id == new for v in views)
            and len({v.metadata_offset for v in views}) == 1
            and all({t.name for t in v.topics} == {"paused", "while-paused"} for v in views)
        )

    wait_until(
        converged, FAILOVER_DEADLINE_S, "all nodes to agree on the new controller's metadata"
    )
    woken = cluster3.metadata(cluster3.nodes[old])
    assert woken.raft_term >= term_while_paused
    wait_until(
        lambda: set(cluster3.broker_states(cluster3.nodes[new]).values()) == {"running"},
        FAILOVER_DEADLINE_S,
        "every broker running",
    )


@pytest.mark.slow
def test_partition_leaders_keep_taking_writes_through_controller_elections(
    cluster3: LocalCluster,
) -> None:
    """Partition leaders keep serving through Raft events: a stopped Raft follower wakes
    with a lapsed election timer (PreVote: it asks for pre-votes, which the voters that
    still hear the controller refuse, so the term and the controller stay), and a
    stopped controller is replaced (an election changes the Raft term on every voter
    before the new controller's first record arrives)."""
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("steady", partitions=6, replication_factor=1)
    controller = cluster3.wait_controller()
    led = {p.leader: p.partition for p in cluster3.partitions(cluster3.nodes[controller], "steady")}
    written = 0

    def writes_until(writer_id: int, condition: Callable[[], bool], what: str) -> None:
        """Write to the partition ``writer_id`` leads, straight to it and without retries,
        until ``condition`` holds: every write must succeed."""
        nonlocal written
        deadline = time.monotonic() + FAILOVER_DEADLINE_S
        with grpc.insecure_channel(cluster3.nodes[writer_id].address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            while not condition():
                assert time.monotonic() < deadline, f"timed out waiting for {what}"
                stub.Produce(
                    pb.ProduceRequest(
                        topic="steady",
                        partition=led[writer_id],
                        records=pb.RecordList(records=[pb.Record(value=b"%d" % written)]),
                        acks=pb.ACKS_LEADER,
                    ),
                    timeout=5,
                )
                written += 1

    def settled(via: int) -> bool:
        views = [cluster3.metadata(n) for n in cluster3.nodes.values()]
        return len({v.controller_id for v in views}) == 1 and set(
            cluster3.broker_states(cluster3.nodes[via]).values()
        ) == {"running"}

    sleeper, writer = (i for i in cluster3.nodes if i != controller)
    term_before = cluster3.metadata(cluster3.nodes[writer]).raft_term
    cluster3.pause(sleeper)
    try:
        stop_until = time.monotonic() + SLEEPER_STOP_S
        writes_until(writer, lambda: time.monotonic() >= stop_until, "the sleeper's stop")
    finally:
        cluster3.resume(sleeper)
    writes_until(
        writer,
        lambda: (
            settled(writer)
            and cluster3.metadata(cluster3.nodes[sleeper]).raft_commit_index
            >= cluster3.metadata(cluster3.nodes[writer]).raft_commit_index
        ),
        f"node {sleeper} back in step with the others",
    )
    assert {cluster3.metadata(n).raft_term for n in cluster3.nodes.values()} == {term_before}
    assert cluster3.wait_controller() == controller

    old = cluster3.wait_controller()
    writer = next(i for i in cluster3.nodes if i != old)
    cluster3.pause(old)
    try:
        writes_until(
            writer,
            lambda: cluster3.controller_id(cluster3.nodes[writer]) not in (-1, old),
            "a new controller while the old one is stopped",
        )
    finally:
        cluster3.resume(old)
    writes_until(writer, lambda: settled(writer), "every node to agree on one controller")
    assert written > 0


# --------------------------------------------------------------------------- brokers


def test_killed_broker_loses_leadership_to_isr_members(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("moving", partitions=6, replication_factor=3)
    controller = cluster3.wait_controller()
    victim = next(i for i in cluster3.nodes if i != controller)
    survivor = cluster3.nodes[controller]
    before = {p.partition: p for p in cluster3.partitions(survivor, "moving")}
    led = [p for p in before.values() if p.leader == victim]
    assert led, "round-robin placement gives every broker leadership"
    cluster3.nodes[victim].kill()
    wait_until(
        lambda: leaders_live(cluster3, survivor, "moving", {victim}),
        FAILOVER_DEADLINE_S,
        f"leadership to move off node {victim}",
    )
    after = {p.partition: p for p in cluster3.partitions(survivor, "moving")}
    for p in led:
        moved = after[p.partition]
        assert moved.leader in p.isr and moved.leader != victim
        assert moved.leader_epoch > p.leader_epoch
    assert cluster3.broker_states(survivor)[victim] == "fenced"
    # Produce and consume keep working through the new leaders.
    bootstrap = cluster3.bootstrap()
    produce_values(bootstrap, "moving", [b"v%d" % i for i in range(30)])
    assert sorted(consume_all(bootstrap, "moving", 30)) == sorted(b"v%d" % i for i in range(30))


@pytest.mark.slow
def test_five_nodes_keep_serving_with_two_down(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 5)
    try:
        cluster.start()
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topic("five", partitions=10, replication_factor=3)
        controller = cluster.wait_controller()
        down = {controller, next(i for i in cluster.nodes if i != controller)}
        for node_id in down:
            cluster.nodes[node_id].kill()
        survivor = cluster.alive()[0]
        cluster.wait_controller(excluding=tuple(down))
        wait_until(
            lambda: leaders_live(cluster, survivor, "five", down),
            FAILOVER_DEADLINE_S,
            "every partition led by a live node",
        )
        bootstrap = cluster.bootstrap()
        with Admin(bootstrap) as admin:
            admin.create_topic("five-new", partitions=3, replication_factor=3)
        values = [b"r%d" % i for i in range(50)]
        produce_values(bootstrap, "five", values)
        assert sorted(consume_all(bootstrap, "five", 50)) == sorted(values)
    finally:
        cluster.close()


def test_controlled_shutdown_moves_leadership_before_exit(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("graceful", partitions=6, replication_factor=3)
    controller = cluster3.wait_controller()
    leaving = next(i for i in cluster3.nodes if i != controller)
    watcher = cluster3.nodes[controller]
    assert any(p.leader == leaving for p in cluster3.partitions(watcher, "graceful"))
    stopped = cluster3.nodes[leaving].stop()
    log = cluster3.nodes[leaving].log()
    assert stopped == 0, log[-4000:]
    assert "controlled shutdown: leadership moved away" in log
    assert log.index("leadership moved away") < log.index(f"node {leaving} stopped")
    # No partition waited for a session timeout: leadership had moved at exit.
    assert all(p.leader not in (leaving, -1) for p in cluster3.partitions(watcher, "graceful"))
    assert cluster3.broker_states(watcher)[leaving] in ("shutting_down", "fenced")


def test_restarting_every_node_keeps_topics_and_data(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(
            "durable", partitions=3, replication_factor=1, configs={"segment_bytes": "1048576"}
        )
        admin.create_topic("durable-rf3", partitions=2, replication_factor=3)
        before = {
            t.name: (t.topic_id, t.partitions, t.replication_factor) for t in admin.list_topics()
        }
    values = [b"d%d" % i for i in range(60)]
    produce_values(cluster3.bootstrap(), "durable", values)
    for node in cluster3.nodes.values():
        node.kill()
    cluster3.start()
    cluster3.wait_controller()
    with Admin(cluster3.bootstrap()) as admin:
        assert {
            t.name: (t.topic_id, t.partitions, t.replication_factor) for t in admin.list_topics()
        } == before
        (described,) = admin.describe_topics(["durable"])
        assert described.configs["segment_bytes"] == "1048576"
    assert sorted(consume_all(cluster3.bootstrap(), "durable", 60)) == sorted(values)


# --------------------------------------------------------------------------- routing


def test_any_node_serves_any_partition(cluster3: LocalCluster) -> None:
    """Thin clients (plain gRPC, no metadata) can send every request to any node."""
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("anywhere", partitions=3, replication_factor=1)
    leaders = {p.partition: p.leader for p in cluster3.partitions(cluster3.nodes[1], "anywhere")}
    assert set(leaders.values()) == {1, 2, 3}
    for node in cluster3.nodes.values():
        with grpc.insecure_channel(node.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            for partition in range(3):
                response = stub.Produce(
                    pb.ProduceRequest(
                        topic="anywhere",
                        partition=partition,
                        records=pb.RecordList(records=[pb.Record(value=b"via-%d" % node.node_id)]),
                        acks=pb.ACKS_LEADER,
                    ),
                    timeout=10,
                )
                assert response.results[0].partition == partition
    for node in cluster3.nodes.values():
        with grpc.insecure_channel(node.address) as channel:
            stub = pb_grpc.BrokerStub(channel)
            for partition in range(3):
                fetched = stub.Fetch(
                    pb.FetchRequest(
                        topic="anywhere",
                        partition=partition,
                        offset=0,
                        format=pb.RECORD_FORMAT_RECORDS,
                    ),
                    timeout=10,
                )
                assert [r.value for r in fetched.decoded] == [b"via-1", b"via-2", b"via-3"]
                assert fetched.high_watermark == 3
            stream = stub.FetchStream(
                pb.FetchRequest(
                    topic="anywhere",
                    partition=0,
                    offset=2,
                    max_wait_ms=1000,
                    format=pb.RECORD_FORMAT_RECORDS,
                ),
                timeout=10,
            )
            first = next(stream)
            stream.cancel()
            assert [r.offset for r in first.decoded] == [2]
            offsets = stub.ListOffsets(
                pb.ListOffsetsRequest(topic="anywhere", spec=pb.OFFSET_SPEC_LATEST), timeout=10
            )
            assert [(o.partition, o.offset) for o in offsets.offsets] == [(0, 3), (1, 3), (2, 3)]
    # The CLI's JSON contract, answered by a node that leads only one partition.
    described = json.loads(
        run_cli(
            "topics", "describe", "anywhere", "--json", "--bootstrap", cluster3.nodes[1].address
        ).stdout
    )
    for p in described["partitions"]:
        assert {
            "partition",
            "leader",
            "replicas",
            "isr",
            "leader_epoch",
            "log_start_offset",
            "high_watermark",
        } <= set(p)
        assert p["high_watermark"] == 3 and p["log_start_offset"] == 0
    status = json.loads(
        run_cli("cluster", "status", "--json", "--bootstrap", cluster3.nodes[2].address).stdout
    )
    assert status["controller_id"] in (1, 2, 3) and status["raft_term"] >= 1
    assert [(b["id"], b["state"]) for b in status["brokers"]] == [
        (1, "running"),
        (2, "running"),
        (3, "running"),
    ]
    assert all(b["address"] for b in status["brokers"])


def test_async_clients_talk_to_the_leader_not_the_bootstrap_node(cluster3: LocalCluster) -> None:
    """AsyncProducer and AsyncConsumer keep working with their bootstrap node stopped:
    after the first Metadata they go to the partition's leader directly."""
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic("direct", partitions=1, replication_factor=1)
    controller = cluster3.wait_controller()
    (state,) = cluster3.partitions(cluster3.nodes[controller], "direct")
    bootstrap_id = next(i for i in cluster3.nodes if i not in (state.leader, controller))
    bootstrap = cluster3.nodes[bootstrap_id].address

    async def run() -> list[bytes]:
        async with (
            AsyncConsumer(bootstrap) as consumer,
            AsyncProducer(bootstrap, acks=1) as producer,
        ):
            await consumer.assign_at("direct", OffsetSpec.EARLIEST)
            await (await producer.send("direct", b"0"))
            cluster3.pause(bootstrap_id)
            try:
                futures = [await producer.send("direct", b"%d" % i) for i in range(1, 100)]
                async with asyncio.timeout(FAILOVER_DEADLINE_S):
                    await asyncio.gather(*futures)
                    values: list[bytes] = []
                    while len(values) < 100:
                        values += [r.value for r in await consumer.poll(timeout_ms=1000)]
            finally:
                cluster3.resume(bootstrap_id)
            return values

    assert asyncio.run(run()) == [b"%d" % i for i in range(100)]


def test_forwarded_requests_report_errors_of_the_leader(cluster3: LocalCluster) -> None:
    with Admin(cluster3.bootstrap()) as admin:
        admin.create_topic(
            "strict", partitions=1, replication_factor=1, configs={"max_message_bytes": "2048"}
        )
    (p,) = cluster3.partitions(cluster3.nodes[1], "strict")
    other = next(n for i, n in cluster3.nodes.items() if i != p.leader)
    with grpc.insecure_channel(other.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Fetch(pb.FetchRequest(topic="strict", partition=0, offset=5), timeout=10)
        assert info.value.code() == grpc.StatusCode.OUT_OF_RANGE
        assert "valid range is [0, 0]" in info.value.details()
        with pytest.raises(grpc.RpcError) as info:
            stub.Produce(
                pb.ProduceRequest(
                    topic="strict",
                    partition=0,
                    records=pb.RecordList(records=[pb.Record(value=b"x" * 4000)]),
                    acks=pb.ACKS_LEADER,
                ),
                timeout=10,
            )
        assert "MESSAGE_TOO_LARGE" in info.value.details()


def test_admin_changes_and_their_bad_input(cluster3: LocalCluster) -> None:
    b = ["--bootstrap", cluster3.bootstrap()]
    assert (
        run_cli(
            "topics", "create", "grow", "--partitions", "2", "--replication-factor", "3", *b
        ).returncode
        == 0
    )
    assert run_cli("topics", "alter", "grow", "--partitions", "5", *b).returncode == 0
    with Admin(cluster3.bootstrap()) as admin:
        (described,) = admin.describe_topics(["grow"])
        assert len(described.partitions) == 5
        assert all(len(p.replicas) == 3 for p in described.partitions)
    shrink = run_cli("topics", "alter", "grow", "--partitions", "3", *b)
    assert shrink.returncode == 1 and "INVALID_PARTITIONS" in shrink.stderr.decode()
    assert "[6, " in shrink.stderr.decode()
    too_many = run_cli("topics", "create", "wide", "--replication-factor", "4", *b)
    assert too_many.returncode == 1
    assert (
        "INVALID_REPLICATION_FACTOR" in too_many.stderr.decode()
        and "[1, 3]" in too_many.stderr.decode()
    )
    for replicas, fragment in [
        ("1,1", "each once"),
        ("9", "not registered"),
        ("x", "not a comma-separated"),
    ]:
        bad = run_cli("topics", "reassign", "grow", "--partition", "0", "--replicas", replicas, *b)
        assert bad.returncode != 0 and fragment in bad.stderr.decode(), bad.stderr
    for change in (
        ["reassign", "nope", "--partition", "0", "--replicas", "1"],
        ["alter", "nope", "--partitions", "3"],
    ):
        began = time.monotonic()
        missing = run_cli("topics", *change, *b)
        assert missing.returncode == 1 and "UNKNOWN_TOPIC_OR_PARTITION" in missing.stderr.decode()
        # The controller's "no such topic" is final: not retried for request_timeout_ms.
        assert time.monotonic() - began < 10, change


def test_broker_only_node_follows_the_metadata(cluster3: LocalCluster, tmp_path: Path) -> None:
    controllers = ",".join(n.internal_address for n in cluster3.nodes.values())
    broker = NodeProcess(
        tmp_path / "broker-4" / "data",
        node_id=4,
        quorum=cluster3.quorum,
        env=cluster3.env,
        extra_args=("--roles", "broker", "--controller-addresses", controllers),
    )
    broker.start()
    try:
        wait_until(
            lambda: cluster3.broker_states(cluster3.nodes[1]).get(4) == "running",
            FAILOVER_DEADLINE_S,
            "the broker-only node to register",
        )
        with Admin(broker.address) as admin:
            admin.create_topic("four", partitions=4, replication_factor=4)
        wait_until(
            lambda: len(cluster3.metadata(broker, ("four",)).topics) == 1, 10, "metadata on node 4"
        )
        view = cluster3.metadata(broker)
        assert view.raft_commit_index == 0 and view.controller_id in (1, 2, 3)
        led_by_4 = [p.partition for p in cluster3.partitions(broker, "four") if p.leader == 4]
        assert led_by_4
        produce_values(broker.address, "four", [b"on-4"], partition=led_by_4[0])
        # The new broker takes over a replica of an existing partition by reassignment:
        # it copies the log, joins the ISR, and the old replica is dropped.
        with Admin(cluster3.bootstrap()) as admin:
            admin.create_topic("moved", partitions=1, replication_factor=3)
        values = [b"m%d" % i for i in range(200)]
        produce_values(cluster3.bootstrap(), "moved", values)
        (before,) = cluster3.partitions(cluster3.nodes[1], "moved")
        leaving = before.replicas[-1]
        spare = next(b for b in (1, 2, 3, 4) if b not in before.replicas)
        target = [*before.replicas[:-1], spare]
        result = run_cli(
            "topics",
            "reassign",
            "moved",
            "--partition",
            "0",
            "--replicas",
            ",".join(map(str, target)),
            "--bootstrap",
            cluster3.bootstrap(),
        )
        assert result.returncode == 0, result.stderr
        wait_until(
            lambda: (
                list(cluster3.partitions(cluster3.nodes[1], "moved")[0].replicas) == target
                and sorted(cluster3.partitions(cluster3.nodes[1], "moved")[0].isr) == sorted(target)
            ),
            FAILOVER_DEADLINE_S,
            "the reassignment to complete",
        )
        nodes = {**cluster3.nodes, 4: broker}
        wait_until(
            lambda: not (nodes[leaving].data_dir / "moved-0").exists(),
            FAILOVER_DEADLINE_S,
            f"node {leaving} to drop its replica",
        )
        assert (nodes[spare].data_dir / "moved-0").exists()
        assert sorted(consume_all(broker.address, "moved", 200)) == sorted(values)
    finally:
        broker.kill()


# --------------------------------------------------------------------------- start-up


def test_serve_refuses_a_bad_quorum(tmp_path: Path) -> None:
    port = free_port()
    cases = [
        (("--quorum", "1@nowhere"), "quorum entry"),
        (("--node-id", "3", "--quorum", f"1@127.0.0.1:{port}"), "not in quorum"),
        (("--roles", "broker"), "controller_addresses"),
    ]
    for args, fragment in cases:
        result = run_cli(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            *args,
            timeout=30,
        )
        assert result.returncode == 1 and fragment in result.stderr.decode(), result.stderr
        assert b"Traceback" not in result.stderr


def test_serve_refuses_a_raft_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        raft = taken.getsockname()[1]
        result = run_cli(
            "serve",
            "--data-dir",
            str(tmp_path / "d"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--quorum",
            f"1@127.0.0.1:{raft}",
            timeout=60,
        )
    assert result.returncode == 1 and "cannot bind the Raft address" in result.stderr.decode(), (
        result.stderr
    )


def test_dev_cluster_starts_prints_addresses_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    base = free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "headwater.cli.main",
            "dev-cluster",
            "--nodes",
            "3",
            "--base-port",
            str(base),
            "--data-dir",
            str(tmp_path / "dev"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ},
    )
    try:
        assert process.stdout is not None
        lines = []
        for line in process.stdout:
            lines.append(line.decode())
            if line.startswith(b"bootstrap:"):
                break
        bootstrap = lines[-1].split()[1]
        assert bootstrap.split(",") == [f"127.0.0.1:{base + 2 * i}" for i in range(3)]
        status = json.loads(run_cli("cluster", "status", "--json", "--bootstrap", bootstrap).stdout)
        assert sorted(b["id"] for b in status["brokers"]) == [1, 2, 3]
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
        with pytest.raises(HeadwaterError) as info, Admin(bootstrap, request_timeout_s=2) as admin:
            admin.list_topics()
        assert info.value.code in (ErrorCode.NETWORK_EXCEPTION, ErrorCode.REQUEST_TIMED_OUT)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        assert process.stdout is not None
        process.stdout.close()
