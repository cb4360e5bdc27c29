"""A metadata voter takes AppendEntries by the Raft rule, whatever order they arrive in.

Reproduces the finding ``CRITICAL pysyncobj.syncobj: truncating already-applied log
entries`` (seen even at a fault-free start): pysyncobj 0.3.17 deletes every entry after
``prevLogIdx`` of any AppendEntries, so a late or repeated one cut committed, applied
entries off a voter's journal and moved its commit index back
(``test_plain_pysyncobj_truncates_...`` pins the library's behaviour;
``test_a_late_heartbeat_leaves_...`` failed before ``RaftFollowerGuard``).

The pure rule (``headwater.raft.follower_append``) gets a table and a seeded simulation of
a follower receiving a leader's messages out of order, repeated and cut short; the guard
itself runs on real pysyncobj objects fed messages directly (no ticking thread, no peer).
"""

from __future__ import annotations

import logging
import pickle
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.syncobj import _COMMAND_TYPE, _RAFT_STATE, _bchr

from headwater.raft.follower_append import AppendAction, Entry, plan_append
from headwater.raft.quorum import (
    HIGHER_TERM,
    PYSYNCOBJ_VERSION,
    MetadataQuorum,
    RaftFollowerGuard,
)
from headwater.tools.ports import free_port_block

NOOP = _bchr(_COMMAND_TYPE.NO_OP)


def _terms(log: list[Entry]) -> Any:
    by_index = {e[1]: e[2] for e in log}
    return by_index.get


def _plan(log: list[Entry], committed: int, prev: int, prev_term: int, entries: list[Entry],
          leader_commit: int) -> Any:  # fmt: skip
    return plan_append(_terms(log), log[-1][1], committed, prev, prev_term, entries,
                       leader_commit)  # fmt: skip


def _log(*terms: int) -> list[Entry]:
    """Entries 1..n with these terms."""
    return [(NOOP, i + 1, t) for i, t in enumerate(terms)]


# ----------------------------------------------------------------------------- the rule


def test_a_late_heartbeat_keeps_the_longer_log_and_commits_only_what_it_proves() -> None:
    log = _log(0, 1, 1, 1)
    plan = _plan(log, committed=4, prev=2, prev_term=1, entries=[], leader_commit=4)
    assert plan.action is AppendAction.ACKNOWLEDGE
    assert (plan.prev_index, plan.commit_limit) == (2, 2)


def test_entries_already_held_are_skipped_and_nothing_is_deleted() -> None:
    log = _log(0, 1, 1, 1)
    plan = _plan(log, 4, prev=1, prev_term=0, entries=log[1:3], leader_commit=4)
    assert plan.action is AppendAction.ACKNOWLEDGE
    assert plan.prev_index == 3
    plan = _plan(log, 4, prev=1, prev_term=0, entries=log[1:], leader_commit=4)
    assert (plan.action, plan.prev_index, plan.entries) == (AppendAction.APPEND, 4, ())


def test_new_entries_after_the_held_ones_are_appended_from_the_log_end() -> None:
    log = _log(0, 1, 1)
    leader = _log(0, 1, 1, 1, 1)
    plan = _plan(log, 3, prev=1, prev_term=0, entries=leader[1:], leader_commit=5)
    assert plan.action is AppendAction.APPEND
    assert (plan.prev_index, plan.prev_term, plan.entries) == (3, 1, tuple(leader[3:]))


def test_an_uncommitted_suffix_of_an_old_term_is_replaced_from_the_first_conflict() -> None:
    log = _log(0, 1, 1, 2, 2)  # 4 and 5 from a term-2 leader that lost them
    leader = _log(0, 1, 1, 3, 3, 3)
    plan = _plan(log, 3, prev=2, prev_term=1, entries=leader[2:], leader_commit=6)
    assert plan.action is AppendAction.APPEND
    assert (plan.prev_index, plan.entries) == (3, tuple(leader[3:]))


def test_a_matching_prefix_with_a_stale_tail_commits_no_further_than_the_prefix() -> None:
    log = _log(0, 1, 2, 2)  # 4 is a stale term-2 entry; the leader's 4 is term 3
    plan = _plan(log, 2, prev=2, prev_term=1, entries=_log(0, 1, 2)[2:], leader_commit=4)
    assert plan.action is AppendAction.ACKNOWLEDGE
    assert (plan.prev_index, plan.commit_limit) == (3, 3)


def test_a_conflict_with_a_committed_entry_is_refused() -> None:
    log = _log(0, 1, 1, 1)
    plan = _plan(log, 4, prev=2, prev_term=1, entries=[(NOOP, 3, 2)], leader_commit=4)
    assert plan.action is AppendAction.REFUSE
    assert "conflicts with the committed entry" in plan.reason


@pytest.mark.parametrize(
    "entries",
    [[(NOOP, 5, 1)], [(NOOP, 3, 1), (NOOP, 3, 1)], [("x", "3", 1)], [[NOOP, 3, 1]]],
)
def test_malformed_entries_are_refused(entries: list[Any]) -> None:
    plan = _plan(_log(0, 1), 2, prev=2, prev_term=1, entries=entries, leader_commit=2)
    assert plan.action is AppendAction.REFUSE


@pytest.mark.parametrize(("prev", "prev_term"), [(2, 2), (7, 1), (0, 0), (2, None)])
def test_a_message_that_does_not_match_at_prev_is_left_to_pysyncobj_to_refuse(
    prev: int, prev_term: Any
) -> None:
    plan = _plan(_log(0, 1, 1), 3, prev=prev, prev_term=prev_term, entries=[], leader_commit=3)
    assert plan.action is AppendAction.DEFER


class _Follower:
    """What pysyncobj does with a plan: the follower's log and commit index."""

    def __init__(self, log: list[Entry], commit: int) -> None:
        self.log = list(log)
        self.commit = commit

    def receive(self, prev: int, prev_term: int, entries: list[Entry], leader_commit: int) -> None:
        plan = _plan(self.log, self.commit, prev, prev_term, entries, leader_commit)
        if plan.action is AppendAction.APPEND:
            del self.log[plan.prev_index :]
            self.log.extend(plan.entries)
            self.commit = max(self.commit, min(leader_commit, self.log[-1][1]))
        elif plan.action is AppendAction.ACKNOWLEDGE:
            self.commit = max(self.commit, plan.commit_limit)
        else:
            assert plan.action is AppendAction.DEFER, plan.reason


@pytest.mark.parametrize("seed", range(300))
def test_out_of_order_repeated_and_short_messages_never_lose_a_committed_entry(
    seed: int,
) -> None:
    rng = random.Random(seed)
    n = rng.randint(3, 30)
    terms = sorted(rng.randint(1, 4) for _ in range(n - 1))
    leader = _log(0, *terms)
    commit = rng.randint(1, n)
    # The follower holds a prefix of the committed log, maybe with a stale tail of entries
    # from a term that never committed them (lower than the leader's term there).
    held = rng.randint(1, commit)
    follower_log = leader[:held]
    for index in range(held + 1, min(n, held + rng.randint(0, 4)) + 1):
        if index <= commit or leader[index - 1][2] <= 1:
            break
        follower_log.append((b"stale", index, rng.randint(1, leader[index - 1][2] - 1)))
    follower = _Follower(follower_log, min(commit, held))
    messages = []
    for _ in range(rng.randint(5, 40)):
        prev = rng.randint(1, n)
        count = rng.randint(0, n - prev)
        messages.append((prev, leader[prev - 1][2], leader[prev : prev + count], commit))
    for message in rng.sample(messages, len(messages)) + messages[: rng.randint(0, 5)]:
        before = follower.commit
        follower.receive(*message)
        assert follower.commit >= before
        assert follower.log[: follower.commit] == leader[: follower.commit]
    follower.receive(1, 0, leader[1:], commit)
    assert follower.log == leader
    assert follower.commit == commit


# ----------------------------------------------------------- on real pysyncobj objects


@pytest.fixture
def follower_of(tmp_path: Path) -> Iterator[Any]:
    made: list[SyncObj] = []

    def make(cls: type[SyncObj]) -> tuple[SyncObj, Any]:
        port = free_port_block(2)
        conf = SyncObjConf(
            autoTick=False,
            appendEntriesUseBatch=False,
            journalFile=str(tmp_path / f"journal-{len(made)}"),
            fullDumpFile=str(tmp_path / f"snapshot-{len(made)}"),
            useFork=False,
        )
        sync = cls(f"127.0.0.1:{port}", [f"127.0.0.1:{port + 1}"], conf)
        made.append(sync)
        return sync, next(iter(sync._SyncObj__otherNodes))

    yield make
    for sync in made:
        sync.destroy()


def _append(prev: int, prev_term: int, entries: list[Entry], commit: int) -> dict[str, Any]:
    return {
        "type": "append_entries",
        "term": 1,
        "commit_index": commit,
        "prevLogIdx": prev,
        "prevLogTerm": prev_term,
        "entries": entries,
    }


def _state(sync: SyncObj) -> tuple[int, int, int]:
    raft_log = sync._SyncObj__raftLog
    return len(raft_log), sync.raftCommitIndex, sync.raftLastApplied


def test_the_guard_is_written_for_the_pinned_pysyncobj() -> None:
    from importlib.metadata import version

    assert version("pysyncobj") == PYSYNCOBJ_VERSION


def test_plain_pysyncobj_truncates_applied_entries_on_a_late_heartbeat(
    follower_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sync, leader = follower_of(SyncObj)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1, 1, 1)[1:], 4))
    sync._onTick(0)
    assert _state(sync) == (4, 4, 4)
    receive(leader, _append(2, 1, [], 4))
    assert _state(sync) == (2, 2, 4)
    assert "truncating already-applied log entries" in caplog.text


def test_a_late_heartbeat_leaves_a_voters_committed_entries_and_commit_index(
    follower_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sync, leader = follower_of(RaftFollowerGuard)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1, 1, 1)[1:], 4))
    sync._onTick(0)
    assert _state(sync) == (4, 4, 4)
    receive(leader, _append(2, 1, [], 4))
    receive(leader, _append(1, 0, _log(0, 1, 1)[1:], 4))
    assert _state(sync) == (4, 4, 4)
    assert sync._getLeader() == leader
    receive(leader, _append(4, 1, [(NOOP, 5, 1)], 5))
    sync._onTick(0)
    assert _state(sync) == (5, 5, 5)
    assert "already-applied" not in caplog.text


def test_a_conflict_below_the_commit_index_is_refused_loudly(
    follower_of: Any, caplog: pytest.LogCaptureFixture
) -> None:
    sync, leader = follower_of(RaftFollowerGuard)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1, 1)[1:], 3))
    sync._onTick(0)
    with caplog.at_level(logging.CRITICAL):
        receive(leader, _append(1, 0, [(NOOP, 2, 2)], 3))
    assert _state(sync) == (3, 3, 3)
    assert "conflicts with the committed entry" in caplog.text


def test_an_uncommitted_suffix_of_an_old_term_is_replaced(follower_of: Any) -> None:
    sync, leader = follower_of(RaftFollowerGuard)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1, 1, 1)[1:], 2))
    sync._onTick(0)
    assert _state(sync) == (4, 2, 2)
    message = _append(2, 1, [(NOOP, 3, 2)], 3)
    message["term"] = 2
    receive(leader, message)
    sync._onTick(0)
    raft_log = sync._SyncObj__raftLog
    assert [(e[1], e[2]) for e in raft_log] == [(1, 0), (2, 1), (3, 2)]
    assert sync.raftCommitIndex == 3


def _chunks(entry: Entry, batch_bytes: int = 2**16) -> list[tuple[str, bytes]]:
    """The chunks pysyncobj 0.3.17's leader sends for one large entry
    (``SyncObj.__sendAppendEntries``), including its quirk: "finish" is decided by the
    command's length, not the pickle's, so some sizes get two "finish" chunks."""
    data = pickle.dumps(entry)
    out = []
    for pos in range(0, len(data), batch_bytes):
        if pos == 0:
            kind = "start"
        elif pos + batch_bytes >= len(entry[0]):
            kind = "finish"
        else:
            kind = "process"
        out.append((kind, data[pos : pos + batch_bytes]))
    return out


@pytest.mark.parametrize("command_bytes", [200_000, 2 * 2**16 - 20])
def test_an_entry_sent_in_chunks_is_taken_by_the_same_rule(
    follower_of: Any, command_bytes: int
) -> None:
    sync, leader = follower_of(RaftFollowerGuard)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1)[1:], 2))
    big: Entry = (NOOP + bytes(command_bytes), 3, 1)
    chunks = _chunks(big)
    if command_bytes == 2 * 2**16 - 20:
        assert [kind for kind, _ in chunks] == ["start", "finish", "finish"]
    for kind, chunk in chunks:
        message = _append(2, 1, [], 3)
        message.update(transmission=kind, data=chunk)
        del message["entries"]
        receive(leader, message)
    assert _state(sync)[:2] == (3, 3)
    assert sync._SyncObj__raftLog[-1] == big
    # The same entry again, late: nothing is cut.
    receive(leader, _append(2, 1, [big], 3))
    receive(leader, _append(1, 0, [], 3))
    assert _state(sync)[:2] == (3, 3)


@pytest.mark.parametrize(("cls", "commit_after"), [(SyncObj, 4), (RaftFollowerGuard, 2)])
def test_a_snapshot_message_commits_no_tail_of_another_term(
    follower_of: Any, cls: type[SyncObj], commit_after: int
) -> None:
    """pysyncobj commits up to its own last entry on every snapshot message, before the
    snapshot arrives: here entries 3 and 4, written by a term-1 leader that never
    committed them (plain pysyncobj, pinned), which the guard does not."""
    sync, leader = follower_of(cls)
    receive = sync._SyncObj__onMessageReceived
    receive(leader, _append(1, 0, _log(0, 1, 1, 1)[1:], 2))
    assert _state(sync)[:2] == (4, 2)
    snapshot = {"type": "append_entries", "term": 2, "commit_index": 50, "serialized": None}
    receive(leader, snapshot)
    assert sync.raftCommitIndex == commit_after
    assert sync._getLeader() == leader


def test_a_leader_stepping_down_never_claims_the_new_term(follower_of: Any) -> None:
    """pysyncobj steps down on a higher term by writing the term (a journal write) and
    then its state. A controller that read "leader" and the new term in between
    activated itself for a term another voter led; that voter's own activation was then
    refused for good and the cluster had no controller. The guard reports leadership
    only for the term the node was elected in."""
    sync, _leader = follower_of(RaftFollowerGuard)
    self_id = sync._SyncObj__selfNode.id
    sync._SyncObj__setCurrentTerm(3, self_id)
    sync._SyncObj__setState(_RAFT_STATE.LEADER)
    assert sync.leader_term() == 3
    # A message of term 4 arrives: the term is written first, the state after.
    sync._SyncObj__setCurrentTerm(4, None)
    assert sync._isLeader() and sync._getTerm() == 4  # what a plain read sees
    assert sync.leader_term() == -1
    quorum = object.__new__(MetadataQuorum)
    quorum._sync = sync
    status = quorum.status()
    assert (status.is_leader, status.term) == (False, 4)
    sync._SyncObj__setState(_RAFT_STATE.FOLLOWER)
    assert sync.leader_term() == -1
    # Elected again, in term 5.
    sync._SyncObj__setCurrentTerm(5, self_id)
    sync._SyncObj__setState(_RAFT_STATE.LEADER)
    assert sync.leader_term() == 5


def _recording_sends(sync: SyncObj) -> list[tuple[Any, Any]]:
    sent: list[tuple[Any, Any]] = []

    def send(node: Any, message: Any) -> bool:
        sent.append((node, message))
        return True

    sync._SyncObj__transport.send = send
    return sent


def test_plain_pysyncobj_ignores_a_leader_of_an_older_term_without_a_word(
    follower_of: Any,
) -> None:
    """A voter whose term got ahead of the leader's takes nothing from it and says
    nothing; with PreVote it wins no election either, so it stays behind for as long as
    that leader lives (a chaos run saw a voter miss metadata for minutes, through two
    restarts)."""
    sync, leader = follower_of(SyncObj)
    sent = _recording_sends(sync)
    sync._SyncObj__setCurrentTerm(5, None)
    sync._SyncObj__onMessageReceived(leader, {**_append(1, 0, [(NOOP, 2, 3)], 2), "term": 3})
    assert sent == [] and len(sync._SyncObj__raftLog) == 1


def test_a_voter_of_a_newer_term_answers_an_older_leader_which_steps_down(
    follower_of: Any,
) -> None:
    voter, leader_node = follower_of(RaftFollowerGuard)
    sent = _recording_sends(voter)
    voter._SyncObj__setCurrentTerm(5, None)
    voter._SyncObj__onMessageReceived(leader_node, {**_append(1, 0, [(NOOP, 2, 3)], 2), "term": 3})
    assert sent == [(leader_node, {"type": HIGHER_TERM, "term": 5})]
    assert len(voter._SyncObj__raftLog) == 1  # nothing taken from the older leader

    leader, voter_node = follower_of(RaftFollowerGuard)
    leader._SyncObj__setCurrentTerm(3, leader._SyncObj__selfNode.id)
    leader._SyncObj__setState(_RAFT_STATE.LEADER)
    assert leader.leader_term() == 3
    receive = leader._SyncObj__onMessageReceived
    for ignored in ({"type": HIGHER_TERM, "term": 3}, {"type": HIGHER_TERM, "term": "9"}):
        receive(voter_node, ignored)
        assert leader.leader_term() == 3
    receive(voter_node, {"type": HIGHER_TERM, "term": 5})
    assert leader._getTerm() == 5 and leader.leader_term() == -1
    assert leader._SyncObj__raftState == _RAFT_STATE.FOLLOWER
    assert leader._getLeader() is None
    # At the same term now, the voter takes the next leader's entries.
    voter._SyncObj__onMessageReceived(leader_node, {**_append(1, 0, [(NOOP, 2, 5)], 2), "term": 5})
    assert len(voter._SyncObj__raftLog) == 2
