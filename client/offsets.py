"""Offsets of many partitions, across topics: earliest, latest, or by timestamp.

One ListOffsets request per topic (per partition for timestamps, which a request carries
one of), sent to any node (a node that leads none of them forwards to the leaders) and
retried while leadership moves. Keys are (topic, partition) pairs. ``offset_requests``
and ``offsets_answered`` are the sans-I/O part, which the asyncio consumer sends itself;
``list_offsets`` is the one synchronous path (Admin, Consumer, the Spark connector).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from headwater.client.connection import Cluster
from headwater.v1 import headwater_pb2 as pb

PartitionKey = tuple[str, int]


def offset_requests(
    partitions: Iterable[PartitionKey],
    spec: pb.OffsetSpec.ValueType,
    timestamps: Mapping[PartitionKey, int] | None = None,
) -> list[pb.ListOffsetsRequest]:
    """The ListOffsets requests that answer for ``partitions`` (sans-I/O: both client
    engines send them): one per topic, or one per partition with ``timestamps``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    requests = []
    for topic, indexes in by_topic.items():
        groups = [[i] for i in indexes] if timestamps is not None else [indexes]
        for group in groups:
            stamp = timestamps[(topic, group[0])] if timestamps is not None else 0
            requests.append(
                pb.ListOffsetsRequest(topic=topic, partitions=group, spec=spec, timestamp_ms=stamp)
            )
    return requests


def one_timestamp(
    keys: Iterable[PartitionKey], spec: pb.OffsetSpec.ValueType, timestamp_ms: int
) -> dict[PartitionKey, int] | None:
    """The ``timestamps`` argument for one timestamp for every partition of ``keys``
    (None unless ``spec`` is OFFSET_SPEC_TIMESTAMP)."""
    return dict.fromkeys(keys, timestamp_ms) if spec == pb.OFFSET_SPEC_TIMESTAMP else None


def offsets_answered(
    request: pb.ListOffsetsRequest, response: pb.ListOffsetsResponse
) -> dict[PartitionKey, int]:
    """{(topic, partition): offset} from the answer to ``request``."""
    return {(request.topic, o.partition): o.offset for o in response.offsets}


def timestamps_answered(
    request: pb.ListOffsetsRequest, response: pb.ListOffsetsResponse
) -> dict[PartitionKey, int | None]:
    """{(topic, partition): offset} from the answer to a timestamp ``request``, None where
    no record is that recent (the answer's timestamp is then -1)."""
    return {
        (request.topic, o.partition): o.offset if o.timestamp_ms >= 0 else None
        for o in response.offsets
    }


def _answers(
    cluster: Cluster, request: pb.ListOffsetsRequest, retry_s: float
) -> pb.ListOffsetsResponse:
    def run(address: str) -> pb.ListOffsetsResponse:
        response: pb.ListOffsetsResponse = cluster.broker(address).ListOffsets(
            request, timeout=cluster.request_timeout_s
        )
        return response

    answer: pb.ListOffsetsResponse = cluster.call_any(run, retry_s=retry_s)
    return answer


def list_offsets(
    cluster: Cluster,
    partitions: Iterable[PartitionKey],
    spec: pb.OffsetSpec.ValueType,
    timestamps: Mapping[PartitionKey, int] | None = None,
    retry_s: float = 30.0,
) -> dict[PartitionKey, int]:
    """{(topic, partition): offset} for ``spec``: the log start (earliest), the high
    watermark (latest), or, with ``timestamps``, the first offset whose record has a
    timestamp at or after the partition's timestamp (else the high watermark)."""
    result: dict[PartitionKey, int] = {}
    for request in offset_requests(partitions, spec, timestamps):
        result.update(offsets_answered(request, _answers(cluster, request, retry_s)))
    return result


def offsets_matching_times(
    cluster: Cluster, timestamps: Mapping[PartitionKey, int], retry_s: float = 30.0
) -> dict[PartitionKey, int | None]:
    """Each partition's first offset with a timestamp at or after its entry in
    ``timestamps`` (ms since the epoch), None where no record is that recent (Kafka's
    ``offsetsForTimes`` answers null there)."""
    result: dict[PartitionKey, int | None] = {}
    for request in offset_requests(list(timestamps), pb.OFFSET_SPEC_TIMESTAMP, timestamps):
        result.update(timestamps_answered(request, _answers(cluster, request, retry_s)))
    return result


def beginning_offsets(
    cluster: Cluster, partitions: Iterable[PartitionKey], retry_s: float = 30.0
) -> dict[PartitionKey, int]:
    """Each partition's log start offset (the first offset a read can return)."""
    return list_offsets(cluster, partitions, pb.OFFSET_SPEC_EARLIEST, retry_s=retry_s)


def end_offsets(
    cluster: Cluster, partitions: Iterable[PartitionKey], retry_s: float = 30.0
) -> dict[PartitionKey, int]:
    """Each partition's high watermark: the offset after the last record consumers may read."""
    return list_offsets(cluster, partitions, pb.OFFSET_SPEC_LATEST, retry_s=retry_s)


def offsets_for_times(
    cluster: Cluster, timestamps: Mapping[PartitionKey, int], retry_s: float = 30.0
) -> dict[PartitionKey, int]:
    """Each partition's first offset with a timestamp at or after its entry in
    ``timestamps`` (milliseconds since the epoch), else its high watermark."""
    return list_offsets(
        cluster, list(timestamps), pb.OFFSET_SPEC_TIMESTAMP, timestamps, retry_s=retry_s
    )
