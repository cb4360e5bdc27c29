"""The metadata journal: pysyncobj's format, no SIGBUS on a full disk, failure and
recovery; and the election rules (PreVote, who may stand)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from pysyncobj.journal import FileJournal

from headwater.raft.elections import LogPosition, grant_pre_vote, has_majority, may_stand
from headwater.raft.journal import MetadataJournal, decode_entries
from headwater.raft.journal_check import frame, journal_problem
from tests.disk_faults import fill, small_filesystem

Entry = tuple[bytes, int, int]


def open_journal(path: Path) -> MetadataJournal:
    return MetadataJournal(path, slow_write_s=10.0, slow_hold_s=30.0)


def command(n: int, size: int = 40) -> bytes:
    # A regular pysyncobj command: type byte 0, then a pickled call with a framed batch.
    import pysyncobj.pickle as pysyncobj_pickle

    batch = frame(f'[{{"n": {n}, "pad": "{"x" * size}"}}]'.encode())
    return b"\x00" + pysyncobj_pickle.dumps((0, (batch,), {}))


def entries_on_disk(path: Path) -> list[Entry]:
    return decode_entries(path.read_bytes())[0]


# pysyncobj's own journal leaves its meta file open (its getMeta): not this code's.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_pysyncobj_reads_what_the_journal_writes_and_the_other_way(tmp_path: Path) -> None:
    ours = open_journal(tmp_path / "ours")
    written = [(command(i), i + 1, 1 + i // 3) for i in range(20)]
    for entry in written:
        ours.add(*entry)
    ours.setCurrentTerm(7, "127.0.0.1:1")
    ours._destroy()
    theirs = FileJournal(str(tmp_path / "ours"))
    assert [theirs[i] for i in range(len(theirs))] == written
    assert theirs.getCurrentTerm() == 7 and theirs.getVotedForNodeId() == "127.0.0.1:1"
    assert journal_problem((tmp_path / "ours").read_bytes()) is None
    theirs.add(command(99), 21, 9)
    theirs._destroy()
    again = open_journal(tmp_path / "ours")
    assert list(again[:]) == [*written, (command(99), 21, 9)]
    assert again.getCurrentTerm() == 7
    again._destroy()


def test_changes_match_a_list_and_survive_reopening(tmp_path: Path) -> None:
    rng = random.Random(7)
    path = tmp_path / "journal"
    journal = open_journal(path)
    oracle: list[Entry] = []
    index = 0
    for step in range(600):
        action = rng.random()
        if action < 0.7 or not oracle:
            index += 1
            entry = (command(index, rng.randrange(0, 300)), index, 1 + step // 50)
            journal.add(*entry)
            oracle.append(entry)
        elif action < 0.85:
            cut = rng.randrange(len(oracle))
            journal.deleteEntriesFrom(cut)
            del oracle[cut:]
            index = oracle[-1][1] if oracle else 0
        elif action < 0.97:
            cut = rng.randrange(len(oracle))
            journal.deleteEntriesTo(cut)
            del oracle[:cut]
        else:
            journal.clear()
            oracle.clear()
            index = 0
        if step % 50 == 0:
            assert list(journal[:]) == oracle
            assert entries_on_disk(path) == oracle
    journal._destroy()
    reopened = open_journal(path)
    assert list(reopened[:]) == oracle and len(reopened) == len(oracle)
    assert journal_problem(path.read_bytes()) is None
    reopened._destroy()


def test_a_full_disk_fails_the_journal_without_a_crash_and_it_recovers(tmp_path: Path) -> None:
    changes: list[str] = []
    with small_filesystem(tmp_path / "fs", 4 << 20) as fs:
        path = fs / "journal"
        journal = MetadataJournal(
            path, 10.0, 30.0, on_change=lambda j: changes.append(j.failure or "recovered")
        )
        kept: list[Entry] = []
        for i in range(1, 11):
            entry = (command(i), i, 1)
            journal.add(*entry)
            kept.append(entry)
        fill(fs / "ballast")
        # Past the journal's reserve: every entry needs new blocks from here on.
        for i in range(11, 1500):
            entry = (command(i, 2000), i, 1)
            journal.add(*entry)
            kept.append(entry)
            if journal.failure:
                break
        assert journal.failure and "No space left on device" in journal.failure
        assert changes == [journal.failure]
        for i in range(len(kept) + 1, len(kept) + 20):  # kept in memory only from now on
            entry = (command(i), i, 2)
            journal.add(*entry)
            kept.append(entry)
        journal.setCurrentTerm(2, "127.0.0.1:2")
        assert list(journal[:]) == kept and journal.getCurrentTerm() == 2
        on_disk = entries_on_disk(path)
        assert on_disk == kept[: len(on_disk)]  # never an entry memory lacks
        journal.onOneSecondTimer()
        assert journal.failure  # still full
        (fs / "ballast").unlink()
        journal.onOneSecondTimer()
        assert not journal.failure and changes[-1] == "recovered"
        assert entries_on_disk(path) == kept
        journal.add(command(5000), len(kept) + 1, 2)
        journal._destroy()
        reopened = open_journal(path)
        assert len(reopened) == len(kept) + 1 and reopened.getCurrentTerm() == 2
        reopened._destroy()


def test_a_term_that_cannot_be_written_fails_the_journal(tmp_path: Path) -> None:
    with small_filesystem(tmp_path / "fs", 1 << 20) as fs:
        journal = open_journal(fs / "journal")
        journal.add(command(1), 1, 1)
        fill(fs / "ballast")
        journal.setCurrentTerm(5, "me")
        assert journal.failure
        assert journal.getCurrentTerm() == 5  # pysyncobj's view stays consistent
        journal._destroy()


# ------------------------------------------------------------------ elections (pure)


def test_pre_votes_are_refused_while_a_leader_is_heard() -> None:
    base = {
        "own_term": 4,
        "own_log": LogPosition(4, 100),
        "candidate_term": 5,
        "candidate_log": LogPosition(4, 100),
        "since_leader_s": 10.0,
        "election_timeout_s": 0.3,
        "is_leader": False,
        "journal_failed": False,
    }
    assert grant_pre_vote(**base)  # type: ignore[arg-type]
    refusals = {
        "since_leader_s": 0.1,  # this voter still hears a leader
        "is_leader": True,
        "journal_failed": True,
        "candidate_term": 4,  # not past this voter's term
        "candidate_log": LogPosition(4, 99),  # shorter log
    }
    for key, value in refusals.items():
        assert not grant_pre_vote(**{**base, key: value}), key  # type: ignore[arg-type]
    assert grant_pre_vote(**{**base, "candidate_log": LogPosition(5, 1)})  # type: ignore[arg-type]


def test_who_may_stand() -> None:
    assert may_stand(
        journal_failed=False, journal_slow=False, since_leader_s=0.0, slow_candidacy_delay_s=3
    )
    assert not may_stand(
        journal_failed=True, journal_slow=False, since_leader_s=99.0, slow_candidacy_delay_s=3
    )
    assert not may_stand(
        journal_failed=False, journal_slow=True, since_leader_s=1.0, slow_candidacy_delay_s=3
    )
    assert may_stand(
        journal_failed=False, journal_slow=True, since_leader_s=3.0, slow_candidacy_delay_s=3
    )
    assert has_majority(2, 3) and not has_majority(1, 3) and has_majority(1, 1)
    assert not has_majority(2, 4) and has_majority(3, 5)


@pytest.mark.parametrize("voters", [1, 2, 3, 5])
def test_majority_needs_more_than_half(voters: int) -> None:
    assert next(g for g in range(voters + 1) if has_majority(g, voters)) == voters // 2 + 1
