"""The controller's decisions (pure): each takes the current image and a request and returns
``ControllerResult(records, response)``.

Nothing here changes state. The driver (``headwater.node.cluster.controller``) proposes the records
to the quorum and answers with the response once they are committed; every node then
applies them (``headwater.raft.metadata.image.apply``). Time and randomness come in as arguments
(``now_ms``, a seeded ``random.Random``), so tests replay any decision exactly.

Placement (``assign_replicas``): live brokers are ordered so that consecutive brokers sit
on different racks where possible (Kafka's rack-alternating list); partition ``p`` of a
new topic takes ``rf`` consecutive brokers of that list starting at ``start + p``, with a
random ``start``, so leaders (the first replica) and replicas are spread evenly.

Leader election (``elect``): the first replica, in replica order, that is in the ISR and
live (registered, unfenced, not shutting down). With none, the partition goes offline
(leader -1) until an ISR member returns, unless the topic sets
``unclean_leader_election=true``: then a live replica outside the ISR is chosen and the ISR
becomes that replica alone (acknowledged data may be lost, as in Kafka). Every leader
change bumps the leader epoch; every change bumps the partition epoch.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Generic, TypeVar

from headwater.raft.metadata import records as r
from headwater.raft.metadata.image import (
    PRODUCER_ID_MAX,
    BrokerState,
    MetadataImage,
    PartitionState,
    TopicImage,
    acl_created,
    acl_deleted,
)
from headwater.shared.acls import ACLS_MAX, Acl, AclFilter, check_acl
from headwater.shared.credentials import USERS_MAX, ScramCredential, check_user_name
from headwater.shared.errors import ErrorCode, HeadwaterError, shown
from headwater.shared.quotas import QUOTA_ENTITIES_MAX, check_entity, check_quota_changes
from headwater.shared.topics import INTERNAL_PREFIX, check_topic_name, unknown_topic

if TYPE_CHECKING:
    import random

T = TypeVar("T")
UNCLEAN_ELECTION_KEY: Final = "unclean_leader_election"


@dataclass(frozen=True, slots=True)
class ControllerResult(Generic[T]):
    records: tuple[r.Record, ...]
    response: T


@dataclass(frozen=True, slots=True)
class TopicLimits:
    """Server-side rules for CreateTopics; ``check_configs`` raises INVALID_CONFIG, and
    returns the overrides as the topic stores them (canonical text)."""

    partitions_max: int
    topics_max: int
    default_partitions: int
    default_replication_factor: int
    check_configs: Callable[[Mapping[str, str]], Mapping[str, str]] = field(default=dict)


@dataclass(frozen=True, slots=True)
class NewTopic:
    name: str
    partitions: int | None = None
    replication_factor: int | None = None
    configs: Mapping[str, str] = field(default_factory=dict)
    # Internal topics (names starting with "__") are created by the cluster itself.
    internal: bool = False


@dataclass(frozen=True, slots=True)
class TopicOutcome:
    name: str
    error: HeadwaterError | None = None
    topic_id: str = ""


@dataclass(frozen=True, slots=True)
class HeartbeatOutcome:
    fenced: bool
    # Controlled shutdown: true once the broker leads no partition another can take.
    shutdown_ready: bool = False


# --------------------------------------------------------------------- controller


def activate(
    image: MetadataImage,
    epoch: int,
    node_id: int,
    address: str,
    rng: random.Random,
    internal_address: str = "",
) -> ControllerResult[None]:
    """The Raft leader of term ``epoch`` claims the controller role (its first record); the
    first activation of a cluster also names it with a random id."""
    cluster_id = image.cluster_id or uuid.UUID(int=rng.getrandbits(128), version=4).hex
    activated = r.ControllerActivated(epoch, node_id, address, cluster_id, internal_address)
    return ControllerResult((activated,), None)


# --------------------------------------------------------------------- brokers


def register_broker(
    image: MetadataImage,
    epoch: int,
    node_id: int,
    incarnation_id: str,
    address: str,
    rack: str,
    internal_address: str = "",
    partition_capacity: int = 0,
    kafka_address: str = "",
) -> ControllerResult[int]:
    """Register a broker process; the response is its broker epoch.

    The same incarnation registering again (a retry) gets its epoch back and no records. A
    new incarnation (the process restarted) replaces the old one, fenced, and leadership of
    the old one's partitions moves to other live ISR members.
    """
    existing = image.brokers.get(node_id)
    if existing is not None and existing.incarnation_id == incarnation_id:
        return ControllerResult((), existing.broker_epoch)
    broker_epoch = image.broker_epoch_last + 1
    registered = BrokerState(
        node_id,
        incarnation_id,
        broker_epoch,
        address,
        rack,
        internal_address=internal_address,
        kafka_address=kafka_address,
        partition_capacity=partition_capacity,
    )
    after = _with_broker(image, registered)
    records: list[r.Record] = [
        r.RegisterBroker(
            epoch,
            node_id,
            incarnation_id,
            broker_epoch,
            address,
            rack,
            internal_address,
            partition_capacity,
            kafka_address,
        )
    ]
    if existing is not None:
        records += _remove_and_elect(after, epoch, {node_id})
    return ControllerResult(tuple(records), broker_epoch)


def heartbeat(
    image: MetadataImage,
    epoch: int,
    node_id: int,
    broker_epoch: int,
    want_shutdown: bool = False,
    log_dir_problem: str = "",
) -> ControllerResult[HeartbeatOutcome]:
    """A broker's heartbeat: unfences it (and elects it where partitions are offline), or,
    with ``want_shutdown``, marks it shutting down and moves its leadership away.

    ``log_dir_problem`` (non-empty: its log directory is offline, and why) is recorded
    when it changes (``BrokerLogDirChanged``): going offline takes the broker out of
    every ISR and moves its leadership, as fencing does; coming back elects it where
    partitions have no leader, and it rejoins ISRs the usual way, once it has caught
    up with each leader.

    Raises STALE_BROKER_EPOCH when the broker must register again.
    """
    broker = _current_broker(image, node_id, broker_epoch)
    records: list[r.Record] = []
    after = image
    problem = log_dir_problem[: r.LOG_DIR_PROBLEM_CHARS_MAX]
    if problem != broker.log_dir_problem:
        records.append(r.BrokerLogDirChanged(epoch, node_id, broker_epoch, bool(problem), problem))
        broker = dataclasses.replace(broker, log_dir_problem=problem)
        after = _with_broker(image, broker)
        if problem:
            records += _remove_and_elect(after, epoch, {node_id})
    if want_shutdown or broker.shutting_down:
        if not broker.shutting_down:
            records.append(r.BrokerShuttingDown(epoch, node_id, broker_epoch))
            after = _with_broker(after, dataclasses.replace(broker, shutting_down=True))
        # A partition with no other live ISR member keeps this leader until the node stops.
        moves = _remove_and_elect(after, epoch, {node_id}, keep_sole_leader=True)
        records += moves
        still_leading = _leads_any_movable(after, node_id, moves)
        return ControllerResult(tuple(records), HeartbeatOutcome(True, not still_leading))
    if broker.fenced:
        records.append(r.UnfenceBroker(epoch, node_id, broker_epoch))
        after = _with_broker(after, dataclasses.replace(broker, fenced=False))
    # Unfenced, or back online: it may lead where no one does (an offline broker may not).
    if records and not problem:
        records += _elect_all(after, epoch, lambda p: p.leader == r.NO_LEADER)
    return ControllerResult(tuple(records), HeartbeatOutcome(False))


PRODUCER_ID_BLOCK: Final = 1000


def allocate_producer_ids(
    image: MetadataImage, epoch: int, node_id: int, broker_epoch: int
) -> ControllerResult[tuple[int, int]]:
    """The next block of PRODUCER_ID_BLOCK producer ids for broker ``node_id`` (at its
    current ``broker_epoch``): ``(first, end)``, committed as ``ProducerIdsAllocated``."""
    broker = image.brokers.get(node_id)
    if broker is None or broker.broker_epoch != broker_epoch:
        raise HeadwaterError(
            ErrorCode.STALE_BROKER_EPOCH,
            f"broker {node_id} at epoch {broker_epoch} is not registered (current: "
            f"{broker.broker_epoch if broker else 'none'}); producer ids go to registered "
            "brokers",
        )
    first = image.next_producer_id
    end = min(first + PRODUCER_ID_BLOCK, PRODUCER_ID_MAX + 1)
    if first >= end:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_SERVER_ERROR, "every producer id has been allocated (2^63)"
        )
    return ControllerResult((r.ProducerIdsAllocated(epoch, node_id, first, end),), (first, end))


def fence_expired(
    image: MetadataImage,
    epoch: int,
    last_heartbeat_ms: Mapping[int, int],
    now_ms: int,
    session_timeout_ms: int,
) -> ControllerResult[list[int]]:
    """Fence every unfenced broker not heard from for ``session_timeout_ms`` (a broker
    missing from ``last_heartbeat_ms`` counts as never heard from) and move leadership off
    it. The response lists the fenced node ids."""
    expired = [
        b
        for b in image.brokers.values()
        if not b.fenced
        and now_ms - last_heartbeat_ms.get(b.node_id, -(1 << 62)) > session_timeout_ms
    ]
    if not expired:
        return ControllerResult((), [])
    after = image
    records: list[r.Record] = []
    for broker in sorted(expired, key=lambda b: b.node_id):
        records.append(r.FenceBroker(epoch, broker.node_id, broker.broker_epoch))
        after = _with_broker(after, dataclasses.replace(broker, fenced=True))
    gone = {b.node_id for b in expired}
    records += _remove_and_elect(after, epoch, gone)
    return ControllerResult(tuple(records), sorted(gone))


def elect_preferred_leaders(
    image: MetadataImage, epoch: int, imbalance_percent_max: int = 0
) -> ControllerResult[int]:
    """Move leadership back to each partition's preferred (first) replica where that
    replica is live and in the ISR; the response counts the moves. With
    ``imbalance_percent_max``, only the partitions of brokers whose imbalance is past it:
    a broker's imbalance is the share of the partitions it is the preferred leader of that
    another broker leads (Kafka's ``leader.imbalance.per.broker.percentage``), so that
    leadership, and with it group coordinators, does not move back and forth on every
    recovery."""
    preferred_of: dict[int, int] = {}
    elsewhere: dict[int, list[tuple[TopicImage, PartitionState]]] = {}
    for topic, p in image.partitions():
        preferred = p.preferred_leader
        preferred_of[preferred] = preferred_of.get(preferred, 0) + 1
        if p.leader != preferred:
            elsewhere.setdefault(preferred, []).append((topic, p))
    records: list[r.Record] = []
    for broker, partitions in sorted(elsewhere.items()):
        if len(partitions) * 100 <= imbalance_percent_max * preferred_of[broker]:
            continue
        if not _live(image, broker):
            continue
        records += [
            _change(topic, p, epoch, leader=broker) for topic, p in partitions if broker in p.isr
        ]
    return ControllerResult(tuple(records), len(records))


# --------------------------------------------------------------------- topics


def create_topics(
    image: MetadataImage,
    epoch: int,
    requests: Sequence[NewTopic],
    limits: TopicLimits,
    rng: random.Random,
    validate_only: bool = False,
) -> ControllerResult[list[TopicOutcome]]:
    """Create each valid topic (a bad one fails alone, with the rule it broke). A name
    given more than once is refused each time (INVALID_REQUEST, as Kafka does), and a
    name that collides with another topic's once '.' and '_' are taken as one (they are
    the same in metric names) is refused (INVALID_TOPIC_EXCEPTION)."""
    records: list[r.Record] = []
    outcomes: list[TopicOutcome] = []
    taken = set(image.topics)
    collision_keys = {metric_name(name): name for name in taken}
    hosted = replicas_per_broker(image)
    partitions_created = 0
    repeated = _repeated(request.name for request in requests)
    for request in requests:
        try:
            if request.name in repeated:
                raise _named_twice(request.name)
            other = collision_keys.get(metric_name(request.name))
            if other is not None and other != request.name:
                raise HeadwaterError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION,
                    f"topic {shown(request.name)} collides with topic {shown(other)}: with "
                    "'.' and '_' taken as one (as in metric names) they are the same name",
                )
            topic_records = _create_topic(image, epoch, request, limits, rng, taken)
            new = [rec.replicas for rec in topic_records if isinstance(rec, r.PartitionCreated)]
            if partitions_created + len(new) > limits.partitions_max:
                raise HeadwaterError(
                    ErrorCode.INVALID_PARTITIONS,
                    f"this request would create {partitions_created + len(new)} partitions in "
                    f"all; at most {limits.partitions_max} (partitions_max) per request",
                )
            hosted = _within_capacity(image, hosted, new)
        except HeadwaterError as error:
            outcomes.append(TopicOutcome(request.name, error))
            continue
        partitions_created += len(new)
        taken.add(request.name)
        collision_keys[metric_name(request.name)] = request.name
        created = topic_records[0]
        assert isinstance(created, r.TopicCreated)
        outcomes.append(TopicOutcome(request.name, None, "" if validate_only else created.topic_id))
        if not validate_only:
            records += topic_records
    return ControllerResult(tuple(records), outcomes)


def metric_name(topic: str) -> str:
    """``topic`` as metric names see it: '.' and '_' are one (Kafka's collision rule)."""
    return topic.replace(".", "_")


def _repeated(names: Iterable[str]) -> set[str]:
    counts = Counter(names)
    return {name for name, count in counts.items() if count > 1}


def _named_twice(name: str) -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.INVALID_REQUEST,
        f"topic {shown(name)} is named more than once in the request; name each topic once",
    )


def _create_topic(
    image: MetadataImage,
    epoch: int,
    request: NewTopic,
    limits: TopicLimits,
    rng: random.Random,
    taken: set[str],
) -> list[r.Record]:
    check_topic_name(request.name, allow_internal=request.internal)
    partitions = limits.default_partitions if request.partitions is None else request.partitions
    if not 1 <= partitions <= limits.partitions_max:
        raise HeadwaterError(
            ErrorCode.INVALID_PARTITIONS,
            f"partitions is {partitions}; valid range is [1, {limits.partitions_max}]",
        )
    rf = (
        limits.default_replication_factor
        if request.replication_factor is None
        else request.replication_factor
    )
    live = [image.brokers[b] for b in image.live_broker_ids()]
    if not 1 <= rf <= max(len(live), 1) or not live:
        raise HeadwaterError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"replication factor is {rf}; valid range is [1, {len(live)}] "
            f"({len(live)} live broker(s))",
        )
    configs = limits.check_configs(request.configs)
    if request.name in taken:
        raise HeadwaterError(
            ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {request.name!r} already exists"
        )
    if len(taken) >= limits.topics_max:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"the cluster holds {len(taken)} topics, its limit (topics_max)",
        )
    topic_id = uuid.UUID(int=rng.getrandbits(128), version=4).hex
    while topic_id in image.topic_names:  # never reuse an id, even of a deleted topic's
        topic_id = uuid.UUID(int=rng.getrandbits(128), version=4).hex
    records: list[r.Record] = [
        r.TopicCreated(epoch, request.name, topic_id, tuple(sorted(configs.items())))
    ]
    assignment = assign_replicas(live, partitions, rf, rng.randrange(len(live)))
    for index, replicas in enumerate(assignment):
        records.append(
            r.PartitionCreated(epoch, topic_id, index, replicas, replicas, replicas[0], 0, 0)
        )
    return records


def replicas_per_broker(image: MetadataImage) -> dict[int, int]:
    """How many partition replicas each broker hosts (a reassignment's adding and removing
    replicas count: both hold the data until it completes)."""
    counts: dict[int, int] = {}
    for _topic, p in image.partitions():
        for broker in p.replicas:
            counts[broker] = counts.get(broker, 0) + 1
    return counts


def _within_capacity(
    image: MetadataImage, hosted: Mapping[int, int], new: Sequence[Sequence[int]]
) -> dict[int, int]:
    """``hosted`` plus the ``new`` replica lists; INVALID_PARTITIONS when that puts a broker
    over the partition capacity it registered (what its open-file limit allows)."""
    after = dict(hosted)
    for replicas in new:
        for broker in replicas:
            after[broker] = after.get(broker, 0) + 1
    for broker_id, count in sorted(after.items()):
        state = image.brokers.get(broker_id)
        capacity = state.partition_capacity if state is not None else 0
        if capacity and count > capacity and count > hosted.get(broker_id, 0):
            raise HeadwaterError(
                ErrorCode.INVALID_PARTITIONS,
                f"broker {broker_id} would host {count} partition replicas, over its capacity "
                f"of {capacity} (partitions_per_node_max, or what its open-file limit allows "
                "at 3 files per partition); add brokers or raise the limit",
            )
    return after


def assign_replicas(
    brokers: Sequence[BrokerState],
    partitions: int,
    replication_factor: int,
    start: int,
    first: int = 0,
) -> list[tuple[int, ...]]:
    """Replica lists for partitions ``[first, first + partitions)``: see the module doc."""
    ordered = rack_alternating(brokers)
    n = len(ordered)
    assert 1 <= replication_factor <= n
    return [
        tuple(ordered[(start + p + j) % n] for j in range(replication_factor))
        for p in range(first, first + partitions)
    ]


def rack_alternating(brokers: Sequence[BrokerState]) -> list[int]:
    """Broker ids ordered rack by rack in turn (rack A's first, rack B's first, ..., rack
    A's second, ...), each rack's brokers by id: consecutive ids sit on different racks
    whenever racks allow."""
    by_rack: dict[str, list[int]] = {}
    for broker in sorted(brokers, key=lambda b: b.node_id):
        by_rack.setdefault(broker.rack, []).append(broker.node_id)
    queues = [by_rack[rack] for rack in sorted(by_rack)]
    ordered: list[int] = []
    for i in range(max((len(q) for q in queues), default=0)):
        ordered += [q[i] for q in queues if i < len(q)]
    return ordered


def _internal_refused(name: str, what: str) -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.INVALID_TOPIC_EXCEPTION,
        f"{name!r} is an internal topic of the cluster and cannot be {what}",
    )


def create_partitions(
    image: MetadataImage, epoch: int, name: str, total: int, limits: TopicLimits, rng: random.Random
) -> ControllerResult[None]:
    """Grow topic ``name`` to ``total`` partitions (partitions never shrink, as in Kafka)."""
    topic = image.topic_named(name)
    if name.startswith(INTERNAL_PREFIX):
        raise _internal_refused(name, "given more partitions")
    current = len(topic.partitions)
    if not current < total <= limits.partitions_max:
        raise HeadwaterError(
            ErrorCode.INVALID_PARTITIONS,
            f"topic {name!r} has {current} partitions; the new count must be in "
            f"[{current + 1}, {limits.partitions_max}]",
        )
    live = [image.brokers[b] for b in image.live_broker_ids()]
    rf = topic.replication_factor
    if rf > len(live):
        raise HeadwaterError(
            ErrorCode.INVALID_REPLICATION_FACTOR,
            f"topic {name!r} has replication factor {rf} but only {len(live)} live broker(s)",
        )
    assignment = assign_replicas(live, total - current, rf, rng.randrange(len(live)), current)
    _within_capacity(image, replicas_per_broker(image), assignment)
    records: list[r.Record] = [
        r.PartitionCreated(
            epoch, topic.topic_id, current + i, replicas, replicas, replicas[0], 0, 0
        )
        for i, replicas in enumerate(assignment)
    ]
    return ControllerResult(tuple(records), None)


def alter_topic_configs(
    image: MetadataImage,
    epoch: int,
    name: str,
    changes: Mapping[str, str | None],
    replace: bool,
    limits: TopicLimits,
    validate_only: bool = False,
) -> ControllerResult[dict[str, str]]:
    """Change topic ``name``'s overrides: each setting in ``changes`` is set (text) or
    removed (None); with ``replace`` every override not set by ``changes`` is removed too
    (Kafka's AlterConfigs). The resulting overrides are checked together
    (``limits.check_configs``, as at creation) and one ``TopicConfigChanged`` is written
    per override that differs (none with ``validate_only``). The response is the
    overrides after the change."""
    topic = image.topic_named(name)
    if name.startswith(INTERNAL_PREFIX):
        raise _internal_refused(name, "given other configs")
    wanted = {} if replace else dict(topic.configs)
    for key, value in changes.items():
        if value is None:
            wanted.pop(key, None)
        else:
            wanted[key] = value
    after = dict(limits.check_configs(wanted))
    records = tuple(
        r.TopicConfigChanged(epoch, topic.topic_id, key, after.get(key))
        for key in sorted(set(topic.configs) | set(after))
        if topic.configs.get(key) != after.get(key)
    )
    return ControllerResult(() if validate_only else records, after)


def delete_topics(
    image: MetadataImage, epoch: int, names: Sequence[str]
) -> ControllerResult[list[TopicOutcome]]:
    records: list[r.Record] = []
    outcomes = []
    repeated = _repeated(names)
    for name in names:
        if name in repeated:
            outcomes.append(TopicOutcome(name, _named_twice(name)))
            continue
        topic = image.topics.get(name)
        if topic is None:
            outcomes.append(TopicOutcome(name, unknown_topic(name)))
            continue
        if name.startswith(INTERNAL_PREFIX):
            outcomes.append(TopicOutcome(name, _internal_refused(name, "deleted")))
            continue
        records.append(r.TopicDeleted(epoch, topic.topic_id))
        outcomes.append(TopicOutcome(name, None, topic.topic_id))
    return ControllerResult(tuple(records), outcomes)


def reassign_partition(
    image: MetadataImage, epoch: int, name: str, partition: int, target: Sequence[int]
) -> ControllerResult[None]:
    """Start moving a partition to the ``target`` replicas (Kafka's reassignment).

    The partition first holds the union of old and target replicas (``adding_replicas``
    fetch from the leader); ``maybe_complete_reassignments`` finishes once every adding
    replica is in the ISR: replicas become ``target``, the ISR keeps its members in
    ``target``, and leadership moves if the leader is leaving. A target that equals the
    current replicas (or only reorders them) takes effect at once.
    """
    topic = image.topic_named(name)
    topic.check_partition(partition)
    state = topic.partitions[partition]
    target = tuple(target)
    if not target or len(set(target)) != len(target):
        raise HeadwaterError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"replicas {list(target)} must list at least one broker, each once",
        )
    unknown = [b for b in target if b not in image.brokers]
    if unknown:
        raise HeadwaterError(
            ErrorCode.INVALID_REPLICA_ASSIGNMENT,
            f"broker(s) {unknown} are not registered; registered: {sorted(image.brokers)}",
        )
    if state.adding_replicas or state.removing_replicas:
        raise HeadwaterError(
            ErrorCode.REASSIGNMENT_IN_PROGRESS,
            f"partition {partition} of {name!r} is being reassigned already",
        )
    if set(target) == set(state.replicas):
        if target == state.replicas:
            return ControllerResult((), None)
        return ControllerResult((_change(topic, state, epoch, replicas=target),), None)
    adding = tuple(b for b in target if b not in state.replicas)
    _within_capacity(image, replicas_per_broker(image), [adding])
    removing = tuple(b for b in state.replicas if b not in target)
    replicas = target + removing
    change = _change(
        topic, state, epoch, replicas=replicas, adding_replicas=adding, removing_replicas=removing
    )
    return ControllerResult((change,), None)


def maybe_complete_reassignments(image: MetadataImage, epoch: int) -> ControllerResult[int]:
    """Finish every reassignment whose adding replicas are all in the ISR."""
    records: list[r.Record] = []
    for topic, p in image.partitions():
        if not (p.adding_replicas or p.removing_replicas):
            continue
        if not set(p.adding_replicas) <= set(p.isr):
            continue
        target = tuple(b for b in p.replicas if b not in p.removing_replicas)
        isr = tuple(b for b in p.isr if b in target)
        leader = p.leader
        if leader not in target:
            live = [b for b in target if b in isr and _live(image, b)]
            leader = live[0] if live else r.NO_LEADER
        records.append(
            _change(
                topic,
                p,
                epoch,
                replicas=target,
                isr=isr or target[:1],
                leader=leader,
                adding_replicas=(),
                removing_replicas=(),
            )
        )
    return ControllerResult(tuple(records), len(records))


# --------------------------------------------------------------------- helpers


def _with_broker(image: MetadataImage, broker: BrokerState) -> MetadataImage:
    brokers = dict(image.brokers)
    brokers[broker.node_id] = broker
    return dataclasses.replace(
        image,
        broker_epoch_last=max(image.broker_epoch_last, broker.broker_epoch),
        brokers=brokers,
    )


def _live(image: MetadataImage, node_id: int) -> bool:
    broker = image.brokers.get(node_id)
    return broker is not None and broker.live


def _current_broker(image: MetadataImage, node_id: int, broker_epoch: int) -> BrokerState:
    broker = image.brokers.get(node_id)
    if broker is None or broker.broker_epoch != broker_epoch:
        current = broker.broker_epoch if broker else "none"
        raise HeadwaterError(
            ErrorCode.STALE_BROKER_EPOCH,
            f"broker {node_id} epoch {broker_epoch} is not current ({current}); register again",
        )
    return broker


def elect(
    image: MetadataImage, topic: TopicImage, p: PartitionState
) -> tuple[int, tuple[int, ...]]:
    """(leader, isr) for ``p`` under the module's election rule; the leader is kept when it
    is still live and in the ISR."""
    if p.leader != r.NO_LEADER and p.leader in p.isr and _live(image, p.leader):
        return p.leader, p.isr
    for candidate in p.replicas:
        if candidate in p.isr and _live(image, candidate):
            return candidate, p.isr
    if topic.configs.get(UNCLEAN_ELECTION_KEY, "false") == "true":
        for candidate in p.replicas:
            if _live(image, candidate):
                return candidate, (candidate,)
    return r.NO_LEADER, p.isr


def _elect_all(
    image: MetadataImage, epoch: int, which: Callable[[PartitionState], bool]
) -> list[r.Record]:
    records: list[r.Record] = []
    for topic, p in image.partitions():
        if not which(p):
            continue
        leader, isr = elect(image, topic, p)
        if leader != p.leader or isr != p.isr:
            records.append(_change(topic, p, epoch, leader=leader, isr=isr))
    return records


def _remove_and_elect(
    image: MetadataImage, epoch: int, gone: set[int], keep_sole_leader: bool = False
) -> list[r.Record]:
    """Take the brokers ``gone`` out of every ISR (never emptying one: its last member
    stays, so that the partition can come back with it) and elect new leaders where a
    gone broker led. With ``keep_sole_leader`` a leader with no live successor keeps
    leading (controlled shutdown: until the node stops)."""
    records: list[r.Record] = []
    for topic, p in image.partitions():
        if not (gone & set(p.isr)) and p.leader not in gone:
            continue
        isr = tuple(b for b in p.isr if b not in gone) or p.isr
        leader, new_isr = elect(image, topic, dataclasses.replace(p, isr=isr))
        if leader == r.NO_LEADER and keep_sole_leader and p.leader in gone:
            leader, new_isr = p.leader, p.isr
        if (leader, new_isr) != (p.leader, p.isr):
            records.append(_change(topic, p, epoch, leader=leader, isr=new_isr))
    return records


def alter_partition_isr(
    image: MetadataImage,
    epoch: int,
    broker_id: int,
    broker_epoch: int,
    topic_id: str,
    partition: int,
    leader_epoch: int,
    partition_epoch: int,
    new_isr: Sequence[int],
) -> ControllerResult[PartitionState]:
    """A leader's ISR change (Kafka's AlterPartition), decided so that the leader can take
    every answer as the partition's committed state:

    - Refused (FENCED_LEADER_EPOCH) unless the requester is the current leader at the
      current leader epoch, with its current broker epoch; refused (INVALID_REQUEST)
      unless the new ISR holds the leader and lies within the replicas.
    - A request made at an older partition epoch (its answer was lost, a copy of it was
      decided since, or the leader's own metadata lags or stands still, as on a node cut
      off from the metadata quorum) is answered with the current state and commits
      nothing: no copy of it can ever commit, so the leader may decide again.
    - Otherwise it commits: the new ISR, less joining brokers that are not live. When
      some were left out, the record is still written (the same ISR at a new partition
      epoch): the answer's partition epoch is then always past the request's, which is
      what tells the leader that no copy of its request can commit later (a copy decided
      later, with the broker live by then, would otherwise add a follower that the high
      watermark stopped waiting for).

    The response is the partition's state after the decision."""
    _current_broker(image, broker_id, broker_epoch)
    topic = image.topic_by_id(topic_id)
    if topic is None or not 0 <= partition < len(topic.partitions):
        raise HeadwaterError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"no partition {partition} of topic id {topic_id}"
        )
    p = topic.partitions[partition]
    if (
        p.leader != broker_id
        or p.leader_epoch != leader_epoch
        or p.partition_epoch < partition_epoch
    ):
        raise HeadwaterError(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"partition {partition} of {topic.name!r} is at leader {p.leader}, leader epoch "
            f"{p.leader_epoch}, partition epoch {p.partition_epoch}; the request assumed "
            f"{broker_id}, {leader_epoch}, {partition_epoch}",
        )
    if p.partition_epoch > partition_epoch:
        return ControllerResult((), p)
    isr = tuple(dict.fromkeys(new_isr))
    if broker_id not in isr or not set(isr) <= set(p.replicas):
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"ISR {list(isr)} must hold the leader {broker_id} and lie within the replicas "
            f"{list(p.replicas)}",
        )
    if isr == p.isr:
        return ControllerResult((), p)  # nothing asked
    kept = tuple(b for b in isr if b in p.isr or _live(image, b))
    change = _change(topic, p, epoch, isr=kept)
    after = dataclasses.replace(p, isr=kept, partition_epoch=change.partition_epoch)
    return ControllerResult((change,), after)


def _leads_any_movable(image: MetadataImage, node_id: int, moves: Sequence[r.Record]) -> bool:
    """After ``moves``, does ``node_id`` still lead a partition some other replica could
    lead? (A partition whose only live ISR member is this node cannot move; waiting for it
    would hold the shutdown forever.)"""
    moved = {(m.topic_id, m.partition) for m in moves if isinstance(m, r.PartitionChanged)}
    for topic, p in image.partitions():
        if p.leader == node_id and (topic.topic_id, p.partition) not in moved:
            others = [b for b in p.isr if b != node_id and _live(image, b)]
            if others:
                return True
    return False


def _change(
    topic: TopicImage,
    p: PartitionState,
    epoch: int,
    *,
    leader: int | None = None,
    isr: tuple[int, ...] | None = None,
    replicas: tuple[int, ...] | None = None,
    adding_replicas: tuple[int, ...] | None = None,
    removing_replicas: tuple[int, ...] | None = None,
) -> r.PartitionChanged:
    new_leader = p.leader if leader is None else leader
    return r.PartitionChanged(
        controller_epoch=epoch,
        topic_id=topic.topic_id,
        partition=p.partition,
        replicas=p.replicas if replicas is None else replicas,
        isr=p.isr if isr is None else isr,
        leader=new_leader,
        leader_epoch=p.leader_epoch + (1 if new_leader != p.leader else 0),
        partition_epoch=p.partition_epoch + 1,
        adding_replicas=p.adding_replicas if adding_replicas is None else adding_replicas,
        removing_replicas=p.removing_replicas if removing_replicas is None else removing_replicas,
    )


# --------------------------------------------------------------------- ACLs and users


def create_acls(image: MetadataImage, epoch: int, acls: Sequence[Acl]) -> ControllerResult[None]:
    """Store each ACL of ``acls`` (checked by ``check_acl``) that is not stored yet; refuse
    the whole request with INVALID_REQUEST when the cluster would hold more than
    ``ACLS_MAX``."""
    new = sorted({check_acl(acl) for acl in acls} - image.acls)
    if len(image.acls) + len(new) > ACLS_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"a cluster holds at most {ACLS_MAX} ACLs: {len(image.acls)} stored, "
            f"{len(new)} more asked",
        )
    return ControllerResult(tuple(acl_created(epoch, acl) for acl in new), None)


def delete_acls(
    image: MetadataImage, epoch: int, filters: Sequence[AclFilter]
) -> ControllerResult[list[Acl]]:
    """Remove every stored ACL that matches any of ``filters``; the response lists them."""
    doomed = sorted(acl for acl in image.acls if any(f.matches(acl) for f in filters))
    return ControllerResult(tuple(acl_deleted(epoch, acl) for acl in doomed), doomed)


@dataclass(frozen=True, slots=True)
class UserUpsertion:
    name: str
    credential: ScramCredential


def alter_users(
    image: MetadataImage,
    epoch: int,
    upsertions: Sequence[UserUpsertion],
    deletions: Sequence[str],
) -> ControllerResult[None]:
    """Set the credentials of ``upsertions`` and remove the users of ``deletions`` (each
    must exist: INVALID_REQUEST naming the user otherwise).
    A name may appear once in the request; at most ``USERS_MAX`` users."""
    names = [u.name for u in upsertions] + list(deletions)
    for name in names:
        check_user_name(name)
    if len(set(names)) != len(names):
        raise HeadwaterError(ErrorCode.INVALID_REQUEST, "a user is named twice in one request")
    for name in deletions:
        if name not in image.users:
            raise HeadwaterError(ErrorCode.INVALID_REQUEST, f"no user {name!r} to delete")
    after = set(image.users) | {u.name for u in upsertions}
    if len(after - set(deletions)) > USERS_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST, f"a cluster holds at most {USERS_MAX} users"
        )
    records: list[r.Record] = [
        r.UserCredentialSet(
            epoch,
            u.name,
            u.credential.mechanism,
            u.credential.iterations,
            u.credential.salt.hex(),
            u.credential.stored_key.hex(),
            u.credential.server_key.hex(),
        )
        for u in upsertions
    ]
    records += [r.UserDeleted(epoch, name) for name in deletions]
    return ControllerResult(tuple(records), None)


def alter_quotas(
    image: MetadataImage,
    epoch: int,
    changes: Sequence[tuple[str, str, str, float | None]],
) -> ControllerResult[None]:
    """Set or remove quotas: each change is (entity type, entity name, key, rate or None
    to remove), checked by ``headwater.shared.quotas``; at most ``QUOTA_ENTITIES_MAX`` entities
    with quotas."""
    check_quota_changes(changes)
    records = []
    entities = set(image.quotas)
    for entity_type, name, key, value in changes:
        entity = check_entity(entity_type, name)
        if value is not None:
            entities.add(entity)
        records.append(r.QuotaChanged(epoch, entity_type, name, key, value))
    if len(entities) > QUOTA_ENTITIES_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"at most {QUOTA_ENTITIES_MAX} users and client ids have quotas",
        )
    return ControllerResult(tuple(records), None)
