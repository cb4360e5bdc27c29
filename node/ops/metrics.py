"""Prometheus metrics of one node, served over HTTP on ``metrics_listen`` by
``headwater.node.ops.metrics_endpoint`` (docs/metrics.md lists every series with its labels and
meaning).

Two kinds of series:

- **Counted as things happen**, on the hot path: records and bytes in and out per topic,
  requests, errors and latency per RPC (``RpcMetricsInterceptor``), produce latency by
  acks. Each is a prometheus_client object whose label children are looked up once and
  cached, so an update is a dict lookup and an add under an uncontended lock.
- **Read when scraped**: everything that is state (partitions, high watermarks, lag, the
  controller, Raft, groups). ``NodeStateCollector`` asks the node's event loop for a
  ``NodeSnapshot`` (taken on the loop, so it never sees a half-made change) and turns it
  into families with the pure ``state_families``. Nothing is computed for these series
  between scrapes.

Label values are bounded: topics and groups are those the cluster holds (a deleted
topic's series are dropped at the next scrape), RPC names are those the node serves
(an unknown method gets no series), and error codes are ``ErrorCode`` names or, for a
call that failed outside Headwater's own errors, the gRPC status name. Per-partition and
per-group series stop at ``SERIES_PER_FAMILY_MAX`` per family, counted in
``headwater_metrics_series_dropped``.

Threads: the hot-path objects are updated on the node's event loop; prometheus_client's
HTTP server scrapes in its own thread, and the collector hands the snapshot to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import grpc
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from headwater.node.rpc.call_hooks import WrappedHandlers, around, service_and_method
from headwater.shared.errors import ErrorCode
from headwater.shared.grpc_errors import ABORTED_WITH

# grpc's interceptor class is generic in its type stubs only.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor

_log = logging.getLogger(__name__)
SCRAPE_SNAPSHOT_TIMEOUT_S: Final = 5.0
SERIES_PER_FAMILY_MAX: Final = 20_000
LATENCY_BUCKETS_S: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
"""Request latency buckets: produce and fetch answer in 1-10 ms on a quiet machine
(BENCHMARKS.md: end-to-end p50 2.4 ms, p99 6.4 ms), acks=all waits up to the request
timeout (30 s by default), long polls up to their max_wait_ms."""

STALL_BUCKETS_S: Final = (
    0.005,
    0.01,
    0.02,
    0.03,
    0.04,
    0.05,
    0.075,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
)
"""Event-loop stall buckets: a node should never hold its loop past 50 ms."""

ACKS_LABELS: Final = {0: "all", 1: "0", 2: "1", 3: "all"}
"""The produce request's acks (proto enum: 0 unspecified = all, 1 none, 2 leader, 3 all)
by the names Kafka users know: "0", "1", "all"."""


class NodeMetrics:
    """The hot-path instruments of one node, in their own registry (several nodes may
    share a process in tests)."""

    def __init__(self) -> None:
        disable_created_metrics()  # type: ignore[no-untyped-call]  # no `_created` twins
        self.registry = CollectorRegistry(auto_describe=True)
        registry = self.registry
        self.records_in = Counter(
            "headwater_records_in",
            "Records appended by producers to partitions this node leads.",
            ["topic"],
            registry=registry,
        )
        self.bytes_in = Counter(
            "headwater_bytes_in",
            "Bytes of record batches appended by producers to partitions this node leads.",
            ["topic"],
            registry=registry,
        )
        self.records_out = Counter(
            "headwater_records_out",
            "Offsets consumers' fetches from this node advanced over (records delivered; "
            "in a compacted topic, also the offsets of removed records passed over).",
            ["topic"],
            registry=registry,
        )
        self.bytes_out = Counter(
            "headwater_bytes_out",
            "Bytes of record batches sent to consumers (replica fetches not included).",
            ["topic"],
            registry=registry,
        )
        self.rpc_requests = Counter(
            "headwater_rpc_requests",
            "gRPC calls received (a stream counts once).",
            ["service", "method"],
            registry=registry,
        )
        self.rpc_errors = Counter(
            "headwater_rpc_errors",
            "Calls that ended with an error, and ProduceStream requests answered with one, "
            "by ErrorCode name (or the gRPC status name outside Headwater's errors).",
            ["service", "method", "code"],
            registry=registry,
        )
        self.authorization_denied = Counter(
            "headwater_authorization_denied",
            "Requests the authorizer refused, by operation and resource type (the node's "
            "log names the principal and resource, rate-limited).",
            ["operation", "resource_type"],
            registry=registry,
        )
        self.failed_logins = Counter(
            "headwater_failed_logins",
            "Passwords refused on the client listener: unknown user or wrong password (the "
            "node's log names the host and user, rate-limited).",
            registry=registry,
        )
        self.rpc_duration = Histogram(
            "headwater_rpc_duration_seconds",
            "Time from receiving a unary call to its answer.",
            ["service", "method"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.produce_duration = Histogram(
            "headwater_produce_duration_seconds",
            "Time from receiving a produce request to its answer, by acks; for acks=all this "
            "includes the wait for the in-sync replicas.",
            ["rpc", "acks"],
            registry=registry,
            buckets=LATENCY_BUCKETS_S,
        )
        self.event_loop_stall = Histogram(
            "headwater_event_loop_stall_seconds",
            "Each time the node's event loop was held for 5 ms or more (heartbeats, "
            "replication and every client wait meanwhile), measured by a task that wakes "
            "every 10 ms (so to within 10 ms below).",
            registry=registry,
            buckets=STALL_BUCKETS_S,
        )
        self._in: dict[str, tuple[Counter, Counter]] = {}
        self._out: dict[str, tuple[Counter, Counter]] = {}
        self._produce: dict[tuple[str, str], Histogram] = {}

    def count_in(self, topic: str, records: int, size: int) -> None:
        children = self._in.get(topic)
        if children is None:
            children = self._in[topic] = (
                self.records_in.labels(topic),
                self.bytes_in.labels(topic),
            )
        children[0].inc(records)
        children[1].inc(size)

    def count_out(self, topic: str, records: int, size: int) -> None:
        children = self._out.get(topic)
        if children is None:
            children = self._out[topic] = (
                self.records_out.labels(topic),
                self.bytes_out.labels(topic),
            )
        children[0].inc(records)
        children[1].inc(size)

    def produce_timer(self, rpc: str, acks: int) -> Histogram:
        """The produce latency child of ``rpc`` ("Produce" or "ProduceStream") and the
        request's acks value."""
        key = (rpc, ACKS_LABELS.get(acks, "invalid"))  # bounded: acks is the client's
        child = self._produce.get(key)
        if child is None:
            child = self._produce[key] = self.produce_duration.labels(*key)
        return child

    def forget_topics(self, kept: Iterable[str]) -> None:
        """Drop the series of topics not in ``kept`` (deleted ones). On the event loop."""
        kept = set(kept)
        for cache, families in (
            (self._in, (self.records_in, self.bytes_in)),
            (self._out, (self.records_out, self.bytes_out)),
        ):
            for topic in [t for t in cache if t not in kept]:
                del cache[topic]
                for family in families:
                    family.remove(topic)


# ----------------------------------------------------------------------------- RPCs


def _failure_code(exc: BaseException, context: Any) -> str:
    code = ABORTED_WITH.get()
    if code is not None:
        return code.name
    if isinstance(exc, asyncio.CancelledError | GeneratorExit):
        return "CANCELLED"  # the client went away
    try:
        status = context.code()
    except Exception:  # not every context answers it
        status = None
    if isinstance(status, grpc.StatusCode) and status != grpc.StatusCode.OK:
        return str(status.name)
    return ErrorCode.UNKNOWN_SERVER_ERROR.name


class RpcMetricsInterceptor(_ServerInterceptor):
    """Counts every call the server has a handler for, its errors, and the latency of
    unary calls. Each method's handler is wrapped once and cached; the wrapper keeps the
    method's counter and histogram children, so a call costs two clock reads and two
    adds."""

    def __init__(self, metrics: NodeMetrics) -> None:
        self.metrics = metrics
        self._wrapped = WrappedHandlers(self._wrap)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Any],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        if handler is None:
            return handler  # type: ignore[return-value]  # unknown method: no series
        return self._wrapped.of(handler_call_details.method, handler)

    def _wrap(self, method: str, handler: Any) -> grpc.RpcMethodHandler[Any, Any]:
        qualified, name = service_and_method(method)
        service = qualified.rpartition(".")[2]  # "Broker" of "headwater.v1.Broker"
        timed = handler.unary_unary is not None  # streams are not timed
        return around(
            handler,
            _RpcCounting(
                self.metrics,
                service,
                name,
                self.metrics.rpc_duration.labels(service, name) if timed else None,
            ),
        )


class _RpcCounting:
    """Counts one method's calls, times unary ones, and counts failures by code."""

    def __init__(
        self, metrics: NodeMetrics, service: str, name: str, duration: Histogram | None
    ) -> None:
        self.requests = metrics.rpc_requests.labels(service, name)
        self.errors = metrics.rpc_errors
        self.service = service
        self.name = name
        self.duration = duration

    def started(self, _context: Any) -> float:
        self.requests.inc()
        return time.perf_counter()

    def ended(self, began: float, error: BaseException | None, context: Any) -> None:
        if self.duration is not None:
            self.duration.observe(time.perf_counter() - began)
        if error is not None:
            self.errors.labels(self.service, self.name, _failure_code(error, context)).inc()


# ----------------------------------------------------------------------------- state


@dataclass(frozen=True, slots=True)
class PartitionSample:
    """One partition replica hosted by the node, at the scrape."""

    topic: str
    partition: int
    leader: bool
    high_watermark: int
    log_start_offset: int
    log_end_offset: int
    size_bytes: int
    segments: int
    replicas: int
    isr: int
    min_insync_replicas: int
    follower_lag: Mapping[int, int] = field(default_factory=dict)
    """Leader only: each follower's records behind the leader's log end."""


@dataclass(frozen=True, slots=True)
class GroupSample:
    """One consumer group this node coordinates, at the scrape."""

    group: str
    members: int
    lag: Mapping[tuple[str, int], int]
    """Records between the committed offset and the high watermark, for each committed
    partition this node holds a replica of."""


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """The node's state for one scrape (``state_families``)."""

    node_id: int
    roles: str
    partitions: Sequence[PartitionSample] = ()
    isr_shrinks: int = 0
    isr_expands: int = 0
    truncations: int = 0
    voter: bool = False
    controller_active: bool = False
    raft_term: int = 0
    raft_commit_index: int = 0
    metadata_offset: int = 0
    offline_partitions: int = 0
    """As the active controller sees them (partitions without a leader); 0 elsewhere."""
    fenced_brokers: int = 0
    """As the active controller sees them; 0 elsewhere."""
    registered_brokers: int = 0
    groups: Sequence[GroupSample] = ()
    uncleanable_partitions: int = 0
    """Compacted partitions the log cleaner leaves alone: a segment cannot be decoded."""
    log_dir_offline: bool = False
    """This node's data folder is offline (a write there failed)."""
    raft_journal_failed: bool = False
    disk_slow: bool = False
    """A write to the data folder (a partition log's or the metadata journal's) was slow
    lately."""
    log_dir_offline_brokers: int = 0
    """Brokers whose data folder is offline, as the active controller sees them."""


def _gauge(name: str, doc: str, value: float, unit: str = "") -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value, unit=unit)


def state_families(snapshot: NodeSnapshot) -> list[Metric]:
    """The read-at-scrape families of ``snapshot`` (pure)."""
    partitions = snapshot.partitions
    led = [p for p in partitions if p.leader]
    dropped = 0
    families: list[Metric] = []
    families += [
        _gauge(
            "headwater_replica_partitions",
            "Partition replicas this node hosts (leaders and followers).",
            len(partitions),
        ),
        _gauge("headwater_leader_partitions", "Partitions this node leads.", len(led)),
        _gauge(
            "headwater_under_replicated_partitions",
            "Partitions this node leads whose ISR is smaller than their replica set.",
            sum(1 for p in led if p.isr < p.replicas),
        ),
        _gauge(
            "headwater_under_min_isr_partitions",
            "Partitions this node leads whose ISR is below min_insync_replicas (acks=all "
            "writes to them fail with NOT_ENOUGH_REPLICAS).",
            sum(1 for p in led if p.isr < p.min_insync_replicas),
        ),
        _gauge(
            "headwater_offline_partitions",
            "Partitions with no leader, as the active controller sees them (0 on every "
            "other node, so the sum over nodes counts each once).",
            snapshot.offline_partitions,
        ),
        CounterMetricFamily(
            "headwater_isr_shrinks",
            "ISR shrinks of partitions this node leads (its own requests, or the controller "
            "removing a fenced broker).",
            value=snapshot.isr_shrinks,
        ),
        CounterMetricFamily(
            "headwater_isr_expands",
            "ISR expansions of partitions this node leads.",
            value=snapshot.isr_expands,
        ),
        CounterMetricFamily(
            "headwater_follower_truncations",
            "Times a follower replica cut its log back to its leader's (after a leader change).",
            value=snapshot.truncations,
        ),
        _gauge(
            "headwater_controller_active",
            "1 on the active controller, 0 elsewhere (the sum over nodes should be 1).",
            int(snapshot.controller_active),
        ),
        _gauge(
            "headwater_fenced_brokers",
            "Registered brokers that are fenced, as the active controller sees them (0 on "
            "every other node).",
            snapshot.fenced_brokers,
        ),
        _gauge(
            "headwater_registered_brokers",
            "Brokers registered in the metadata, as the active controller sees them (0 on "
            "every other node).",
            snapshot.registered_brokers,
        ),
        _gauge(
            "headwater_log_dir_offline",
            "1 while this node's data folder is offline (a write there failed: a full disk, "
            "an I/O error; the node's log names it), 0 otherwise (Kafka's "
            "OfflineLogDirectoryCount).",
            int(snapshot.log_dir_offline),
        ),
        _gauge(
            "headwater_disk_slow",
            "1 while a write to this node's data folder (a partition log's append, a "
            "metadata journal write) took longer than half the Raft election timeout in the "
            "last 30 s, 0 otherwise.",
            int(snapshot.disk_slow),
        ),
        _gauge(
            "headwater_log_dir_offline_brokers",
            "Brokers whose data folder is offline, as the active controller sees them (0 on "
            "every other node).",
            snapshot.log_dir_offline_brokers,
        ),
        _gauge(
            "headwater_log_cleaner_uncleanable_partitions",
            "Compacted partitions hosted here that the log cleaner leaves alone because a "
            "segment of theirs cannot be decoded (the node's log names it).",
            snapshot.uncleanable_partitions,
        ),
        _gauge(
            "headwater_metadata_offset",
            "Offset of the newest metadata record this node has applied.",
            snapshot.metadata_offset,
        ),
    ]
    if snapshot.voter:
        families += [
            _gauge("headwater_raft_term", "Raft term of this metadata voter.", snapshot.raft_term),
            _gauge(
                "headwater_raft_commit_index",
                "Raft commit index of this metadata voter.",
                snapshot.raft_commit_index,
            ),
            _gauge(
                "headwater_raft_journal_failed",
                "1 while this voter's metadata journal cannot be written (it neither votes nor "
                "stands for election until it can), 0 otherwise.",
                int(snapshot.raft_journal_failed),
            ),
        ]
    per_partition = {
        "high_watermark": GaugeMetricFamily(
            "headwater_partition_high_watermark",
            "Offset below which records are committed (readable by consumers).",
            labels=["topic", "partition"],
        ),
        "log_start_offset": GaugeMetricFamily(
            "headwater_partition_log_start_offset",
            "First offset still in the log (retention moves it).",
            labels=["topic", "partition"],
        ),
        "log_end_offset": GaugeMetricFamily(
            "headwater_partition_log_end_offset",
            "Offset the next appended record gets.",
            labels=["topic", "partition"],
        ),
        "size_bytes": GaugeMetricFamily(
            "headwater_partition_log_size_bytes",
            "Bytes of the replica's segment files.",
            labels=["topic", "partition"],
        ),
        "segments": GaugeMetricFamily(
            "headwater_partition_log_segments",
            "Segments of the replica's log.",
            labels=["topic", "partition"],
        ),
        "leader": GaugeMetricFamily(
            "headwater_partition_leader",
            "1 when this node leads the partition, 0 when it follows.",
            labels=["topic", "partition"],
        ),
        "isr": GaugeMetricFamily(
            "headwater_partition_in_sync_replicas",
            "In-sync replicas of a partition this node leads.",
            labels=["topic", "partition"],
        ),
    }
    lag = GaugeMetricFamily(
        "headwater_follower_lag_records",
        "Records a follower is behind the log end of a partition this node leads.",
        labels=["topic", "partition", "replica"],
    )
    series = lag_series = 0
    for p in partitions:
        if series >= SERIES_PER_FAMILY_MAX:
            dropped += 1
            continue
        series += 1
        labels = [p.topic, str(p.partition)]
        per_partition["high_watermark"].add_metric(labels, p.high_watermark)
        per_partition["log_start_offset"].add_metric(labels, p.log_start_offset)
        per_partition["log_end_offset"].add_metric(labels, p.log_end_offset)
        per_partition["size_bytes"].add_metric(labels, p.size_bytes)
        per_partition["segments"].add_metric(labels, p.segments)
        per_partition["leader"].add_metric(labels, int(p.leader))
        if p.leader:
            per_partition["isr"].add_metric(labels, p.isr)
            for replica, behind in sorted(p.follower_lag.items()):
                if lag_series >= SERIES_PER_FAMILY_MAX:
                    dropped += 1
                    continue
                lag_series += 1
                lag.add_metric([*labels, str(replica)], behind)
    families += [*per_partition.values(), lag]
    group_lag = GaugeMetricFamily(
        "headwater_group_lag_records",
        "Records between a consumer group's committed offset and the high watermark, on "
        "the group's coordinator, for partitions it holds a replica of.",
        labels=["group", "topic", "partition"],
    )
    members = GaugeMetricFamily(
        "headwater_group_members",
        "Members of a consumer group this node coordinates.",
        labels=["group"],
    )
    series = 0
    for number, group in enumerate(snapshot.groups):
        if number < SERIES_PER_FAMILY_MAX:
            members.add_metric([group.group], group.members)
        else:
            dropped += 1
        for (topic, index), behind in sorted(group.lag.items()):
            if series >= SERIES_PER_FAMILY_MAX:
                dropped += 1
                continue
            series += 1
            group_lag.add_metric([group.group, topic, str(index)], behind)
    families += [group_lag, members]
    families.append(
        _gauge(
            "headwater_metrics_series_dropped",
            f"Per-partition and per-group series left out of this scrape beyond "
            f"{SERIES_PER_FAMILY_MAX} per family.",
            dropped,
        )
    )
    return families


class NodeStateCollector(Collector):
    """Collects ``state_families`` of a snapshot taken on ``loop`` by ``snapshot``."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        snapshot: Callable[[], Coroutine[Any, Any, NodeSnapshot]],
    ) -> None:
        self.loop = loop
        self.snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        try:
            snapshot = _on_loop(self.loop, self.snapshot, SCRAPE_SNAPSHOT_TIMEOUT_S)
        except (RuntimeError, TimeoutError, concurrent.futures.TimeoutError):
            return  # the node is stopping, or its loop is stuck: the state series are absent
        except Exception:  # a part closing under the snapshot, say: the scrape goes on
            _log.exception("taking the node's state for a metrics scrape failed")
            return
        yield from state_families(snapshot)

    def describe(self) -> Iterable[Metric]:
        return ()  # no fixed set: the registry must not collect the node's state to describe


def _on_loop(
    loop: asyncio.AbstractEventLoop,
    function: Callable[[], Coroutine[Any, Any, Any]],
    timeout_s: float,
) -> Any:
    """``function()`` run on ``loop`` from another thread, waiting up to ``timeout_s``."""
    done = asyncio.run_coroutine_threadsafe(function(), loop)
    try:
        return done.result(timeout_s)
    finally:
        done.cancel()
