"""``headwater bench kafka-requests``: the longest the node's event loop is held while it
handles the worst legal request of each Kafka API.

It starts its own node (``headwater.tools.devcluster``) with a Kafka listener, the ACL
authorizer and its metrics endpoint, and ``--partitions`` partitions in topics of 1,000
(the node's open-file limit bounds how many it may host). ``User:ANONYMOUS`` may do
everything from 127.0.0.1 and nothing from 127.0.0.2 (an ACL's host), so each request is
sent twice: as a caller with every right, whose request does the work it asks for, and
as one with none, whose request is refused entry by entry. Each request is the largest
the node's limits allow (``topics_max`` and ``partitions_max`` names, group ids, configs
and members; a 4 MiB frame), built here byte by byte at a version every client sends.

For each, the figures are the time to its answer (or to the connection's close, for a
request over a limit), and the longest stall of the node's event loop meanwhile, read
from the ``headwater_event_loop_stall_seconds`` histogram before and after (the upper
bound of the highest bucket that gained a count; the node measures to within 10 ms
below). With ``--cluster``, three nodes instead, and the requests sent in a loop to one
of them for ``--seconds``: the figures are then the longest stall on each node, and
whether any broker was fenced or the controller moved meanwhile. With ``--reads``, one
partition of 10,000 one-record batches read from its start over each front
(``measure_reads``): the longest stall of each.
"""

from __future__ import annotations

import json
import re
import socket
import struct
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import click
import crc32c

from headwater.client import Admin, LogReader
from headwater.shared.acls import CLUSTER_RESOURCE, parse_acl
from headwater.tools.devcluster import LocalCluster, LocalNode
from headwater.tools.ports import free_port

DEADLINE_S: Final = 120.0
RIGHTS_HOST: Final = "127.0.0.1"
NO_RIGHTS_HOST: Final = "127.0.0.2"
TOPICS_MAX: Final = 10_000
PARTITIONS_MAX: Final = 10_000
MEMBERS_MAX: Final = 1000
PARTITIONS_PER_TOPIC: Final = 1000
GROUP: Final = "bench-group"


# ----------------------------------------------------------------------------- frames


def i8(value: int) -> bytes:
    return struct.pack(">b", value)


def i16(value: int) -> bytes:
    return struct.pack(">h", value)


def i32(value: int) -> bytes:
    return struct.pack(">i", value)


def i64(value: int) -> bytes:
    return struct.pack(">q", value)


def string(value: str | None) -> bytes:
    if value is None:
        return i16(-1)
    data = value.encode()
    return i16(len(data)) + data


def blob(value: bytes | None) -> bytes:
    if value is None:
        return i32(-1)
    return i32(len(value)) + value


def array(items: Iterable[bytes] | None) -> bytes:
    if items is None:
        return i32(-1)
    listed = list(items)
    return i32(len(listed)) + b"".join(listed)


def uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def compact_string(value: str | None) -> bytes:
    if value is None:
        return b"\0"
    data = value.encode()
    return uvarint(len(data) + 1) + data


def compact_array(items: Iterable[bytes] | None) -> bytes:
    if items is None:
        return b"\0"
    listed = list(items)
    return uvarint(len(listed) + 1) + b"".join(listed)


NO_TAGS: Final = b"\0"


def request(api_key: int, version: int, body: bytes, flexible: bool = False) -> bytes:
    """A whole frame: size, header (v1, or v2 with its tagged fields), body."""
    header = i16(api_key) + i16(version) + i32(1) + string("bench")
    if flexible:
        header += NO_TAGS
    return i32(len(header) + len(body)) + header + body


def record_batch() -> bytes:
    """The smallest valid RecordBatch v2: one record, no key, a 1-byte value."""
    record_body = i8(0) + b"\x00" + b"\x00" + b"\x01" + b"\x02" + b"x" + b"\x00"
    record = bytes([len(record_body) * 2]) + record_body  # zigzag varint length
    after_crc = (
        i16(0)  # attributes
        + i32(0)  # last offset delta
        + i64(1_767_225_600_000)
        + i64(1_767_225_600_000)
        + i64(-1)  # producer id
        + i16(-1)
        + i32(-1)
        + i32(1)  # records
        + record
    )
    crc = crc32c.crc32c(after_crc)
    header = i64(0) + i32(len(after_crc) + 9) + i32(0) + i8(2) + struct.pack(">I", crc)
    return header + after_crc


# ----------------------------------------------------------------------------- requests


@dataclass(frozen=True, slots=True)
class Worst:
    api: str
    frame: bytes
    entries: int
    """What the request names (topics, partitions, ids, ...)."""


def _partitions(topics: list[str], count: int) -> list[tuple[str, list[int]]]:
    """``count`` partitions spread over ``topics`` (1,000 a topic; past the topics the
    node has, partitions of topics it does not)."""
    found: list[tuple[str, list[int]]] = []
    left = count
    index = 0
    while left:
        name = topics[index] if index < len(topics) else f"missing-{index}"
        take = min(left, PARTITIONS_PER_TOPIC)
        found.append((name, list(range(take))))
        left -= take
        index += 1
    return found


def worst_requests(topics: list[str]) -> list[Worst]:
    """The largest request of each API the node's default limits allow."""
    spread = _partitions(topics, PARTITIONS_MAX)
    batch = record_batch()
    names = [f"name-{n}" for n in range(TOPICS_MAX)]
    return [
        Worst(
            "Produce v3 (acks=1)",
            request(
                0,
                3,
                string(None)
                + i16(1)
                + i32(30_000)
                + array(
                    string(t) + array(i32(p) + blob(batch) for p in parts) for t, parts in spread
                ),
            ),
            PARTITIONS_MAX,
        ),
        Worst(
            "Fetch v4",
            request(
                1,
                4,
                i32(-1)
                + i32(0)
                + i32(0)
                + i32(64 << 20)
                + i8(0)
                + array(
                    string(t) + array(i32(p) + i64(0) + i32(1 << 20) for p in parts)
                    for t, parts in spread
                ),
            ),
            PARTITIONS_MAX,
        ),
        Worst(
            "ListOffsets v1",
            request(
                2,
                1,
                i32(-1)
                + array(string(t) + array(i32(p) + i64(-1) for p in parts) for t, parts in spread),
            ),
            PARTITIONS_MAX,
        ),
        Worst("Metadata v1 (every topic)", request(3, 1, array(None)), len(topics)),
        Worst(
            "Metadata v4 (10,000 names)",
            request(3, 4, array(string(n) for n in names) + i8(0)),
            TOPICS_MAX,
        ),
        Worst(
            "OffsetCommit v2",
            request(
                8,
                2,
                string(GROUP)
                + i32(-1)
                + string("")
                + i64(-1)
                + array(
                    string(t) + array(i32(p) + i64(0) + string("") for p in parts)
                    for t, parts in spread
                ),
            ),
            PARTITIONS_MAX,
        ),
        Worst(
            "OffsetFetch v1",
            request(
                9,
                1,
                string(GROUP)
                + array(string(t) + array(i32(p) for p in parts) for t, parts in spread),
            ),
            PARTITIONS_MAX,
        ),
        Worst(
            "JoinGroup v1 (32 protocols of 100 KiB)",
            request(
                11,
                1,
                string(GROUP)
                + i32(10_000)
                + i32(30_000)
                + string("")
                + string("consumer")
                + array(string(f"p{n}") + blob(b"\0" * (100 << 10)) for n in range(32)),
            ),
            32,
        ),
        Worst(
            "LeaveGroup v3 (1,000 members)",
            request(
                13,
                3,
                string(GROUP) + array(string(f"m{n}") + string(None) for n in range(MEMBERS_MAX)),
            ),
            MEMBERS_MAX,
        ),
        Worst(
            "SyncGroup v1 (1,000 assignments)",
            request(
                14,
                1,
                string(GROUP)
                + i32(1)
                + string("m0")
                + array(string(f"m{n}") + blob(b"\0" * 1000) for n in range(MEMBERS_MAX)),
            ),
            MEMBERS_MAX,
        ),
        Worst(
            "DescribeGroups v0 (10,000 ids)",
            request(15, 0, array(string(f"g{n}") for n in range(TOPICS_MAX))),
            TOPICS_MAX,
        ),
        Worst(
            "CreateTopics v2 (10,000, validate only)",
            request(
                19,
                2,
                array(string(n) + i32(1) + i16(1) + array([]) + array([]) for n in names)
                + i32(30_000)
                + i8(1),
            ),
            TOPICS_MAX,
        ),
        Worst(
            "DeleteTopics v1 (10,000 missing)",
            request(20, 1, array(string(n) for n in names) + i32(30_000)),
            TOPICS_MAX,
        ),
        Worst(
            "DescribeConfigs v1 (10,000 topics)",
            request(
                32,
                1,
                array(i8(2) + string(n) + array(None) for n in [*topics, *names][:TOPICS_MAX])
                + i8(0),
            ),
            TOPICS_MAX,
        ),
        Worst(
            "AlterConfigs v0 (10,000 topics)",
            request(
                33,
                0,
                array(
                    i8(2) + string(n) + array([string("retention.ms") + string("60000")])
                    for n in names
                )
                + i8(1),
            ),
            TOPICS_MAX,
        ),
        Worst(
            "IncrementalAlterConfigs v0 (10,000 topics)",
            request(
                44,
                0,
                array(
                    i8(2) + string(n) + array([string("cleanup.policy") + i8(3) + string("delete")])
                    for n in names
                )
                + i8(1),
            ),
            TOPICS_MAX,
        ),
        Worst(
            "CreatePartitions v0 (10,000 topics)",
            request(
                37,
                0,
                array(string(n) + i32(2000) + array(None) for n in names) + i32(30_000) + i8(0),
            ),
            TOPICS_MAX,
        ),
        Worst(
            "DeleteGroups v0 (10,000 ids)",
            request(42, 0, array(string(f"g{n}") for n in range(TOPICS_MAX))),
            TOPICS_MAX,
        ),
        Worst(
            "ConsumerGroupHeartbeat v0 (10,000 topics)",
            request(
                68,
                0,
                compact_string(GROUP)
                + compact_string("")
                + i32(0)
                + compact_string(None)
                + compact_string(None)
                + i32(45_000)
                + compact_array(compact_string(n) for n in names)
                + compact_string(None)
                + compact_array([])
                + NO_TAGS,
                flexible=True,
            ),
            TOPICS_MAX,
        ),
        Worst("ListGroups v0", request(16, 0, b""), 0),
        Worst("ApiVersions v0", request(18, 0, b""), 0),
    ]


# ----------------------------------------------------------------------------- measuring


STALL_BUCKET: Final = re.compile(
    r'^headwater_event_loop_stall_seconds_bucket\{le="([^"]+)"\} (\S+)$'
)


def stall_buckets(metrics_address: str) -> dict[float, float]:
    """The node's event-loop stall histogram: upper bound (s) -> cumulative count."""
    with urllib.request.urlopen(f"http://{metrics_address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    found = {}
    for line in text.splitlines():
        match = STALL_BUCKET.match(line)
        if match:
            bound = float("inf") if match[1] == "+Inf" else float(match[1])
            found[bound] = float(match[2])
    return found


def longest_stall_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """The upper bound of the longest stall between the two readings of the cumulative
    histogram: the lowest bucket holding every stall counted meanwhile (0: none of 5 ms
    or more; inf: one past the highest bucket)."""
    gained = {bound: after[bound] - before.get(bound, 0) for bound in after}
    total = gained.get(float("inf"), 0)
    if not total:
        return 0.0
    return min(bound for bound, count in gained.items() if count >= total) * 1000


def send(address: str, source: str, frame: bytes) -> tuple[float, str]:
    """(seconds to the answer, "answered" or "closed") of one request."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection(
        (host, int(port)), timeout=DEADLINE_S, source_address=(source, 0)
    ) as sock:
        started = time.perf_counter()
        sock.sendall(frame)
        prefix = sock.recv(4, socket.MSG_WAITALL)
        if len(prefix) < 4:
            return time.perf_counter() - started, "closed"
        (size,) = struct.unpack(">i", prefix)
        left = size
        while left:
            chunk = sock.recv(min(left, 1 << 20))
            if not chunk:
                return time.perf_counter() - started, "closed"
            left -= len(chunk)
        return time.perf_counter() - started, "answered"


def _setup(node_address: str, partitions: int) -> list[str]:
    topics = []
    with Admin(node_address) as admin:
        for n in range(max(1, partitions // PARTITIONS_PER_TOPIC)):
            name = f"wide-{n}"
            admin.create_topic(name, min(PARTITIONS_PER_TOPIC, partitions))
            topics.append(name)
        admin.create_acls(
            [
                parse_acl(kind, name, "User:ANONYMOUS", "all", host=RIGHTS_HOST)
                for kind, name in (("topic", "*"), ("group", "*"), ("cluster", CLUSTER_RESOURCE))
            ]
        )
    return topics


def measure_node(
    kafka_address: str, metrics_address: str, requests: list[Worst], echo: Callable[[str], None]
) -> list[dict[str, Any]]:
    rows = []
    for worst in requests:
        for caller, source in (("rights", RIGHTS_HOST), ("none", NO_RIGHTS_HOST)):
            time.sleep(0.3)  # the previous request's answer written and gone
            before = stall_buckets(metrics_address)
            seconds, outcome = send(kafka_address, source, worst.frame)
            time.sleep(0.2)
            after = stall_buckets(metrics_address)
            row = {
                "api": worst.api,
                "caller": caller,
                "entries": worst.entries,
                "request_bytes": len(worst.frame),
                "answer_ms": round(seconds * 1000, 1),
                "outcome": outcome,
                "longest_stall_ms": longest_stall_ms(before, after),
            }
            rows.append(row)
            echo(
                f"{worst.api:45s} {caller:6s} {outcome:8s} answer {row['answer_ms']:8.1f} ms"
                f"  longest stall <= {row['longest_stall_ms']:.0f} ms"
            )
    return rows


def _cluster_state(cluster: LocalCluster) -> tuple[set[int], set[int]]:
    """(the controller ids the live nodes name, the brokers any of them sees fenced)."""
    controllers: set[int] = set()
    fenced: set[int] = set()
    for node in cluster.alive():
        try:
            with Admin(node.address, request_timeout_s=2.0) as admin:
                metadata = admin.node_metadata(node.address, include_digest=False)
        except Exception:
            controllers.add(-1)
            continue
        controllers.add(metadata.controller_id)
        fenced |= {b.node_id for b in metadata.brokers if b.state == "fenced"}
    return controllers, fenced


def measure_cluster(root: Path, seconds: float, echo: Callable[[str], None]) -> dict[str, Any]:
    """Three nodes; the worst requests sent in a loop to one that is not the controller
    for ``seconds``: each node's longest stall, the brokers seen fenced and the
    controllers named meanwhile."""
    metrics_base = free_port() - 10
    kafka_ports = {i: free_port() for i in (1, 2, 3)}
    cluster = LocalCluster(
        root, 3, metrics_base_port=metrics_base, kafka_ports=kafka_ports, env=_ACL_ENV
    )
    cluster.start()
    try:
        topics = _setup(cluster.bootstrap(), 1000)
        controller = next(iter(_cluster_state(cluster)[0]))
        target = next(i for i in cluster.nodes if i != controller)
        address = f"127.0.0.1:{kafka_ports[target]}"
        requests = worst_requests(topics)
        before = {i: stall_buckets(f"127.0.0.1:{metrics_base + i}") for i in cluster.nodes}
        controllers: set[int] = set()
        fenced: set[int] = set()
        sent = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for worst in requests:
                for source in (RIGHTS_HOST, NO_RIGHTS_HOST):
                    send(address, source, worst.frame)
                    sent += 1
                named, seen_fenced = _cluster_state(cluster)
                controllers |= named
                fenced |= seen_fenced
                if time.monotonic() >= end:
                    break
        after = {i: stall_buckets(f"127.0.0.1:{metrics_base + i}") for i in cluster.nodes}
        stalls = {i: longest_stall_ms(before[i], after[i]) for i in cluster.nodes}
        echo(
            f"{sent} requests to node {target} in {seconds:.0f} s; longest stalls {stalls}; "
            f"controllers named {sorted(controllers)}; fenced {sorted(fenced)}"
        )
        return {
            "target": target,
            "controller": controller,
            "requests": sent,
            "longest_stall_ms": stalls,
            "controllers_named": sorted(controllers),
            "fenced": sorted(fenced),
        }
    finally:
        cluster.close()


_ACL_ENV: Final = {"HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:ANONYMOUS"}


SMALL_BATCHES: Final = 10_000
"""One-record Kafka batches in the partition ``measure_reads`` reads."""


def produce_small_batches(kafka_address: str, topic: str, batches: int) -> None:
    """``batches`` one-record Kafka batches into ``topic``'s partition 0, one Produce
    (v3, acks=1) each, 16 sent before their answers are read."""
    frame = request(
        0,
        3,
        string(None)
        + i16(1)
        + i32(30_000)
        + array([string(topic) + array([i32(0) + blob(record_batch())])]),
    )
    host, port = kafka_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        for sent in range(0, batches, 16):
            window = min(16, batches - sent)
            sock.sendall(frame * window)
            for _ in range(window):
                (size,) = struct.unpack(">i", _exactly(sock, 4))
                answer = _exactly(sock, size)
                # correlation id, topics (1), name, partitions (1), index, then its error
                name_bytes = struct.unpack_from(">h", answer, 8)[0]
                (error,) = struct.unpack_from(">h", answer, 10 + name_bytes + 4 + 4)
                if error:
                    raise RuntimeError(f"the node refused a produced batch: error {error}")


def _exactly(sock: socket.socket, size: int) -> bytes:
    data = sock.recv(size, socket.MSG_WAITALL)
    if len(data) < size:
        raise RuntimeError("the node closed the connection")
    return data


def measure_reads(
    node_address: str,
    kafka_address: str,
    metrics_address: str,
    topic: str = "small-batches",
    rounds: int = 3,
) -> dict[str, float]:
    """The longest event-loop stall (ms) while one partition of ``SMALL_BATCHES``
    one-record batches produced over Kafka is read from its start, ``rounds`` times over
    each front: a Kafka Fetch v4 of 1 MiB of it (its batches cut to Kafka's, read on while
    they fit), and a gRPC fetch of 4 MiB (the same batches transcoded to columnar ones)."""
    with Admin(node_address) as admin:
        admin.create_topic(topic, 1)
    produce_small_batches(kafka_address, topic, SMALL_BATCHES)
    fetch = request(
        1,
        4,
        i32(-1)
        + i32(0)
        + i32(0)
        + i32(64 << 20)
        + i8(0)
        + array([string(topic) + array([i32(0) + i64(0) + i32(1 << 20)])]),
    )
    stalls = {}
    before = stall_buckets(metrics_address)
    for _ in range(rounds):
        _seconds, outcome = send(kafka_address, RIGHTS_HOST, fetch)
        if outcome != "answered":
            raise RuntimeError(f"the Kafka fetch was {outcome}")
    stalls["kafka"] = longest_stall_ms(before, stall_buckets(metrics_address))
    with LogReader(node_address) as reader:
        before = stall_buckets(metrics_address)
        for _ in range(rounds):
            fetched = reader.fetch(topic, 0, 0, max_bytes=4 << 20)
            if fetched.next_offset != SMALL_BATCHES:
                raise RuntimeError(f"the gRPC fetch ended at {fetched.next_offset}")
        stalls["grpc"] = longest_stall_ms(before, stall_buckets(metrics_address))
    return stalls


@click.command("kafka-requests")
@click.option(
    "--partitions",
    type=click.IntRange(min=1, max=PARTITIONS_MAX),
    default=6000,
    show_default=True,
    help="Partitions the node hosts (its open-file limit bounds them).",
)
@click.option("--only", default="", help="Only the APIs whose name contains this text.")
@click.option(
    "--cluster",
    "cluster_s",
    type=click.FloatRange(min=0),
    default=0,
    help="Instead: three nodes, the requests in a loop to one of them for this many seconds.",
)
@click.option(
    "--reads",
    is_flag=True,
    help=f"Instead: one partition of {SMALL_BATCHES:,} one-record batches read over each front.",
)
@click.option("--json", "as_json", is_flag=True)
def bench_kafka_requests(
    partitions: int, only: str, cluster_s: float, reads: bool, as_json: bool
) -> None:
    """The event loop's longest stall under the worst legal request of each Kafka API."""
    echo = (lambda _line: None) if as_json else click.echo
    if reads:
        with tempfile.TemporaryDirectory(prefix="hw-kafka-requests-") as root:
            metrics_port = free_port()
            node = LocalNode(Path(root) / "data", kafka_port=free_port(), metrics_port=metrics_port)
            node.start()
            try:
                assert node.kafka_address is not None
                stalls = measure_reads(
                    node.address, node.kafka_address, f"127.0.0.1:{metrics_port}"
                )
            finally:
                node.stop()
        if as_json:
            click.echo(json.dumps(stalls, indent=2))
        else:
            for front, stall in stalls.items():
                click.echo(f"{front:6s} longest stall <= {stall:.0f} ms")
        return
    if cluster_s:
        with tempfile.TemporaryDirectory(prefix="hw-kafka-requests-") as root:
            found = measure_cluster(Path(root), cluster_s, echo)
        if as_json:
            click.echo(json.dumps(found, indent=2))
        return
    with tempfile.TemporaryDirectory(prefix="hw-kafka-requests-") as root:
        metrics_port = free_port()
        node = LocalNode(
            Path(root) / "data",
            kafka_port=free_port(),
            metrics_port=metrics_port,
            env=_ACL_ENV,
        )
        node.start()
        try:
            topics = _setup(node.address, partitions)
            node.stop()
            node.env["HEADWATER_SUPER_USERS"] = ""
            node.start()
            assert node.kafka_address is not None
            requests = [w for w in worst_requests(topics) if only.lower() in w.api.lower()]
            rows = measure_node(node.kafka_address, f"127.0.0.1:{metrics_port}", requests, echo)
        finally:
            node.stop()
    worst = max((r["longest_stall_ms"] for r in rows), default=0.0)
    if as_json:
        click.echo(json.dumps({"partitions": partitions, "requests": rows}, indent=2))
    else:
        click.echo(f"longest stall over every request: <= {worst:.0f} ms")


__all__ = ["bench_kafka_requests", "measure_cluster", "measure_reads", "worst_requests"]
