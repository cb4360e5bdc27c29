"""Admin client: create, delete, list and describe topics; offsets; cluster metadata;
users, quotas and ACLs; consumer groups.

Every method raises HeadwaterError with the broker's code and message on failure.
Results are the client's own frozen values (headwater.client.admin_types, each field
documented there), built from the gRPC answers by headwater.client.admin_messages: no
method takes or returns a protobuf message (tests/test_layers.py checks the signatures).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from headwater.client import admin_messages, offsets
from headwater.client.admin_types import (
    ClusterMetadata,
    GroupDescription,
    GroupListing,
    OffsetSpec,
    PartitionLag,
    ReplicaLogDescription,
    TopicDescription,
    TopicSummary,
    UserDescription,
)
from headwater.client.connection import Cluster, call
from headwater.client.groups import GroupCalls
from headwater.client.positions import TopicPartition
from headwater.shared.acl_messages import acl_binding, acl_of, filter_binding
from headwater.shared.acls import Acl, AclFilter
from headwater.shared.credentials import ITERATIONS_DEFAULT, MECHANISM, new_salted_password
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.tls import ClientSecurity
from headwater.v1 import headwater_pb2 as pb

CONTROLLER_ANSWERS: Final = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION})
"""Answers of the active controller to a change of a topic (it is the metadata's source,
so "no such topic" is final there, not metadata still on its way): not retried."""


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create: None takes the node's default (``partitions``,
    ``replication_factor``); ``configs`` are topic settings (docs/configuration.md)."""

    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)


class Admin:
    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        request_timeout_s: float = 30.0,
        cluster: Cluster | None = None,
        security: ClientSecurity | None = None,
    ) -> None:
        """``cluster`` shares another client's connections and metadata cache (then its
        ``request_timeout_s`` applies); closing this Admin does not close a shared one.
        ``security``: TLS settings (headwater.shared.tls.ClientSecurity), else the environment's."""
        self._owns_cluster = cluster is None
        self.cluster = cluster or Cluster(
            bootstrap, request_timeout_s=request_timeout_s, security=security
        )
        self._timeout = self.cluster.request_timeout_s

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._owns_cluster:
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
        new = NewTopic(name, partitions, replication_factor, dict(configs or {}))
        return self.create_topics([new], validate_only)[name]

    def create_topics(
        self, topics: Sequence[NewTopic], validate_only: bool = False
    ) -> dict[str, str]:
        """Create many topics in one request (one metadata write); return {name: topic
        id}. Raises the first topic's error, after the others were created."""
        request = pb.CreateTopicsRequest(
            topics=[
                pb.NewTopic(
                    name=t.name,
                    partitions=t.partitions,
                    replication_factor=t.replication_factor,
                    configs=dict(t.configs),
                )
                for t in topics
            ],
            validate_only=validate_only,
        )
        response: pb.CreateTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).CreateTopics(request, timeout=self._timeout),
            retry_s=self._timeout,
        )
        for result in response.results:
            if result.error_code != pb.NONE:
                raise HeadwaterError(ErrorCode(result.error_code), result.error_message)
        return {r.name: r.topic_id for r in response.results}

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
            final=CONTROLLER_ANSWERS,
        )
        self.cluster.invalidate(name)

    def alter_topic_configs(
        self,
        name: str,
        set_configs: Mapping[str, str] | None = None,
        delete_configs: Sequence[str] = (),
        *,
        replace: bool = False,
        validate_only: bool = False,
    ) -> dict[str, str]:
        """Change topic ``name``'s config overrides: set ``set_configs``, remove
        ``delete_configs`` (the node's default applies again); with ``replace`` every
        other override is removed too. Names are the node's (``retention_ms``) or Kafka's
        (``retention.ms``). Returns the topic's overrides after the change."""
        changes = [pb.TopicConfigChange(name=k, value=v) for k, v in (set_configs or {}).items()]
        changes += [pb.TopicConfigChange(name=k) for k in delete_configs]
        response = self.cluster.call_any(
            lambda a: self.cluster.admin(a).AlterTopicConfigs(
                pb.AlterTopicConfigsRequest(
                    topic=name, changes=changes, replace=replace, validate_only=validate_only
                ),
                timeout=self._timeout,
            ),
            retry_s=self._timeout,
            final=CONTROLLER_ANSWERS,
        )
        self.cluster.invalidate(name)
        return dict(response.configs)

    def reassign_partition(self, name: str, partition: int, replicas: Sequence[int]) -> None:
        """Start moving a partition to ``replicas`` (see the Admin.ReassignPartition RPC)."""
        self.cluster.call_any(
            lambda a: self.cluster.admin(a).ReassignPartition(
                pb.ReassignPartitionRequest(topic=name, partition=partition, replicas=replicas),
                timeout=self._timeout,
            ),
            retry_s=self._timeout,
            final=CONTROLLER_ANSWERS,
        )
        self.cluster.invalidate(name)

    # ------------------------------------------------------------------ ACLs and users

    def _admin_call(self, method: str, request: object) -> object:
        return self.cluster.call_any(
            lambda a: getattr(self.cluster.admin(a), method)(request, timeout=self._timeout),
            retry_s=self._timeout,
        )

    def create_acls(self, acls: Sequence[Acl]) -> None:
        """Store ``acls`` (headwater.shared.acls.parse_acl makes one from text); ones that exist
        already are left as they are."""
        self._admin_call(
            "CreateAcls", pb.CreateAclsRequest(acls=[acl_binding(acl) for acl in acls])
        )

    def describe_acls(self, acl_filter: AclFilter | None = None) -> list[Acl]:
        """The stored ACLs that match ``acl_filter`` (all of them without one)."""
        response = self._admin_call(
            "DescribeAcls", pb.DescribeAclsRequest(filter=filter_binding(acl_filter))
        )
        assert isinstance(response, pb.DescribeAclsResponse)
        return [acl_of(binding) for binding in response.acls]

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[Acl]:
        """Remove every ACL matching any of ``filters``; return the ones removed."""
        response = self._admin_call(
            "DeleteAcls", pb.DeleteAclsRequest(filters=[filter_binding(f) for f in filters])
        )
        assert isinstance(response, pb.DeleteAclsResponse)
        return [acl_of(binding) for binding in response.deleted]

    def upsert_user(self, name: str, password: str, iterations: int = ITERATIONS_DEFAULT) -> None:
        """Set user ``name``'s password (creating the user). The password is salted and
        hashed here (PBKDF2, ``iterations``); only the salted form is sent."""
        salt, salted = new_salted_password(password, iterations)
        upsertion = pb.UserCredentialUpsertion(
            name=name,
            mechanism=MECHANISM,
            iterations=iterations,
            salt=salt,
            salted_password=salted,
        )
        self._admin_call(
            "AlterUserCredentials", pb.AlterUserCredentialsRequest(upsertions=[upsertion])
        )

    def delete_user(self, name: str) -> None:
        self._admin_call("AlterUserCredentials", pb.AlterUserCredentialsRequest(deletions=[name]))

    def list_users(self) -> list[UserDescription]:
        """Every user with SCRAM credentials: name, mechanism and iterations (no keys)."""
        response = self._admin_call("DescribeUsers", pb.DescribeUsersRequest())
        assert isinstance(response, pb.DescribeUsersResponse)
        return [admin_messages.user_of(user) for user in response.users]

    def alter_quotas(
        self,
        entity_type: str,
        entity_name: str,
        rates: Mapping[str, float] | None = None,
        remove: Sequence[str] = (),
    ) -> None:
        """Set ``rates`` (quota key -> rate) and remove the ``remove`` keys of one entity:
        ``entity_type`` "user" or "client-id", ``entity_name`` "" for the type's default
        (headwater.shared.quotas)."""
        entries = [
            pb.QuotaEntry(entity_type=entity_type, entity_name=entity_name, key=k, value=v)
            for k, v in (rates or {}).items()
        ] + [
            pb.QuotaEntry(entity_type=entity_type, entity_name=entity_name, key=k, remove=True)
            for k in remove
        ]
        self._admin_call("AlterQuotas", pb.AlterQuotasRequest(entries=entries))

    def describe_quotas(self) -> list[tuple[str, str, str, float]]:
        """Every quota: (entity type, entity name ('' for a default), key, rate)."""
        response = self._admin_call("DescribeQuotas", pb.DescribeQuotasRequest())
        assert isinstance(response, pb.DescribeQuotasResponse)
        return [(e.entity_type, e.entity_name, e.key, e.value) for e in response.entries]

    # ------------------------------------------------------------------ topics

    def list_topics(self, include_internal: bool = False) -> list[TopicSummary]:
        """Every topic, sorted by name; internal ones (names starting with "__") only with
        ``include_internal``."""
        response: pb.ListTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).ListTopics(
                pb.ListTopicsRequest(include_internal=include_internal), timeout=self._timeout
            )
        )
        return [admin_messages.topic_summary_of(t) for t in response.topics]

    def describe_topics(self, names: Sequence[str] = ()) -> list[TopicDescription]:
        """The topics ``names`` in that order (every topic, by name, when empty): configs,
        partitions with their replicas and the leaders' logs."""
        response: pb.DescribeTopicsResponse = self.cluster.call_any(
            lambda a: self.cluster.admin(a).DescribeTopics(
                pb.DescribeTopicsRequest(names=list(names)), timeout=self._timeout
            )
        )
        return [admin_messages.topic_description_of(t) for t in response.topics]

    def list_offsets(
        self,
        topic: str,
        spec: OffsetSpec = OffsetSpec.LATEST,
        timestamp_ms: int = 0,
        partitions: Sequence[int] = (),
    ) -> dict[int, int]:
        """{partition: offset} for earliest, latest (high watermark) or a timestamp
        (``timestamp_ms``, ms since the epoch), of ``partitions`` (every partition of the
        topic when empty)."""
        wanted = partitions or range(self.cluster.layout(topic).partitions)
        keys = [(topic, p) for p in wanted]
        wire_spec = admin_messages.OFFSET_SPECS[spec]
        stamps = offsets.one_timestamp(keys, wire_spec, timestamp_ms)
        found = offsets.list_offsets(self.cluster, keys, wire_spec, stamps, retry_s=self._timeout)
        return {partition: offset for (_topic, partition), offset in found.items()}

    def beginning_offsets(
        self, partitions: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], int]:
        """{(topic, partition): log start offset} for partitions of any topics."""
        return offsets.beginning_offsets(self.cluster, partitions, retry_s=self._timeout)

    def end_offsets(self, partitions: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """{(topic, partition): high watermark} for partitions of any topics."""
        return offsets.end_offsets(self.cluster, partitions, retry_s=self._timeout)

    def offsets_for_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """{(topic, partition): the first offset with a timestamp at or after the one given
        (ms since the epoch), else the high watermark}."""
        return offsets.offsets_for_times(self.cluster, timestamps, retry_s=self._timeout)

    def offsets_matching_times(
        self, timestamps: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int | None]:
        """{(topic, partition): the first offset with a timestamp at or after the one given
        (ms since the epoch), None where no record is that recent}."""
        return offsets.offsets_matching_times(self.cluster, timestamps, retry_s=self._timeout)

    def partition_counts(self, topics: Sequence[str] = ()) -> dict[str, int]:
        """{topic: partition count} of ``topics`` (all topics when empty) that exist."""
        response = self.cluster.refresh(topics, retry_s=self._timeout)
        return {t.name: len(t.partitions) for t in response.topics}

    def metadata(self, topics: Sequence[str] = ()) -> ClusterMetadata:
        """The cluster's metadata from any node: brokers, controller, and ``topics`` (every
        topic when empty) with their partitions' leaders and replicas."""
        return admin_messages.cluster_metadata_of(self.cluster.refresh(topics))

    def describe_replica_log(
        self, address: str, topic: str, partition: int, start_offset: int = 0, end_offset: int = 0
    ) -> ReplicaLogDescription:
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
        return admin_messages.replica_log_of(response)

    def node_metadata(self, address: str, include_digest: bool = True) -> ClusterMetadata:
        """The metadata as the node at ``address`` holds it (asked of that node only): its
        image's offset and, with ``include_digest``, the image's SHA-256
        (``metadata_digest``), for checking that nodes applied the same metadata."""
        request = pb.MetadataRequest(include_digest=include_digest)
        response: pb.MetadataResponse = call(
            lambda: self.cluster.broker(address).Metadata(request, timeout=self._timeout),
            address,
        )
        return admin_messages.cluster_metadata_of(response)

    # ------------------------------------------------------------------ groups

    def list_groups(self) -> GroupListing:
        """Every consumer group of the cluster (``unreachable_nodes``: brokers that did not
        answer, whose groups are missing)."""
        response: pb.ListGroupsResponse = self.cluster.call_any(
            lambda a: self.cluster.groups(a).ListGroups(
                pb.ListGroupsRequest(), timeout=self._timeout
            ),
            retry_s=self._timeout,
        )
        return admin_messages.group_listing_of(response)

    def describe_group(self, group_id: str) -> GroupDescription:
        """The group's state, members with their assignments, and committed offsets
        (GROUP_ID_NOT_FOUND when it does not exist)."""
        response: pb.DescribeGroupResponse = GroupCalls(self.cluster, group_id).call(
            "DescribeGroup", pb.DescribeGroupRequest(group_id=group_id)
        )
        return admin_messages.group_description_of(response)

    def group_lag(self, description: GroupDescription) -> list[PartitionLag]:
        """Per partition the group reads or has committed: committed offset, log end and
        lag (the partitions of its members' assignments and of its commits)."""
        committed = {(o.topic, o.partition): o.offset for o in description.offsets}
        owner: dict[tuple[str, int], str] = {}
        for member in description.members:
            for item in [*member.assigned, *member.revoking]:
                for partition in item.partitions:
                    owner[(item.topic, partition)] = member.member_id
        keys = sorted(set(committed) | set(owner))
        ends = self.end_offsets(keys) if keys else {}
        rows = []
        for key in keys:
            offset = committed.get(key)
            end = ends[key]
            lag = max(end - offset, 0) if offset is not None else None
            rows.append(PartitionLag(key[0], key[1], offset, end, lag, owner.get(key, "")))
        return rows

    def delete_group(self, group_id: str) -> None:
        """Delete an empty group and its offsets (NON_EMPTY_GROUP while it has members)."""
        GroupCalls(self.cluster, group_id).call(
            "DeleteGroup", pb.DeleteGroupRequest(group_id=group_id)
        )

    def group_offsets(self, group_id: str) -> dict[TopicPartition, int]:
        """The group's committed offsets."""
        found = GroupCalls(self.cluster, group_id).committed()
        return {tp: o.offset for tp, o in found.items()}

    def alter_group_offsets(self, group_id: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Set committed offsets from outside the group (only while it has no members:
        NON_EMPTY_GROUP otherwise); creates the group when it does not exist."""
        GroupCalls(self.cluster, group_id).commit(dict(offsets))
