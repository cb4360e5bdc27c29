"""The ``headwater.v1.Admin`` servicer: topic administration on any node.

Changes (create, delete, add partitions, reassign) are decisions of the active
controller: this node makes them itself when it is the active controller, and otherwise
forwards the call to it (one hop). After a forwarded change succeeds, the node waits (up
to ``METADATA_WAIT_S``) until its own image shows it, so a client that next asks this
node sees its change.

Reads (list, describe) answer from this node's image; DescribeTopics asks each partition's
leader for the log figures (start and end offsets, high watermark, size), which only the
leader knows, and every replica's node for what it set aside from its replica.

DescribeReplicaLog answers for this node's own replica (never forwarded): its offsets and
a SHA-256 of its stored batches over a range, so that a caller asking every replica's
node can compare the replicas byte for byte (``headwater debug compare-replicas``).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import heapq
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import grpc

from headwater.log import batch as batch_format
from headwater.log.api import PartitionLog
from headwater.log.file_log import FileLog
from headwater.node.clock import now_ms
from headwater.node.cluster.cluster_state import ClusterState
from headwater.node.cluster.controller import ControllerDriver
from headwater.node.cluster.peers import (
    FORWARDED,
    LOCAL_ONLY_KEY,
    Peers,
    is_forwarded,
    is_local_only,
    peer_error,
)
from headwater.node.config import NodeConfig
from headwater.node.core.limits import distinct, yield_every
from headwater.node.core.topic_admin import METADATA_WAIT_S, TopicAdmin
from headwater.node.replicas.log_manager import LogManager
from headwater.node.replicas.partition import Partition
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.node.rpc.metadata_answers import partition_fields
from headwater.node.security.authorizer import Authorizer
from headwater.raft.metadata import decisions
from headwater.raft.metadata.image import MetadataImage, TopicImage
from headwater.shared.acl_messages import acl_binding, acl_of, filter_of
from headwater.shared.acls import Operation, ResourceType
from headwater.shared.credentials import MECHANISM, credential_from_salted
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.quotas import check_quota_changes
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

T = TypeVar("T")
DESCRIBE_PEER_TIMEOUT_S: Final = 2.0
REPLICA_READ_BYTES: Final = 1 << 20
"""Bytes read per step while hashing a replica (DescribeReplicaLog)."""
REPLICA_HASH_BYTES_MAX: Final = 256 << 20
"""Bytes one DescribeReplicaLog hashes at most; the caller asks again for the rest."""
REPLICA_HASHES_AT_ONCE: Final = 2
"""DescribeReplicaLog calls hashing at once on a node; more are refused (retriable)."""


class AdminService(pb_grpc.AdminServicer):
    def __init__(
        self,
        config: NodeConfig,
        logs: LogManager,
        state: ClusterState,
        peers: Peers,
        controller: ControllerDriver | None,
        *,
        authorizer: Authorizer,
    ) -> None:
        self.config = config
        self.auth = authorizer
        self.logs = logs
        self.state = state
        self.peers = peers
        self.controller = controller
        self.forward = ForwardToController(peers)
        self.topics = TopicAdmin(config, state, controller, self.forward, authorizer=authorizer)
        self._hashing = 0  # DescribeReplicaLog calls hashing now

    async def _decide(
        self,
        context: grpc.aio.ServicerContext[Any, Any] | None,
        method: str,
        request: Any,
        decide: Callable[[ControllerDriver, MetadataImage, int], decisions.ControllerResult[T]],
    ) -> T | Any:
        """Run ``decide`` on the active controller: here (returns its response) or there
        (returns the forwarded call's gRPC response)."""
        address = self.topics.controller_address(context is not None and is_forwarded(context))
        if address is None:
            assert self.controller is not None  # the active controller is this node
            response, _ = await self.controller.run(functools.partial(decide, self.controller))
            return response
        return await self.forward.call(address, method, request)

    # ------------------------------------------------------------------ changes

    @rpc_handler
    async def CreateTopics(
        self, request: pb.CreateTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateTopicsResponse:
        self.topics.check_topics_named(len(request.topics))  # before they are translated
        wanted = [
            decisions.NewTopic(
                name=t.name,
                partitions=t.partitions if t.HasField("partitions") else None,
                replication_factor=t.replication_factor
                if t.HasField("replication_factor")
                else None,
                configs=dict(t.configs),
            )
            async for t in yield_every(request.topics)
        ]
        outcomes = await self.topics.create_topics(
            wanted, request.validate_only, is_forwarded(context)
        )
        return pb.CreateTopicsResponse(results=[_result(o) async for o in yield_every(outcomes)])

    @rpc_handler
    async def DeleteTopics(
        self, request: pb.DeleteTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteTopicsResponse:
        outcomes = await self.topics.delete_topics(list(request.names), is_forwarded(context))
        return pb.DeleteTopicsResponse(results=[_result(o) async for o in yield_every(outcomes)])

    @rpc_handler
    async def CreatePartitions(
        self, request: pb.CreatePartitionsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreatePartitionsResponse:
        await self.topics.create_partitions(
            request.topic, request.partitions, is_forwarded(context)
        )
        return pb.CreatePartitionsResponse()

    @rpc_handler
    async def AlterTopicConfigs(
        self, request: pb.AlterTopicConfigsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AlterTopicConfigsResponse:
        configs = await self.topics.alter_topic_configs(
            request.topic,
            [(c.name, c.value if c.HasField("value") else None) for c in request.changes],
            request.replace,
            request.validate_only,
            is_forwarded(context),
        )
        return pb.AlterTopicConfigsResponse(configs=configs)

    @rpc_handler
    async def ReassignPartition(
        self, request: pb.ReassignPartitionRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ReassignPartitionResponse:
        self.auth.require_cluster(Operation.ALTER)
        replicas = tuple(request.replicas)
        await self._decide(
            context,
            "ReassignPartition",
            request,
            lambda controller, image, epoch: decisions.reassign_partition(
                image, epoch, request.topic, request.partition, replicas
            ),
        )
        return pb.ReassignPartitionResponse()

    # ------------------------------------------------------------------ reads

    @rpc_handler
    def ListTopics(
        self, request: pb.ListTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.ListTopicsResponse:
        image = self.state.image
        visible = set(self.auth.visible(ResourceType.TOPIC, image.topics))
        return pb.ListTopicsResponse(
            topics=[
                pb.TopicSummary(
                    name=t.name,
                    topic_id=t.topic_id,
                    partitions=len(t.partitions),
                    replication_factor=t.replication_factor,
                )
                for t in sorted(image.topics.values(), key=lambda t: t.name)
                if (request.include_internal or not t.name.startswith("__")) and t.name in visible
            ]
        )

    @rpc_handler
    async def DescribeTopics(
        self, request: pb.DescribeTopicsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeTopicsResponse:
        image = self.state.image
        asked = distinct(request.names, self.config.topics_max, "topic names", "topics_max")
        for name in asked:
            self.auth.require(Operation.DESCRIBE, ResourceType.TOPIC, name)
        names = asked or self.auth.visible(ResourceType.TOPIC, sorted(image.topics))
        topics = [image.topic_named(name) for name in names]
        local_only = is_local_only(context)
        described = [
            self._describe_local(topic, any_replica=local_only)
            async for topic in yield_every(topics, weight=lambda t: len(t.partitions))
        ]
        if not local_only:
            await self._fill_from_replicas(image, topics, described)
        return pb.DescribeTopicsResponse(topics=described)

    def _describe_local(self, topic: TopicImage, any_replica: bool) -> pb.TopicDescription:
        """The topic from the image, with log figures for the partitions led here (with
        ``any_replica``: for every replica hosted here, leader or not) and -1 for the
        others. A leader adds its view of each follower."""
        partitions = []
        for p in topic.partitions:
            description = pb.PartitionDescription(
                **partition_fields(p),
                log_start_offset=-1,
                log_end_offset=-1,
                high_watermark=-1,
                size_bytes=-1,
                segment_count=-1,
                cleanable_ratio=-1,
                cleaned_offset=-1,
            )
            local = self.logs.partition(topic.name, p.partition)
            if local is not None and (any_replica or p.leader == self.config.node_id):
                _fill_log_figures(description, local.log, local.high_watermark)
            if local is not None and local.is_leader:
                description.followers.extend(_followers(local))
            if local is not None and local.damage_report:
                description.damaged_replicas.append(
                    pb.ReplicaDamage(node_id=self.config.node_id, damage=local.damage_report)
                )
            partitions.append(description)
        return pb.TopicDescription(
            name=topic.name,
            topic_id=topic.topic_id,
            configs=self.config.topic_defaults() | dict(topic.configs),
            partitions=partitions,
            config_overrides=sorted(topic.configs),
        )

    async def _fill_from_replicas(
        self,
        image: MetadataImage,
        topics: list[TopicImage],
        described: list[pb.TopicDescription],
    ) -> None:
        """Ask every other node that hosts a replica of the topics: for the log figures of
        the partitions it leads (only the leader knows them), and for what it set aside
        from any replica it hosts (``damaged_replicas``). One call per node, in parallel."""
        wanted: dict[int, set[str]] = {}
        for topic in topics:
            for p in topic.partitions:
                for node_id in {p.leader, *p.replicas}:
                    if node_id >= 0 and node_id != self.config.node_id:
                        wanted.setdefault(node_id, set()).add(topic.name)
        answers = await asyncio.gather(
            *(self._describe_on(image, node_id, names) for node_id, names in wanted.items())
        )
        by_name = {d.name: d for d in described}
        for node_id, answer in zip(wanted, answers, strict=True):
            for theirs in answer.topics if answer is not None else ():
                ours = by_name.get(theirs.name)
                if ours is None or ours.topic_id != theirs.topic_id:
                    continue
                for mine, remote in zip(ours.partitions, theirs.partitions, strict=False):
                    mine.damaged_replicas.extend(
                        d for d in remote.damaged_replicas if d.node_id == node_id
                    )
                    if mine.leader == node_id and remote.high_watermark >= 0:
                        mine.log_start_offset = remote.log_start_offset
                        mine.log_end_offset = remote.log_end_offset
                        mine.high_watermark = remote.high_watermark
                        mine.size_bytes = remote.size_bytes
                        mine.segment_count = remote.segment_count
                        mine.cleanable_ratio = remote.cleanable_ratio
                        mine.cleaned_offset = remote.cleaned_offset
                        mine.followers.extend(remote.followers)
                        mine.producers.extend(remote.producers)

    async def _describe_on(
        self, image: MetadataImage, node_id: int, names: set[str]
    ) -> pb.DescribeTopicsResponse | None:
        """``names`` as the node ``node_id`` describes its own replicas (None when it
        cannot be asked: its figures stay -1)."""
        address = image.broker_internal_address(node_id)
        if not address:
            return None
        try:
            answer: pb.DescribeTopicsResponse = await self.peers.admin(address).DescribeTopics(
                pb.DescribeTopicsRequest(names=sorted(names)),
                metadata=((LOCAL_ONLY_KEY, "1"),),
                timeout=DESCRIBE_PEER_TIMEOUT_S,
            )
        except grpc.RpcError:
            return None
        return answer

    def _hash_done(self, _work: asyncio.Future[ReplicaHash]) -> None:
        self._hashing -= 1

    @rpc_handler
    async def DescribeReplicaLog(
        self, request: pb.DescribeReplicaLogRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeReplicaLogResponse:
        """This node's replica only, never forwarded: a caller compares the replicas by
        asking each of their nodes. The hashing runs in a worker thread (logs are
        thread-safe) so that a large range does not hold up the event loop."""
        self.auth.require_cluster(Operation.DESCRIBE)
        local = self.logs.partition(request.topic, request.partition)
        if local is None:
            raise HeadwaterError(
                ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                f"node {self.config.node_id} hosts no replica of "
                f"{request.topic}-{request.partition}",
            )
        response = pb.DescribeReplicaLogResponse(
            node_id=self.config.node_id,
            log_start_offset=local.log.log_start_offset,
            high_watermark=local.high_watermark,
            log_end_offset=local.log.log_end_offset,
            leader_epoch=local.leader_epoch,
            is_leader=local.is_leader,
            damage=local.damage_report,
        )
        if request.end_offset <= request.start_offset:
            response.covered_start_offset = response.covered_end_offset = -1
            response.sha256 = hashlib.sha256().digest()
            return response
        if self._hashing >= REPLICA_HASHES_AT_ONCE:
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"node {self.config.node_id} is hashing {self._hashing} replica ranges, the "
                f"most it hashes at once ({REPLICA_HASHES_AT_ONCE}); retry shortly",
            )
        self._hashing += 1
        # Counted until the thread is done, not until the call is: a cancelled call leaves
        # its thread hashing.
        work = asyncio.ensure_future(
            asyncio.to_thread(
                hash_log_range,
                local.log,
                request.start_offset,
                request.end_offset,
                REPLICA_HASH_BYTES_MAX,
            )
        )
        work.add_done_callback(self._hash_done)
        hashed = await asyncio.shield(work)
        response.covered_start_offset = hashed.covered_start_offset
        response.covered_end_offset = hashed.covered_end_offset
        response.batch_count = hashed.batch_count
        response.size_bytes = hashed.size_bytes
        response.sha256 = hashed.sha256
        return response

    # ------------------------------------------------------------------ ACLs and users

    @rpc_handler
    async def CreateAcls(
        self, request: pb.CreateAclsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CreateAclsResponse:
        self.auth.require_cluster(Operation.ALTER)
        if len(request.acls) > ACLS_PER_REQUEST_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{len(request.acls)} ACLs in one request; at most {ACLS_PER_REQUEST_MAX}",
            )
        acls = [acl_of(binding) for binding in request.acls]
        await self._decide(
            context,
            "CreateAcls",
            request,
            lambda _controller, image, epoch: decisions.create_acls(image, epoch, acls),
        )
        await self.state.wait_until(lambda image: set(acls) <= image.acls, METADATA_WAIT_S)
        return pb.CreateAclsResponse()

    @rpc_handler
    def DescribeAcls(
        self, request: pb.DescribeAclsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeAclsResponse:
        self.auth.require_cluster(Operation.DESCRIBE)
        wanted = filter_of(request.filter)
        return pb.DescribeAclsResponse(
            acls=[acl_binding(acl) for acl in sorted(self.state.image.acls) if wanted.matches(acl)]
        )

    @rpc_handler
    async def DeleteAcls(
        self, request: pb.DeleteAclsRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DeleteAclsResponse:
        self.auth.require_cluster(Operation.ALTER)
        if not 1 <= len(request.filters) <= ACLS_PER_REQUEST_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{len(request.filters)} filters; valid: 1 to {ACLS_PER_REQUEST_MAX}",
            )
        filters = [filter_of(f) for f in request.filters]
        answer = await self._decide(
            context,
            "DeleteAcls",
            request,
            lambda _controller, image, epoch: decisions.delete_acls(image, epoch, filters),
        )
        if not isinstance(answer, pb.DeleteAclsResponse):
            answer = pb.DeleteAclsResponse(deleted=[acl_binding(acl) for acl in answer])
        gone = {acl_of(binding) for binding in answer.deleted}
        await self.state.wait_until(lambda image: not gone & image.acls, METADATA_WAIT_S)
        return answer

    @rpc_handler
    async def AlterUserCredentials(
        self,
        request: pb.AlterUserCredentialsRequest,
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> pb.AlterUserCredentialsResponse:
        self.auth.require_cluster(Operation.ALTER)
        if len(request.upsertions) + len(request.deletions) > ACLS_PER_REQUEST_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"at most {ACLS_PER_REQUEST_MAX} users in one request",
            )
        upsertions = []
        for u in request.upsertions:
            if u.mechanism != MECHANISM:
                raise HeadwaterError(
                    ErrorCode.INVALID_REQUEST,
                    f"mechanism {u.mechanism[:40]!r} for user {u.name[:128]!r}; valid: {MECHANISM}",
                )
            credential = credential_from_salted(u.salted_password, u.salt, u.iterations)
            upsertions.append(decisions.UserUpsertion(u.name, credential))
        deletions = list(request.deletions)
        await self._decide(
            context,
            "AlterUserCredentials",
            request,
            lambda _controller, image, epoch: decisions.alter_users(
                image, epoch, upsertions, deletions
            ),
        )
        await self.state.wait_until(
            lambda image: (
                all(image.users.get(u.name) == u.credential for u in upsertions)
                and not set(deletions) & set(image.users)
            ),
            METADATA_WAIT_S,
        )
        return pb.AlterUserCredentialsResponse()

    @rpc_handler
    def DescribeUsers(
        self, request: pb.DescribeUsersRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeUsersResponse:
        self.auth.require_cluster(Operation.DESCRIBE)
        return pb.DescribeUsersResponse(
            users=[
                pb.UserDescription(
                    name=name, mechanism=credential.mechanism, iterations=credential.iterations
                )
                for name, credential in sorted(self.state.image.users.items())
            ]
        )

    @rpc_handler
    async def AlterQuotas(
        self, request: pb.AlterQuotasRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AlterQuotasResponse:
        self.auth.require_cluster(Operation.ALTER)
        if not 1 <= len(request.entries) <= ACLS_PER_REQUEST_MAX:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"{len(request.entries)} quota entries; valid: 1 to {ACLS_PER_REQUEST_MAX}",
            )
        changes = [
            (e.entity_type, e.entity_name, e.key, None if e.remove else e.value)
            for e in request.entries
        ]
        check_quota_changes(changes)  # refused here, at once, before any forwarding
        await self._decide(
            context,
            "AlterQuotas",
            request,
            lambda _controller, image, epoch: decisions.alter_quotas(image, epoch, changes),
        )

        def applied(image: MetadataImage) -> bool:
            return all(
                image.quotas.get((t, n), {}).get(k) == (None if v is None else float(v))
                for t, n, k, v in changes
            )

        await self.state.wait_until(applied, METADATA_WAIT_S)
        return pb.AlterQuotasResponse()

    @rpc_handler
    def DescribeQuotas(
        self, request: pb.DescribeQuotasRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.DescribeQuotasResponse:
        self.auth.require_cluster(Operation.DESCRIBE)
        return pb.DescribeQuotasResponse(
            entries=[
                pb.QuotaEntry(entity_type=entity_type, entity_name=name, key=key, value=value)
                for (entity_type, name), rates in sorted(self.state.image.quotas.items())
                for key, value in sorted(rates.items())
            ]
        )


ACLS_PER_REQUEST_MAX: Final = 10_000
"""ACLs (or filters, or users) one request may carry."""


@dataclass(frozen=True, slots=True)
class ReplicaHash:
    """What ``hash_log_range`` hashed: whole batches covering [covered_start_offset,
    covered_end_offset) (both -1 when none), their count, bytes and SHA-256."""

    covered_start_offset: int
    covered_end_offset: int
    batch_count: int
    size_bytes: int
    sha256: bytes


def hash_log_range(
    log: PartitionLog, start_offset: int, end_offset: int, bytes_max: int
) -> ReplicaHash:
    """SHA-256 of the stored batches holding offsets in [start_offset, end_offset), cut to
    the log's [log_start_offset, log_end_offset): whole batches, bytes as stored. It stops
    at the first read that reaches ``bytes_max`` bytes (the covered end says where), so
    two replicas holding the same batches stop at the same one."""
    digest = hashlib.sha256()
    offset = max(start_offset, log.log_start_offset)
    bound = min(end_offset, log.log_end_offset)
    first = last = -1
    batches = size = 0
    while offset < bound:
        read = log.read(offset, min(REPLICA_READ_BYTES, bytes_max - size), upper_bound=bound)
        if not read.data or read.next_offset <= offset:
            break
        for _position, header in batch_format.iter_headers(read.data, verify_crc=False):
            first = header.base_offset if first < 0 else first
            last = header.next_offset
            batches += 1
        digest.update(read.data)
        size += len(read.data)
        offset = read.next_offset
        if size >= bytes_max:
            break
    return ReplicaHash(first, last, batches, size, digest.digest())


PRODUCERS_DESCRIBED_MAX: Final = 1000
"""Most producers one partition's description lists (the most recently active)."""


def _fill_log_figures(description: pb.PartitionDescription, log: Any, high_watermark: int) -> None:
    description.log_start_offset = log.log_start_offset
    description.log_end_offset = log.log_end_offset
    description.high_watermark = high_watermark
    description.size_bytes = log.size_bytes
    description.segment_count = log.segment_count
    if isinstance(log, FileLog) and log.config.compacted:
        description.cleanable_ratio = log.cleanable_ratio(now_ms(), high_watermark)
        description.cleaned_offset = log.cleaned_offset
    producers = heapq.nlargest(
        PRODUCERS_DESCRIBED_MAX,
        log.producer_states.items(),
        key=lambda item: item[1].last_timestamp_ms,
    )
    description.producers.extend(
        pb.ProducerState(
            producer_id=producer_id,
            producer_epoch=entry.epoch,
            next_sequence=entry.next_sequence,
            last_offset=entry.batches[-1].last_offset if entry.batches else -1,
            last_timestamp_ms=entry.last_timestamp_ms,
        )
        for producer_id, entry in sorted(producers)
    )


def _followers(partition: Partition) -> list[pb.ReplicaProgress]:
    end = partition.log.log_end_offset
    now = now_ms()
    return [
        pb.ReplicaProgress(
            node_id=node_id,
            log_end_offset=progress.log_end_offset,
            lag_records=end - progress.log_end_offset if progress.log_end_offset >= 0 else -1,
            # A follower at the leader's end is caught up now, fetching or not.
            caught_up_ms_ago=(
                0 if progress.log_end_offset >= end else now - progress.last_caught_up_ms
            ),
        )
        for node_id, progress in sorted(partition.followers.items())
    ]


def _result(outcome: decisions.TopicOutcome) -> pb.TopicResult:
    result = pb.TopicResult(name=outcome.name)
    if outcome.error is not None:
        result.error_code = pb.ErrorCode.ValueType(outcome.error.code)
        result.error_message = outcome.error.message
        result.retriable = outcome.error.retriable
    else:
        result.topic_id = outcome.topic_id
    return result


def _outcome(result: pb.TopicResult) -> decisions.TopicOutcome:
    """A controller's topic result as an outcome."""
    if result.error_code == pb.NONE:
        return decisions.TopicOutcome(result.name, topic_id=result.topic_id)
    return decisions.TopicOutcome(
        result.name, HeadwaterError(ErrorCode(result.error_code), result.error_message)
    )


class ForwardToController:
    """``TopicAdmin``'s way to the active controller: the Admin service's calls on it,
    marked forwarded (it answers them itself or refuses; never passes them on)."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    async def call(self, address: str, method: str, request: Any) -> Any:
        """The Admin service's ``method`` on the node at ``address``, marked forwarded; its
        refusal raised as this node's error."""
        try:
            return await getattr(self.peers.admin(address), method)(
                request, metadata=FORWARDED, timeout=self.peers.timeout_s
            )
        except grpc.RpcError as error:
            raise peer_error(error, address) from None

    async def create_topics(
        self, address: str, wanted: Sequence[decisions.NewTopic], validate_only: bool
    ) -> list[decisions.TopicOutcome]:
        topics = []
        async for topic in yield_every(wanted):
            spec = pb.NewTopic(name=topic.name, configs=dict(topic.configs))
            if topic.partitions is not None:
                spec.partitions = topic.partitions
            if topic.replication_factor is not None:
                spec.replication_factor = topic.replication_factor
            topics.append(spec)
        answer = await self.call(
            address,
            "CreateTopics",
            pb.CreateTopicsRequest(topics=topics, validate_only=validate_only),
        )
        return [_outcome(r) async for r in yield_every(answer.results)]

    async def delete_topics(
        self, address: str, names: Sequence[str]
    ) -> list[decisions.TopicOutcome]:
        answer = await self.call(address, "DeleteTopics", pb.DeleteTopicsRequest(names=names))
        return [_outcome(r) async for r in yield_every(answer.results)]

    async def create_partitions(self, address: str, topic: str, count: int) -> None:
        await self.call(
            address,
            "CreatePartitions",
            pb.CreatePartitionsRequest(topic=topic, partitions=count),
        )

    async def alter_topic_configs(
        self,
        address: str,
        topic: str,
        changes: Mapping[str, str | None],
        replace: bool,
        validate_only: bool,
    ) -> dict[str, str]:
        answer = await self.call(
            address,
            "AlterTopicConfigs",
            pb.AlterTopicConfigsRequest(
                topic=topic,
                changes=[
                    pb.TopicConfigChange(name=name)
                    if value is None
                    else pb.TopicConfigChange(name=name, value=value)
                    for name, value in changes.items()
                ],
                replace=replace,
                validate_only=validate_only,
            ),
        )
        return dict(answer.configs)
