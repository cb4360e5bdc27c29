"""Prometheus metrics (node/ops/metrics.py, docs/metrics.md): the pure families of a state
snapshot, and real nodes scraped over HTTP while they take writes, reads, bad calls, and
a SIGKILLed replica."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from headwater.client import Admin, LogReader, Producer
from headwater.node.ops.metrics import (
    SERIES_PER_FAMILY_MAX,
    GroupSample,
    NodeSnapshot,
    PartitionSample,
    state_families,
)
from headwater.shared.errors import ErrorCode
from headwater.shared.grpc_errors import from_rpc_error
from headwater.tools.ports import free_port, free_port_block
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, run_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> Samples:
    """Every sample at http://ADDRESS/metrics: {(name, sorted labels): value}."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def partition(topic: str, index: int, **fields: object) -> PartitionSample:
    values: dict[str, object] = {
        "leader": True,
        "high_watermark": 10,
        "log_start_offset": 0,
        "log_end_offset": 12,
        "size_bytes": 4096,
        "segments": 1,
        "replicas": 3,
        "isr": 3,
        "min_insync_replicas": 2,
        **fields,
    }
    return PartitionSample(topic, index, **values)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- pure


def test_state_families_count_what_the_snapshot_holds() -> None:
    snapshot = NodeSnapshot(
        node_id=2,
        roles="controller,broker",
        partitions=[
            partition("a", 0, follower_lag={1: 0, 3: 7}),
            partition("a", 1, isr=1),  # under-replicated and under min ISR
            partition("b", 0, leader=False),
        ],
        isr_shrinks=4,
        isr_expands=3,
        voter=True,
        controller_active=True,
        raft_term=5,
        raft_commit_index=99,
        offline_partitions=2,
        fenced_brokers=1,
        registered_brokers=3,
        groups=[GroupSample("g", 2, {("a", 0): 5})],
    )
    by_name = {f.name: f for f in state_families(snapshot)}

    def only(name: str) -> float:
        (sample,) = by_name[name].samples
        return float(sample.value)

    assert only("headwater_leader_partitions") == 2
    assert only("headwater_replica_partitions") == 3
    assert only("headwater_under_replicated_partitions") == 1
    assert only("headwater_under_min_isr_partitions") == 1
    assert only("headwater_offline_partitions") == 2
    assert only("headwater_controller_active") == 1
    assert only("headwater_raft_term") == 5
    assert only("headwater_raft_commit_index") == 99
    assert only("headwater_fenced_brokers") == 1
    assert only("headwater_isr_shrinks") == 4
    lag = {
        tuple(s.labels.values()): s.value for s in by_name["headwater_follower_lag_records"].samples
    }
    assert lag == {("a", "0", "1"): 0, ("a", "0", "3"): 7}
    isr = by_name["headwater_partition_in_sync_replicas"].samples
    assert len(isr) == 2, "the ISR size is reported by the leader only"
    (group_lag,) = by_name["headwater_group_lag_records"].samples
    assert group_lag.labels == {"group": "g", "topic": "a", "partition": "0"}
    assert group_lag.value == 5
    assert only("headwater_metrics_series_dropped") == 0


def test_a_broker_that_is_not_a_voter_reports_no_raft_series() -> None:
    names = {f.name for f in state_families(NodeSnapshot(node_id=4, roles="broker"))}
    assert "headwater_raft_term" not in names
    assert "headwater_controller_active" in names


def test_per_partition_series_stop_at_the_cap_and_say_so() -> None:
    many = [partition("t", i) for i in range(SERIES_PER_FAMILY_MAX + 5)]
    by_name = {f.name: f for f in state_families(NodeSnapshot(1, "broker", partitions=many))}
    assert len(by_name["headwater_partition_high_watermark"].samples) == SERIES_PER_FAMILY_MAX
    (dropped,) = by_name["headwater_metrics_series_dropped"].samples
    assert dropped.value == 5
    (leaders,) = by_name["headwater_leader_partitions"].samples
    assert leaders.value == SERIES_PER_FAMILY_MAX + 5, "counts cover every partition"


# ----------------------------------------------------------------------------- one node


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path_factory.mktemp("metrics") / "data", metrics_port=free_port())
    process.start()
    try:
        yield process
    finally:
        process.kill()


@pytest.fixture
def fresh_metered(tmp_path: Path) -> Iterator[NodeProcess]:
    """A node of its own, for counts no other test's calls may change."""
    process = NodeProcess(tmp_path / "data", metrics_port=free_port())
    process.start()
    try:
        yield process
    finally:
        process.kill()


def test_a_node_counts_records_bytes_requests_and_errors(fresh_metered: NodeProcess) -> None:
    metered = fresh_metered
    assert metered.metrics_address is not None
    with Admin(metered.address) as admin:
        admin.create_topic("counted", 2, 1)
    with grpc.insecure_channel(metered.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BrokerStub(channel).ListOffsets(
                pb.ListOffsetsRequest(topic="absent"), timeout=10
            )
        error = from_rpc_error(refused.value, metered.address)
        assert error.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    with Producer(metered.address, acks="all") as producer:
        for i in range(300):
            producer.send("counted", b"v%05d" % i, partition=i % 2)
    with Producer(metered.address, acks="1", enable_idempotence=False) as producer:
        for i in range(200):
            producer.send("counted", b"w%05d" % i, partition=0)
    with LogReader(metered.address) as reader:
        fetched = reader.fetch("counted", 0, 0, max_bytes=1 << 20)

    samples = scrape(metered.metrics_address)
    assert value(samples, "headwater_records_in_total", topic="counted") == 500
    bytes_in = value(samples, "headwater_bytes_in_total", topic="counted")
    assert bytes_in is not None and bytes_in > 500 * 6
    assert value(samples, "headwater_records_out_total", topic="counted") == fetched.next_offset
    assert value(samples, "headwater_bytes_out_total", topic="counted") == len(fetched.records)
    assert (
        value(samples, "headwater_rpc_requests_total", service="Admin", method="CreateTopics") == 1
    )
    assert (
        value(samples, "headwater_rpc_requests_total", service="Broker", method="ListOffsets") == 1
    )
    assert (
        value(
            samples,
            "headwater_rpc_errors_total",
            service="Broker",
            method="ListOffsets",
            code="UNKNOWN_TOPIC_OR_PARTITION",
        )
        == 1
    )
    latency = value(
        samples, "headwater_rpc_duration_seconds_count", service="Broker", method="ListOffsets"
    )
    assert latency == 1
    by_acks = {
        labels: v
        for (name, labels), v in samples.items()
        if name == "headwater_produce_duration_seconds_count"
    }
    acks_seen = {dict(labels)["acks"] for labels, count in by_acks.items() if count > 0}
    assert acks_seen == {"all", "1"}
    high = sum(
        value(samples, "headwater_partition_high_watermark", topic="counted", partition=str(p)) or 0
        for p in (0, 1)
    )
    assert high == 500
    assert (
        value(samples, "headwater_partition_log_end_offset", topic="counted", partition="0") == 350
    )
    assert value(samples, "headwater_partition_log_segments", topic="counted", partition="0") == 1
    size = value(samples, "headwater_partition_log_size_bytes", topic="counted", partition="0")
    assert size is not None and size > 0
    assert value(samples, "headwater_controller_active") == 1
    assert (value(samples, "headwater_raft_term") or 0) >= 1
    assert value(samples, "headwater_registered_brokers") == 1
    assert value(samples, "process_resident_memory_bytes") is not None


def test_a_deleted_topic_leaves_no_series(metered: NodeProcess) -> None:
    assert metered.metrics_address is not None
    with Admin(metered.address) as admin:
        admin.create_topic("doomed", 1, 1)
    with Producer(metered.address) as producer:
        producer.send("doomed", b"x").result(30)
    assert value(scrape(metered.metrics_address), "headwater_records_in_total", topic="doomed") == 1
    with Admin(metered.address) as admin:
        admin.delete_topic("doomed")

    def gone() -> bool:
        samples = scrape(metered.metrics_address or "")
        return not any(dict(labels).get("topic") == "doomed" for (_, labels) in samples)

    assert not gone()

    wait_until(gone, 30, "the deleted topic's series to go")


def test_an_unknown_method_gets_no_series(metered: NodeProcess) -> None:
    """Method names come from callers: only served methods may become label values."""
    assert metered.metrics_address is not None
    with grpc.insecure_channel(metered.address) as channel:
        call = channel.unary_unary("/headwater.v1.Broker/NoSuchMethod" + "x" * 50)
        with pytest.raises(grpc.RpcError) as failed:
            call(b"", timeout=5)
        assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED  # type: ignore[attr-defined]
    assert not any("NoSuchMethod" in str(key) for key in scrape(metered.metrics_address))


def test_every_series_a_node_serves_is_documented(metered: NodeProcess) -> None:
    """docs/metrics.md has a row for every headwater_ family a node serves, and names none
    it does not."""
    assert metered.metrics_address is not None
    with urllib.request.urlopen(f"http://{metered.metrics_address}/metrics", timeout=10) as a:
        served = {f.name for f in text_string_to_metric_families(a.read().decode())}
    served = {name for name in served if name.startswith("headwater_")}
    documented = set(
        re.findall(r"^\| `(headwater_[a-z_]+)`", (ROOT / "docs/metrics.md").read_text(), re.M)
    )
    # The parser names counter families without _total; the docs give the names as
    # queried.
    documented_families = {re.sub(r"_total$", "", name) for name in documented}
    assert served - documented_families == set(), "served but not in docs/metrics.md"
    assert documented_families - served == set(), "in docs/metrics.md but not served"


def test_a_taken_metrics_port_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(
            "serve",
            "--data-dir",
            str(tmp_path / "data"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--metrics-listen",
            f"127.0.0.1:{port}",
            timeout=60,
        )
    assert result.returncode != 0
    assert b"cannot serve metrics on 127.0.0.1:" in result.stderr
    assert b"Traceback" not in result.stderr


# ----------------------------------------------------------------------------- a cluster


@pytest.mark.slow
def test_a_killed_replica_shows_as_shrinks_under_replication_and_offline_partitions(
    tmp_path: Path,
) -> None:
    """Kill a broker: the leader of an RF-3 partition shrinks its ISR (counted, and the
    partition under-replicated), the controller counts an offline RF-1 partition of the
    dead broker and one fenced broker; restart it: the ISR expands again."""
    base = free_port_block(4)
    cluster = LocalCluster(
        tmp_path,
        3,
        env={"HEADWATER_REPLICA_LAG_MS_MAX": "1000"},
        metrics_base_port=base,
    )
    cluster.start()
    try:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topic("wide", 1, 3)
            admin.create_topic("narrow", 3, 1)
        (wide,) = cluster.partitions(cluster.nodes[1], "wide")
        victim_id = next(r for r in wide.replicas if r != wide.leader)
        narrow = cluster.partitions(cluster.nodes[1], "narrow")
        assert any(p.leader == victim_id for p in narrow)
        with Producer(cluster.bootstrap()) as producer:
            for i in range(100):
                producer.send("wide", b"%d" % i)
        leader = cluster.nodes[wide.leader]
        assert leader.metrics_address is not None

        cluster.nodes[victim_id].kill()

        def shrunk() -> bool:
            samples = scrape(leader.metrics_address or "")
            return (value(samples, "headwater_isr_shrinks_total") or 0) >= 1 and (
                value(samples, "headwater_under_replicated_partitions") or 0
            ) >= 1

        wait_until(
            shrunk, 60, "the leader to count an ISR shrink and an under-replicated partition"
        )

        def controller_sees_it() -> bool:
            live = [n for n in cluster.alive() if n.metrics_address]
            scraped = [scrape(n.metrics_address or "") for n in live]
            active = [s for s in scraped if value(s, "headwater_controller_active") == 1]
            return (
                len(active) == 1
                and (value(active[0], "headwater_offline_partitions") or 0) >= 1
                and value(active[0], "headwater_fenced_brokers") == 1
            )

        wait_until(controller_sees_it, 60, "the active controller to count the offline partition")

        cluster.nodes[victim_id].start()

        def healed() -> bool:
            samples = scrape(leader.metrics_address or "")
            return (value(samples, "headwater_isr_expands_total") or 0) >= 1 and value(
                samples, "headwater_under_replicated_partitions"
            ) == 0

        wait_until(healed, 60, "the ISR to expand again")
    finally:
        cluster.close()


def test_streaming_handlers_that_write_keep_working_with_metrics_on(metered: NodeProcess) -> None:
    """Health.Watch writes with context.write (a coroutine, not an async generator): the
    metrics wrapper must await it, not iterate it."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    assert metered.metrics_address is not None
    with grpc.insecure_channel(metered.address) as channel:
        watch = health_pb2_grpc.HealthStub(channel).Watch(
            health_pb2.HealthCheckRequest(), timeout=10
        )
        first = next(iter(watch))
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()
    address = metered.metrics_address

    def counted() -> bool:
        samples = scrape(address)
        labels = {"service": "Health", "method": "Watch"}
        return (
            value(samples, "headwater_rpc_requests_total", **labels) == 1
            and value(samples, "headwater_rpc_errors_total", code="CANCELLED", **labels) == 1
        )

    wait_until(counted, 10, "the watch counted, and its cancellation")


def test_unsigned_calls_on_the_inter_broker_listener_are_refused_and_counted(
    metered: NodeProcess,
) -> None:
    """The client services forwarded calls reach there, streams included, refuse a
    caller without the cluster secret's proof, with the reason."""
    assert metered.metrics_address is not None and metered.internal_address is not None
    with grpc.insecure_channel(metered.internal_address) as channel:
        with pytest.raises(grpc.RpcError) as unary:
            pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=10)
        with pytest.raises(grpc.RpcError) as stream:
            list(pb_grpc.BrokerStub(channel).FetchStream(pb.FetchRequest(topic="t"), timeout=10))
    for refused in (unary.value, stream.value):
        assert refused.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]
        assert "cluster" in refused.details()  # type: ignore[attr-defined]
    address = metered.metrics_address

    def counted() -> bool:
        samples = scrape(address)
        return all(
            value(
                samples,
                "headwater_rpc_errors_total",
                service="Broker",
                method=method,
                code="UNAUTHENTICATED",
            )
            == 1
            for method in ("Metadata", "FetchStream")
        )

    # The client may see the status a moment before the server's wrapper has counted it.
    wait_until(counted, 10, "both refusals counted as UNAUTHENTICATED")


def test_forwarded_calls_beyond_their_limit_are_refused_as_retriable() -> None:
    """ForwardedCallLimit: client services on the inter-broker listener hold at most
    calls_max calls; more are refused with THROTTLING_QUOTA_EXCEEDED, other services
    (heartbeats, replication) never."""
    import asyncio

    from headwater.node.security.cluster_auth import ForwardedCallLimit

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method
            self.invocation_metadata = ()

    class Aborted(Exception):
        pass

    class Context:
        def __init__(self) -> None:
            self.aborted: tuple[Any, ...] | None = None

        async def abort(self, *status: Any) -> None:
            self.aborted = status
            raise Aborted

    release = asyncio.Event()

    async def held(_request: Any, _context: Any) -> str:
        await release.wait()
        return "answered"

    handler = grpc.unary_unary_rpc_method_handler(held)

    async def continuation(_details: Any) -> Any:
        return handler

    async def scenario() -> None:
        limit = ForwardedCallLimit(2)
        produce = "/headwater.v1.Broker/Produce"
        calls = [
            asyncio.ensure_future(
                (await limit.intercept_service(continuation, Details(produce))).unary_unary(
                    None, Context()
                )
            )
            for _ in range(2)
        ]
        await asyncio.sleep(0)
        assert limit.open == 2
        third = await limit.intercept_service(continuation, Details(produce))
        context = Context()
        with pytest.raises(Aborted):
            await third.unary_unary(None, context)
        assert context.aborted is not None
        assert context.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "THROTTLING_QUOTA_EXCEEDED" in context.aborted[1]
        heartbeat = await limit.intercept_service(
            continuation, Details("/headwater.v1.Controller/BrokerHeartbeat")
        )
        assert heartbeat is handler, "inter-broker services are not limited"
        release.set()
        assert await asyncio.gather(*calls) == ["answered", "answered"]
        assert limit.open == 0

    asyncio.run(scenario())
