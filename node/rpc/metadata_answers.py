"""Metadata answers of the ``headwater.v1.Broker`` servicer: the Metadata response and its
TopicMetadata messages, built from this node's metadata image.

A TopicMetadata is built once per image (``MetadataAnswers.topic_metadata``) and kept
until the image moves on to a new offset; a cached message is shared by every answer
built from that image and never changed. ``partition_fields`` gives the fields that
PartitionMetadata and Admin's PartitionDescription share.

Everything here runs on the node's event loop (the servicer's); the cache takes no lock.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from headwater.raft.metadata.image import MetadataImage, PartitionState, TopicImage, image_digest
from headwater.v1 import headwater_pb2 as pb


class MetadataAnswers:
    """Metadata responses of node ``node_id``, with the Raft term and commit index of
    ``quorum_status``. A node whose image names itself the controller while
    ``controller_active`` says it is not (it lost the role and its image has not caught
    up yet: a slow or paused voter) answers "no controller" (-1), never itself."""

    def __init__(
        self,
        node_id: int,
        quorum_status: Callable[[], tuple[int, int]],
        controller_active: Callable[[], bool] = lambda: True,
    ) -> None:
        self.node_id = node_id
        self.quorum_status = quorum_status
        self.controller_active = controller_active
        # TopicMetadata messages built from the image at offset _metadata_offset.
        self._metadata_offset = -1
        self._metadata_cache: dict[str, pb.TopicMetadata] = {}
        self._digest_of: tuple[MetadataImage, bytes] | None = None

    def topic_metadata(self, image: MetadataImage, topic: TopicImage) -> pb.TopicMetadata:
        """Built once per image (a 3,000-partition topic costs ~10 ms to build)."""
        if image.offset != self._metadata_offset:
            self._metadata_offset = image.offset
            self._metadata_cache = {}
        cached = self._metadata_cache.get(topic.name)
        if cached is None:
            cached = self._metadata_cache[topic.name] = _topic_metadata(topic)
        return cached

    def _digest(self, image: MetadataImage) -> bytes:
        """The image's digest, computed once per image (it serialises every topic, ACL
        and user)."""
        cached = self._digest_of
        if cached is None or cached[0] is not image:
            cached = self._digest_of = (image, image_digest(image))
        return cached[1]

    def response(
        self, image: MetadataImage, topics: list[pb.TopicMetadata], include_digest: bool
    ) -> pb.MetadataResponse:
        """The Metadata response of ``image`` for ``topics``; with the image's digest when
        ``include_digest``."""
        brokers = [
            pb.BrokerInfo(
                node_id=b.node_id,
                address=b.address,
                rack=b.rack,
                state=b.state,
                broker_epoch=b.broker_epoch,
                log_dir_problem=b.log_dir_problem,
            )
            for b in sorted(image.brokers.values(), key=lambda b: b.node_id)
        ]
        term, commit_index = self.quorum_status()
        controller_id = image.controller_id
        if controller_id == self.node_id and not self.controller_active():
            controller_id = -1
        return pb.MetadataResponse(
            brokers=brokers,
            controller_id=controller_id,
            cluster_id=image.cluster_id,
            topics=topics,
            raft_term=term,
            raft_commit_index=commit_index,
            metadata_offset=image.offset,
            node_id=self.node_id,
            metadata_digest=self._digest(image) if include_digest else b"",
        )


def partition_fields(p: PartitionState) -> dict[str, Any]:
    """The fields PartitionMetadata and PartitionDescription share, from the image."""
    return {
        "partition": p.partition,
        "leader": p.leader,
        "leader_epoch": p.leader_epoch,
        "replicas": p.replicas,
        "isr": p.isr,
        "partition_epoch": p.partition_epoch,
        "adding_replicas": p.adding_replicas,
        "removing_replicas": p.removing_replicas,
    }


def _topic_metadata(topic: TopicImage) -> pb.TopicMetadata:
    return pb.TopicMetadata(
        name=topic.name,
        topic_id=topic.topic_id,
        partitions=[pb.PartitionMetadata(**partition_fields(p)) for p in topic.partitions],
    )
