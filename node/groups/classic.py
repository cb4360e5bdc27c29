"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), the
membership state of one group (pure: no I/O, no clock; times come in as arguments).

The classic protocol runs the assignor in a client: a rebalance gathers every member's
JoinGroup (its subscription as opaque protocol metadata), then the coordinator picks a
protocol every member supports, makes one member the *leader*, hands it every member's
metadata, and waits for the leader's SyncGroup with everyone's assignment, which each
member then receives from its own SyncGroup. States, as Kafka names them:

- ``Empty``: no members (committed offsets may exist);
- ``PreparingRebalance``: a rebalance is gathering JoinGroups; it completes when every
  member has joined, or at the deadline (the longest rebalance timeout of the members,
  counted from the rebalance's start), when the members that did not join are removed;
- ``CompletingRebalance``: the generation is decided, waiting for the leader's SyncGroup;
- ``Stable``: every member has its assignment and heartbeats.

Invariants: ``generation`` only grows; an answer (join, sync, heartbeat, commit check)
for a generation other than the current one is ILLEGAL_GENERATION, for an unknown member
UNKNOWN_MEMBER_ID; a member that joins or leaves, or misses its session timeout, starts a
rebalance, and members learn of it from their heartbeats (REBALANCE_IN_PROGRESS).

The state lives in the coordinator's memory; each generation the leader completes is
written to ``__consumer_offsets`` (``headwater.node.groups.classic_groups``) before anyone gets an
assignment, so that a new coordinator carries on from it; committed offsets go there
like every group's.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

from headwater.shared.errors import ErrorCode

EMPTY: Final = "Empty"
PREPARING: Final = "PreparingRebalance"
COMPLETING: Final = "CompletingRebalance"
STABLE: Final = "Stable"
NO_GENERATION: Final = -1
PROTOCOLS_MAX: Final = 32
PROTOCOL_METADATA_BYTES_MAX: Final = 1 << 20
ASSIGNMENT_BYTES_MAX: Final = 1 << 20
REBALANCE_TIMEOUT_RANGE_MS: Final = (1, 1_800_000)


class ClassicError(enum.IntEnum):
    """Kafka's codes the classic protocol answers that Headwater's own API has no use for."""

    ILLEGAL_GENERATION = 22
    INCONSISTENT_GROUP_PROTOCOL = 23
    REBALANCE_IN_PROGRESS = 27
    MEMBER_ID_REQUIRED = 79
    FENCED_INSTANCE_ID = 82


def protocols_bytes(protocols: Sequence[tuple[str, bytes]]) -> int:
    """Bytes of client data a join's protocols hold: their names and metadata."""
    return sum(len(name) + len(data) for name, data in protocols)


class GroupProtocolError(Exception):
    """A refusal with a Kafka code (``code``) and a message for the log; ``member_id``:
    the id a MEMBER_ID_REQUIRED refusal hands out."""

    def __init__(self, code: int, message: str, member_id: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.member_id = member_id


@dataclass(slots=True)
class ClassicMember:
    member_id: str
    client_id: str
    host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    last_seen_ms: int
    assignment: bytes = b""
    joined: bool = False
    """Has it sent JoinGroup in the rebalance in progress?"""
    instance_id: str = ""
    """A static member's ``group.instance.id`` ("" for a dynamic member)."""

    def held_bytes(self) -> int:
        """Bytes of client data it holds: its protocols' names and metadata and its
        assignment."""
        return len(self.assignment) + protocols_bytes(self.protocols)

    def metadata_for(self, protocol: str) -> bytes:
        return next((data for name, data in self.protocols if name == protocol), b"")


@dataclass(slots=True)
class ClassicGroup:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str = ""
    protocol_name: str = ""
    leader: str = ""
    members: dict[str, ClassicMember] = field(default_factory=dict)
    rebalance_deadline_ms: int = 0
    pending: dict[str, int] = field(default_factory=dict)
    """Member ids handed out by MEMBER_ID_REQUIRED and not yet joined with, each to the
    time (ms) it is forgotten (its session timeout after it was handed out)."""

    def held_bytes(self) -> int:
        """Bytes of client data its members hold (``ClassicMember.held_bytes``)."""
        return sum(m.held_bytes() for m in self.members.values())

    # ------------------------------------------------------------------ join

    def join(
        self,
        *,
        member_id: str,
        new_member_id: str,
        client_id: str,
        host: str,
        protocol_type: str,
        protocols: Sequence[tuple[str, bytes]],
        session_timeout_ms: int,
        rebalance_timeout_ms: int,
        now_ms: int,
        members_max: int,
        session_range_ms: tuple[int, int],
        member_id_required: bool = False,
        instance_id: str = "",
    ) -> str:
        """Take a JoinGroup; the joining member's id (``new_member_id`` for a new one).
        Starts a rebalance unless one is gathering already. With ``member_id_required``
        (JoinGroup v4 and later) a join without a member id is refused with
        MEMBER_ID_REQUIRED and ``new_member_id``, which the next join may use (until its
        session timeout passes). A static member (``instance_id``, Kafka's
        ``group.instance.id``) gets no MEMBER_ID_REQUIRED; joining without a member id it
        replaces the member holding its instance id (a restart), and with another member
        id than that one's it is refused FENCED_INSTANCE_ID (an old incarnation)."""
        low, high = session_range_ms
        if not low <= session_timeout_ms <= high:
            raise GroupProtocolError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"session timeout {session_timeout_ms} ms; valid range is [{low}, {high}]",
            )
        low, high = REBALANCE_TIMEOUT_RANGE_MS
        if not low <= rebalance_timeout_ms <= high:
            raise GroupProtocolError(
                ErrorCode.INVALID_SESSION_TIMEOUT,
                f"rebalance timeout {rebalance_timeout_ms} ms; valid range is [{low}, {high}]",
            )
        if not protocols or len(protocols) > PROTOCOLS_MAX or not protocol_type:
            raise GroupProtocolError(
                ClassicError.INCONSISTENT_GROUP_PROTOCOL,
                f"a join names 1 to {PROTOCOLS_MAX} protocols and a protocol type; got "
                f"{len(protocols)} and {protocol_type!r}",
            )
        if any(len(data) > PROTOCOL_METADATA_BYTES_MAX for _, data in protocols):
            raise GroupProtocolError(
                ErrorCode.INVALID_REQUEST,
                f"protocol metadata over {PROTOCOL_METADATA_BYTES_MAX} bytes",
            )
        if self.members and protocol_type != self.protocol_type:
            raise GroupProtocolError(
                ClassicError.INCONSISTENT_GROUP_PROTOCOL,
                f"group {self.group_id!r} uses protocol type {self.protocol_type!r}, not "
                f"{protocol_type!r}",
            )
        names = {name for name, _ in protocols}
        others = [
            {n for n, _ in m.protocols} for m in self.members.values() if m.member_id != member_id
        ]
        if others and not self._common_protocols([names, *others]):
            raise GroupProtocolError(
                ClassicError.INCONSISTENT_GROUP_PROTOCOL,
                f"none of the protocols {sorted(names)} is supported by every member of "
                f"group {self.group_id!r}",
            )
        holder = self.instance_holder(instance_id)
        if holder is not None:
            if member_id and member_id != holder.member_id:
                raise _fenced(instance_id, holder.member_id)
            if not member_id and self._rejoins_unchanged(holder, protocols):
                return self._replace_static(
                    holder,
                    ClassicMember(
                        new_member_id,
                        client_id,
                        host,
                        session_timeout_ms,
                        rebalance_timeout_ms,
                        tuple(protocols),
                        now_ms,
                        assignment=holder.assignment,
                        joined=True,
                        instance_id=instance_id,
                    ),
                )
            if not member_id:
                # A static member that restarted takes its old incarnation's place (the
                # old member id is fenced): no wait for the old one's session to end.
                del self.members[holder.member_id]
                if self.leader == holder.member_id:
                    self.leader = ""
        member = self.members.get(member_id) if member_id else None
        if member is None:
            if member_id and member_id not in self.pending:
                raise GroupProtocolError(
                    ErrorCode.UNKNOWN_MEMBER_ID,
                    f"member {member_id!r} is not in group {self.group_id!r}; join again "
                    "without a member id",
                )
            if len(self.members) >= members_max:
                raise GroupProtocolError(
                    ErrorCode.GROUP_MAX_SIZE_REACHED,
                    f"group {self.group_id!r} has {members_max} members, the most allowed "
                    "(group_members_max)",
                )
            if not member_id and member_id_required and not instance_id:
                # KIP-394: the id first, the membership when the client joins with it, so
                # a join whose answer was lost leaves no member behind.
                if len(self.pending) >= members_max:
                    raise GroupProtocolError(
                        ErrorCode.GROUP_MAX_SIZE_REACHED,
                        f"group {self.group_id!r} has {members_max} member ids handed out "
                        "and not joined with (group_members_max)",
                    )
                self.pending[new_member_id] = now_ms + session_timeout_ms
                raise GroupProtocolError(
                    ClassicError.MEMBER_ID_REQUIRED,
                    "join again with the member id given",
                    member_id=new_member_id,
                )
            self.pending.pop(member_id, None)
            member_id = member_id or new_member_id
            member = self.members[member_id] = ClassicMember(
                member_id, client_id, host, session_timeout_ms, rebalance_timeout_ms, (), now_ms
            )
        if instance_id:
            member.instance_id = instance_id
        member.protocols = tuple(protocols)
        member.session_timeout_ms = session_timeout_ms
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.client_id, member.host, member.last_seen_ms = client_id, host, now_ms
        self.protocol_type = protocol_type
        if self.state != PREPARING:
            # Any join outside a rebalance starts one (a member of the stable generation
            # asking again lost its answer: a new generation keeps everyone consistent).
            self.prepare_rebalance(now_ms)
        member.joined = True
        return member_id

    def _rejoins_unchanged(
        self, holder: ClassicMember, protocols: Sequence[tuple[str, bytes]]
    ) -> bool:
        """Is a static member that restarted (``holder`` is its old incarnation) asking
        for nothing new of a stable group: the protocol chosen, with the same metadata
        (its subscription)? Then it takes its old place without a rebalance (KIP-345)."""
        wanted = dict(protocols).get(self.protocol_name)
        return self.state == STABLE and wanted == holder.metadata_for(self.protocol_name)

    def _replace_static(self, holder: ClassicMember, member: ClassicMember) -> str:
        """The new incarnation ``member`` of a static member takes its old one's place,
        assignment and leadership in the current generation (the old member id is
        fenced: ``check_instance``)."""
        del self.members[holder.member_id]
        self.members[member.member_id] = member
        if self.leader == holder.member_id:
            self.leader = member.member_id
        return member.member_id

    @staticmethod
    def _common_protocols(supported: list[set[str]]) -> set[str]:
        common = set(supported[0])
        for names in supported[1:]:
            common &= names
        return common

    def prepare_rebalance(self, now_ms: int) -> None:
        """Start a rebalance: every member must join again by the deadline (a new
        coordinator does this for a group whose members left or expired after its last
        generation)."""
        self.state = PREPARING
        for member in self.members.values():
            member.joined = False
        self.rebalance_deadline_ms = now_ms + max(
            (m.rebalance_timeout_ms for m in self.members.values()), default=0
        )

    def join_ready(self, now_ms: int) -> bool:
        """Can the rebalance in progress complete now?"""
        return self.state == PREPARING and (
            all(m.joined for m in self.members.values()) or now_ms >= self.rebalance_deadline_ms
        )

    def complete_join(self, now_ms: int) -> list[str]:
        """Decide the generation: members that did not join are removed (their ids are
        returned), the protocol is the one most members list first among those all
        support, and the leader is kept when it joined (else the first member). Every
        member's session starts again now (one that waited in its join for the others
        has not heartbeated meanwhile)."""
        gone = [m for m, member in self.members.items() if not member.joined]
        for member_id in gone:
            del self.members[member_id]
        for member in self.members.values():
            member.last_seen_ms = now_ms
        self.generation += 1
        if not self.members:
            self.state, self.protocol_name, self.leader = EMPTY, "", ""
            return gone
        common = self._common_protocols(
            [{n for n, _ in m.protocols} for m in self.members.values()]
        )
        votes: dict[str, int] = {}
        for member in self.members.values():
            first = next(name for name, _ in member.protocols if name in common)
            votes[first] = votes.get(first, 0) + 1
        self.protocol_name = max(sorted(votes), key=lambda name: votes[name])
        if self.leader not in self.members:
            self.leader = next(iter(self.members))
        for member in self.members.values():
            member.assignment = b""
        self.state = COMPLETING
        return gone

    def instance_holder(self, instance_id: str) -> ClassicMember | None:
        """The member holding static instance id ``instance_id`` (None for "")."""
        if not instance_id:
            return None
        return next((m for m in self.members.values() if m.instance_id == instance_id), None)

    def check_instance(self, member_id: str, instance_id: str) -> None:
        """A request naming ``instance_id`` comes from the member holding it: otherwise
        FENCED_INSTANCE_ID (an old incarnation of a static member that restarted). A
        member without one learns it (members taken over from a written generation)."""
        if not instance_id:
            return
        holder = self.instance_holder(instance_id)
        if holder is not None and holder.member_id != member_id:
            raise _fenced(instance_id, holder.member_id)
        member = self.members.get(member_id)
        if member is not None:
            if member.instance_id and member.instance_id != instance_id:
                raise _fenced(instance_id, member_id)
            member.instance_id = instance_id

    # ------------------------------------------------------------------ sync

    def check_member(self, member_id: str, generation: int) -> ClassicMember:
        member = self.members.get(member_id)
        if member is None:
            raise GroupProtocolError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {self.group_id!r}; join again",
            )
        if generation != self.generation:
            raise GroupProtocolError(
                ClassicError.ILLEGAL_GENERATION,
                f"generation {generation} of group {self.group_id!r} is over (now "
                f"{self.generation}); join again",
            )
        return member

    def sync(
        self, member_id: str, generation: int, assignments: Sequence[tuple[str, bytes]], now_ms: int
    ) -> bool:
        """Take a SyncGroup; True when it is the leader's, with everyone's assignment:
        the caller writes the generation, then ``stabilize``s it (until then the group
        stays CompletingRebalance and no member gets its assignment)."""
        self._current_member(member_id, generation, now_ms)
        if self.state != COMPLETING or member_id != self.leader:
            return False
        for target, assignment in assignments:
            if len(assignment) > ASSIGNMENT_BYTES_MAX:
                raise GroupProtocolError(
                    ErrorCode.INVALID_REQUEST,
                    f"assignment of member {target!r} over {ASSIGNMENT_BYTES_MAX} bytes",
                )
            if target in self.members:
                self.members[target].assignment = bytes(assignment)
        return True

    def stabilize(self, generation: int) -> bool:
        """The generation was written: members may have their assignments. False when a
        rebalance began meanwhile (the generation is over)."""
        if self.state != COMPLETING or self.generation != generation:
            return False
        self.state = STABLE
        return True

    # ------------------------------------------------------------------ heartbeat, leave

    def heartbeat(self, member_id: str, generation: int, now_ms: int) -> None:
        """Raises what the member must do instead of carrying on: join again
        (REBALANCE_IN_PROGRESS, ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID)."""
        self._current_member(member_id, generation, now_ms)

    def _current_member(self, member_id: str, generation: int, now_ms: int) -> None:
        """A member of this generation, seen now; REBALANCE_IN_PROGRESS while one gathers."""
        self.check_member(member_id, generation).last_seen_ms = now_ms
        if self.state == PREPARING:
            raise GroupProtocolError(
                ClassicError.REBALANCE_IN_PROGRESS,
                f"group {self.group_id!r} is rebalancing; join again",
            )

    def leave(self, member_id: str, now_ms: int) -> None:
        if self.members.pop(member_id, None) is None:
            raise GroupProtocolError(
                ErrorCode.UNKNOWN_MEMBER_ID,
                f"member {member_id!r} is not in group {self.group_id!r}",
            )
        if self.state != PREPARING:
            self.prepare_rebalance(now_ms)

    def expire(self, now_ms: int) -> list[str]:
        """Remove the members whose session ran out (not those waiting in a join); a
        removal starts a rebalance. The ids removed."""
        gone = [
            m.member_id
            for m in self.members.values()
            if not (self.state == PREPARING and m.joined)
            and now_ms - m.last_seen_ms > m.session_timeout_ms
        ]
        for member_id in gone:
            del self.members[member_id]
        for member_id, forget_at_ms in list(self.pending.items()):
            if now_ms >= forget_at_ms:
                del self.pending[member_id]
        if gone and self.state != PREPARING:
            self.prepare_rebalance(now_ms)
        return gone

    def check_commit(self, member_id: str, generation: int) -> None:
        """May this member commit offsets now? Anyone may when the group has no members
        and the commit names no generation (-1): offsets managed outside a group."""
        if generation == NO_GENERATION and not member_id:
            if self.members:
                raise GroupProtocolError(
                    ClassicError.ILLEGAL_GENERATION,
                    f"group {self.group_id!r} has members; a commit from outside it is refused",
                )
            return
        self.check_member(member_id, generation)
        if self.state == COMPLETING:
            raise GroupProtocolError(
                ClassicError.REBALANCE_IN_PROGRESS,
                f"group {self.group_id!r} is completing a rebalance; commit after it",
            )


def _fenced(instance_id: str, member_id: str) -> GroupProtocolError:
    return GroupProtocolError(
        ClassicError.FENCED_INSTANCE_ID,
        f"instance id {instance_id!r} is held by member {member_id!r}: this member was "
        "replaced by a newer one with the same group.instance.id",
    )
