"""Consumer groups' pure core (node/groups): the records of ``__consumer_offsets``, the
group image and its apply, the assignors against an oracle (Hypothesis), and member
reconciliation under seeded random histories: no partition ever has two owners, and every
history settles on the target."""

from __future__ import annotations

import contextlib
import json
import random
from collections.abc import Mapping
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.node.groups import decisions
from headwater.node.groups import records as r
from headwater.node.groups.assignors import range_assignor, reconcile, uniform
from headwater.node.groups.image import GroupsImage, GroupState, apply, replay
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.topics import check_group_id

G = "g"


# ---------------------------------------------------------------------- records


SAMPLES: list[r.GroupRecord] = [
    r.GroupEpochBumped(G, 3),
    r.MemberJoined(G, "m1", "", "client", ("a", "b"), "", 45_000, 60_000),
    r.MemberJoined(G, "m2", "i", "c", (), "o.*", 45_000, 60_000, "range", 4, "10.0.0.7"),
    r.MemberLeft(G, "m1"),
    r.TargetAssignment(G, 3, (("m1", (("a", 0), ("b", 2))), ("m2", ()))),
    r.MemberAssignment(G, "m1", 3, (("a", 0),), (("b", 1),)),
    r.OffsetCommitted(G, "a", 0, 42, "meta", 1_700_000_000_000),
    r.OffsetDeleted(G, "a", 0),
    r.GroupDeleted(G),
    r.ClassicGeneration(
        G, 4, "consumer", "range", "m1", (("m1", "c", "h", 6000, 9000, "AAE=", ""),)
    ),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda x: type(x).__name__)
def test_records_round_trip(record: r.GroupRecord) -> None:
    assert r.decode_record(r.encode_record(record)) == record


def test_a_member_record_written_without_a_host_reads_with_none() -> None:
    """Members joined before records carried the member's address read as unknown."""
    written = json.loads(r.encode_record(SAMPLES[2]))
    del written["host"]
    assert r.decode_record(json.dumps(written).encode()) == replace(SAMPLES[2], host="")


def test_keys_name_what_a_record_sets() -> None:
    committed = r.OffsetCommitted(G, "a", 0, 1, "", 0)
    assert r.record_key(committed) == r.record_key(r.OffsetCommitted(G, "a", 0, 9, "x", 5))
    assert r.record_key(committed) == r.record_key(r.OffsetDeleted(G, "a", 0))
    assert r.record_key(committed) != r.record_key(r.OffsetCommitted(G, "a", 1, 1, "", 0))
    assert r.record_key(SAMPLES[1]) == r.record_key(SAMPLES[3])  # joined and left: one key


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        (b"\xff", "not JSON"),
        (b"[]", "JSON object"),
        (b'{"type": "Nope", "version": 1}', "unknown group record type"),
        (b'{"type": "GroupDeleted", "version": 2, "group_id": "g"}', "version 2"),
        (b'{"type": "GroupDeleted", "version": 1}', "lacks field"),
        (b'{"type": "GroupEpochBumped", "version": 1, "group_id": "g", "epoch": "3"}', "epoch"),
        (
            b'{"type": "MemberAssignment", "version": 1, "group_id": "g", "member_id": "m", '
            b'"member_epoch": 1, "assigned": [["a", -1]], "revoking": []}',
            "assigned",
        ),
    ],
)
def test_bad_records_are_refused_with_the_reason(data: bytes, fragment: str) -> None:
    with pytest.raises(r.GroupRecordError, match=fragment):
        r.decode_record(data)


def test_the_coordinator_partition_and_group_ids() -> None:
    assert r.coordinator_partition("g1") == r.coordinator_partition("g1")
    spread = {r.coordinator_partition(f"group-{i}") for i in range(500)}
    assert spread <= set(range(r.OFFSETS_TOPIC_PARTITIONS)) and len(spread) > 40
    check_group_id("g" * 255)
    for bad in ("", "g" * 256):
        with pytest.raises(HeadwaterError, match="1 to 255"):
            check_group_id(bad)


# ---------------------------------------------------------------------- assignors


@st.composite
def groups(
    draw: st.DrawFn,
) -> tuple[dict[str, set[str]], dict[str, int], dict[str, set[r.TopicPartitionKey]], bool]:
    topics = {f"t{i}": draw(st.integers(1, 12)) for i in range(draw(st.integers(1, 4)))}
    names = sorted(topics)
    member_ids = [f"m{i}" for i in range(draw(st.integers(1, 8)))]
    same = draw(st.booleans())
    shared = set(draw(st.lists(st.sampled_from(names), min_size=1, unique=True)))
    members = {
        m: shared if same else set(draw(st.lists(st.sampled_from(names), unique=True)))
        for m in member_ids
    }
    everything = [(t, p) for t, n in topics.items() for p in range(n)] + [("gone", 0)]
    current = {
        m: set(draw(st.lists(st.sampled_from(everything), max_size=8, unique=True)))
        for m in member_ids
    }
    return members, topics, current, same


def _check_complete(
    assignment: Mapping[str, frozenset[r.TopicPartitionKey]],
    members: Mapping[str, set[str]],
    topics: Mapping[str, int],
) -> None:
    owners: dict[r.TopicPartitionKey, str] = {}
    for member, held in assignment.items():
        for tp in held:
            assert tp not in owners, f"{tp} given to {owners[tp]} and {member}"
            assert tp[0] in members[member], f"{tp} given to {member}, not subscribed"
            owners[tp] = member
    wanted = {
        (t, p) for t, n in topics.items() for p in range(n) if any(t in s for s in members.values())
    }
    assert set(owners) == wanted


@settings(max_examples=300, deadline=None)
@given(groups())
def test_uniform_is_complete_balanced_and_sticky(
    case: tuple[dict[str, set[str]], dict[str, int], dict[str, set[r.TopicPartitionKey]], bool],
) -> None:
    members, topics, current, same = case
    assignment = uniform(members, topics, current)
    _check_complete(assignment, members, topics)
    assert uniform(members, topics, current) == assignment  # deterministic
    if same:
        counts = [len(held) for held in assignment.values()]
        assert max(counts) - min(counts) <= 1
        total = sum(counts)
        claimed: set[r.TopicPartitionKey] = set()
        for member in sorted(members):  # what each member may keep: valid, not claimed before
            valid = {
                tp
                for tp in current[member]
                if tp[0] in members[member] and tp[1] < topics.get(tp[0], 0) and tp not in claimed
            }
            claimed |= valid
            kept = len(valid & assignment[member])
            assert kept >= min(len(valid), total // len(members)), (member, valid, assignment)
    else:  # no member holds two more than another member that could take one of its partitions
        for giver, held in assignment.items():
            for taker in members:
                if len(held) - len(assignment[taker]) > 1:
                    assert not any(tp[0] in members[taker] for tp in held), (giver, taker)


@settings(max_examples=200, deadline=None)
@given(groups())
def test_range_gives_contiguous_even_ranges(
    case: tuple[dict[str, set[str]], dict[str, int], dict[str, set[r.TopicPartitionKey]], bool],
) -> None:
    members, topics, current, _same = case
    assignment = range_assignor(members, topics, current)
    _check_complete(assignment, members, topics)
    for topic in topics:
        shares = [sorted(p for t, p in held if t == topic) for held in assignment.values()]
        shares = [s for s in shares if s] or [[]]
        for share in shares:
            assert share == list(range(share[0], share[0] + len(share))) if share else True
        subscribed = sum(1 for s in members.values() if topic in s)
        if subscribed:
            sizes = [
                len([p for t, p in assignment[m] if t == topic])
                for m in members
                if topic in members[m]
            ]
            assert max(sizes) - min(sizes) <= 1


# ---------------------------------------------------------------------- image and reconcile


class Coordinator:
    """A model coordinator over the pure core: membership changes bump the epoch and
    write a new target; heartbeats reconcile one member. Every record goes through
    ``apply`` and is kept, so a replay can be compared."""

    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = topics
        self.image = GroupsImage()
        self.log: list[r.GroupRecord] = []

    @property
    def group(self) -> GroupState:
        return self.image.group(G) or GroupState(G)

    def write(self, record: r.GroupRecord) -> None:
        self.image = apply(self.image, record)
        self.log.append(record)
        owners: dict[r.TopicPartitionKey, str] = {}
        for member, assignment in self.group.current.items():
            for tp in (*assignment.assigned, *assignment.revoking):
                assert tp not in owners, f"{tp} held by {owners[tp]} and {member}"
                owners[tp] = member

    def membership(self, record: r.MemberJoined | r.MemberLeft) -> None:
        self.write(record)
        group = self.group
        self.write(r.GroupEpochBumped(G, group.epoch + 1))
        group = self.group
        subscriptions = {m: set(j.subscribed_topics) for m, j in group.members.items()}
        owned = {m: set(a.assigned) | set(a.revoking) for m, a in group.current.items()}
        target = uniform(subscriptions, self.topics, owned)
        members = tuple(sorted((m, tuple(sorted(p))) for m, p in target.items()))
        self.write(r.TargetAssignment(G, group.epoch, members))

    def heartbeat(self, member: str, releases: bool) -> None:
        current = self.group.current.get(member)
        owned = set(current.assigned) if current is not None else set()
        if current is not None and not releases:
            owned |= set(current.revoking)  # still working through its revocation
        after = reconcile(self.group, member, owned)
        if after != current:
            self.write(after)


@pytest.mark.parametrize("seed", range(12))
def test_random_histories_never_share_a_partition_and_settle(seed: int) -> None:
    rng = random.Random(seed)
    topics = {"a": rng.randint(1, 12), "b": rng.randint(1, 6)}
    coordinator = Coordinator(topics)
    next_id = 0
    for _step in range(400):
        members = sorted(coordinator.group.members)
        action = rng.random()
        if action < 0.12 or not members:
            next_id += 1
            subscribed = tuple(sorted(rng.sample(["a", "b"], rng.randint(1, 2))))
            joined = r.MemberJoined(G, f"m{next_id}", "", "c", subscribed, "", 45_000, 60_000)
            coordinator.membership(joined)
        elif action < 0.2:
            coordinator.membership(r.MemberLeft(G, rng.choice(members)))
        else:
            coordinator.heartbeat(rng.choice(members), releases=rng.random() < 0.6)
    for _round in range(20):  # faults over: every member heartbeats and releases
        for member in sorted(coordinator.group.members):
            coordinator.heartbeat(member, releases=True)
    group = coordinator.group
    assert group.state in ("stable", "empty"), group.state
    for member, assignment in group.current.items():
        assert set(assignment.assigned) == set(group.target[member]) and not assignment.revoking
    replayed = GroupsImage()
    for record in coordinator.log:
        replayed = apply(replayed, record)
    assert replayed == coordinator.image


def test_apply_refuses_a_second_owner_and_falling_epochs() -> None:
    image = GroupsImage()
    for record in (
        r.MemberJoined(G, "m1", "", "c", ("a",), "", 45_000, 60_000),
        r.MemberJoined(G, "m2", "", "c", ("a",), "", 45_000, 60_000),
        r.GroupEpochBumped(G, 1),
        r.TargetAssignment(G, 1, (("m1", (("a", 0),)), ("m2", (("a", 1),)))),
        r.MemberAssignment(G, "m1", 1, (("a", 0),), ()),
    ):
        image = apply(image, record)
    with pytest.raises(r.GroupRecordError, match="still holds"):
        apply(image, r.MemberAssignment(G, "m2", 1, (("a", 0),), ()))
    with pytest.raises(r.GroupRecordError, match="epoch 1 after 1"):
        apply(image, r.GroupEpochBumped(G, 1))
    with pytest.raises(r.GroupRecordError, match="past the target"):
        apply(image, r.MemberAssignment(G, "m2", 2, (("a", 1),), ()))
    with pytest.raises(r.GroupRecordError, match="twice"):
        apply(image, r.TargetAssignment(G, 1, (("m1", (("a", 0),)), ("m2", (("a", 0),)))))
    with pytest.raises(r.GroupRecordError, match="not a member"):
        apply(image, r.MemberAssignment(G, "m9", 1, (), ()))
    left = apply(image, r.MemberLeft(G, "m1"))
    assert (
        apply(left, r.MemberAssignment(G, "m2", 1, (("a", 0),), ())).groups[G].owner(("a", 0))
        == "m2"
    )  # a member that leaves frees its partitions


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)


@given(st.binary(max_size=200) | json_values.map(lambda v: json.dumps(v).encode()))
def test_decoding_any_bytes_gives_a_record_or_a_group_record_error(data: bytes) -> None:
    with contextlib.suppress(r.GroupRecordError):
        r.decode_record(data)


@given(
    st.sampled_from(sorted(r.RECORD_TYPES)),
    st.dictionaries(
        st.sampled_from(
            [
                "group_id",
                "member_id",
                "epoch",
                "members",
                "assigned",
                "revoking",
                "topic",
                "partition",
                "offset",
                "subscribed_topics",
                "member_epoch",
                "metadata",
            ]
        ),
        json_values,
    ),
)
def test_records_with_fields_of_any_type_are_refused_not_crashed(
    kind: str, fields: dict[str, object]
) -> None:
    with contextlib.suppress(r.GroupRecordError):
        r.decode_record(json.dumps({"type": kind, "version": 1, **fields}).encode())


def test_deeply_nested_or_huge_values_are_refused() -> None:
    for data in (b"[" * 100_000 + b"]" * 100_000, b" " * (r.RECORD_BYTES_MAX + 1)):
        with pytest.raises(r.GroupRecordError):
            r.decode_record(data)


# ---------------------------------------------------------------------- compaction


def compact(
    entries: list[tuple[bytes, bytes | None]], cut: int, drop_tombstones: bool
) -> list[tuple[bytes, bytes | None]]:
    """What the log cleaner leaves of ``entries`` cleaned below index ``cut``: the newest
    entry of each key among those below it (tombstones too, unless expired), and
    everything from ``cut`` on."""
    newest = {key: i for i, (key, _) in enumerate(entries[:cut])}
    return [
        (key, value)
        for i, (key, value) in enumerate(entries)
        if i >= cut or (newest[key] == i and not (value is None and drop_tombstones))
    ]


def replayed(entries: list[tuple[bytes, bytes | None]]) -> GroupsImage:
    image, problems = replay(GroupsImage(), [k for k, _ in entries], [v for _, v in entries])
    assert problems == []
    return image


@pytest.mark.parametrize("seed", range(16))
def test_a_compacted_group_log_replays_to_the_image_of_the_whole_log(seed: int) -> None:
    """The cleaner keeps the newest record per key of __consumer_offsets: replaying what
    it leaves, at any cleaned point, with or without expired tombstones, gives the image
    the whole log gives (and the coordinator's)."""
    rng = random.Random(seed)
    topics = {"a": rng.randint(1, 8), "b": rng.randint(1, 4)}
    coordinator = Coordinator(topics)
    next_id = 0
    for _step in range(300):
        members = sorted(coordinator.group.members)
        action = rng.random()
        if action < 0.1 or (not members and action < 0.5):
            next_id += 1
            subscribed = tuple(sorted(rng.sample(["a", "b"], rng.randint(1, 2))))
            coordinator.membership(
                r.MemberJoined(G, f"m{next_id % 7}", "", "c", subscribed, "", 45_000, 60_000)
            )
        elif action < 0.18 and members:
            coordinator.membership(r.MemberLeft(G, rng.choice(members)))
        elif action < 0.4:
            topic = rng.choice(sorted(topics))
            partition = rng.randrange(topics[topic])
            coordinator.write(r.OffsetCommitted(G, topic, partition, rng.randrange(1000), "", 0))
        elif action < 0.45:
            topic = rng.choice(sorted(topics))
            coordinator.write(r.OffsetDeleted(G, topic, rng.randrange(topics[topic])))
        elif action < 0.47 and not members:
            for topic, partition in sorted(coordinator.group.offsets):  # as delete_group
                coordinator.write(r.OffsetDeleted(G, topic, partition))
            coordinator.write(r.GroupDeleted(G))
        elif members:
            coordinator.heartbeat(rng.choice(members), releases=rng.random() < 0.6)
    entries = [entry for record in coordinator.log for entry in r.log_entries(record)]
    whole = replayed(entries)
    assert whole == coordinator.image
    for cut in sorted({0, len(entries), *(rng.randrange(len(entries)) for _ in range(6))}):
        for drop_tombstones in (False, True):
            left = compact(entries, cut, drop_tombstones)
            assert replayed(left) == whole, (cut, drop_tombstones)
            # A second pass over what the first left changes nothing either.
            assert replayed(compact(left, len(left), drop_tombstones)) == whole
    assert len(compact(entries, len(entries), True)) < len(entries) // 2
    # A group deleted at the end leaves nothing once its tombstones expire.
    for member in sorted(coordinator.group.members):
        coordinator.write(r.MemberLeft(G, member))
    for topic, partition in sorted(coordinator.group.offsets):
        coordinator.write(r.OffsetDeleted(G, topic, partition))
    coordinator.write(r.GroupDeleted(G))
    entries = [entry for record in coordinator.log for entry in r.log_entries(record)]
    assert replayed(entries) == GroupsImage()
    assert compact(entries, len(entries), drop_tombstones=True) == []


def test_tombstone_keys_name_their_removal_and_nothing_else() -> None:
    left = r.MemberLeft(G, "m1")
    (member_key, none1), (assignment_key, none2) = r.log_entries(left)
    assert none1 is None and none2 is None
    assert r.removal_of(member_key) == left
    assert r.removal_of(assignment_key) == r.AssignmentCleared(G, "m1")
    ((offset_key, none3),) = r.log_entries(r.OffsetDeleted(G, "a", 3))
    assert none3 is None and r.removal_of(offset_key) == r.OffsetDeleted(G, "a", 3)
    deleted = r.log_entries(r.GroupDeleted(G))
    # Its group, epoch, target and classic-generation keys.
    assert [value for _, value in deleted] == [None, None, None, None]
    assert {r.removal_of(key) for key, _ in deleted} == {r.GroupDeleted(G)}
    for bad in (b"\xff", b"[]", b'["member","g"]', b'["offset","g","a",-1]', b'["target","g","x"]'):
        with pytest.raises(r.GroupRecordError):
            r.removal_of(bad)


def test_a_classic_generation_is_kept_by_compaction_and_ends_with_its_group() -> None:
    saved = r.ClassicGeneration(
        G, 2, "consumer", "range", "m1", (("m1", "c", "h", 6000, 9000, "", ""),)
    )
    image = apply(GroupsImage(), saved)
    group = image.group(G)
    assert group is not None and group.has_classic_members and group.classic == saved
    with pytest.raises(HeadwaterError) as refused:
        decisions.delete_group(image, G)
    assert refused.value.code is ErrorCode.NON_EMPTY_GROUP
    emptied = apply(image, r.ClassicGeneration(G, 3, "consumer", "", "", ()))
    assert decisions.delete_group(emptied, G).image.group(G) is None
    ((key, value),) = r.log_entries(saved)
    assert key == b'["classic","g"]' and value is not None
