"""The Kafka front's group requests: FindCoordinator, the classic protocol (JoinGroup,
SyncGroup, Heartbeat, LeaveGroup), the consumer protocol (ConsumerGroupHeartbeat, on
the server-side groups gRPC members use), OffsetCommit, OffsetFetch, ListGroups,
DescribeGroups and DeleteGroups: translations over ``GroupCore`` (who may do what, where
a group is coordinated, listings, descriptions) and ``ClassicGroups`` (the classic
protocol's groups). Kafka clients send these to the group's coordinator
(FindCoordinator names it); another node answers NOT_COORDINATOR and the client asks
again. A commit refused on a topic is refused for that topic's partitions only, as
Kafka does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Final

from headwater.node.core.limits import yield_every
from headwater.node.groups.classic import GroupProtocolError
from headwater.node.groups.classic_groups import ClassicGroups
from headwater.node.groups.consumer_protocol import assignment_within, subscription_within
from headwater.node.groups.core import GroupCore
from headwater.node.groups.decisions import CommitItem
from headwater.node.kafka import consumer_heartbeat, protocol
from headwater.node.kafka.answers import code_of, message_of, names_by_id, ready, topic_uuid
from headwater.node.security.authorizer import current_caller
from headwater.shared.errors import ErrorCode, HeadwaterError

GROUP_KEY_TYPE: Final = 0
PROTOCOL_TYPE: Final = "consumer"
DEAD: Final = "Dead"
TRANSACTIONAL_ID_AUTHORIZATION_FAILED: Final = 53
NO_TRANSACTIONS: Final = (
    "transactions are not served by this broker: produce without transactional.id "
    "(an idempotent producer writes each record once per partition)"
)
MEMBER_ID_REQUIRED_FROM: Final = 4
"""JoinGroup versions from this one get a member id first (KIP-394, MEMBER_ID_REQUIRED)."""


class GroupHandlers:
    """Group requests of the Kafka front (see the module doc)."""

    def __init__(
        self,
        groups: ClassicGroups,
        core: GroupCore,
        kafka_address: Callable[[int], str],
    ) -> None:
        self.groups = groups
        self.core = core
        self.kafka_address = kafka_address

    def by_key(self) -> dict[int, Callable[[protocol.Request], Awaitable[Any]]]:
        return {
            protocol.FIND_COORDINATOR: self.find_coordinator,
            protocol.JOIN_GROUP: self.join_group,
            protocol.SYNC_GROUP: self.sync_group,
            protocol.HEARTBEAT: self.heartbeat,
            protocol.LEAVE_GROUP: self.leave_group,
            protocol.OFFSET_COMMIT: self.offset_commit,
            protocol.OFFSET_FETCH: self.offset_fetch,
            protocol.LIST_GROUPS: self.list_groups,
            protocol.DESCRIBE_GROUPS: self.describe_groups,
            protocol.DELETE_GROUPS: self.delete_groups,
            protocol.CONSUMER_GROUP_HEARTBEAT: self.consumer_group_heartbeat,
        }

    @staticmethod
    def _schema(request: protocol.Request) -> type[Any]:
        return protocol.response_schema(request.api_key, request.api_version)

    # ------------------------------------------------------------------ coordinator

    async def find_coordinator(self, request: protocol.Request) -> Any:
        body = request.body
        key_type = int(getattr(body, "key_type", GROUP_KEY_TYPE))
        answer: dict[str, Any] = {"node_id": -1, "host": "", "port": -1}
        if key_type != GROUP_KEY_TYPE:
            # Kafka's non-retriable code: a transactional producer fails at once
            # (librdkafka retries INVALID_REQUEST every 500 ms until its timeout).
            answer.update(
                error_code=TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error_message=NO_TRANSACTIONS
            )
            return ready(protocol.answer(self._schema(request), **answer))
        try:
            self.core.authorize_coordinator_lookup(body.key)
            _image, _index, leader = await self.core.locate(body.key)
            address = self.kafka_address(leader)
            if not address:
                raise HeadwaterError(
                    ErrorCode.COORDINATOR_NOT_AVAILABLE,
                    f"node {leader} coordinates group {body.key!r} but serves no Kafka listener",
                )
            host, _, port = address.rpartition(":")
            answer.update(error_code=0, node_id=leader, host=host, port=int(port))
        except (HeadwaterError, GroupProtocolError) as error:
            answer.update(error_code=code_of(error), error_message=message_of(error))
        return ready(protocol.answer(self._schema(request), **answer))

    # ------------------------------------------------------------------ classic protocol

    async def join_group(self, request: protocol.Request) -> Any:
        body = request.body
        session_ms = protocol.milliseconds(body.session_timeout)
        rebalance = getattr(body, "rebalance_timeout", None)
        rebalance_ms = protocol.milliseconds(rebalance) if rebalance is not None else session_ms
        caller = current_caller()

        async def answer() -> Any:
            try:
                self.core.authorize_membership(body.group_id)
                joined = await self.groups.join(
                    body.group_id,
                    body.member_id,
                    request.client_id,
                    caller.host,
                    body.protocol_type,
                    [(p.name, bytes(p.metadata)) for p in body.protocols],
                    session_ms,
                    rebalance_ms,
                    member_id_required=request.api_version >= MEMBER_ID_REQUIRED_FROM,
                    instance_id=getattr(body, "group_instance_id", None) or "",
                )
            except (HeadwaterError, GroupProtocolError) as error:
                handed_out = isinstance(error, GroupProtocolError) and error.member_id
                return protocol.answer(
                    self._schema(request),
                    error_code=code_of(error),
                    generation_id=-1,
                    member_id=handed_out or body.member_id,
                )
            return protocol.answer(
                self._schema(request),
                error_code=0,
                generation_id=joined.generation,
                protocol_name=joined.protocol_name,
                leader=joined.leader,
                member_id=joined.member_id,
                members=[{"member_id": m, "metadata": data} for m, data in joined.members],
            )

        return asyncio.ensure_future(answer())

    async def sync_group(self, request: protocol.Request) -> Any:
        body = request.body

        async def answer() -> Any:
            try:
                self.core.authorize_membership(body.group_id)
                assignment = await self.groups.sync(
                    body.group_id,
                    body.member_id,
                    int(body.generation_id),
                    [(a.member_id, bytes(a.assignment)) for a in body.assignments],
                    getattr(body, "group_instance_id", None) or "",
                )
            except (HeadwaterError, GroupProtocolError) as error:
                return protocol.answer(self._schema(request), error_code=code_of(error))
            return protocol.answer(self._schema(request), error_code=0, assignment=assignment)

        return asyncio.ensure_future(answer())

    async def heartbeat(self, request: protocol.Request) -> Any:
        body = request.body
        try:
            self.core.authorize_membership(body.group_id)
            await self.groups.heartbeat(
                body.group_id,
                body.member_id,
                int(body.generation_id),
                getattr(body, "group_instance_id", None) or "",
            )
            code = 0
        except (HeadwaterError, GroupProtocolError) as error:
            code = code_of(error)
        return ready(protocol.answer(self._schema(request), error_code=code))

    async def leave_group(self, request: protocol.Request) -> Any:
        body = request.body
        leaving = (
            [(m.member_id, m.group_instance_id or "") for m in body.members]
            if hasattr(body, "members")
            else [(body.member_id, "")]
        )
        results = []
        code = 0
        try:
            self.core.authorize_membership(body.group_id)
        except HeadwaterError as error:
            code = code_of(error)
        async for member_id, instance_id in yield_every(leaving if code == 0 else []):
            answer = {"member_id": member_id, "group_instance_id": instance_id or None}
            try:
                answer["member_id"] = await self.groups.leave(body.group_id, member_id, instance_id)
                results.append({**answer, "error_code": 0})
            except (HeadwaterError, GroupProtocolError) as error:
                results.append({**answer, "error_code": code_of(error)})
                if len(leaving) == 1:
                    code = code_of(error)
        return ready(
            protocol.answer(
                self._schema(request), entries=len(results), error_code=code, members=results
            )
        )

    # ------------------------------------------------------------------ KIP-848

    async def consumer_group_heartbeat(self, request: protocol.Request) -> Any:
        """A member of a group of Kafka's consumer protocol: the same server-side group
        as a gRPC member's (``consumer_heartbeat``), topics by id (see
        ``headwater.node.kafka.consumer_heartbeat``)."""
        body = request.body

        async def answer() -> Any:
            try:
                # Authorized before anything is looked up; again below with the
                # subscription the group holds for a member that sent none.
                self.core.authorize_heartbeat(
                    body.group_id,
                    body.subscribed_topic_names or (),
                    getattr(body, "subscribed_topic_regex", None) or "",
                )
                index = await self.core.here(body.group_id)
                group = self.core.held(index, body.group_id)
                image = self.core.state.image
                heartbeat = consumer_heartbeat.heartbeat_of(
                    body,
                    request.client_id,
                    current_caller().host,
                    group.members.get(body.member_id) if group else None,
                    group.current.get(body.member_id) if group else None,
                    names_by_id(image),
                )
                self.core.authorize_heartbeat(
                    heartbeat.group_id, heartbeat.subscribed_topics, heartbeat.subscribed_pattern
                )
                joined, interval = await self.core.consumer_heartbeat(index, heartbeat)
            except consumer_heartbeat.HeartbeatShapeError as error:
                return protocol.answer(
                    self._schema(request),
                    error_code=ErrorCode.INVALID_REQUEST,
                    error_message=str(error),
                )
            except (HeadwaterError, GroupProtocolError) as error:
                return protocol.answer(
                    self._schema(request),
                    error_code=code_of(error),
                    error_message=message_of(error),
                )
            image = self.core.state.image
            ids = {
                topic: topic_id
                for topic, _ in joined.assigned
                if (topic_id := topic_uuid(image, topic)) is not None
            }
            return protocol.answer(
                self._schema(request),
                error_code=0,
                member_id=joined.member_id,
                member_epoch=joined.member_epoch,
                heartbeat_interval=interval,
                assignment=(
                    consumer_heartbeat.assignment_of(joined.assigned, ids)
                    if joined.member_epoch >= 0
                    else None
                ),
            )

        return asyncio.ensure_future(answer())

    # ------------------------------------------------------------------ offsets

    async def offset_commit(self, request: protocol.Request) -> Any:
        body = request.body
        generation = int(
            getattr(body, "generation_id_or_member_epoch", getattr(body, "generation_id", -1))
        )
        items = [
            CommitItem(
                topic.name,
                int(p.partition_index),
                int(p.committed_offset),
                p.committed_metadata or "",
                int(getattr(p, "committed_leader_epoch", -1)),
            )
            for topic in body.topics
            for p in topic.partitions
        ]
        try:
            refused = self.core.commit_refusals(body.group_id, (i.topic for i in items))
            allowed = [i for i in items if i.topic not in refused]
            outcomes = (
                await self.groups.commit(
                    body.group_id,
                    body.member_id,
                    generation,
                    allowed,
                    getattr(body, "group_instance_id", None) or "",
                )
                if allowed
                else []
            )
            by_item = dict(zip(((i.topic, i.partition) for i in allowed), outcomes, strict=True))
            codes = {
                (i.topic, i.partition): (
                    int(ErrorCode.TOPIC_AUTHORIZATION_FAILED)
                    if i.topic in refused
                    else code_of(error)
                    if (error := by_item[(i.topic, i.partition)])
                    else 0
                )
                for i in items
            }
        except (HeadwaterError, GroupProtocolError) as error:
            codes = {(i.topic, i.partition): code_of(error) for i in items}
        topics: dict[str, list[dict[str, int]]] = {}
        for item in items:
            topics.setdefault(item.topic, []).append(
                {
                    "partition_index": item.partition,
                    "error_code": codes[(item.topic, item.partition)],
                }
            )
        return ready(
            protocol.answer(
                self._schema(request),
                entries=len(items),
                topics=[{"name": name, "partitions": parts} for name, parts in topics.items()],
            )
        )

    async def offset_fetch(self, request: protocol.Request) -> Any:
        body = request.body
        try:
            self.core.authorize_describe(body.group_id)
            committed = await self.groups.committed(body.group_id)
        except (HeadwaterError, GroupProtocolError) as error:
            return ready(protocol.answer(self._schema(request), error_code=code_of(error)))
        visibility = self.core.topic_visibility()

        def visible(topic: str) -> bool:
            return visibility is None or visibility(topic)

        if body.topics is None:  # every topic the caller may describe, as over gRPC
            wanted: dict[str, list[int]] = {}
            for topic, partition in sorted(committed):
                if visible(topic):
                    wanted.setdefault(topic, []).append(partition)
        else:
            wanted = {t.name: [int(p) for p in t.partition_indexes] for t in body.topics}
        topics: list[dict[str, Any]] = []
        for name, partitions in wanted.items():
            answers: list[dict[str, Any]]
            if not visible(name):
                answers = [
                    {
                        "partition_index": p,
                        "committed_offset": -1,
                        "error_code": int(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                    }
                    for p in partitions
                ]
            else:
                answers = []
                for p in partitions:
                    offset, metadata, epoch = committed.get((name, p), (-1, "", -1))
                    answers.append(
                        {
                            "partition_index": p,
                            "committed_offset": offset,
                            "committed_leader_epoch": epoch,
                            "metadata": metadata,
                            "error_code": 0,
                        }
                    )
            topics.append({"name": name, "partitions": answers})
        entries = sum(len(t["partitions"]) for t in topics)
        return ready(
            protocol.answer(self._schema(request), entries=entries, error_code=0, topics=topics)
        )

    # ------------------------------------------------------------------ listing

    async def list_groups(self, request: protocol.Request) -> Any:
        """The groups this node coordinates, both protocols."""
        listed = {g.group_id for g in self.core.visible_groups(self.core.own_groups())}
        return ready(
            protocol.answer(
                self._schema(request),
                entries=len(listed),
                error_code=0,
                groups=[{"group_id": g, "protocol_type": PROTOCOL_TYPE} for g in sorted(listed)],
            )
        )

    async def describe_groups(self, request: protocol.Request) -> Any:
        """Each group named, once (a group named again is answered once, so an answer
        holds at most the members the node has), a slice of members at a time."""
        described = []
        named = list(dict.fromkeys(request.body.groups))
        async for group_id in yield_every(named, weight=self._members_of):
            entry: dict[str, Any] = {"group_id": group_id, "group_state": DEAD}
            try:
                self.core.authorize_describe(group_id)
                await self.groups.committed(group_id)  # routes: NOT_COORDINATOR elsewhere
                entry.update(self._describe(group_id))
                entry["error_code"] = 0
            except (HeadwaterError, GroupProtocolError) as error:
                entry["error_code"] = code_of(error)
            described.append(entry)
        entries = sum(1 + len(g.get("members", ())) for g in described)
        return ready(protocol.answer(self._schema(request), entries=entries, groups=described))

    def _members_of(self, group_id: str) -> int:
        group = self.groups.groups.get(group_id)
        return 1 + (len(group.members) if group is not None else 0)

    def _describe(self, group_id: str) -> dict[str, Any]:
        """A group as DescribeGroups shows it. With the authorizer on, members'
        subscriptions and assignments name only the topics the caller may describe (as the
        gRPC DescribeGroup's do): re-encoded for the consumer protocol, left empty for a
        protocol the broker cannot read."""
        group = self.groups.groups.get(group_id)
        if group is not None and group.members:
            visible = self.core.topic_visibility()
            readable = group.protocol_type == PROTOCOL_TYPE
            members: list[dict[str, Any]] = []
            for m in group.members.values():
                metadata, assignment = m.metadata_for(group.protocol_name), m.assignment
                if visible is not None:
                    metadata = subscription_within(metadata, visible) if readable else b""
                    assignment = assignment_within(assignment, visible) if readable else b""
                members.append(
                    {
                        "member_id": m.member_id,
                        "group_instance_id": m.instance_id or None,
                        "client_id": m.client_id,
                        "client_host": m.host,
                        "member_metadata": metadata,
                        "member_assignment": assignment,
                    }
                )
            return {
                "group_state": group.state,
                "protocol_type": group.protocol_type,
                "protocol_data": group.protocol_name,
                "members": members,
            }
        state = self.core.group_state(group_id)
        if state is None:
            return {}
        name, consumers = state
        return {
            "group_state": name,
            "protocol_type": PROTOCOL_TYPE,
            "members": [{"member_id": m, "client_id": c} for m, c in consumers],
        }

    async def delete_groups(self, request: protocol.Request) -> Any:
        results = []
        async for group_id in yield_every(request.body.groups_names):
            try:
                self.core.authorize_delete(group_id)
                await self.groups.delete(group_id)
                code = 0
            except (HeadwaterError, GroupProtocolError) as error:
                code = code_of(error)
            results.append({"group_id": group_id, "error_code": code})
        return ready(protocol.answer(self._schema(request), entries=len(results), results=results))
