"""Kafka's classic group protocol, the pure state of one group
(``headwater.node.groups.classic``): joins gather into generations, the leader's sync
hands out assignments, and heartbeats, leaves and expired sessions move the group on.
A seeded random walk checks the invariants against every sequence of events."""

from __future__ import annotations

import asyncio
import random

import pytest

from headwater.node.groups import classic
from headwater.node.groups.classic import ClassicError, ClassicGroup, GroupProtocolError
from headwater.node.groups.image import GroupState
from headwater.node.groups.records import ClassicGeneration
from headwater.shared.errors import ErrorCode

SESSION_RANGE = (1000, 1_800_000)


def join(
    group: ClassicGroup,
    member_id: str = "",
    new_id: str = "m",
    now_ms: int = 0,
    protocols: tuple[tuple[str, bytes], ...] = (("range", b"sub"),),
    session_ms: int = 10_000,
    member_id_required: bool = False,
    instance_id: str = "",
) -> str:
    return group.join(
        member_id=member_id,
        new_member_id=new_id,
        client_id="c",
        host="127.0.0.1",
        protocol_type="consumer",
        protocols=protocols,
        session_timeout_ms=session_ms,
        rebalance_timeout_ms=5000,
        now_ms=now_ms,
        members_max=3,
        session_range_ms=SESSION_RANGE,
        member_id_required=member_id_required,
        instance_id=instance_id,
    )


def test_two_members_form_a_generation_and_the_leaders_sync_hands_out_assignments() -> None:
    group = ClassicGroup("g")
    a = join(group, new_id="a")
    assert group.state == classic.PREPARING and group.join_ready(0)
    b = join(group, new_id="b")
    assert group.join_ready(0)
    assert group.complete_join(0) == []
    assert (group.state, group.generation, group.leader, group.protocol_name) == (
        classic.COMPLETING,
        1,
        "a",
        "range",
    )
    assert group.sync(b, 1, [], 1) is False  # a follower waits for the leader
    assert group.sync(a, 1, [("a", b"p0"), ("b", b"p1")], 1) is True
    assert group.state == classic.COMPLETING  # until the generation is written
    assert group.stabilize(1)
    assert group.state == classic.STABLE
    assert (group.members[a].assignment, group.members[b].assignment) == (b"p0", b"p1")
    group.heartbeat(b, 1, 2)


def test_a_join_without_an_id_gets_one_first_and_a_lost_answer_leaves_no_member() -> None:
    """KIP-394 (JoinGroup v4 and later): a join without a member id is refused with
    MEMBER_ID_REQUIRED and an id; only a join with that id makes a member. An id nobody
    joins with is forgotten after its session timeout; ids handed out are bounded."""
    group = ClassicGroup("g")
    with pytest.raises(GroupProtocolError) as first:
        join(group, new_id="a", member_id_required=True)
    assert first.value.code == ClassicError.MEMBER_ID_REQUIRED
    assert first.value.member_id == "a" and group.members == {}
    # The client lost that answer and asks again: another id, still no member.
    with pytest.raises(GroupProtocolError):
        join(group, new_id="a2", member_id_required=True)
    assert group.members == {} and set(group.pending) == {"a", "a2"}
    assert join(group, member_id="a2", member_id_required=True) == "a2"
    assert list(group.members) == ["a2"] and set(group.pending) == {"a"}
    group.expire(9_999)
    assert set(group.pending) == {"a"}
    group.expire(10_000)  # "a" was never joined with: forgotten
    assert group.pending == {}
    with pytest.raises(GroupProtocolError) as unknown:
        join(group, member_id="a", member_id_required=True)
    assert unknown.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    for i in range(3):
        with pytest.raises(GroupProtocolError):
            join(group, new_id=f"p{i}", member_id_required=True)
    with pytest.raises(GroupProtocolError) as bounded:
        join(group, new_id="p3", member_id_required=True)
    assert bounded.value.code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_a_static_member_that_restarts_takes_its_old_incarnations_place() -> None:
    """group.instance.id: a join without a member id from an instance the group holds
    replaces that member at once (no wait for its session to end; no MEMBER_ID_REQUIRED),
    and the old incarnation is fenced: its heartbeat, commit or join is refused with
    FENCED_INSTANCE_ID."""
    group = ClassicGroup("g")
    old = join(group, new_id="old", instance_id="i1", member_id_required=True)
    join(group, new_id="other")  # a dynamic member beside it
    assert old == "old" and group.members["old"].instance_id == "i1"
    group.complete_join(0)
    generation = group.generation
    new = join(group, new_id="new", instance_id="i1", member_id_required=True, now_ms=5)
    assert new == "new" and "old" not in group.members
    assert group.instance_holder("i1") is group.members["new"]
    assert group.state == classic.PREPARING
    for refused in (
        lambda: group.check_instance("old", "i1"),
        lambda: join(group, member_id="old", instance_id="i1"),
    ):
        with pytest.raises(GroupProtocolError) as fenced:
            refused()
        assert fenced.value.code == ClassicError.FENCED_INSTANCE_ID
    group.check_instance("new", "i1")
    assert generation == 1 and "other" in group.members


def test_a_member_taken_over_without_its_instance_id_learns_it() -> None:
    group = ClassicGroup("g")
    member = join(group, new_id="m")
    group.check_instance(member, "i9")
    assert group.members[member].instance_id == "i9"
    with pytest.raises(GroupProtocolError) as fenced:
        group.check_instance(member, "i10")
    assert fenced.value.code == ClassicError.FENCED_INSTANCE_ID


def test_a_new_member_starts_a_rebalance_that_others_learn_of_from_heartbeats() -> None:
    group = ClassicGroup("g")
    a = join(group, new_id="a")
    group.complete_join(0)
    group.sync(a, 1, [("a", b"all")], 0)
    group.stabilize(1)
    join(group, new_id="b", now_ms=10)
    with pytest.raises(GroupProtocolError) as rebalancing:
        group.heartbeat(a, 1, 20)
    assert rebalancing.value.code == ClassicError.REBALANCE_IN_PROGRESS
    assert not group.join_ready(20)  # a has not joined again, and the deadline is ahead
    assert group.join_ready(10 + 5000)  # at the deadline: a is left out
    assert group.complete_join(5010) == ["a"]
    assert (group.generation, group.leader, list(group.members)) == (2, "b", ["b"])
    with pytest.raises(GroupProtocolError) as gone:
        group.heartbeat(a, 1, 5020)
    assert gone.value.code == ErrorCode.UNKNOWN_MEMBER_ID


def test_stale_generations_and_unknown_members_are_refused() -> None:
    group = ClassicGroup("g")
    a = join(group, new_id="a")
    group.complete_join(0)
    with pytest.raises(GroupProtocolError) as stale:
        group.sync(a, 0, [], 0)
    assert stale.value.code == ClassicError.ILLEGAL_GENERATION
    with pytest.raises(GroupProtocolError) as unknown:
        join(group, member_id="nobody")
    assert unknown.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    with pytest.raises(GroupProtocolError) as completing:
        group.check_commit(a, 1)
    assert completing.value.code == ClassicError.REBALANCE_IN_PROGRESS


def test_members_must_share_a_protocol_and_fit_the_limits() -> None:
    group = ClassicGroup("g")
    join(group, new_id="a", protocols=(("range", b""),))
    with pytest.raises(GroupProtocolError) as inconsistent:
        join(group, new_id="b", protocols=(("roundrobin", b""),))
    assert inconsistent.value.code == ClassicError.INCONSISTENT_GROUP_PROTOCOL
    with pytest.raises(GroupProtocolError) as session:
        join(group, new_id="c", session_ms=10)
    assert session.value.code == ErrorCode.INVALID_SESSION_TIMEOUT
    join(group, new_id="b")
    join(group, new_id="c")
    with pytest.raises(GroupProtocolError) as full:
        join(group, new_id="d")
    assert full.value.code == ErrorCode.GROUP_MAX_SIZE_REACHED


def test_the_protocol_most_members_prefer_among_those_all_support_wins() -> None:
    group = ClassicGroup("g")
    both = (("cooperative-sticky", b"x"), ("range", b"y"))
    join(group, new_id="a", protocols=both)
    join(group, new_id="b", protocols=(("range", b"z"), ("cooperative-sticky", b"w")))
    join(group, new_id="c", protocols=both)
    group.complete_join(0)
    assert group.protocol_name == "cooperative-sticky"
    assert group.members["b"].metadata_for("cooperative-sticky") == b"w"


def test_a_missed_session_removes_the_member_and_starts_a_rebalance() -> None:
    group = ClassicGroup("g")
    a = join(group, new_id="a")
    b = join(group, new_id="b")
    group.complete_join(0)
    group.sync(a, 1, [], 0)
    group.stabilize(1)
    group.heartbeat(a, 1, 9000)
    assert group.expire(10_001) == [b]
    assert group.state == classic.PREPARING
    join(group, member_id=a, now_ms=10_002)
    assert group.join_ready(10_002)
    group.complete_join(10_002)
    assert (group.generation, list(group.members)) == (2, [a])


def test_members_that_waited_in_their_join_are_not_expired_when_it_completes() -> None:
    """B joins at 20 s and waits while A, heartbeating, takes until 80 s to join again
    (within its rebalance timeout): B's 10 s session starts again when the generation
    is decided, so the group does not fall back into a rebalance."""
    group = ClassicGroup("g")
    a = join(group, new_id="a")
    group.complete_join(0)
    group.sync(a, 1, [], 0)
    group.stabilize(1)
    b = join(group, new_id="b", now_ms=20_000)
    group.members[a].rebalance_timeout_ms = 300_000
    group.rebalance_deadline_ms = 320_000
    join(group, member_id=a, now_ms=80_000)
    assert group.join_ready(80_000)
    group.complete_join(80_000)
    assert group.expire(80_500) == []
    assert group.state == classic.COMPLETING and set(group.members) == {a, b}


def test_a_commit_from_outside_needs_an_empty_group() -> None:
    group = ClassicGroup("g")
    group.check_commit("", classic.NO_GENERATION)
    join(group, new_id="a")
    with pytest.raises(GroupProtocolError) as refused:
        group.check_commit("", classic.NO_GENERATION)
    assert refused.value.code == ClassicError.ILLEGAL_GENERATION


@pytest.mark.parametrize("seed", range(40))
def test_random_histories_keep_the_invariants(seed: int) -> None:
    """Whatever happens: generations only grow; the leader is a member when there are
    members; a stable group's members all have the current generation's assignments;
    every refusal carries a code."""
    rng = random.Random(seed)
    group = ClassicGroup("g")
    now = 0
    ids = iter(f"m{i}" for i in range(10_000))
    generation = group.generation
    refusals: list[int] = []
    for _ in range(300):
        now += rng.randint(0, 3000)
        members = list(group.members)
        action = rng.random()
        try:
            if action < 0.25 or not members:
                join(group, new_id=next(ids), now_ms=now)
            elif action < 0.45:
                join(group, member_id=rng.choice(members), now_ms=now)
            elif action < 0.6:
                leader = group.leader or rng.choice(members)
                if group.sync(leader, group.generation, [(m, m.encode()) for m in members], now):
                    group.stabilize(group.generation)
            elif action < 0.75:
                group.heartbeat(rng.choice(members), group.generation, now)
            elif action < 0.85:
                group.leave(rng.choice(members), now)
            else:
                group.expire(now)
        except GroupProtocolError as refusal:
            refusals.append(refusal.code)
        if group.join_ready(now):
            group.complete_join(now)
        assert group.generation >= generation
        generation = group.generation
        if group.members and group.state != classic.PREPARING:
            assert group.leader in group.members
        if group.state == classic.STABLE:
            assert all(m.assignment == m.member_id.encode() for m in group.members.values())
    assert all(refusals), "every refusal carries a Kafka code"


# --------------------------------------------------------------------------- node budget


class _Core:
    """A group core that routes every group to partition 0 here."""

    async def here(self, group_id: str) -> int:
        return 0


class _Committed:
    def group(self, group_id: str) -> None:
        return None


class _Shard:
    """A coordinator shard whose replicas have caught up with it."""

    loaded = True

    @staticmethod
    def caught_up() -> bool:
        return True


class _Coordinator:
    shards: dict[int, object] = {}

    def committed(self, index: int) -> _Committed:
        return _Committed()


def test_the_nodes_classic_groups_hold_a_bounded_amount_of_member_data() -> None:
    """Members' protocol metadata counts against one budget for all the node's groups: a
    join that would pass it is refused (GROUP_MAX_SIZE_REACHED), smaller joins go on, and
    the count is exact again at the next session check."""
    from headwater.node.config import NodeConfig
    from headwater.node.groups.classic_groups import ClassicGroups

    async def scenario() -> None:
        groups = ClassicGroups(
            NodeConfig(),
            _Core(),  # type: ignore[arg-type]
            _Coordinator(),  # type: ignore[arg-type]
            held_bytes_max=10_000,
        )

        def join(group_id: str, size: int) -> asyncio.Future[object]:
            return asyncio.ensure_future(
                groups.join(
                    group_id, "", "c", "h", "consumer", [("range", b"x" * size)], 10_000, 5000
                )
            )

        try:
            first = join("g1", 6000)
            while groups.held_bytes == 0:
                await asyncio.sleep(0)
            assert groups.held_bytes == 6005
            with pytest.raises(GroupProtocolError) as refused:
                await join("g2", 6000)
            assert refused.value.code == ErrorCode.GROUP_MAX_SIZE_REACHED
            assert "10000" in str(refused.value)
            second = join("g2", 1000)
            while groups.held_bytes == 6005:
                await asyncio.sleep(0)
            assert set(groups.groups) == {"g1", "g2"}
            await asyncio.wait_for(asyncio.gather(first, second), 5)
            for group in groups.groups.values():
                group.members.clear()  # every member leaves
            deadline = asyncio.get_running_loop().time() + 5
            while groups.held_bytes:
                assert asyncio.get_running_loop().time() < deadline
                await asyncio.sleep(0.05)
        finally:
            groups.close()

    asyncio.run(scenario())


class _MovingCoordinator:
    """One ``__consumer_offsets`` partition whose shard can be let go and taken again,
    with what was written of the group (``state``)."""

    def __init__(self) -> None:
        self.shards: dict[int, object] = {0: _Shard()}
        self.state: GroupState | None = None

    def committed(self, index: int) -> _MovingCoordinator:
        return self

    def group(self, group_id: str) -> GroupState | None:
        return self.state


def test_a_group_whose_partition_moved_away_and_back_is_read_again() -> None:
    """The coordinator partition was let go and taken again while a join waited here:
    the group in memory may be older than what another coordinator wrote meanwhile, so
    it is dropped (the waiting member is told NOT_COORDINATOR) and the last written
    generation is served instead."""
    from headwater.node.config import NodeConfig
    from headwater.node.groups.classic_groups import ClassicGroups
    from headwater.shared.errors import HeadwaterError

    async def scenario() -> None:
        coordinator = _MovingCoordinator()
        groups = ClassicGroups(
            NodeConfig(),
            _Core(),  # type: ignore[arg-type]
            coordinator,  # type: ignore[arg-type]
        )
        try:
            waiting = asyncio.ensure_future(
                groups.join("g", "", "c", "h", "consumer", [("range", b"s")], 10_000, 5000)
            )
            while "g" not in groups.groups:
                await asyncio.sleep(0)
            # Another coordinator ran generation 7 of member m-7, and wrote it.
            written = ClassicGeneration(
                "g",
                7,
                "consumer",
                "range",
                "m-7",
                (("m-7", "c", "h", 10_000, 5000, "cw==", "YQ=="),),
            )
            coordinator.state = GroupState("g", classic=written)
            coordinator.shards[0] = _Shard()  # the partition came back: a new shard
            await groups.heartbeat("g", "m-7", 7)
            with pytest.raises(HeadwaterError) as moved:
                await asyncio.wait_for(waiting, 5)
            assert moved.value.code is ErrorCode.NOT_COORDINATOR
            group = groups.groups["g"]
            assert (group.generation, group.state, group.leader) == (7, classic.STABLE, "m-7")
            assert group.members["m-7"].assignment == b"a"
        finally:
            groups.close()

    asyncio.run(scenario())


def test_a_generation_written_while_rebalancing_reads_back_and_older_records_read_as_not() -> None:
    from headwater.node.groups.records import ClassicGeneration, decode_record, encode_record

    record = ClassicGeneration("g", 4, "consumer", "range", "m1", (), rebalancing=True)
    assert decode_record(encode_record(record)) == record
    older = encode_record(ClassicGeneration("g", 4, "consumer", "range", "m1", ()))
    older = older.replace(b',"rebalancing":false', b"")
    assert b"rebalancing" not in older
    assert decode_record(older).rebalancing is False
