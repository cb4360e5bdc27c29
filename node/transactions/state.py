"""A transactional id's state and its record on ``__transaction_state`` (pure).

A transactional producer names itself by a *transactional id*. The transaction
coordinator keeps one ``TransactionState`` per id: the producer id and epoch it gave the
id's current instance, the transaction's timeout, where the transaction stands
(``TxnStatus``), the partitions it wrote to and when it began. The state lives in one
partition of the compacted internal topic ``__transaction_state``
(``transaction_partition``), as one record per id: its **key** is the transactional id's
UTF-8 bytes, its **value** the whole state as UTF-8 JSON::

    {"version": 1, "transactional_id": "t", "producer_id": 7, "producer_epoch": 3,
     "timeout_ms": 60000, "status": "ONGOING", "partitions": [["orders", 0]],
     "started_ms": 1767225600000, "updated_ms": 1767225600000}

Compaction keeps the newest record of each id, which is its whole state; a decoder
refuses a newer ``version`` rather than guess, and every field is checked
(``decode_state``): the bytes come from a log that may be damaged.

Where a transaction stands (Kafka's KIP-98 states):

- ``EMPTY``: no transaction under way (a new id, or one just initialized);
- ``ONGOING``: partitions were added; the producer writes to them;
- ``PREPARE_COMMIT`` / ``PREPARE_ABORT``: the end is decided and written; the markers
  are being written to every partition of the transaction;
- ``COMPLETE_COMMIT`` / ``COMPLETE_ABORT``: every marker is written; the next
  transaction may begin.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass
from typing import Any, Final

from headwater.shared.json_records import json_object
from headwater.shared.partitioning import murmur2

TRANSACTION_STATE_TOPIC: Final = "__transaction_state"
TRANSACTION_STATE_PARTITIONS: Final = 50
STATE_VERSION: Final = 1
STATE_BYTES_MAX: Final = 4 << 20
"""Larger than the state of a transaction over ``TRANSACTION_PARTITIONS_MAX`` partitions."""
TRANSACTION_PARTITIONS_MAX: Final = 10_000
"""Partitions one transaction may write to (the node's ``partitions_max``)."""
PRODUCER_EPOCH_MAX: Final = 32_767
"""A producer epoch is a 16-bit signed number in Kafka's records."""
TRANSACTIONAL_ID_LENGTH_MAX: Final = 249
NO_TIME: Final = -1

TopicPartition = tuple[str, int]


class TxnStatus(enum.Enum):
    EMPTY = "EMPTY"
    ONGOING = "ONGOING"
    PREPARE_COMMIT = "PREPARE_COMMIT"
    PREPARE_ABORT = "PREPARE_ABORT"
    COMPLETE_COMMIT = "COMPLETE_COMMIT"
    COMPLETE_ABORT = "COMPLETE_ABORT"

    @property
    def ending(self) -> bool:
        """The end is decided and its markers are being written."""
        return self in (TxnStatus.PREPARE_COMMIT, TxnStatus.PREPARE_ABORT)


class TxnRecordError(ValueError):
    """Bytes that are not a transaction state this version can read."""


@dataclass(frozen=True, slots=True)
class TransactionState:
    """One transactional id's state (module doc). ``partitions`` is sorted and holds no
    duplicate; ``started_ms`` is ``NO_TIME`` unless a transaction is under way or
    ending."""

    transactional_id: str
    producer_id: int
    producer_epoch: int
    timeout_ms: int
    status: TxnStatus
    partitions: tuple[TopicPartition, ...] = ()
    started_ms: int = NO_TIME
    updated_ms: int = NO_TIME


def transaction_partition(
    transactional_id: str, partitions: int = TRANSACTION_STATE_PARTITIONS
) -> int:
    """The partition of ``__transaction_state`` that holds ``transactional_id``: murmur2
    of its UTF-8 bytes, made non-negative, modulo the partition count (as a group's
    partition of ``__consumer_offsets``)."""
    return (murmur2(transactional_id.encode()) & 0x7FFFFFFF) % partitions


def encode_state(state: TransactionState) -> bytes:
    """The record value of ``state`` (module doc)."""
    body = {
        "version": STATE_VERSION,
        "transactional_id": state.transactional_id,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "timeout_ms": state.timeout_ms,
        "status": state.status.value,
        "partitions": [list(p) for p in state.partitions],
        "started_ms": state.started_ms,
        "updated_ms": state.updated_ms,
    }
    return json.dumps(body, separators=(",", ":")).encode()


def decode_state(data: bytes) -> TransactionState:
    """The state in a record value; TxnRecordError for anything else: more than
    ``STATE_BYTES_MAX`` bytes, not JSON, another version, a field missing, of the wrong
    type or out of range, a status this code does not know, partitions unsorted, repeated
    or more than ``TRANSACTION_PARTITIONS_MAX``."""
    body = json_object(
        data, bytes_max=STATE_BYTES_MAX, what="transaction state", error=TxnRecordError
    )
    if body.get("version") != STATE_VERSION:
        raise TxnRecordError(
            f"transaction state version {body.get('version')!r}; this code reads {STATE_VERSION}"
        )
    transactional_id = _field(body, "transactional_id", str)
    if not 0 < len(transactional_id) <= TRANSACTIONAL_ID_LENGTH_MAX:
        raise TxnRecordError(
            f"transactional_id of {len(transactional_id)} characters; valid: "
            f"[1, {TRANSACTIONAL_ID_LENGTH_MAX}]"
        )
    producer_id = _field(body, "producer_id", int)
    producer_epoch = _field(body, "producer_epoch", int)
    timeout_ms = _field(body, "timeout_ms", int)
    started_ms = _field(body, "started_ms", int)
    updated_ms = _field(body, "updated_ms", int)
    if producer_id < 0 or not 0 <= producer_epoch <= PRODUCER_EPOCH_MAX or timeout_ms <= 0:
        raise TxnRecordError(
            f"producer id {producer_id}, epoch {producer_epoch} or timeout {timeout_ms} ms "
            f"out of range (id >= 0, epoch in [0, {PRODUCER_EPOCH_MAX}], timeout > 0)"
        )
    if started_ms < NO_TIME or updated_ms < NO_TIME:
        raise TxnRecordError(f"times {started_ms}, {updated_ms} below {NO_TIME}")
    try:
        status = TxnStatus(_field(body, "status", str))
    except ValueError:
        raise TxnRecordError(f"unknown transaction status {body.get('status')!r}") from None
    raw = _field(body, "partitions", list)
    if len(raw) > TRANSACTION_PARTITIONS_MAX:
        raise TxnRecordError(
            f"{len(raw)} partitions in a transaction; at most {TRANSACTION_PARTITIONS_MAX}"
        )
    partitions = []
    for item in raw:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or type(item[1]) is not int
            or item[1] < 0
        ):
            raise TxnRecordError(f"a transaction partition must be [topic, index >= 0]: {item!r}")
        partitions.append((item[0], item[1]))
    if partitions != sorted(set(partitions)):
        raise TxnRecordError("a transaction's partitions must be sorted and distinct")
    return TransactionState(
        transactional_id,
        producer_id,
        producer_epoch,
        timeout_ms,
        status,
        tuple(partitions),
        started_ms,
        updated_ms,
    )


def _field(body: dict[str, Any], name: str, kind: type) -> Any:
    if name not in body:
        raise TxnRecordError(f"transaction state lacks field {name!r}")
    value = body[name]
    if type(value) is not kind:  # bool is not an int here
        raise TxnRecordError(f"transaction state field {name!r} is not {kind.__name__}")
    return value
