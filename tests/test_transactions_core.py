"""The transaction coordinator's state and decisions (``node/transactions/``), pure:
every transition, fencing, timeouts, the state's record, and a seeded search over two
instances of one transactional id for the rules the coordinator promises."""

from __future__ import annotations

import contextlib
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.node.transactions import decisions as txn
from headwater.node.transactions.decisions import ProducerIdentity
from headwater.node.transactions.state import (
    PRODUCER_EPOCH_MAX,
    TransactionState,
    TxnRecordError,
    TxnStatus,
    decode_state,
    encode_state,
    transaction_partition,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

TID = "orders-writer"
NOW = 1_767_225_600_000
TIMEOUT = 60_000


def started(fresh: int = 7) -> TransactionState:
    decision = txn.init_producer_id(None, TID, TIMEOUT, NOW, fresh_producer_id=fresh)
    assert decision.state is not None
    return decision.state


def me(state: TransactionState) -> ProducerIdentity:
    return ProducerIdentity(state.producer_id, state.producer_epoch)


def refused(code: ErrorCode, call: object, *args: object, **kwargs: object) -> HeadwaterError:
    with pytest.raises(HeadwaterError) as caught:
        call(*args, **kwargs)  # type: ignore[operator]
    assert caught.value.code is code, caught.value
    return caught.value


def ongoing(partitions: list[tuple[str, int]]) -> TransactionState:
    state = started()
    added = txn.add_partitions(state, TID, me(state), partitions, NOW + 1).state
    assert added is not None
    return added


def test_a_new_transactional_id_gets_a_fresh_producer_id_at_epoch_0() -> None:
    decision = txn.init_producer_id(None, TID, TIMEOUT, NOW, fresh_producer_id=7)
    assert decision.answer == ProducerIdentity(7, 0)
    assert decision.state == TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.EMPTY, (), -1, NOW)


def test_each_init_raises_the_epoch_and_fences_the_instance_before() -> None:
    first = started()
    second = txn.init_producer_id(first, TID, TIMEOUT, NOW + 5, fresh_producer_id=99)
    assert second.answer == ProducerIdentity(7, 1)
    assert second.state is not None
    refused(
        ErrorCode.PRODUCER_FENCED, txn.add_partitions, second.state, TID, me(first), [("t", 0)], NOW
    )
    refused(
        ErrorCode.INVALID_PRODUCER_ID_MAPPING,
        txn.add_partitions,
        second.state,
        TID,
        ProducerIdentity(8, 1),
        [("t", 0)],
        NOW,
    )


def test_a_spent_epoch_gives_a_new_producer_id() -> None:
    worn = TransactionState(TID, 7, PRODUCER_EPOCH_MAX - 1, TIMEOUT, TxnStatus.COMPLETE_COMMIT)
    decision = txn.init_producer_id(worn, TID, TIMEOUT, NOW, fresh_producer_id=42)
    assert decision.answer == ProducerIdentity(42, 0)


def test_timeouts_and_ids_are_checked() -> None:
    refused(
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        txn.init_producer_id,
        None,
        TID,
        txn.TRANSACTION_TIMEOUT_MAX_MS + 1,
        NOW,
        fresh_producer_id=1,
    )
    refused(
        ErrorCode.INVALID_TRANSACTION_TIMEOUT,
        txn.init_producer_id,
        None,
        TID,
        0,
        NOW,
        fresh_producer_id=1,
    )
    refused(
        ErrorCode.INVALID_REQUEST, txn.init_producer_id, None, "", TIMEOUT, NOW, fresh_producer_id=1
    )
    refused(
        ErrorCode.INVALID_REQUEST,
        txn.init_producer_id,
        None,
        "x" * 250,
        TIMEOUT,
        NOW,
        fresh_producer_id=1,
    )


def test_kip_360_an_init_naming_an_older_instance_is_fenced() -> None:
    state = started()
    later = txn.init_producer_id(state, TID, TIMEOUT, NOW, fresh_producer_id=9).state
    refused(
        ErrorCode.PRODUCER_FENCED,
        txn.init_producer_id,
        later,
        TID,
        TIMEOUT,
        NOW,
        fresh_producer_id=9,
        expected=me(state),
    )
    assert later is not None
    again = txn.init_producer_id(later, TID, TIMEOUT, NOW, fresh_producer_id=9, expected=me(later))
    assert again.answer == ProducerIdentity(7, 2)


def test_adding_partitions_begins_the_transaction_once() -> None:
    state = started()
    first = txn.add_partitions(state, TID, me(state), [("b", 1), ("a", 0)], NOW + 10).state
    assert first is not None
    assert (first.status, first.partitions, first.started_ms) == (
        TxnStatus.ONGOING,
        (("a", 0), ("b", 1)),
        NOW + 10,
    )
    assert txn.add_partitions(first, TID, me(first), [("a", 0)], NOW + 20).state is None
    more = txn.add_partitions(first, TID, me(first), [("c", 2)], NOW + 30).state
    assert more is not None and more.started_ms == NOW + 10 and len(more.partitions) == 3
    refused(
        ErrorCode.INVALID_REQUEST, txn.add_partitions, first, TID, me(first), [("d", 0)], NOW, 2
    )


def test_an_end_is_decided_once_and_a_retry_of_it_is_answered_as_done() -> None:
    state = ongoing([("a", 0), ("b", 0)])
    decision = txn.end_transaction(state, TID, me(state), True, NOW + 50)
    assert decision.answer == txn.Markers(7, 0, True, (("a", 0), ("b", 0)))
    ending = decision.state
    assert ending is not None and ending.status is TxnStatus.PREPARE_COMMIT
    # While its markers are written: the same end again, any other call, retriable.
    for call, args in (
        (txn.end_transaction, (ending, TID, me(ending), True, NOW)),
        (txn.add_partitions, (ending, TID, me(ending), [("c", 0)], NOW)),
    ):
        assert refused(ErrorCode.CONCURRENT_TRANSACTIONS, call, *args).retriable
    refused(ErrorCode.INVALID_TXN_STATE, txn.end_transaction, ending, TID, me(ending), False, NOW)
    done = txn.complete(ending, NOW + 60)
    assert (done.status, done.partitions, done.started_ms) == (TxnStatus.COMPLETE_COMMIT, (), -1)
    assert txn.end_transaction(done, TID, me(done), True, NOW) == txn.TxnDecision(None, None)
    refused(ErrorCode.INVALID_TXN_STATE, txn.end_transaction, done, TID, me(done), False, NOW)
    refused(ErrorCode.INVALID_TXN_STATE, txn.complete, done, NOW)
    fresh = started()
    refused(ErrorCode.INVALID_TXN_STATE, txn.end_transaction, fresh, TID, me(fresh), True, NOW)


def test_an_init_during_a_transaction_aborts_it_and_fences_its_producer() -> None:
    state = ongoing([("a", 0)])
    decision = txn.init_producer_id(state, TID, TIMEOUT, NOW + 5, fresh_producer_id=99)
    assert isinstance(decision.answer, HeadwaterError)
    assert decision.answer.code is ErrorCode.CONCURRENT_TRANSACTIONS
    aborting = decision.state
    assert aborting is not None
    assert (aborting.status, aborting.producer_epoch) == (TxnStatus.PREPARE_ABORT, 1)
    assert txn.markers_of(aborting) == txn.Markers(7, 1, False, (("a", 0),))
    refused(ErrorCode.PRODUCER_FENCED, txn.end_transaction, aborting, TID, me(state), True, NOW)
    retry = txn.init_producer_id(aborting, TID, TIMEOUT, NOW + 6, fresh_producer_id=99)
    assert retry.state is None and isinstance(retry.answer, HeadwaterError)
    settled = txn.init_producer_id(
        txn.complete(aborting, NOW + 7), TID, TIMEOUT, NOW + 8, fresh_producer_id=99
    )
    assert settled.answer == ProducerIdentity(7, 2)


def test_a_transaction_past_its_timeout_is_aborted_and_its_producer_fenced() -> None:
    state = ongoing([("a", 0)])  # began at NOW + 1
    assert txn.expire([state], NOW + 1 + TIMEOUT) == []
    (aborted,) = txn.expire([state, started()], NOW + 2 + TIMEOUT)
    assert (aborted.status, aborted.producer_epoch) == (TxnStatus.PREPARE_ABORT, 1)
    refused(ErrorCode.PRODUCER_FENCED, txn.add_partitions, aborted, TID, me(state), [("b", 0)], NOW)


def test_fencing_at_the_last_epoch_still_fences() -> None:
    """An instance never holds the last epoch, so an abort can always raise it."""
    worn = TransactionState(TID, 7, PRODUCER_EPOCH_MAX - 2, TIMEOUT, TxnStatus.EMPTY)
    decision = txn.init_producer_id(worn, TID, TIMEOUT, NOW, fresh_producer_id=42)
    assert decision.answer == ProducerIdentity(7, PRODUCER_EPOCH_MAX - 1)
    assert decision.state is not None
    running = txn.add_partitions(decision.state, TID, me(decision.state), [("a", 0)], NOW).state
    assert running is not None
    (aborted,) = txn.expire([running], NOW + TIMEOUT + 1)
    assert aborted.producer_epoch == PRODUCER_EPOCH_MAX > running.producer_epoch


# --------------------------------------------------------------------------- the record


def test_a_state_reads_back_from_its_record() -> None:
    state = ongoing([("a", 0), ("b", 3)])
    assert decode_state(encode_state(state)) == state
    assert 0 <= transaction_partition(TID) < 50
    assert transaction_partition(TID) == transaction_partition(TID)


@pytest.mark.parametrize(
    "damage",
    [
        b"not json",
        b"[]",
        b'{"version": 2}',
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.EMPTY)).replace(
            b"EMPTY", b"LOST"
        ),
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.EMPTY)).replace(
            b'"producer_epoch":0', b'"producer_epoch":40000'
        ),
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.EMPTY)).replace(
            b'"producer_id":7', b'"producer_id":true'
        ),
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.ONGOING, (("b", 0), ("a", 0)))),
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.ONGOING, (("a", 0), ("a", 0)))),
        encode_state(TransactionState(TID, 7, 0, TIMEOUT, TxnStatus.EMPTY)).replace(
            b'"timeout_ms":60000', b'"timeout_ms":0'
        ),
    ],
)
def test_a_damaged_record_is_refused_by_name(damage: bytes) -> None:
    with pytest.raises(TxnRecordError):
        decode_state(damage)


@given(st.binary(max_size=400))
@settings(max_examples=300, deadline=None)
def test_any_bytes_decode_to_a_state_or_a_record_error(data: bytes) -> None:
    with contextlib.suppress(TxnRecordError):
        decode_state(data)


# --------------------------------------------------------------------------- seeded search


@pytest.mark.parametrize("seed", range(20))
def test_two_instances_of_one_id_never_break_the_coordinators_rules(seed: int) -> None:
    _search(seed)


def test_the_search_catches_a_coordinator_that_lets_a_fenced_instance_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same search with the epoch check taken out of the coordinator's checks."""
    checked = txn._checked

    def without_epochs(
        current: TransactionState | None, transactional_id: str, producer: ProducerIdentity
    ) -> TransactionState:
        if current is not None and current.producer_id == producer.producer_id:
            return current
        return checked(current, transactional_id, producer)

    monkeypatch.setattr(txn, "_checked", without_epochs)
    with pytest.raises(AssertionError, match="fenced instance"):
        _search(0)


def _search(seed: int) -> None:
    """Two producer instances of one transactional id, each starting (init), adding
    partitions and ending transactions at random, a fenced one stopping and starting
    again; the coordinator completing ending transactions and expiring old ones at random
    times. After every step: the epoch never
    goes back; only the current instance's calls change the state; a transaction is
    ended one way only, and each decided end completes that way."""
    rng = random.Random(seed)
    state: TransactionState | None = None
    instances: list[ProducerIdentity | None] = [None, None]
    now = NOW
    fresh = 100
    epochs_seen: list[tuple[int, int]] = []
    decided: dict[tuple[int, int, int], bool] = {}  # (id, epoch, started) -> commit?
    completed = {True: 0, False: 0}
    for _ in range(400):
        now += rng.randrange(1, 5_000)
        who = 0 if rng.random() < 0.85 else 1  # the second instance a rare zombie
        if rng.random() < 0.3:  # the coordinator: markers written, or a timeout
            action = rng.choice(["complete", "complete", "expire"])
        elif instances[who] is None or rng.random() < 0.05:  # an instance (re)starts
            action = "init"
        else:
            action = rng.choice(["add", "add", "add", "end"])
        before = state
        refusal: HeadwaterError | None = None
        try:
            if action == "init":
                fresh += 1
                decision = txn.init_producer_id(state, TID, TIMEOUT, now, fresh_producer_id=fresh)
                if isinstance(decision.answer, ProducerIdentity):
                    instances[who] = decision.answer
                state = decision.state or state
            elif action == "add" and instances[who] is not None:
                identity = instances[who]
                assert identity is not None
                partition = ("t", rng.randrange(4))
                state = txn.add_partitions(state, TID, identity, [partition], now).state or state
                assert state is not None and (identity.producer_id, identity.producer_epoch) == (
                    state.producer_id,
                    state.producer_epoch,
                ), "a call of a fenced instance changed the state"
            elif action == "end" and instances[who] is not None:
                identity = instances[who]
                assert identity is not None
                commit = rng.random() < 0.5
                decision = txn.end_transaction(state, TID, identity, commit, now)
                if decision.state is not None:
                    key = (state.producer_id, state.producer_epoch, state.started_ms)  # type: ignore[union-attr]
                    assert key not in decided, "a transaction was ended twice"
                    decided[key] = commit
                state = decision.state or state
            elif action == "complete" and state is not None and state.status.ending:
                commit = state.status is TxnStatus.PREPARE_COMMIT
                key = (
                    state.producer_id,
                    state.producer_epoch,
                    state.started_ms,
                )
                if key in decided:
                    assert decided[key] == commit, "an end completed the other way"
                state = txn.complete(state, now)
                completed[commit] += 1
            elif action == "expire" and state is not None:
                expired = txn.expire([state], now)
                state = expired[0] if expired else state
        except HeadwaterError as error:
            refusal = error
            if error.code in (ErrorCode.PRODUCER_FENCED, ErrorCode.INVALID_PRODUCER_ID_MAPPING):
                instances[who] = None  # a fenced instance stops; another may start
        if refusal is not None:
            assert state is before, f"a refused call changed the state: {refusal}"
        if state is not None:
            epochs_seen.append((state.producer_id, state.producer_epoch))
            if state.status in (
                TxnStatus.EMPTY,
                TxnStatus.COMPLETE_COMMIT,
                TxnStatus.COMPLETE_ABORT,
            ):
                assert state.partitions == () and state.started_ms == -1
    for (pid_a, epoch_a), (pid_b, epoch_b) in itertools.pairwise(epochs_seen):
        assert pid_b > pid_a or (pid_b == pid_a and epoch_b >= epoch_a), "the epoch went back"
    assert completed[True] and completed[False], f"seed {seed} completed {completed}"
