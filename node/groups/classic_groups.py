"""Classic consumer groups (Kafka's JoinGroup protocol): the groups this node coordinates, with
the waiting Kafka's JoinGroup and SyncGroup do (``headwater.node.groups.classic`` holds
the state and its rules), and their offsets in the same ``__consumer_offsets`` as every
group (``GroupCoordinator``).

A group is served where the gRPC groups are: by the leader of its partition of
``__consumer_offsets`` (``GroupCore.route``). A request for a group this node does
not coordinate is answered NOT_COORDINATOR, and a group whose partition this node no
longer leads is dropped from memory (its waiting members are told NOT_COORDINATOR and
find the new coordinator).

Every generation a leader completes (its SyncGroup) is written to the group's partition
(``ClassicGeneration``) before the members get their assignments, and so is a group that
empties. A new coordinator serves the last written generation: its members carry on
(heartbeats and commits of that generation are accepted) and those that stopped are
removed when their session runs out; a rebalance that was gathering when the coordinator
moved starts again at the new one. A group id is either classic or a
KIP-848 group while it has members: a join of a group with KIP-848 members is refused
with INCONSISTENT_GROUP_PROTOCOL, as Kafka does.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

from headwater.node.config import NodeConfig
from headwater.node.groups import classic
from headwater.node.groups.classic import ClassicError, ClassicGroup, GroupProtocolError
from headwater.node.groups.consumer_protocol import assigned_partitions, subscribed_topics
from headwater.node.groups.coordinator import GroupCoordinator
from headwater.node.groups.core import ClassicMemberView, ClassicView, GroupCore
from headwater.node.groups.decisions import SESSION_TIMEOUT_RANGE_MS, CommitItem
from headwater.node.groups.records import OFFSETS_TOPIC, ClassicGeneration
from headwater.shared.errors import ErrorCode, HeadwaterError

_log = logging.getLogger(__name__)
EXPIRY_CHECK_S: Final = 0.5
INITIAL_JOIN_DELAY_MS: Final = 500
"""A group with no members waits this long after its first join for more (Kafka's
``group.initial.rebalance.delay.ms``, shorter): consumers started together share one
rebalance instead of one each."""
ADMIN_MEMBER_EPOCH: Final = -1
HELD_BYTES_MAX: Final = 256 << 20
"""Client data (protocol metadata and assignments) the classic groups of a node hold at
most, all groups together: a join that would pass it is refused with
GROUP_MAX_SIZE_REACHED (each member may send up to a request's 4 MiB, and a node has
many groups)."""


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    generation: int
    protocol_name: str
    leader: str
    member_id: str
    members: tuple[tuple[str, bytes], ...]
    """Every member's metadata for the chosen protocol: for the leader only."""


class ClassicGroups:
    """The classic groups this node coordinates."""

    def __init__(
        self,
        config: NodeConfig,
        core: GroupCore,
        coordinator: GroupCoordinator,
        clock: Callable[[], float] = time.monotonic,
        held_bytes_max: int = HELD_BYTES_MAX,
    ) -> None:
        self.config = config
        self.held_bytes_max = held_bytes_max
        self.core = core
        self.coordinator = coordinator
        self.clock = clock
        self.groups: dict[str, ClassicGroup] = {}
        self._partition: dict[str, int] = {}
        """The ``__consumer_offsets`` partition of each group in memory."""
        self._shard: dict[str, object] = {}
        """The coordinator shard each group in memory was taken from: a group whose
        partition was let go and taken again since is read again from the log."""
        self._saving: collections.Counter[str] = collections.Counter()
        """Saves of each group's generation under way (a background save and one a sync
        waits for may overlap)."""
        self._scanned: dict[int, object] = {}
        """Each ``__consumer_offsets`` partition's shard whose written generations were
        taken over (a shard is scanned once, when this node has loaded it)."""
        self._joins: dict[str, dict[str, asyncio.Future[None]]] = {}
        self._syncs: dict[str, dict[str, asyncio.Future[None]]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._gathering: set[str] = set()
        """Groups in their initial join delay."""
        self._expiry: asyncio.Task[None] | None = None
        self._background: set[asyncio.Future[None]] = set()
        self.held_bytes = 0
        """Client data the groups hold: counted again exactly at every session check,
        and between checks raised by each join and sync (never lowered), so it is never
        below the truth."""

    def close(self) -> None:
        """Stop the session checks and the background writes (the node is stopping)."""
        for task in (self._expiry, *self._background):
            if task is not None:
                task.cancel()

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def has_members(self, group_id: str) -> bool:
        group = self.groups.get(group_id)
        return group is not None and bool(group.members)

    def view(self, group_id: str) -> ClassicView | None:
        """The group as DescribeGroup shows it: each member's subscribed topics and
        assigned partitions read from the consumer protocol's bytes (left empty when the
        protocol type is another, or the bytes do not decode)."""
        group = self.groups.get(group_id)
        if group is None:
            return None
        consumer = group.protocol_type == "consumer"
        members = []
        for member in sorted(group.members.values(), key=lambda m: m.member_id):
            metadata = member.metadata_for(group.protocol_name)
            topics = subscribed_topics(metadata) if consumer else None
            assigned = assigned_partitions(member.assignment) if consumer else None
            members.append(
                ClassicMemberView(
                    member_id=member.member_id,
                    instance_id=member.instance_id,
                    client_id=member.client_id,
                    host=member.host,
                    generation=group.generation,
                    subscribed_topics=tuple(topics or ()),
                    assigned=tuple((topic, tuple(parts)) for topic, parts in assigned or ()),
                    session_timeout_ms=member.session_timeout_ms,
                    rebalance_timeout_ms=member.rebalance_timeout_ms,
                )
            )
        return ClassicView(group.state, group.generation, group.protocol_name, tuple(members))

    def listings(self) -> list[tuple[str, str, int]]:
        return [(g.group_id, g.state, len(g.members)) for g in list(self.groups.values())]

    async def _route(self, group_id: str) -> int:
        """The coordinator partition of ``group_id`` when this node coordinates it;
        otherwise its classic state here is dropped and NOT_COORDINATOR raised."""
        try:
            route = await self.core.here(group_id)
        except HeadwaterError as error:
            if error.code in (ErrorCode.NOT_COORDINATOR, ErrorCode.COORDINATOR_NOT_AVAILABLE):
                self._drop(group_id, error)
            raise
        if self._expiry is None or self._expiry.done():
            self._expiry = asyncio.get_running_loop().create_task(self._expire_sessions())
        shard = self.coordinator.shards.get(route)
        if group_id in self.groups and self._shard.get(group_id) is not shard:
            self._drop(
                group_id,
                HeadwaterError(
                    ErrorCode.NOT_COORDINATOR,
                    f"group {group_id!r} was coordinated elsewhere meanwhile; find the "
                    "coordinator again",
                ),
            )
        if group_id not in self.groups:
            if shard is not None and not shard.caught_up():
                raise HeadwaterError(
                    ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                    f"group {group_id!r}: this coordinator took over {OFFSETS_TOPIC}-{route} and "
                    "its replicas have not all caught up with what it holds yet; retry",
                )
            self._restore(group_id, route)
        self._partition[group_id] = route
        self._shard[group_id] = shard
        return route

    def _restore(self, group_id: str, index: int) -> None:
        """Take the group's last written generation, if any (see the module doc)."""
        state = self.coordinator.committed(index).group(group_id)
        saved = state.classic if state is not None else None
        if saved is None:
            return
        group = self.groups[group_id] = ClassicGroup(
            group_id, generation=saved.generation, protocol_type=saved.protocol_type
        )
        self._partition[group_id] = index
        self._shard[group_id] = self.coordinator.shards.get(index)
        if not saved.members:
            return
        now = self._now_ms()
        # One per member; none in a record without instance ids.
        instance_ids = saved.instance_ids + ("",) * (len(saved.members) - len(saved.instance_ids))
        for (
            member_id,
            client_id,
            host,
            session_ms,
            rebalance_ms,
            metadata,
            assignment,
        ), instance_id in zip(saved.members, instance_ids, strict=False):
            group.members[member_id] = classic.ClassicMember(
                member_id,
                client_id,
                host,
                session_ms,
                rebalance_ms,
                ((saved.protocol_name, base64.b64decode(metadata)),),
                now,
                assignment=base64.b64decode(assignment),
                instance_id=instance_id,
            )
        group.state, group.protocol_name, group.leader = (
            classic.STABLE,
            saved.protocol_name,
            saved.leader,
        )
        if saved.rebalancing:  # members left or expired after this generation
            group.prepare_rebalance(now)
            self._schedule(group, max(0.0, (group.rebalance_deadline_ms - now) / 1000))
        _log.info(
            "group %s: generation %d of %d members taken over%s",
            group_id,
            saved.generation,
            len(saved.members),
            ", rebalancing" if saved.rebalancing else "",
        )

    async def _save(self, group: ClassicGroup) -> None:
        """Write the group's generation (members and assignments) and wait until the
        in-sync replicas hold it."""
        record = ClassicGeneration(
            group.group_id,
            group.generation,
            group.protocol_type,
            group.protocol_name,
            group.leader,
            tuple(
                (
                    m.member_id,
                    m.client_id,
                    m.host,
                    m.session_timeout_ms,
                    m.rebalance_timeout_ms,
                    base64.b64encode(m.metadata_for(group.protocol_name)).decode(),
                    base64.b64encode(m.assignment).decode(),
                )
                for m in group.members.values()
            ),
            rebalancing=group.state == classic.PREPARING,
            instance_ids=tuple(m.instance_id for m in group.members.values()),
        )
        self._saving[group.group_id] += 1
        try:
            await self.coordinator.save_classic(self._partition[group.group_id], record)
        except HeadwaterError as error:
            raise HeadwaterError(
                ErrorCode.NOT_COORDINATOR,
                f"group {group.group_id!r}: its generation could not be written here "
                f"({error.message}); find the coordinator again",
            ) from None
        finally:
            self._saving[group.group_id] -= 1
            if not self._saving[group.group_id]:
                del self._saving[group.group_id]

    def _drop(self, group_id: str, error: HeadwaterError) -> None:
        self.groups.pop(group_id, None)
        self._partition.pop(group_id, None)
        self._shard.pop(group_id, None)
        self._gathering.discard(group_id)
        for waiters in (self._joins.pop(group_id, {}), self._syncs.pop(group_id, {})):
            for waiter in waiters.values():
                if not waiter.done():
                    waiter.set_exception(error)
        timer = self._timers.pop(group_id, None)
        if timer is not None:
            timer.cancel()

    def _group(self, group_id: str) -> ClassicGroup:
        group = self.groups.get(group_id)
        if group is None:
            group = self.groups[group_id] = ClassicGroup(group_id)
        return group

    # ------------------------------------------------------------------ join, sync

    async def join(
        self,
        group_id: str,
        member_id: str,
        client_id: str,
        host: str,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        member_id_required: bool = False,
        instance_id: str = "",
    ) -> JoinAnswer:
        """A member's JoinGroup, answered when the rebalance completes (see
        ``ClassicGroup.join`` for ``member_id_required`` and ``instance_id``). A static
        member's earlier incarnation that it replaces is told FENCED_INSTANCE_ID."""
        index = await self._route(group_id)
        image_group = self.coordinator.committed(index).group(group_id)
        if image_group is not None and image_group.members:
            raise GroupProtocolError(
                ClassicError.INCONSISTENT_GROUP_PROTOCOL,
                f"group {group_id!r} has members of the consumer (KIP-848) protocol",
            )
        incoming = classic.protocols_bytes(protocols)
        if self.held_bytes + incoming > self.held_bytes_max:
            raise GroupProtocolError(
                ErrorCode.GROUP_MAX_SIZE_REACHED,
                f"the node's classic groups hold {self.held_bytes} bytes of members' "
                f"protocol metadata and assignments; a join of {incoming} more would pass "
                f"the {self.held_bytes_max} the node keeps at most",
            )
        group = self._group(group_id)
        was_empty = not group.members
        holder = group.instance_holder(instance_id)
        member_id = group.join(
            member_id=member_id,
            new_member_id=f"{client_id or 'member'}-{uuid.uuid4()}",
            client_id=client_id,
            host=host,
            protocol_type=protocol_type,
            protocols=protocols,
            session_timeout_ms=session_timeout_ms,
            rebalance_timeout_ms=rebalance_timeout_ms,
            now_ms=self._now_ms(),
            members_max=self.config.group_members_max,
            session_range_ms=SESSION_TIMEOUT_RANGE_MS,
            member_id_required=member_id_required,
            instance_id=instance_id,
        )
        if holder is not None and holder.member_id not in group.members:
            replaced = self._joins.get(group_id, {}).pop(holder.member_id, None)
            if replaced is not None and not replaced.done():
                replaced.set_exception(
                    GroupProtocolError(
                        ClassicError.FENCED_INSTANCE_ID,
                        f"member {holder.member_id!r} was replaced by {member_id!r}, a newer "
                        f"incarnation of instance {instance_id!r}",
                    )
                )
        self.held_bytes += incoming
        if group.state == classic.STABLE:  # a static member back in its old place
            self._save_in_background(group)
            return self._join_answer(group, member_id)
        self._cancel_syncs(group_id)
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[None] = loop.create_future()
        previous = self._joins.setdefault(group_id, {}).pop(member_id, None)
        if previous is not None and not previous.done():
            previous.set_exception(_joined_again(group_id, member_id))
        self._joins[group_id][member_id] = waiter
        if was_empty:
            group.rebalance_deadline_ms = self._now_ms() + INITIAL_JOIN_DELAY_MS
            self._gathering.add(group_id)
            self._schedule(group, INITIAL_JOIN_DELAY_MS / 1000)
        else:
            self._schedule(group, max(0.0, (group.rebalance_deadline_ms - self._now_ms()) / 1000))
            self._maybe_complete(group)
        try:
            await waiter
        finally:
            if self._joins.get(group_id, {}).get(member_id) is waiter:
                del self._joins[group_id][member_id]
        if member_id not in group.members:
            raise GroupProtocolError(
                ErrorCode.UNKNOWN_MEMBER_ID, f"member {member_id!r} left group {group_id!r}"
            )
        return self._join_answer(group, member_id)

    @staticmethod
    def _join_answer(group: ClassicGroup, member_id: str) -> JoinAnswer:
        members: tuple[tuple[str, bytes], ...] = ()
        if member_id == group.leader:
            members = tuple(
                (m.member_id, m.metadata_for(group.protocol_name)) for m in group.members.values()
            )
        return JoinAnswer(group.generation, group.protocol_name, group.leader, member_id, members)

    def _schedule(self, group: ClassicGroup, delay_s: float) -> None:
        timer = self._timers.pop(group.group_id, None)
        if timer is not None:
            timer.cancel()
        self._timers[group.group_id] = asyncio.get_running_loop().call_later(
            delay_s, self._deadline, group.group_id
        )

    def _deadline(self, group_id: str) -> None:
        self._timers.pop(group_id, None)
        self._gathering.discard(group_id)
        group = self.groups.get(group_id)
        if group is not None and group.state == classic.PREPARING:
            group.rebalance_deadline_ms = min(group.rebalance_deadline_ms, self._now_ms())
            self._maybe_complete(group)

    def _maybe_complete(self, group: ClassicGroup) -> None:
        if not group.join_ready(self._now_ms()):
            return
        if group.group_id in self._gathering:
            return  # a new group gathers its first members until the initial delay ends
        gone = group.complete_join(self._now_ms())
        if gone:
            _log.info("group %s: members %s did not join again in time", group.group_id, gone)
        if group.state == classic.EMPTY:
            self._save_in_background(group)
        for waiter in self._joins.pop(group.group_id, {}).values():
            if not waiter.done():
                waiter.set_result(None)

    def _save_in_background(self, group: ClassicGroup) -> None:
        """Write the group as it is now without holding up the request that changed it: an
        emptied group, or one whose members left or expired (the next coordinator then
        serves no member that is gone, and rebalances the others)."""
        saving = asyncio.ensure_future(self._save_quietly(group))
        self._background.add(saving)
        saving.add_done_callback(self._background.discard)

    async def _save_quietly(self, group: ClassicGroup) -> None:
        if group.group_id not in self._partition:
            return
        try:
            await self._save(group)
        except HeadwaterError as error:
            _log.info("group %s: its state was not written: %s", group.group_id, error)

    async def sync(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        assignments: Sequence[tuple[str, bytes]],
        instance_id: str = "",
    ) -> bytes:
        await self._route(group_id)
        group = self._known(group_id, member_id, instance_id)
        self.held_bytes += sum(len(data) for _, data in assignments)
        if group.sync(member_id, generation, assignments, self._now_ms()):
            try:
                await self._save(group)
            except HeadwaterError as error:
                self._drop(group_id, error)  # its waiters are told the same
                raise
            if group.stabilize(generation):
                for waiting in self._syncs.pop(group_id, {}).values():
                    if not waiting.done():
                        waiting.set_result(None)
        elif group.state == classic.COMPLETING:
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            waiters = self._syncs.setdefault(group_id, {})
            previous = waiters.pop(member_id, None)
            if previous is not None and not previous.done():
                previous.set_exception(_joined_again(group_id, member_id))
            waiters[member_id] = waiter
            try:
                await waiter
            finally:
                if self._syncs.get(group_id, {}).get(member_id) is waiter:
                    del self._syncs[group_id][member_id]
        group.check_member(member_id, generation)
        if group.state != classic.STABLE:
            raise GroupProtocolError(
                ClassicError.REBALANCE_IN_PROGRESS, f"group {group_id!r} is rebalancing; join again"
            )
        return group.members[member_id].assignment

    def _cancel_syncs(self, group_id: str) -> None:
        """A rebalance began: members waiting for the leader's assignment join again."""
        for waiter in self._syncs.pop(group_id, {}).values():
            if not waiter.done():
                waiter.set_exception(
                    GroupProtocolError(
                        ClassicError.REBALANCE_IN_PROGRESS,
                        f"group {group_id!r} is rebalancing; join again",
                    )
                )

    def _known(self, group_id: str, member_id: str, instance_id: str = "") -> ClassicGroup:
        """The group in memory, the request coming from the holder of ``instance_id``
        when it names one (``ClassicGroup.check_instance``)."""
        group = self.groups.get(group_id)
        if group is None:
            raise GroupProtocolError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {group_id!r} (it has no members here); "
                "join again",
            )
        group.check_instance(member_id, instance_id)
        return group

    # ------------------------------------------------------------------ heartbeat, leave

    async def heartbeat(
        self, group_id: str, member_id: str, generation: int, instance_id: str = ""
    ) -> None:
        await self._route(group_id)
        group = self._known(group_id, member_id, instance_id)
        group.heartbeat(member_id, generation, self._now_ms())

    async def leave(self, group_id: str, member_id: str, instance_id: str = "") -> str:
        """The member leaves (by its instance id alone when ``member_id`` is "", as an
        admin removes a static member); the id of the member that left."""
        await self._route(group_id)
        group = self._known(group_id, member_id, "" if not member_id else instance_id)
        if not member_id:
            holder = group.instance_holder(instance_id)
            if holder is None:
                raise GroupProtocolError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"no member of group {group_id!r} holds instance id {instance_id!r}",
                )
            member_id = holder.member_id
        group.leave(member_id, self._now_ms())
        self._after_removal(group)
        return member_id

    def _after_removal(self, group: ClassicGroup) -> None:
        """Members left or expired: the rebalance they started goes on, and the group is
        written as it is now (an emptied group by ``_maybe_complete``), so that a new
        coordinator never serves a member that is gone."""
        self._cancel_syncs(group.group_id)
        waiter = self._joins.get(group.group_id, {})
        for gone in [m for m in waiter if m not in group.members]:
            future = waiter.pop(gone)
            if not future.done():
                future.set_exception(_joined_again(group.group_id, gone))
        self._schedule(group, max(0.0, (group.rebalance_deadline_ms - self._now_ms()) / 1000))
        self._maybe_complete(group)
        if group.state != classic.EMPTY:
            self._save_in_background(group)

    async def _expire_sessions(self) -> None:
        """Every EXPIRY_CHECK_S: take over the written generations of the groups of each
        partition this node has newly loaded (so that members that stopped are found
        out), and remove members whose session ran out."""
        while True:
            await asyncio.sleep(EXPIRY_CHECK_S)
            for index, shard in list(self.coordinator.shards.items()):
                if not shard.loaded or self._scanned.get(index) is shard or not shard.caught_up():
                    continue
                self._scanned[index] = shard
                for group_id, state in shard.committed().groups.items():
                    if (
                        state.has_classic_members
                        and group_id not in self.groups
                        and group_id not in self._saving
                    ):
                        self._restore(group_id, index)
            held = 0
            for group in list(self.groups.values()):
                held += group.held_bytes()
                gone = group.expire(self._now_ms())
                if gone:
                    _log.info("group %s: members %s missed their session", group.group_id, gone)
                    self._after_removal(group)
                saving = group.group_id in self._saving
                idle = not group.members and not group.pending
                if idle and group.state == classic.EMPTY and not saving:
                    self.groups.pop(group.group_id, None)
                    self._partition.pop(group.group_id, None)
                    self._shard.pop(group.group_id, None)
            self.held_bytes = held

    # ------------------------------------------------------------------ offsets

    async def commit(
        self,
        group_id: str,
        member_id: str,
        generation: int,
        items: list[CommitItem],
        instance_id: str = "",
    ) -> Sequence[HeadwaterError | GroupProtocolError | None]:
        """Commit ``items`` for a member of the current generation (or, with generation
        -1 and no member id, for a group without members); a member of Kafka's consumer
        protocol (ConsumerGroupHeartbeat) commits at its member epoch instead."""
        index = await self._route(group_id)
        group = self.groups.get(group_id)
        saved = self.coordinator.shard(index).image.group(group_id)
        if group is None and saved is not None and member_id in saved.members:
            return await self.coordinator.commit(index, group_id, member_id, generation, items)
        if group is None:
            if generation != classic.NO_GENERATION:
                raise GroupProtocolError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"group {group_id!r} has no members here; join again (or commit with "
                    "generation -1 from outside the group)",
                )
            return await self.coordinator.commit(index, group_id, "", ADMIN_MEMBER_EPOCH, items)

        def may_commit() -> None:
            current = self.groups.get(group_id)
            if current is None:
                raise GroupProtocolError(
                    ErrorCode.UNKNOWN_MEMBER_ID, f"group {group_id!r} has no members here"
                )
            current.check_instance(member_id, instance_id)
            current.check_commit(member_id, generation)

        may_commit()
        if member_id in group.members:
            group.members[member_id].last_seen_ms = self._now_ms()
        return await self.coordinator.commit_classic(index, group_id, items, may_commit)

    async def committed(self, group_id: str) -> dict[tuple[str, int], tuple[int, str, int]]:
        """(topic, partition) -> (offset, metadata, leader epoch) of everything the group
        committed."""
        index = await self._route(group_id)
        group = self.coordinator.committed(index).group(group_id)
        if group is None:
            return {}
        return {key: (c.offset, c.metadata, c.leader_epoch) for key, c in group.offsets.items()}

    async def delete(self, group_id: str) -> None:
        index = await self._route(group_id)
        if self.has_members(group_id):
            raise HeadwaterError(
                ErrorCode.NON_EMPTY_GROUP, f"group {group_id!r} has members; it cannot be deleted"
            )
        self.groups.pop(group_id, None)
        await self.coordinator.delete(index, group_id)


def _joined_again(group_id: str, member_id: str) -> GroupProtocolError:
    return GroupProtocolError(
        ErrorCode.UNKNOWN_MEMBER_ID,
        f"member {member_id!r} of group {group_id!r} left or joined again on another request",
    )
