"""Admin client: create, delete, list and describe topics; offsets; cluster metadata.

Every method raises HeadwaterError with the broker's code and message on failure.
Results are the protobuf messages of headwater.v1 (documented in the .proto file).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from headwater.client.connection import Cluster, call
from headwater.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb


class Admin:
    def __init__(
        self, bootstrap: str | Sequence[str] | None = None, *, request_timeout_s: float = 30.0
    ) -> None:
        self.cluster = Cluster(bootstrap, request_timeout_s=request_timeout_s)
        self._timeout = request_timeout_s

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.cluster.close()

    def create_topic(
        self,
        name: str,
        partitions: int | None = None,
        replication_factor: int | None = None,
        configs: Mapping[str, str] | None = None,
        validate_only: bool = False,
    ) -> str:
        """Create one topic; return its topic id. None means the node's default."""
        request = pb.CreateTopicsRequest(
            topics=[
                pb.NewTopic(
                    name=name,
                    partitions=partitions,
                    replication_factor=replication_factor,
                    configs=dict(configs or {}),
                )
            ],
            validate_only=validate_only,
        )
        response: pb.CreateTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).CreateTopics(request, timeout=self._timeout),
            retry_s=self._timeout,
        )
        result = response.results[0]
        if result.error_code != pb.NONE:
            raise HeadwaterError(ErrorCode(result.error_code), result.error_message)
        return result.topic_id

    def delete_topic(self, name: str) -> None:
        response: pb.DeleteTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).DeleteTopics(
                pb.DeleteTopicsRequest(names=[name]), timeout=self._timeout
            ),
            retry_s=self._timeout,
        )
        result = response.results[0]
        if result.error_code != pb.NONE:
            raise HeadwaterError(ErrorCode(result.error_code), result.error_message)
        self.cluster.invalidate(name)

    def create_partitions(self, name: str, partitions: int) -> None:
        """Grow topic ``name`` to ``partitions`` partitions."""
        self.cluster.call_any(
            lambda a: self.cluster.admin(a).CreatePartitions(
                pb.CreatePartitionsRequest(topic=name, partitions=partitions),
                timeout=self._timeout,
            ),
            retry_s=self._timeout,
        )
        self.cluster.invalidate(name)

    def reassign_partition(self, name: str, partition: int, replicas: Sequence[int]) -> None:
        """Start moving a partition to ``replicas`` (see the Admin.ReassignPartition RPC)."""
        self.cluster.call_any(
            lambda a: self.cluster.admin(a).ReassignPartition(
                pb.ReassignPartitionRequest(topic=name, partition=partition, replicas=replicas),
                timeout=self._timeout,
            ),
            retry_s=self._timeout,
        )
        self.cluster.invalidate(name)

    def list_topics(self, include_internal: bool = False) -> list[pb.TopicSummary]:
        response: pb.ListTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).ListTopics(
                pb.ListTopicsRequest(include_internal=include_internal), timeout=self._timeout
            )
        )
        return list(response.topics)

    def describe_topics(self, names: Sequence[str] = ()) -> list[pb.TopicDescription]:
        response: pb.DescribeTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).DescribeTopics(
                pb.DescribeTopicsRequest(names=list(names)), timeout=self._timeout
            )
        )
        return list(response.topics)

    def list_offsets(
        self,
        topic: str,
        spec: pb.OffsetSpec.ValueType = pb.OFFSET_SPEC_LATEST,
        timestamp_ms: int = 0,
        partitions: Sequence[int] = (),
    ) -> dict[int, int]:
        """{partition: offset} for earliest, latest (high watermark) or a timestamp."""
        request = pb.ListOffsetsRequest(
            topic=topic, partitions=list(partitions), spec=spec, timestamp_ms=timestamp_ms
        )
        response: pb.ListOffsetsResponse = self.cluster.call_leader(
            topic,
            partitions[0] if partitions else 0,
            lambda address: self.cluster.broker(address).ListOffsets(
                request, timeout=self._timeout
            ),
            retry_s=self._timeout,
        )
        return {o.partition: o.offset for o in response.offsets}

    def metadata(self, topics: Sequence[str] = ()) -> pb.MetadataResponse:
        return self.cluster.refresh(topics)

    def describe_replica_log(
        self, address: str, topic: str, partition: int, start_offset: int = 0, end_offset: int = 0
    ) -> pb.DescribeReplicaLogResponse:
        """The replica of ``topic``/``partition`` held by the node at ``address`` (asked of
        that node only, never forwarded): its log start, high watermark, log end and
        leader epoch, and a SHA-256 of its stored batches holding offsets in
        [start_offset, end_offset) (see the DescribeReplicaLog RPC). The default range is
        empty: offsets only. Addresses of the replicas' nodes are in ``metadata()``."""
        request = pb.DescribeReplicaLogRequest(
            topic=topic, partition=partition, start_offset=start_offset, end_offset=end_offset
        )
        response: pb.DescribeReplicaLogResponse = call(
            lambda: self.cluster.admin(address).DescribeReplicaLog(request, timeout=self._timeout),
            address,
        )
        return response

    def node_metadata(self, address: str, include_digest: bool = True) -> pb.MetadataResponse:
        """The metadata as the node at ``address`` holds it (asked of that node only): its
        image's offset and, with ``include_digest``, the image's SHA-256
        (``metadata_digest``), for checking that nodes applied the same metadata."""
        request = pb.MetadataRequest(include_digest=include_digest)
        response: pb.MetadataResponse = call(
            lambda: self.cluster.broker(address).Metadata(request, timeout=self._timeout),
            address,
        )
        return response
