"""The coordinator's decisions (pure): heartbeats, commits, deletions and timeouts, each
refusal with its error code, and seeded random histories of honest members that must
never let two members hold a partition and must settle to a balanced, stable group."""

from __future__ import annotations

import random
import time

import pytest

from headwater.node.groups import decisions as d
from headwater.node.groups.image import GroupsImage, apply, apply_offsets
from headwater.node.groups.records import GroupRecordError, OffsetCommitted, TopicPartitionKey
from headwater.shared.errors import ErrorCode, HeadwaterError

G = "g"
LIMITS = d.GroupLimits(members_max=50, session_timeout_ms=45_000)
COUNTS = {"a": 6, "b": 3, "other": 2}


class Group:
    """Applies decisions to an image, as the coordinator does after each append."""

    def __init__(self, counts: dict[str, int] | None = None) -> None:
        self.image = GroupsImage()
        self.counts = dict(counts or COUNTS)
        self.next_id = 0

    def _apply(self, decision: d.Decision[d.T]) -> d.T:
        for record in decision.records:
            self.image = apply(self.image, record)
        return decision.answer

    def heartbeat(self, **fields: object) -> d.HeartbeatAnswer:
        request = d.check_heartbeat(d.Heartbeat(group_id=G, **fields), LIMITS)  # type: ignore[arg-type]
        self.next_id += 1
        return self._apply(
            d.heartbeat(self.image, request, self.counts, f"m{self.next_id}", LIMITS)
        )

    def commit(
        self, member_id: str, epoch: int, items: list[d.CommitItem]
    ) -> list[HeadwaterError | None]:
        return self._apply(
            d.commit_offsets(self.image, G, member_id, epoch, items, self.counts, 1000)
        )

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.image.group(G)


class Member:
    """An honest client: reports what it owns, releases revoked partitions at once."""

    def __init__(self, group: Group, topics: tuple[str, ...] = ("a",), **extra: object) -> None:
        self.group = group
        self.topics = topics
        self.extra = extra
        self.member_id = ""
        self.epoch = 0
        self.owned: frozenset[TopicPartitionKey] = frozenset()

    def beat(self) -> d.HeartbeatAnswer:
        answer = self.group.heartbeat(
            member_id=self.member_id,
            member_epoch=self.epoch,
            subscribed_topics=self.topics,
            owned=self.owned,
            **self.extra,
        )
        self.member_id, self.epoch = answer.member_id, answer.member_epoch
        self.owned = frozenset(answer.assigned)  # revoked ones released, new ones taken
        return answer

    def leave(self) -> None:
        self.group.heartbeat(member_id=self.member_id, member_epoch=d.LEAVE_EPOCH)


def settle(members: list[Member], rounds: int = 10) -> None:
    for _ in range(rounds):
        for member in members:
            member.beat()


def test_three_members_on_six_partitions_settle_two_each() -> None:
    group = Group()
    members = [Member(group) for _ in range(3)]
    settle(members)
    assert sorted(len(m.owned) for m in members) == [2, 2, 2]
    assert set().union(*(m.owned for m in members)) == {("a", p) for p in range(6)}
    assert group.state.state == "stable"


def test_a_partition_moves_only_after_its_owner_releases_it() -> None:
    group = Group()
    first = Member(group)
    first.beat()
    assert len(first.owned) == 6
    second = Member(group)
    answer = second.beat()
    # The target gives the second member 3 partitions, but the first still holds them.
    assert answer.assigned == () and answer.reconciling
    assert len(group.state.target[second.member_id]) == 3
    revoked = first.group.heartbeat(
        member_id=first.member_id,
        member_epoch=first.epoch,
        subscribed_topics=("a",),
        owned=first.owned,
    )
    assert len(revoked.assigned) == 3  # the other 3 are being revoked
    assert second.beat().assigned == ()  # still not released
    first.owned = frozenset(revoked.assigned)
    first.beat()  # reports them released
    assert len(second.beat().assigned) == 3


def test_only_the_partitions_that_must_move_move() -> None:
    group = Group({"a": 12})
    members = [Member(group) for _ in range(3)]
    settle(members)
    before = {m.member_id: m.owned for m in members}
    members.append(Member(group))
    settle(members)
    moved = sum(len(before[m.member_id] - m.owned) for m in members[:3])
    assert moved == 3  # 4-4-4 -> 3-3-3-3: one from each
    members[0].leave()
    settle(members[1:])
    kept = [len(before[m.member_id] & m.owned) for m in members[1:3]]
    assert kept == [3, 3]
    assert sorted(len(m.owned) for m in members[1:]) == [4, 4, 4]


def test_members_beyond_the_partition_count_stay_idle_and_take_over() -> None:
    group = Group({"b": 3})
    members = [Member(group, ("b",)) for _ in range(4)]
    settle(members)
    assert sorted(len(m.owned) for m in members) == [0, 1, 1, 1]
    busy = next(m for m in members if m.owned)
    busy.leave()
    rest = [m for m in members if m is not busy]
    settle(rest)
    assert sorted(len(m.owned) for m in rest) == [1, 1, 1]


def test_expired_members_leave_and_their_partitions_move() -> None:
    group = Group()
    members = [Member(group) for _ in range(2)]
    settle(members)
    group._apply(d.remove_members(group.image, G, [members[0].member_id], group.counts))
    settle(members[1:])
    assert len(members[1].owned) == 6
    with pytest.raises(HeadwaterError) as caught:
        members[0].beat()
    assert caught.value.code is ErrorCode.UNKNOWN_MEMBER_ID


def test_member_epochs_ahead_or_with_lost_partitions_are_fenced() -> None:
    group = Group()
    member = Member(group)
    member.beat()
    with pytest.raises(HeadwaterError) as caught:
        group.heartbeat(
            member_id=member.member_id, member_epoch=member.epoch + 5, subscribed_topics=("a",)
        )
    assert caught.value.code is ErrorCode.FENCED_MEMBER_EPOCH
    old_epoch, old_owned = member.epoch, member.owned
    other = Member(group)
    settle([member, other])
    assert member.epoch > old_epoch
    # The answer to a heartbeat was lost and the member sends it again, at its old
    # epoch: accepted while what it claims to own is still its own ...
    again = group.heartbeat(
        member_id=member.member_id,
        member_epoch=old_epoch,
        subscribed_topics=("a",),
        owned=member.owned,
    )
    assert again.member_epoch == member.epoch
    # ... fenced when it claims a partition that is now another member's.
    with pytest.raises(HeadwaterError) as caught:
        group.heartbeat(
            member_id=member.member_id,
            member_epoch=old_epoch,
            subscribed_topics=("a",),
            owned=old_owned,
        )
    assert caught.value.code is ErrorCode.FENCED_MEMBER_EPOCH


def test_static_member_comes_back_to_its_partitions_without_a_rebalance() -> None:
    group = Group()
    a = Member(group, instance_id="host-a")
    b = Member(group, instance_id="host-b")
    settle([a, b])
    epoch = group.state.epoch
    mine = a.owned
    group.heartbeat(member_id=a.member_id, member_epoch=d.STATIC_LEAVE_EPOCH, instance_id="host-a")
    assert len(group.state.members) == 2  # still holds its place
    again = Member(group, instance_id="host-a")
    answer = again.beat()
    assert frozenset(answer.assigned) == mine
    assert group.state.epoch == epoch
    assert a.member_id not in group.state.members


def test_a_live_static_members_instance_id_is_not_taken_over() -> None:
    """KIP-848: a member joining with the instance id of a member that has not left (no
    static leave, its session running) is refused UNRELEASED_INSTANCE_ID; the holder keeps
    its place and partitions, rather than being replaced at once."""
    group = Group()
    a = Member(group, instance_id="host-a")
    settle([a])
    mine = a.owned
    with pytest.raises(HeadwaterError) as caught:
        Member(group, instance_id="host-a").beat()
    assert caught.value.code is ErrorCode.UNRELEASED_INSTANCE_ID
    assert a.member_id in group.state.members
    assert frozenset(a.beat().assigned) == mine


def test_pattern_subscription_follows_new_topics() -> None:
    group = Group({"logs-1": 2})
    member = Member(group, topics=())
    member.extra = {"subscribed_pattern": "logs-.*"}
    settle([member])
    assert member.owned == {("logs-1", 0), ("logs-1", 1)}
    group.counts["logs-2"] = 1
    group.counts["__consumer_offsets"] = 50
    assert d.stale_targets(group.image, group.counts) == [G]
    group._apply(d.refresh_target(group.image, G, group.counts))
    settle([member])
    assert member.owned == {("logs-1", 0), ("logs-1", 1), ("logs-2", 0)}


def test_a_pattern_cannot_make_the_coordinator_spin() -> None:
    topics = {"a" * 200 + "!": 1}
    group = Group(topics)
    member = Member(group, topics=())
    member.extra = {"subscribed_pattern": "(a+)+$"}  # exponential for a backtracking engine
    started = time.monotonic()
    member.beat()
    assert time.monotonic() - started < 1.0


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"group_id": ""}, ErrorCode.INVALID_GROUP_ID),
        ({"group_id": "x" * 256}, ErrorCode.INVALID_GROUP_ID),
        ({"subscribed_topics": ()}, ErrorCode.INVALID_REQUEST),
        ({"subscribed_pattern": "("}, ErrorCode.INVALID_REGULAR_EXPRESSION),
        ({"subscribed_pattern": "x" * 1001}, ErrorCode.INVALID_REGULAR_EXPRESSION),
        ({"assignor": "roundrobin"}, ErrorCode.UNSUPPORTED_ASSIGNOR),
        ({"session_timeout_ms": 10}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"rebalance_timeout_ms": 10**8}, ErrorCode.INVALID_SESSION_TIMEOUT),
        ({"member_epoch": -3}, ErrorCode.INVALID_REQUEST),
        ({"member_epoch": 4}, ErrorCode.UNKNOWN_MEMBER_ID),
        ({"member_epoch": -2, "member_id": "m"}, ErrorCode.INVALID_REQUEST),
        ({"member_id": "m" * 256}, ErrorCode.INVALID_REQUEST),
        ({"subscribed_topics": ("t" * 250,)}, ErrorCode.INVALID_REQUEST),
        ({"subscribed_topics": ("",)}, ErrorCode.INVALID_REQUEST),
        ({"subscribed_topics": tuple(f"{i:0200}" for i in range(1400))}, ErrorCode.INVALID_REQUEST),
    ],
)
def test_bad_heartbeats_are_refused_with_their_code(
    fields: dict[str, object], code: ErrorCode
) -> None:
    request = {"group_id": G, "member_id": "", "member_epoch": 0, "subscribed_topics": ("a",)}
    request.update(fields)
    with pytest.raises(HeadwaterError) as caught:
        d.check_heartbeat(d.Heartbeat(**request), LIMITS)  # type: ignore[arg-type]
    assert caught.value.code is code


def test_group_size_is_limited() -> None:
    group = Group()
    members = [Member(group) for _ in range(LIMITS.members_max)]
    for member in members:
        member.beat()
    with pytest.raises(HeadwaterError) as caught:
        Member(group).beat()
    assert caught.value.code is ErrorCode.GROUP_MAX_SIZE_REACHED


def test_commits_are_fenced_by_ownership_and_epoch() -> None:
    group = Group()
    a, b = Member(group), Member(group)
    settle([a, b])
    mine = sorted(a.owned)[0]
    theirs = sorted(b.owned)[0]
    answers = group.commit(
        a.member_id,
        a.epoch,
        [
            d.CommitItem(*mine, 10),
            d.CommitItem(*theirs, 10),
            d.CommitItem("a", 99, 1),
            d.CommitItem("nope", 0, 1),
            d.CommitItem(*mine, -1),
            d.CommitItem(*mine, 1, "m" * 4097),
        ],
    )
    codes = [a and a.code for a in answers]
    assert codes == [
        None,
        ErrorCode.PARTITION_NOT_ASSIGNED,
        ErrorCode.PARTITION_OUT_OF_RANGE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.OFFSET_METADATA_TOO_LARGE,
    ]
    assert group.state.offsets[mine].offset == 10
    assert theirs not in group.state.offsets
    for member_id, epoch, code in (
        ("ghost", 1, ErrorCode.UNKNOWN_MEMBER_ID),
        (a.member_id, a.epoch + 1, ErrorCode.FENCED_MEMBER_EPOCH),
        ("", -1, ErrorCode.NON_EMPTY_GROUP),  # an admin reset of an active group
    ):
        before = group.image
        with pytest.raises(HeadwaterError) as caught:
            group.commit(member_id, epoch, [d.CommitItem(*mine, 11)])
        assert caught.value.code is code
        assert group.image is before
    with pytest.raises(HeadwaterError) as caught:
        d.commit_offsets(group.image, "unknown", "m", 1, [d.CommitItem(*mine, 1)], COUNTS, 0)
    assert caught.value.code is ErrorCode.GROUP_ID_NOT_FOUND
    with pytest.raises(HeadwaterError) as caught:
        group.commit(a.member_id, a.epoch, [])
    assert caught.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(HeadwaterError) as caught:  # 1.2 MB of metadata in one request
        group.commit(a.member_id, a.epoch, [d.CommitItem(*mine, 1, "m" * 4000)] * 300)
    assert caught.value.code is ErrorCode.INVALID_REQUEST


def test_a_member_that_lost_a_partition_cannot_commit_it() -> None:
    group = Group()
    a = Member(group)
    a.beat()
    old_epoch = a.epoch
    lost = sorted(a.owned)[-1]
    b = Member(group)
    settle([a, b])
    assert lost in b.owned
    (answer,) = group.commit(a.member_id, old_epoch, [d.CommitItem(*lost, 5)])
    assert answer is not None and answer.code is ErrorCode.STALE_MEMBER_EPOCH


def test_admin_commits_delete_and_expiry_of_an_empty_group() -> None:
    group = Group()
    assert group.commit("", -1, [d.CommitItem("a", 0, 7)]) == [None]  # creates the group
    assert group.state.offsets[("a", 0)].offset == 7
    member = Member(group)
    member.beat()
    with pytest.raises(HeadwaterError) as caught:
        d.delete_group(group.image, G)
    assert caught.value.code is ErrorCode.NON_EMPTY_GROUP
    member.leave()
    assert group._apply(d.expire_offsets(group.image, 1000 + 500, 1000)) is None
    assert group.state is not None  # not old enough yet
    group._apply(d.expire_offsets(group.image, 1000 + 1000, 1000))
    assert group.state is None
    with pytest.raises(HeadwaterError) as caught:
        d.delete_group(group.image, G)
    assert caught.value.code is ErrorCode.GROUP_ID_NOT_FOUND


@pytest.mark.parametrize("seed", range(8))
def test_random_histories_never_share_a_partition_and_settle(seed: int) -> None:
    """Members join, leave, time out, resubscribe and skip heartbeats at random; honest
    members release what they are told to give up only some of the time. ``apply``
    refuses any record that would give a partition two owners, so a decision that tried
    would raise; at the end, with everyone heartbeating, the group settles balanced."""
    rng = random.Random(seed)
    group = Group({"a": 7, "b": 5})
    members: list[Member] = []
    for _ in range(300):
        roll = rng.random()
        if roll < 0.08 and len(members) < 8:
            members.append(Member(group, rng.choice([("a",), ("b",), ("a", "b")])))
            members[-1].beat()
        elif roll < 0.12 and members:
            members.pop(rng.randrange(len(members))).leave()
        elif roll < 0.14 and members:
            gone = members.pop(rng.randrange(len(members)))
            group._apply(d.remove_members(group.image, G, [gone.member_id], group.counts))
        elif roll < 0.16 and members:
            member = rng.choice(members)
            member.topics = rng.choice([("a",), ("b",), ("a", "b")])
            member.beat()
        elif members:
            member = rng.choice(members)
            if rng.random() < 0.5:
                member.beat()
            else:  # a slow member: still reading what it is giving up
                answer = group.heartbeat(
                    member_id=member.member_id,
                    member_epoch=member.epoch,
                    subscribed_topics=member.topics,
                    owned=member.owned,
                )
                member.epoch = answer.member_epoch
                member.owned = member.owned | frozenset(answer.assigned)
        state = group.state
        if state is not None:
            held = [tp for a in state.current.values() for tp in (*a.assigned, *a.revoking)]
            assert len(held) == len(set(held))
    settle(members, rounds=6)
    if members:
        state = group.state
        assert state.state == "stable"
        owned = [tp for m in members for tp in m.owned]
        assert len(owned) == len(set(owned))
        subscribed = {t for m in members for t in m.topics}
        assert set(owned) == {(t, p) for t in subscribed for p in range(group.counts[t])}


@pytest.mark.parametrize("seed", range(4))
def test_apply_offsets_is_applying_each_commit(seed: int) -> None:
    rng = random.Random(seed)
    image = GroupsImage()
    for _ in range(20):
        records = [
            OffsetCommitted(G, rng.choice("ab"), rng.randrange(5), rng.randrange(100), "", 1)
            for _ in range(rng.randrange(1, 8))
        ]
        one_by_one = image
        for record in records:
            one_by_one = apply(one_by_one, record)
        image = apply_offsets(image, records)
        assert image == one_by_one
    with pytest.raises(GroupRecordError):
        apply_offsets(
            image, [OffsetCommitted(G, "a", 0, 1, "", 1), OffsetCommitted("h", "a", 0, 1, "", 1)]
        )


def test_commits_from_before_a_member_joined_again_are_refused() -> None:
    """A member that was fenced joins again under the same id; a commit it sent before
    (its old epoch) must not be stored, even for a partition it holds again."""
    group = Group({"a": 2})
    member = Member(group, ("a",))
    settle([member])
    old_epoch = member.epoch
    member.epoch, member.owned = 0, frozenset()  # fenced: joins again as itself
    settle([member, Member(group, ("a",))])
    assert member.owned and member.epoch > old_epoch
    held = sorted(member.owned)[0]
    with pytest.raises(HeadwaterError) as caught:
        group.commit(member.member_id, old_epoch, [d.CommitItem(*held, 5)])
    assert caught.value.code is ErrorCode.STALE_MEMBER_EPOCH
    assert group.commit(member.member_id, member.epoch, [d.CommitItem(*held, 5)]) == [None]
    with pytest.raises(HeadwaterError) as fenced:
        group.heartbeat(
            member_id=member.member_id,
            member_epoch=old_epoch,
            subscribed_topics=("a",),
            owned=frozenset([held]),
        )
    assert fenced.value.code is ErrorCode.FENCED_MEMBER_EPOCH
