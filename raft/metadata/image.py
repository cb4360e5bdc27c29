"""The metadata image: the cluster's metadata at one point of the record log (pure).

``MetadataImage`` is immutable; ``apply(image, records)`` returns the next one. Every node
(active controller, standby controllers, broker-only nodes, and any node restarting from
its journal) builds the same image by applying the same committed batches in the same
order, so ``apply`` must be deterministic: it looks at nothing but its arguments.

A batch is atomic. ``apply`` refuses the whole batch (the image stays as it was, apart from
``offset``) when any record in it is stale or inconsistent:

- a ``controller_epoch`` lower than the image's (a deposed controller's write);
- a broker record whose ``broker_epoch`` is not the broker's current one;
- a partition change whose ``partition_epoch`` is not the current one plus 1, whose
  ``leader_epoch`` goes back, or whose leader / ISR is not among its replicas;
- a topic that exists already (create) or not at all (change, delete).

``offset`` counts the batches applied, refused ones included, so two nodes at the same
offset hold the same image.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from headwater.log.batch import SELF_NAMED_PRODUCER_ID_MIN
from headwater.raft.metadata import records as r
from headwater.shared.acls import Acl, parse_acl
from headwater.shared.credentials import (
    KEY_BYTES,
    MECHANISM,
    SALT_BYTES_MAX,
    SALT_BYTES_MIN,
    ScramCredential,
    check_iterations,
    check_user_name,
)
from headwater.shared.errors import HeadwaterError
from headwater.shared.quotas import Entity, check_entity, check_quota
from headwater.shared.topics import check_partition, unknown_topic

PRODUCER_ID_MAX: Final = SELF_NAMED_PRODUCER_ID_MIN - 1
"""The last id the controller allocates: the rest are named by writers (log.batch)."""
BROKER_RUNNING: Final = "running"
BROKER_FENCED: Final = "fenced"
BROKER_SHUTTING_DOWN: Final = "shutting_down"
BROKER_LOG_DIR_OFFLINE: Final = "log_dir_offline"


@dataclass(frozen=True, slots=True)
class BrokerState:
    """One registered broker.

    Pickled with the image into the Raft snapshot (``data_dir/raft/snapshot``, and the
    snapshots a leader sends its followers) as the list of its field values in field
    order. New fields are therefore added at the end only, with a default: a snapshot
    written before a field existed holds fewer values and ``__setstate__`` gives the
    missing ones their defaults; a snapshot with more values than this code knows has the
    extra ones ignored (as ``dataclasses`` does).
    """

    node_id: int
    incarnation_id: str
    broker_epoch: int
    address: str
    rack: str
    fenced: bool = True
    shutting_down: bool = False
    internal_address: str = ""
    """Its inter-broker listener (Replica service); ``address`` is for clients."""
    partition_capacity: int = 0
    """Most partition replicas it can host, as it registered (0: no limit stated)."""
    log_dir_problem: str = ""
    """Why its log directory is offline ("" while it is online): see
    ``records.BrokerLogDirChanged``."""
    kafka_address: str = ""
    """HOST:PORT Kafka clients are told for it ("": it serves no Kafka listener)."""

    def __setstate__(self, state: Sequence[object]) -> None:
        """Unpickle from the field values in order; trailing fields the state lacks take
        their defaults (see the class doc). Raises ValueError when a field without a
        default is missing."""
        fields = dataclasses.fields(self)
        for index, f in enumerate(fields):
            if index < len(state):
                value = state[index]
            elif f.default is not dataclasses.MISSING:
                value = f.default
            else:
                raise ValueError(f"BrokerState state of {len(state)} values lacks {f.name!r}")
            object.__setattr__(self, f.name, value)

    @property
    def log_dir_offline(self) -> bool:
        return bool(self.log_dir_problem)

    @property
    def live(self) -> bool:
        """May lead partitions, be in an ISR and take new replicas: registered,
        heartbeating, not shutting down, its log directory online."""
        return not self.fenced and not self.shutting_down and not self.log_dir_problem

    @property
    def state(self) -> str:
        if self.shutting_down:
            return BROKER_SHUTTING_DOWN
        if self.fenced:
            return BROKER_FENCED
        return BROKER_LOG_DIR_OFFLINE if self.log_dir_problem else BROKER_RUNNING


@dataclass(frozen=True, slots=True)
class PartitionState:
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0]


@dataclass(frozen=True, slots=True)
class TopicImage:
    name: str
    topic_id: str
    configs: Mapping[str, str]
    partitions: tuple[PartitionState, ...]

    def check_partition(self, index: int) -> None:
        """Raise PARTITION_OUT_OF_RANGE unless the topic has partition ``index``."""
        check_partition(self.name, index, len(self.partitions))

    @property
    def replication_factor(self) -> int:
        """Target replicas per partition (a reassignment in progress may hold more)."""
        first = self.partitions[0] if self.partitions else None
        if first is None:
            return 0
        return len(first.replicas) - len(first.removing_replicas)


@dataclass(frozen=True, slots=True)
class MetadataImage:
    offset: int = 0
    cluster_id: str = ""
    controller_epoch: int = 0
    controller_id: int = r.NO_LEADER
    controller_address: str = ""
    controller_internal_address: str = ""
    """The active controller's inter-broker listener (Controller service)."""
    broker_epoch_last: int = 0
    brokers: Mapping[int, BrokerState] = field(default_factory=dict)
    topics: Mapping[str, TopicImage] = field(default_factory=dict)
    topic_names: Mapping[str, str] = field(default_factory=dict)  # topic_id -> name
    next_producer_id: int = 0
    """Producer ids below this are allocated (``ProducerIdsAllocated``); it only grows."""
    acls: frozenset[Acl] = frozenset()
    """Every ACL; the same object from image to image while no ACL changes."""
    users: Mapping[str, ScramCredential] = field(default_factory=dict)
    """User name -> credential; the same object from image to image while none changes."""
    quotas: Mapping[Entity, Mapping[str, float]] = field(default_factory=dict)
    """(entity type, name) -> quota key -> rate (``headwater.shared.quotas``)."""

    def topic_named(self, name: str) -> TopicImage:
        """The topic ``name``; raises UNKNOWN_TOPIC_OR_PARTITION when there is none."""
        topic = self.topics.get(name)
        if topic is None:
            raise unknown_topic(name)
        return topic

    def topic_by_id(self, topic_id: str) -> TopicImage | None:
        name = self.topic_names.get(topic_id)
        return None if name is None else self.topics[name]

    def live_broker_ids(self) -> list[int]:
        return sorted(b.node_id for b in self.brokers.values() if b.live)

    def broker_address(self, node_id: int) -> str:
        broker = self.brokers.get(node_id)
        return broker.address if broker else ""

    def broker_internal_address(self, node_id: int) -> str:
        broker = self.brokers.get(node_id)
        return broker.internal_address if broker else ""

    def broker_kafka_address(self, node_id: int) -> str:
        """The broker's Kafka listener as clients are told it; "" when the broker is
        unknown or serves no Kafka listener."""
        broker = self.brokers.get(node_id)
        return broker.kafka_address if broker else ""

    def partitions(self) -> Iterator[tuple[TopicImage, PartitionState]]:
        for topic in self.topics.values():
            for partition in topic.partitions:
                yield topic, partition

    def partition_count(self) -> int:
        return sum(len(t.partitions) for t in self.topics.values())


class RefusedBatchError(Exception):
    """A record of the batch is stale or inconsistent with the image (the message says which)."""


@dataclass(frozen=True, slots=True)
class ApplyResult:
    image: MetadataImage
    refusal: str | None = None


def apply(image: MetadataImage, batch: Sequence[r.Record]) -> ApplyResult:
    """The image after ``batch``, or the same image (offset + 1) and why it was refused."""
    builder = _Builder(image)
    try:
        for record in batch:
            builder.apply(record)
    except RefusedBatchError as refusal:
        return ApplyResult(dataclasses.replace(image, offset=image.offset + 1), str(refusal))
    except (TypeError, ValueError, AttributeError, OverflowError) as exc:
        # Fields of the wrong type (decode_batch checks them; records built in code may
        # not have been): refused like any inconsistent batch, never a crash of the node.
        malformed = f"a record with malformed fields: {type(exc).__name__}: {exc}"
        return ApplyResult(dataclasses.replace(image, offset=image.offset + 1), malformed)
    return ApplyResult(builder.build())


def snapshot_records(image: MetadataImage) -> list[r.Record]:
    """Records that rebuild ``image`` (but not its offset) when applied to an empty image:
    how a broker-only node receives the metadata."""
    epoch = image.controller_epoch
    out: list[r.Record] = []
    if image.controller_id != r.NO_LEADER:
        out.append(
            r.ControllerActivated(
                epoch,
                image.controller_id,
                image.controller_address,
                image.cluster_id,
                image.controller_internal_address,
            )
        )
    for b in sorted(image.brokers.values(), key=lambda b: b.broker_epoch):
        out.append(
            r.RegisterBroker(
                epoch,
                b.node_id,
                b.incarnation_id,
                b.broker_epoch,
                b.address,
                b.rack,
                b.internal_address,
                b.partition_capacity,
                kafka_address=b.kafka_address,
            )
        )
        if not b.fenced:
            out.append(r.UnfenceBroker(epoch, b.node_id, b.broker_epoch))
        if b.shutting_down:
            out.append(r.BrokerShuttingDown(epoch, b.node_id, b.broker_epoch))
        if b.log_dir_problem:
            out.append(
                r.BrokerLogDirChanged(epoch, b.node_id, b.broker_epoch, True, b.log_dir_problem)
            )
    if image.next_producer_id:
        out.append(r.ProducerIdsAllocated(epoch, -1, 0, image.next_producer_id))
    out.extend(acl_created(epoch, acl) for acl in sorted(image.acls))
    out.extend(
        r.UserCredentialSet(
            epoch,
            name,
            credential.mechanism,
            credential.iterations,
            credential.salt.hex(),
            credential.stored_key.hex(),
            credential.server_key.hex(),
        )
        for name, credential in sorted(image.users.items())
    )
    out.extend(
        r.QuotaChanged(epoch, entity_type, name, key, value)
        for (entity_type, name), rates in sorted(image.quotas.items())
        for key, value in sorted(rates.items())
    )
    for topic in image.topics.values():
        configs = tuple(sorted(topic.configs.items()))
        out.append(r.TopicCreated(epoch, topic.name, topic.topic_id, configs))
        out.extend(
            r.PartitionCreated(
                epoch,
                topic.topic_id,
                p.partition,
                p.replicas,
                p.isr,
                p.leader,
                p.leader_epoch,
                p.partition_epoch,
                p.adding_replicas,
                p.removing_replicas,
            )
            for p in topic.partitions
        )
    return out


def acl_fields(acl: Acl) -> tuple[str, str, str, str, str, str, str]:
    """An ACL's fields as the text ``AclCreated`` and ``AclDeleted`` carry."""
    return (
        acl.resource_type.value,
        acl.pattern_type.value,
        acl.resource_name,
        acl.principal,
        acl.host,
        acl.operation.value,
        acl.permission.value,
    )


def acl_created(epoch: int, acl: Acl) -> r.AclCreated:
    return r.AclCreated(epoch, *acl_fields(acl))


def acl_deleted(epoch: int, acl: Acl) -> r.AclDeleted:
    return r.AclDeleted(epoch, *acl_fields(acl))


def _acl_of(record: r.AclCreated | r.AclDeleted) -> Acl:
    try:
        return parse_acl(
            record.resource_type,
            record.resource_name,
            record.principal,
            record.operation,
            record.permission,
            record.pattern_type,
            record.host,
        )
    except HeadwaterError as exc:
        raise RefusedBatchError(f"invalid ACL: {exc.message}") from None


def _credential_of(record: r.UserCredentialSet) -> ScramCredential:
    """The credential a record sets, checked as a request's would be."""
    try:
        check_user_name(record.name)
        check_iterations(record.iterations)
        credential = ScramCredential(
            record.iterations,
            bytes.fromhex(record.salt),
            bytes.fromhex(record.stored_key),
            bytes.fromhex(record.server_key),
            record.mechanism,
        )
    except HeadwaterError as exc:
        raise RefusedBatchError(f"user {record.name[:80]!r}: {exc.message}") from None
    except (ValueError, TypeError):
        raise RefusedBatchError(f"user {record.name!r}: salt or keys are not hex") from None
    if record.mechanism != MECHANISM:
        raise RefusedBatchError(f"user {record.name!r}: mechanism {record.mechanism!r}")
    if not SALT_BYTES_MIN <= len(credential.salt) <= SALT_BYTES_MAX or not (
        len(credential.stored_key) == len(credential.server_key) == KEY_BYTES
    ):
        raise RefusedBatchError(f"user {record.name!r}: salt or key lengths out of range")
    return credential


def image_digest(image: MetadataImage) -> bytes:
    """SHA-256 of ``image``: of its offset (decimal, then a newline) followed by the
    encoded batch of ``snapshot_records`` with topics in name order. Every node, voter or
    broker-only, computes the same digest for the same image; two nodes at one offset
    with different digests applied different metadata."""
    ordered = dataclasses.replace(image, topics=dict(sorted(image.topics.items())))
    digest = hashlib.sha256(f"{image.offset}\n".encode())
    digest.update(r.encode_batch(snapshot_records(ordered)))
    return digest.digest()


class _Builder:
    """Copies of the image's maps, changed record by record, frozen by ``build``."""

    def __init__(self, image: MetadataImage) -> None:
        self.base = image
        self.cluster_id = image.cluster_id
        self.controller_epoch = image.controller_epoch
        self.controller_id = image.controller_id
        self.controller_address = image.controller_address
        self.controller_internal_address = image.controller_internal_address
        self.broker_epoch_last = image.broker_epoch_last
        self.brokers = dict(image.brokers)
        self.topics = dict(image.topics)
        self.topic_names = dict(image.topic_names)
        self.next_producer_id = image.next_producer_id
        self.partitions: dict[str, list[PartitionState]] = {}  # topic_id -> being changed
        self.acls: set[Acl] | None = None  # a copy once an ACL record comes
        self.users: dict[str, ScramCredential] | None = None  # a copy once a user record comes
        self.quotas: dict[Entity, Mapping[str, float]] | None = None

    def build(self) -> MetadataImage:
        for topic_id, partitions in self.partitions.items():
            name = self.topic_names.get(topic_id)
            if name is not None:
                self.topics[name] = dataclasses.replace(
                    self.topics[name], partitions=tuple(partitions)
                )
        return MetadataImage(
            offset=self.base.offset + 1,
            cluster_id=self.cluster_id,
            controller_epoch=self.controller_epoch,
            controller_id=self.controller_id,
            controller_address=self.controller_address,
            controller_internal_address=self.controller_internal_address,
            broker_epoch_last=self.broker_epoch_last,
            brokers=self.brokers,
            topics=self.topics,
            topic_names=self.topic_names,
            next_producer_id=self.next_producer_id,
            acls=self.base.acls if self.acls is None else frozenset(self.acls),
            users=self.base.users if self.users is None else self.users,
            quotas=self.base.quotas if self.quotas is None else self.quotas,
        )

    def apply(self, record: r.Record) -> None:
        if record.controller_epoch < self.controller_epoch:
            raise RefusedBatchError(
                f"{type(record).__name__} from controller epoch {record.controller_epoch}; "
                f"the current epoch is {self.controller_epoch}"
            )
        self.controller_epoch = record.controller_epoch
        match record:
            case r.ControllerActivated():
                if record.controller_epoch == self.base.controller_epoch and (
                    self.controller_id not in (r.NO_LEADER, record.node_id)
                ):
                    raise RefusedBatchError(
                        f"node {record.node_id} activation in epoch {record.controller_epoch}, "
                        f"already held by node {self.controller_id}"
                    )
                self.controller_id = record.node_id
                self.controller_address = record.address
                self.controller_internal_address = record.internal_address
                self.cluster_id = self.cluster_id or record.cluster_id
            case r.RegisterBroker():
                if record.broker_epoch <= self.broker_epoch_last:
                    raise RefusedBatchError(
                        f"broker epoch {record.broker_epoch} <= last {self.broker_epoch_last}"
                    )
                self.broker_epoch_last = record.broker_epoch
                self.brokers[record.node_id] = BrokerState(
                    record.node_id,
                    record.incarnation_id,
                    record.broker_epoch,
                    record.address,
                    record.rack,
                    internal_address=record.internal_address,
                    kafka_address=record.kafka_address,
                    partition_capacity=record.partition_capacity,
                )
            case r.FenceBroker() | r.UnfenceBroker() | r.BrokerShuttingDown():
                broker = self._broker(record.node_id, record.broker_epoch)
                if isinstance(record, r.FenceBroker):
                    broker = dataclasses.replace(broker, fenced=True)
                elif isinstance(record, r.UnfenceBroker):
                    broker = dataclasses.replace(broker, fenced=False)
                else:
                    broker = dataclasses.replace(broker, shutting_down=True)
                self.brokers[record.node_id] = broker
            case r.BrokerLogDirChanged():
                broker = self._broker(record.node_id, record.broker_epoch)
                problem = record.problem[: r.LOG_DIR_PROBLEM_CHARS_MAX] if record.offline else ""
                if record.offline and not problem:
                    problem = "offline"
                self.brokers[record.node_id] = dataclasses.replace(broker, log_dir_problem=problem)
            case r.TopicCreated():
                if record.name in self.topics:
                    raise RefusedBatchError(f"topic {record.name!r} exists already")
                if record.topic_id in self.topic_names:
                    raise RefusedBatchError(f"topic id {record.topic_id} is in use")
                self.topics[record.name] = TopicImage(
                    record.name, record.topic_id, dict(record.configs), ()
                )
                self.topic_names[record.topic_id] = record.name
            case r.PartitionCreated():
                partitions = self._partitions(record.topic_id)
                if record.partition != len(partitions):
                    raise RefusedBatchError(
                        f"partition {record.partition} created out of order; next is "
                        f"{len(partitions)}"
                    )
                state = _state_of(record)
                _check_partition(state)
                partitions.append(state)
            case r.PartitionChanged():
                self._change_partition(record)
            case r.TopicConfigChanged():
                topic = self._topic(record.topic_id)
                configs = dict(topic.configs)
                if record.value is None:
                    configs.pop(record.key, None)
                else:
                    configs[record.key] = record.value
                self.topics[topic.name] = dataclasses.replace(topic, configs=configs)
            case r.TopicDeleted():
                topic = self._topic(record.topic_id)
                del self.topics[topic.name]
                del self.topic_names[record.topic_id]
                self.partitions.pop(record.topic_id, None)
            case r.ProducerIdsAllocated():
                if record.first_id != self.next_producer_id or not (
                    record.first_id < record.end_id <= PRODUCER_ID_MAX + 1
                ):
                    raise RefusedBatchError(
                        f"producer ids [{record.first_id}, {record.end_id}) are not the next "
                        f"block (ids from {self.next_producer_id} are free)"
                    )
                self.next_producer_id = record.end_id
            case r.AclCreated() | r.AclDeleted():
                acl = _acl_of(record)
                if self.acls is None:
                    self.acls = set(self.base.acls)
                if isinstance(record, r.AclCreated):
                    if acl in self.acls:
                        raise RefusedBatchError(f"ACL {acl_fields(acl)} exists already")
                    self.acls.add(acl)
                else:
                    if acl not in self.acls:
                        raise RefusedBatchError(f"ACL {acl_fields(acl)} does not exist")
                    self.acls.remove(acl)
            case r.UserCredentialSet() | r.UserDeleted():
                if self.users is None:
                    self.users = dict(self.base.users)
                if isinstance(record, r.UserCredentialSet):
                    self.users[record.name] = _credential_of(record)
                elif self.users.pop(record.name, None) is None:
                    raise RefusedBatchError(f"user {record.name!r} does not exist")
            case r.QuotaChanged():
                try:
                    entity = check_entity(record.entity_type, record.entity_name)
                    check_quota(record.key, record.value)
                except HeadwaterError as exc:
                    raise RefusedBatchError(f"invalid quota: {exc.message}") from None
                if self.quotas is None:
                    self.quotas = dict(self.base.quotas)
                rates = dict(self.quotas.get(entity, {}))
                if record.value is None:
                    rates.pop(record.key, None)
                else:
                    rates[record.key] = float(record.value)
                if rates:
                    self.quotas[entity] = rates
                else:
                    self.quotas.pop(entity, None)

    def _broker(self, node_id: int, broker_epoch: int) -> BrokerState:
        broker = self.brokers.get(node_id)
        if broker is None or broker.broker_epoch != broker_epoch:
            current = broker.broker_epoch if broker else None
            raise RefusedBatchError(
                f"broker {node_id} epoch {broker_epoch} is not current (current: {current})"
            )
        return broker

    def _topic(self, topic_id: str) -> TopicImage:
        name = self.topic_names.get(topic_id)
        if name is None:
            raise RefusedBatchError(f"no topic with id {topic_id}")
        return self.topics[name]

    def _partitions(self, topic_id: str) -> list[PartitionState]:
        partitions = self.partitions.get(topic_id)
        if partitions is None:
            partitions = self.partitions[topic_id] = list(self._topic(topic_id).partitions)
        return partitions

    def _change_partition(self, record: r.PartitionChanged) -> None:
        partitions = self._partitions(record.topic_id)
        if not 0 <= record.partition < len(partitions):
            raise RefusedBatchError(
                f"partition {record.partition} of {record.topic_id} does not exist"
            )
        current = partitions[record.partition]
        if record.partition_epoch != current.partition_epoch + 1:
            raise RefusedBatchError(
                f"partition {record.partition} change to partition epoch "
                f"{record.partition_epoch}; current is {current.partition_epoch}"
            )
        if record.leader_epoch < current.leader_epoch:
            raise RefusedBatchError(
                f"partition {record.partition} leader epoch {record.leader_epoch} < current "
                f"{current.leader_epoch}"
            )
        state = _state_of(record)
        _check_partition(state)
        partitions[record.partition] = state


def _state_of(record: r.PartitionCreated | r.PartitionChanged) -> PartitionState:
    return PartitionState(
        record.partition,
        record.replicas,
        record.isr,
        record.leader,
        record.leader_epoch,
        record.partition_epoch,
        record.adding_replicas,
        record.removing_replicas,
    )


def _check_partition(state: PartitionState) -> None:
    replicas = set(state.replicas)
    if not state.replicas or len(replicas) != len(state.replicas):
        raise RefusedBatchError(
            f"partition {state.partition} replicas {state.replicas} are invalid"
        )
    if not set(state.isr) <= replicas:
        raise RefusedBatchError(
            f"partition {state.partition} ISR {state.isr} is not within replicas"
        )
    if state.leader != r.NO_LEADER and state.leader not in state.isr:
        raise RefusedBatchError(
            f"partition {state.partition} leader {state.leader} is not in the ISR"
        )
