"""The transaction coordinator's decisions (pure): what a request or the passing of time
changes in a transactional id's state, and the answer.

Every function takes the id's state as the coordinator's partition of
``__transaction_state`` has it (None: the id was never seen), checks the request against
it and returns ``TxnDecision(state, answer)``: ``state`` is the new state to append (None:
nothing changes), and the caller answers once it is replicated. A refused request raises
HeadwaterError and changes nothing. Nothing here reads a clock, allocates a producer id or
does I/O: the time and a fresh producer id come in as arguments.

Rules, each kept here (KIP-98, KIP-360, KIP-890):

- **Fencing**: every ``init_producer_id`` of an id raises its producer epoch (a new
  producer id at epoch 0 once the epoch would reach ``PRODUCER_EPOCH_MAX``); a request
  carrying another producer id is refused INVALID_PRODUCER_ID_MAPPING, one carrying
  another epoch PRODUCER_FENCED. So of two instances of one transactional id, only the
  later can add partitions or end a transaction.
- **One transaction at a time**: a transaction whose end is decided (``PREPARE_*``)
  completes, its markers written, before the id may begin another or initialize again
  (CONCURRENT_TRANSACTIONS, retriable, meanwhile). An ``init_producer_id`` while a
  transaction is under way aborts it, with the epoch raised first so the old instance's
  writes and end are refused.
- **An end is decided once**: ``end_transaction`` moves ``ONGOING`` to
  ``PREPARE_COMMIT`` or ``PREPARE_ABORT``; asked again the same way it is answered as
  done (a retry), asked the other way it is refused INVALID_TXN_STATE. A transaction is
  never both committed and aborted.
- **Timeouts**: a transaction under way longer than its timeout is aborted
  (``expire``), its epoch raised so its producer is fenced.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, Generic, TypeVar

from headwater.node.transactions.state import (
    NO_TIME,
    PRODUCER_EPOCH_MAX,
    TRANSACTION_PARTITIONS_MAX,
    TRANSACTIONAL_ID_LENGTH_MAX,
    TopicPartition,
    TransactionState,
    TxnStatus,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

T = TypeVar("T")
TRANSACTION_TIMEOUT_MAX_MS: Final = 900_000
"""The longest timeout a producer may ask by default (Kafka's transaction.max.timeout.ms)."""
NO_PRODUCER: Final = -1
"""An ``expected`` producer id or epoch that is not given (KIP-360)."""


@dataclass(frozen=True, slots=True)
class TxnDecision(Generic[T]):
    """The state to append (None: nothing changes) and the answer once it is replicated."""

    state: TransactionState | None
    answer: T


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class Markers:
    """What ending a transaction writes: a commit or abort marker of ``producer_id`` at
    ``producer_epoch`` in every partition of ``partitions``."""

    producer_id: int
    producer_epoch: int
    commit: bool
    partitions: tuple[TopicPartition, ...]


def check_transactional_id(transactional_id: str) -> None:
    """INVALID_REQUEST unless the id has 1 to ``TRANSACTIONAL_ID_LENGTH_MAX`` characters."""
    if not 0 < len(transactional_id) <= TRANSACTIONAL_ID_LENGTH_MAX:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"a transactional id has 1 to {TRANSACTIONAL_ID_LENGTH_MAX} characters; this one "
            f"has {len(transactional_id)}",
        )


def init_producer_id(
    current: TransactionState | None,
    transactional_id: str,
    timeout_ms: int,
    now_ms: int,
    *,
    fresh_producer_id: int,
    timeout_max_ms: int = TRANSACTION_TIMEOUT_MAX_MS,
    expected: ProducerIdentity | None = None,
) -> TxnDecision[ProducerIdentity | HeadwaterError]:
    """A producer instance of ``transactional_id`` starts (InitProducerId). The answer is
    its producer id and epoch, or CONCURRENT_TRANSACTIONS (an error the producer retries:
    a transaction of the id is ending, or was under way and is now aborted, its epoch
    raised). ``fresh_producer_id``: an unused producer id, taken only for a new id or when
    the epoch is spent. ``expected`` (KIP-360): the id and epoch the producer last had;
    when given and not the current ones, PRODUCER_FENCED."""
    check_transactional_id(transactional_id)
    if not 0 < timeout_ms <= timeout_max_ms:
        raise HeadwaterError(
            ErrorCode.INVALID_TRANSACTION_TIMEOUT,
            f"transaction timeout {timeout_ms} ms; valid: [1, {timeout_max_ms}]",
        )
    if current is None:
        state = TransactionState(
            transactional_id, fresh_producer_id, 0, timeout_ms, TxnStatus.EMPTY, (), NO_TIME, now_ms
        )
        return TxnDecision(state, ProducerIdentity(fresh_producer_id, 0))
    if expected is not None and (
        expected.producer_id != current.producer_id
        or expected.producer_epoch != current.producer_epoch
    ):
        raise HeadwaterError(
            ErrorCode.PRODUCER_FENCED,
            f"transactional id {transactional_id!r} is at producer {current.producer_id} epoch "
            f"{current.producer_epoch}, not {expected.producer_id} epoch {expected.producer_epoch}",
        )
    if current.status.ending:
        return TxnDecision(None, _still_ending(current))
    if current.status is TxnStatus.ONGOING:
        aborting = _abort_fencing(current, now_ms)
        return TxnDecision(
            aborting,
            HeadwaterError(
                ErrorCode.CONCURRENT_TRANSACTIONS,
                f"transactional id {transactional_id!r} had a transaction under way: it is "
                "being aborted; retry",
            ),
        )
    producer_id, epoch = _next_epoch(current, fresh_producer_id)
    state = TransactionState(
        transactional_id, producer_id, epoch, timeout_ms, TxnStatus.EMPTY, (), NO_TIME, now_ms
    )
    return TxnDecision(state, ProducerIdentity(producer_id, epoch))


def add_partitions(
    current: TransactionState | None,
    transactional_id: str,
    producer: ProducerIdentity,
    partitions: Sequence[TopicPartition],
    now_ms: int,
    partitions_max: int = TRANSACTION_PARTITIONS_MAX,
) -> TxnDecision[None]:
    """The producer will write to ``partitions`` in its transaction (AddPartitionsToTxn;
    AddOffsetsToTxn adds the group's partition of ``__consumer_offsets``). The first
    partition added begins the transaction; adding one already added changes nothing."""
    state = _checked(current, transactional_id, producer)
    if state.status.ending:
        raise _still_ending(state)
    added = sorted(set(state.partitions).union(partitions))
    if len(added) > partitions_max:
        raise HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"a transaction writes to at most {partitions_max} partitions; this one would "
            f"write to {len(added)}",
        )
    if state.status is TxnStatus.ONGOING and len(added) == len(state.partitions):
        return TxnDecision(None, None)
    started = state.started_ms if state.status is TxnStatus.ONGOING else now_ms
    return TxnDecision(
        replace(
            state,
            status=TxnStatus.ONGOING,
            partitions=tuple(added),
            started_ms=started,
            updated_ms=now_ms,
        ),
        None,
    )


def end_transaction(
    current: TransactionState | None,
    transactional_id: str,
    producer: ProducerIdentity,
    commit: bool,
    now_ms: int,
) -> TxnDecision[Markers | None]:
    """The producer commits (``commit``) or aborts its transaction (EndTxn). The answer is
    the markers to write before the transaction completes (``complete``), or None for a
    retry of an end already completed the same way."""
    state = _checked(current, transactional_id, producer)
    wanted = TxnStatus.PREPARE_COMMIT if commit else TxnStatus.PREPARE_ABORT
    done = TxnStatus.COMPLETE_COMMIT if commit else TxnStatus.COMPLETE_ABORT
    if state.status is TxnStatus.ONGOING:
        ending = replace(state, status=wanted, updated_ms=now_ms)
        return TxnDecision(ending, markers_of(ending))
    if state.status is done:
        return TxnDecision(None, None)
    if state.status is wanted:
        raise _still_ending(state)
    raise HeadwaterError(
        ErrorCode.INVALID_TXN_STATE,
        f"transactional id {transactional_id!r}: cannot {'commit' if commit else 'abort'} "
        f"a transaction that is {state.status.value}",
    )


def complete(current: TransactionState, now_ms: int) -> TransactionState:
    """Every marker of the ending transaction is written: it is complete, and the id may
    begin another. INVALID_TXN_STATE unless the transaction is ending (a coordinator that
    replays its partition completes each ending transaction once it has written the
    markers again)."""
    if current.status is TxnStatus.PREPARE_COMMIT:
        status = TxnStatus.COMPLETE_COMMIT
    elif current.status is TxnStatus.PREPARE_ABORT:
        status = TxnStatus.COMPLETE_ABORT
    else:
        raise HeadwaterError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {current.transactional_id!r}: no transaction is ending "
            f"({current.status.value})",
        )
    return replace(current, status=status, partitions=(), started_ms=NO_TIME, updated_ms=now_ms)


def markers_of(state: TransactionState) -> Markers:
    """The markers an ending transaction writes (its state ``PREPARE_*``)."""
    if not state.status.ending:
        raise HeadwaterError(
            ErrorCode.INVALID_TXN_STATE,
            f"transactional id {state.transactional_id!r}: no transaction is ending "
            f"({state.status.value})",
        )
    return Markers(
        state.producer_id,
        state.producer_epoch,
        state.status is TxnStatus.PREPARE_COMMIT,
        state.partitions,
    )


def expire(states: Iterable[TransactionState], now_ms: int) -> list[TransactionState]:
    """The transactions under way for longer than their timeout, each aborted with its
    epoch raised (its producer fenced): the states to append, then their markers."""
    return [
        _abort_fencing(state, now_ms)
        for state in states
        if state.status is TxnStatus.ONGOING and now_ms - state.started_ms > state.timeout_ms
    ]


def _checked(
    current: TransactionState | None, transactional_id: str, producer: ProducerIdentity
) -> TransactionState:
    """``current`` when ``producer`` is the id's current instance; else the refusal."""
    check_transactional_id(transactional_id)
    if current is None or current.producer_id != producer.producer_id:
        now = "none" if current is None else str(current.producer_id)
        raise HeadwaterError(
            ErrorCode.INVALID_PRODUCER_ID_MAPPING,
            f"transactional id {transactional_id!r} has producer id {now}, not "
            f"{producer.producer_id}",
        )
    if current.producer_epoch != producer.producer_epoch:
        raise HeadwaterError(
            ErrorCode.PRODUCER_FENCED,
            f"transactional id {transactional_id!r} is at producer epoch "
            f"{current.producer_epoch}; epoch {producer.producer_epoch} was fenced",
        )
    return current


def _abort_fencing(state: TransactionState, now_ms: int) -> TransactionState:
    """``state``'s transaction under way, aborted with the epoch raised (kept at the most
    an epoch may be: the instance then holds the last epoch of its producer id, and the
    next ``init_producer_id`` gives a new id)."""
    epoch = min(state.producer_epoch + 1, PRODUCER_EPOCH_MAX)
    return replace(state, producer_epoch=epoch, status=TxnStatus.PREPARE_ABORT, updated_ms=now_ms)


def _next_epoch(state: TransactionState, fresh_producer_id: int) -> tuple[int, int]:
    """The next instance's producer id and epoch. An instance is never given
    ``PRODUCER_EPOCH_MAX``: that epoch is kept for fencing it (``_abort_fencing``)."""
    if state.producer_epoch + 1 >= PRODUCER_EPOCH_MAX:
        return fresh_producer_id, 0
    return state.producer_id, state.producer_epoch + 1


def _still_ending(state: TransactionState) -> HeadwaterError:
    return HeadwaterError(
        ErrorCode.CONCURRENT_TRANSACTIONS,
        f"transactional id {state.transactional_id!r}: its transaction is "
        f"{state.status.value}, its markers being written; retry",
    )
