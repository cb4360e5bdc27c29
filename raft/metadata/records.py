"""Metadata records: the only way cluster metadata changes (pure).

The active controller turns every decision into a *batch* of records; the Raft quorum
replicates the batch; every node applies committed batches, in order, to its
``MetadataImage`` (``headwater.raft.metadata.image``). A batch is atomic: ``apply`` takes all of
its records or none.

Wire form (``encode_batch``/``decode_batch``): UTF-8 JSON, one array per batch, one object
per record::

    [{"type": "RegisterBroker", "version": 1, "controller_epoch": 3, "node_id": 2, ...}, ...]

``type`` names the dataclass below, ``version`` is ``RECORD_VERSION`` (a decoder refuses a
newer version rather than guess), and the other keys are the dataclass fields (tuples as
JSON arrays). JSON rather than pickle because the bytes are stored in the Raft journal and
read back by later versions of the code. A field with a default may be absent, and then
decodes as its default, so a journal written before a field was added still reads; keys
the code does not know are ignored.

Every record carries ``controller_epoch``: the Raft term of the controller that wrote it.
Partition records also carry the leader epoch (bumped on every leader change) and the
partition epoch (bumped on every change of the partition), which ``apply`` checks.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

RECORD_VERSION: Final = 1
NO_LEADER: Final = -1


class RecordFormatError(ValueError):
    """Bytes that are not a metadata record batch this version can read."""


@dataclass(frozen=True, slots=True)
class ControllerActivated:
    """A node became the active controller for ``controller_epoch`` (its Raft term).
    ``cluster_id`` names the cluster; the first activation ever sets it, later ones repeat it."""

    controller_epoch: int
    node_id: int
    address: str
    cluster_id: str
    internal_address: str = ""
    """The controller's inter-broker listener (Controller service); its client gRPC
    address is ``address`` (Admin calls are forwarded there)."""


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    """A broker process joined: ``incarnation_id`` is unique per process start, and
    ``broker_epoch`` (assigned by the controller, increasing) must accompany its heartbeats.
    A registered broker starts fenced; its first heartbeat unfences it."""

    controller_epoch: int
    node_id: int
    incarnation_id: str
    broker_epoch: int
    address: str
    rack: str
    internal_address: str = ""
    """The broker's inter-broker listener (Replica service); ``address`` is for clients."""
    partition_capacity: int = 0
    """Most partition replicas the broker can host (0: not stated, no limit)."""
    kafka_address: str = ""
    """HOST:PORT Kafka clients are told for the broker ("": it serves no Kafka listener)."""


@dataclass(frozen=True, slots=True)
class FenceBroker:
    """The broker missed its session timeout: it leads nothing until unfenced."""

    controller_epoch: int
    node_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    controller_epoch: int
    node_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BrokerShuttingDown:
    """Controlled shutdown began: the broker is given no new leadership."""

    controller_epoch: int
    node_id: int
    broker_epoch: int


LOG_DIR_PROBLEM_CHARS_MAX: Final = 300
"""Longest ``BrokerLogDirChanged.problem`` kept (the rest is cut)."""


@dataclass(frozen=True, slots=True)
class BrokerLogDirChanged:
    """The broker's log directory went offline (``offline``: a write there failed; the
    broker hosts no replica until it is back) or came back online. An offline broker
    leads nothing, is in no ISR and is given no new replica (Kafka's log-directory
    failure); ``problem`` says what failed (the folder and the errno), "" when online."""

    controller_epoch: int
    node_id: int
    broker_epoch: int
    offline: bool
    problem: str = ""


@dataclass(frozen=True, slots=True)
class TopicCreated:
    controller_epoch: int
    name: str
    topic_id: str
    configs: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class PartitionCreated:
    """A new partition. A controller creates it with ``isr`` equal to ``replicas`` (every
    log is empty, so all are in sync) and epochs 0; a metadata snapshot recreates a
    partition in whatever state it had, a reassignment in progress included."""

    controller_epoch: int
    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PartitionChanged:
    """The whole new state of an existing partition.

    ``partition_epoch`` must be the current one plus 1 and ``leader_epoch`` must not go
    back; a change computed from an older state is refused. ``adding_replicas`` and
    ``removing_replicas`` describe a reassignment in progress (both empty otherwise).
    """

    controller_epoch: int
    topic_id: str
    partition: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: tuple[int, ...] = ()
    removing_replicas: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopicConfigChanged:
    """Sets (``value`` text) or removes (``value`` None) one config override of a topic."""

    controller_epoch: int
    topic_id: str
    key: str
    value: str | None


@dataclass(frozen=True, slots=True)
class TopicDeleted:
    controller_epoch: int
    topic_id: str


@dataclass(frozen=True, slots=True)
class ProducerIdsAllocated:
    """Producer ids [first_id, end_id) now belong to broker ``node_id``, which hands them
    out to idempotent producers (InitProducerId). Blocks are contiguous: ``first_id`` is
    the end of the previous block (the image's ``next_producer_id``), so no id is ever
    given twice, whichever controller allocates. ``node_id`` -1: the block of a snapshot
    (everything below ``end_id`` is taken)."""

    controller_epoch: int
    node_id: int
    first_id: int
    end_id: int


@dataclass(frozen=True, slots=True)
class AclCreated:
    """An ACL (``headwater.shared.acls``), its fields as text (``parse_acl`` reads them back)."""

    controller_epoch: int
    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class AclDeleted:
    """Removes the ACL with exactly these fields."""

    controller_epoch: int
    resource_type: str
    pattern_type: str
    resource_name: str
    principal: str
    host: str
    operation: str
    permission: str


@dataclass(frozen=True, slots=True)
class UserCredentialSet:
    """Sets (or replaces) a user's SCRAM credential (``headwater.shared.credentials``); the salt and
    keys are hex. Never the password or the salted password."""

    controller_epoch: int
    name: str
    mechanism: str
    iterations: int
    salt: str
    stored_key: str
    server_key: str


@dataclass(frozen=True, slots=True)
class UserDeleted:
    controller_epoch: int
    name: str


@dataclass(frozen=True, slots=True)
class QuotaChanged:
    """Sets (``value``) or removes (None) one quota of an entity (``headwater.shared.quotas``):
    ``entity_type`` user or client-id, ``entity_name`` '' for the type's default."""

    controller_epoch: int
    entity_type: str
    entity_name: str
    key: str
    value: float | None


Record = (
    ControllerActivated
    | RegisterBroker
    | FenceBroker
    | UnfenceBroker
    | BrokerShuttingDown
    | BrokerLogDirChanged
    | TopicCreated
    | PartitionCreated
    | PartitionChanged
    | TopicConfigChanged
    | TopicDeleted
    | ProducerIdsAllocated
    | AclCreated
    | AclDeleted
    | UserCredentialSet
    | UserDeleted
    | QuotaChanged
)
RECORD_TYPES: Final[dict[str, type[Record]]] = {
    cls.__name__: cls
    for cls in (
        ControllerActivated,
        RegisterBroker,
        FenceBroker,
        UnfenceBroker,
        BrokerShuttingDown,
        BrokerLogDirChanged,
        TopicCreated,
        PartitionCreated,
        PartitionChanged,
        TopicConfigChanged,
        TopicDeleted,
        ProducerIdsAllocated,
        AclCreated,
        AclDeleted,
        UserCredentialSet,
        UserDeleted,
        QuotaChanged,
    )
}


_FIELD_TYPES: Final = {cls: typing.get_type_hints(cls) for cls in RECORD_TYPES.values()}


def _conforms(value: Any, hint: Any) -> bool:
    """Is ``value`` (decoded from JSON, arrays as tuples) of the field type ``hint``?"""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is bool or hint is int or hint is str:
        return type(value) is hint
    if hint is float:
        if type(value) not in (int, float):
            return False
        try:
            return math.isfinite(float(value))
        except OverflowError:
            return False
    if hint is type(None):
        return value is None
    if origin is tuple:
        if not isinstance(value, tuple):
            return False
        if len(args) == 2 and args[1] is Ellipsis:
            return all(_conforms(v, args[0]) for v in value)
        return len(value) == len(args) and all(
            _conforms(v, a) for v, a in zip(value, args, strict=True)
        )
    if origin is typing.Union or origin is types.UnionType:
        return any(_conforms(value, a) for a in args)
    return False


def record_to_json(record: Record) -> dict[str, Any]:
    body: dict[str, Any] = {"type": type(record).__name__, "version": RECORD_VERSION}
    for field in dataclasses.fields(record):
        body[field.name] = getattr(record, field.name)
    return body


def record_from_json(body: Any) -> Record:
    """Raise RecordFormatError unless ``body`` is a record object of a known type."""
    if not isinstance(body, dict):
        raise RecordFormatError(f"a record must be a JSON object, not {type(body).__name__}")
    cls = RECORD_TYPES.get(str(body.get("type")))
    if cls is None:
        raise RecordFormatError(f"unknown record type {body.get('type')!r}")
    version = body.get("version")
    if version != RECORD_VERSION:
        raise RecordFormatError(
            f"{cls.__name__} version {version!r}; this code reads version {RECORD_VERSION}"
        )
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name not in body:
            if field.default is dataclasses.MISSING:
                raise RecordFormatError(f"{cls.__name__} lacks field {field.name!r}")
            continue
        value = body[field.name]
        value = _tuples(value) if isinstance(value, list) else value
        if not _conforms(value, _FIELD_TYPES[cls][field.name]):
            raise RecordFormatError(
                f"{cls.__name__}.{field.name} is {type(value).__name__} {str(value)[:40]!r}, "
                f"not {_FIELD_TYPES[cls][field.name]}"
            )
        values[field.name] = value
    return cls(**values)


def _tuples(value: list[Any]) -> tuple[Any, ...]:
    return tuple(_tuples(v) if isinstance(v, list) else v for v in value)


def encode_batch(records: Sequence[Record]) -> bytes:
    return json.dumps([record_to_json(r) for r in records], separators=(",", ":")).encode()


def decode_batch(data: bytes) -> tuple[Record, ...]:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordFormatError(f"metadata batch is not JSON: {exc}") from exc
    if not isinstance(body, list):
        raise RecordFormatError("a metadata batch must be a JSON array of records")
    return tuple(record_from_json(item) for item in body)
