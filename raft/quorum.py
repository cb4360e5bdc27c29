"""The metadata quorum: replicates metadata record batches with Raft (pysyncobj).

This module and ``journal_check`` are the only ones that import pysyncobj. Voters (nodes
with the controller role) each run one ``MetadataQuorum``. Its Raft leader is the active
controller; it proposes record batches with ``propose``; every voter applies each
committed batch, in log order, in pysyncobj's thread, and hands the new image to
``on_applied``.

Transport: pysyncobj's own TCP protocol, bound to this voter's quorum address and
encrypted and authenticated with ``secret`` (Fernet, a key derived from the secret; a
node always has one, see ``cluster_secret``): a message is authenticated before it is
unpickled. A message announces its length first, and pysyncobj would buffer whatever
length a peer announces before it can authenticate anything (a 2^31-1 prefix and junk
stalled metadata for 32 s; 16 MB of junk moved the controller): ``bound_raft_reads``
reads at most ``RAFT_FIRST_MESSAGE_BYTES_MAX`` from a connection until one of its
messages has been authenticated and at most ``RAFT_MESSAGE_BYTES_MAX`` after, drops a
connection that announces more, and stops reading from one while a whole message waits
to be parsed: a stranger costs a voter a few hundred KiB and no time of note.

Durability of metadata, exactly (pysyncobj 0.3.17):
- Every entry is appended to the journal file (``data_dir/raft/journal``, memory-mapped)
  when received, but the journal is not fsynced before the entry counts towards a commit.
  A committed batch survives the SIGKILL of any number of nodes (the page cache holds it)
  and the power loss of a minority of voters; losing power on a majority at once may lose
  the most recently committed batches.
- A full snapshot of the image is written to ``data_dir/raft/snapshot`` on log compaction
  (every ``logCompactionMinEntries`` entries or ``logCompactionMinTime`` seconds), and the
  journal is replayed over it at start-up.
- pysyncobj truncates a follower's log after ``prevLogIdx`` without comparing terms, so a
  late or repeated AppendEntries cut committed, applied entries off a voter's journal
  ("truncating already-applied log entries", seen even at a fault-free start) and moved
  its commit index back: for a while a committed batch was held by fewer than a majority.
  ``RaftFollowerGuard`` takes every AppendEntries by the Raft rule instead
  (``headwater.raft.follower_append``): only a suffix that conflicts in term is deleted,
  never an entry at or below the commit index (such a message is refused and logged
  CRITICAL; Raft cannot send one), and the commit index never moves back.
- pysyncobj ignores AppendEntries of an older term without a reply; with PreVote, a
  voter whose term got ahead of the leader's would take nothing from it for as long as
  it leads. ``RaftFollowerGuard`` answers such a message with the voter's term
  (``HIGHER_TERM``), and the leader takes the term and steps down, as Raft has it.
- The controller epoch on every record (``headwater.raft.metadata.image.apply`` refuses records of
  an older epoch than the image's) stops a deposed controller's records from taking effect.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pysyncobj.pickle as pysyncobj_pickle
import pysyncobj.syncobj as pysyncobj_syncobj
from pysyncobj import (
    FAIL_REASON,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    SyncObjException,
    replicated,
)
from pysyncobj.tcp_connection import TcpConnection

from headwater.raft.elections import LogPosition, grant_pre_vote, has_majority, may_stand
from headwater.raft.follower_append import AppendAction, plan_append
from headwater.raft.journal import MetadataJournal
from headwater.raft.journal_check import DamagedBatchError, frame, journal_problem, unframe
from headwater.raft.metadata.image import ApplyResult, MetadataImage, apply
from headwater.raft.metadata.records import RecordFormatError, decode_batch
from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)
_FAIL_NAMES: Final = {
    getattr(FAIL_REASON, name): name for name in dir(FAIL_REASON) if name.isupper()
}


class QuorumBindError(Exception):
    """The Raft address cannot be bound (in use, or not an address of this machine)."""


class QuorumJournalError(Exception):
    """The journal of a quorum of one is damaged: the message says what and what to do."""


def _check_journal(data_dir: Path, alone: bool) -> None:
    """Check the journal before pysyncobj replays it (``journal_problem``). A damaged one is
    never replayed: a voter of a larger quorum sets ``data_dir`` aside (into ``damaged/``
    next to it) and starts empty, to copy the metadata from the other voters again; a
    quorum of one holds the only copy, so it refuses to start and changes nothing."""
    journal = data_dir / "journal"
    if not journal.exists():
        return
    problem = journal_problem(journal.read_bytes())
    if problem is None:
        return
    if alone:
        raise QuorumJournalError(
            f"the metadata journal {journal} is damaged ({problem}). This node holds the only "
            "copy of the cluster's metadata, so it does not start, and nothing was changed: "
            f"restore {data_dir} from a backup"
        )
    aside = data_dir.parent / "damaged" / f"{data_dir.name}.{time.time_ns() // 1_000_000}"
    aside.parent.mkdir(exist_ok=True)
    data_dir.rename(aside)
    data_dir.mkdir()
    _log.error(
        "the metadata journal %s is damaged (%s): set aside in %s; this voter starts empty "
        "and copies the metadata from the other voters",
        journal,
        problem,
        aside,
    )


class ProposalFailedError(Exception):
    """A batch was not committed: the message says why (e.g. NOT_LEADER, MISSING_LEADER)."""


@dataclass(frozen=True, slots=True)
class QuorumTimings:
    """Raft timing, in seconds: elections start after a random silence in
    [election_min_s, election_max_s]; a leader that cannot reach a majority for
    leader_fallback_s steps down; heartbeats go out every heartbeat_s."""

    election_min_s: float = 0.3
    election_max_s: float = 0.7
    heartbeat_s: float = 0.05
    leader_fallback_s: float = 1.5


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    term: int
    commit_index: int
    is_leader: bool
    leader_address: str  # "" when no leader is known
    journal_problem: str = ""
    """Why this voter's journal cannot be written ("" when it can): it neither votes nor
    stands for election meanwhile."""
    journal_slow: bool = False
    """A journal write, or another write to the node's data folder, was slow lately: this
    voter does not stand for election first, and hands the controller role over."""


class _MetadataLog(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state: the image. pysyncobj snapshots attributes set after
    ``SyncObjConsumer.__init__`` (only ``image``); callbacks are set before it."""

    def __init__(self, on_applied: Callable[[MetadataImage, str | None], None]) -> None:
        self._on_applied = on_applied
        self.damaged = ""
        """Why this voter stopped applying metadata ("" while it applies)."""
        super().__init__()
        self.image = MetadataImage()

    @replicated  # type: ignore[untyped-decorator]
    def apply_batch(self, payload: bytes) -> tuple[str | None, int]:
        """Apply one committed batch; return (why it was refused or None, the image's offset
        after it)."""
        if self.damaged:
            return self.damaged, self.image.offset
        try:
            batch = unframe(payload)
        except DamagedBatchError as exc:
            # Never skip it: every later batch assumes it. This voter's metadata stops
            # here (a journal is checked before replay, so this is damage in transit).
            self.damaged = f"committed metadata batch {self.image.offset + 1} is damaged: {exc}"
            _log.critical("%s; this node applies no more metadata", self.damaged)
            return self.damaged, self.image.offset
        try:
            result = apply(self.image, decode_batch(batch))
        except RecordFormatError as exc:
            refused = dataclasses.replace(self.image, offset=self.image.offset + 1)
            result = ApplyResult(refused, f"undecodable batch: {exc}")
        self.image = result.image
        if result.refusal:
            _log.warning("metadata batch %d refused: %s", result.image.offset, result.refusal)
        self._on_applied(result.image, result.refusal)
        return result.refusal, result.image.offset

    def _deserialize(self, data: dict[str, Any]) -> None:
        super()._deserialize(data)
        self._on_applied(self.image, None)


RAFT_MESSAGE_BYTES_MAX: Final = 64 << 20
"""Longest Raft message a voter accepts from a peer that has proved the secret (a
metadata batch or a snapshot part is far smaller: a topic of 10,000 partitions is about
2 MB of records)."""
RAFT_FIRST_MESSAGE_BYTES_MAX: Final = 256 << 10
"""Longest message a voter reads from a connection before one of its messages has been
authenticated (the first messages of pysyncobj's handshake are tens of bytes)."""
_LENGTH_PREFIX: Final = struct.Struct("i")  # pysyncobj's: native int32
DROPPED_LOG_INTERVAL_S: Final = 10.0
_dropped = LogEvery(_log, DROPPED_LOG_INTERVAL_S)


def bound_raft_reads(
    limit: int = RAFT_MESSAGE_BYTES_MAX, first_limit: int = RAFT_FIRST_MESSAGE_BYTES_MAX
) -> None:
    """Install the read bounds on pysyncobj's TcpConnection (idempotent).

    A connection is *authenticated* once a message has decrypted (Fernet: the secret's
    HMAC checked before anything is unpickled) that carries the random key this side
    sent on that connection (pysyncobj checks it), so a message captured from another
    connection and replayed does not count; until then its bound is ``first_limit``,
    after that ``limit``. A connection whose next message announces a
    length outside [0, bound] is dropped before it is buffered (one WARNING per
    ``DROPPED_LOG_INTERVAL_S`` names the peer), and no more is read from a connection
    while bound + 4 bytes wait to be parsed. So a stranger costs a voter at most
    ``first_limit`` bytes of buffer per connection and a few reads of the Raft thread,
    never a long read loop (the buffer is grown by copying, quadratic in its size)."""
    original_read = TcpConnection.__dict__.get("_headwater_unbounded_read")
    if original_read is None:
        original_read = TcpConnection._TcpConnection__processRead
        original_parse = TcpConnection._TcpConnection__processParseMessage
        original_connect = TcpConnection.connect
    else:
        original_parse = TcpConnection._headwater_unbounded_parse
        original_connect = TcpConnection._headwater_unbounded_connect

    def bounded_read(self: Any) -> bool:
        buffered = self._TcpConnection__readBuffer
        if len(buffered) >= _LENGTH_PREFIX.size:
            bound = limit if getattr(self, "_headwater_authenticated", False) else first_limit
            (length,) = _LENGTH_PREFIX.unpack_from(buffered)
            if not 0 <= length <= bound:
                _dropped.log(
                    "dropped a Raft connection from %s that announced a %d-byte message "
                    "(limit %d%s)",
                    _peer_of(self),
                    length,
                    bound,
                    "" if bound == limit else " before the peer has proved the cluster secret",
                )
                self.disconnect()
                return False
            if len(buffered) >= _LENGTH_PREFIX.size + bound:
                return False  # parse what is here first; the poller calls again
        return bool(original_read(self))

    def parse_and_note(self: Any) -> Any:
        # Fresh only once this side's random key was sent: a message replayed from another
        # connection decrypts, but fails pysyncobj's key check and drops the connection.
        fresh = bool(getattr(self, "recvRandKey", None)) or not self.encryptor
        message = original_parse(self)
        if message is not None and fresh:
            self._headwater_authenticated = True
        return message

    def connect(self: Any, host: str, port: int) -> Any:
        self._headwater_authenticated = False
        return original_connect(self, host, port)

    TcpConnection._headwater_unbounded_read = original_read
    TcpConnection._headwater_unbounded_parse = original_parse
    TcpConnection._headwater_unbounded_connect = original_connect
    TcpConnection._TcpConnection__processRead = bounded_read
    TcpConnection._TcpConnection__processParseMessage = parse_and_note
    TcpConnection.connect = connect


STRANGER_CONNECTION_S: Final = 5.0
"""How long a connection may stay unauthenticated and unassociated with a voter."""
STRANGER_CONNECTIONS_MAX: Final = 64
"""Connections a voter keeps open that have not yet said which voter they are."""


def drop_strangers(unknown_connections: Any, now: float) -> int:
    """Disconnect the connections of ``unknown_connections`` (pysyncobj's set of incoming
    connections that have not named their voter) that have been open unauthenticated for
    ``STRANGER_CONNECTION_S``, and the oldest beyond ``STRANGER_CONNECTIONS_MAX``: a
    stranger can hold neither buffers nor file descriptors for long. The number dropped."""
    ages = []
    for connection in list(unknown_connections):
        seen = getattr(connection, "_headwater_seen", None)
        if seen is None:
            connection._headwater_seen = seen = now
        ages.append((seen, id(connection), connection))
    ages.sort()
    excess = len(ages) - STRANGER_CONNECTIONS_MAX
    dropped = 0
    for n, (seen, _, connection) in enumerate(ages):
        stale = now - seen > STRANGER_CONNECTION_S and not getattr(
            connection, "_headwater_authenticated", False
        )
        if n < excess or stale:
            _dropped.log(
                "dropped a Raft connection from %s that did not prove the cluster secret "
                "within %.0f s (or one of more than %d such)",
                _peer_of(connection),
                STRANGER_CONNECTION_S,
                STRANGER_CONNECTIONS_MAX,
            )
            connection.disconnect()
            dropped += 1
    return dropped


def _peer_of(connection: Any) -> str:
    try:
        host, port = connection._TcpConnection__socket.getpeername()[:2]
    except (AttributeError, OSError, ValueError, TypeError):
        return "an unknown peer"
    return f"{host}:{port}"


PYSYNCOBJ_VERSION: Final = "0.3.17"
"""The pysyncobj release ``RaftFollowerGuard`` was written against (pinned in
pyproject.toml): it reads the follower's private state by pysyncobj's mangled names."""
DNS_CACHE_S: Final = 3.0
DNS_FAIL_CACHE_S: Final = 1.0
"""How long pysyncobj keeps a voter's resolved address (and a failed resolution)."""


_RAFT_STATE: Final = pysyncobj_syncobj._RAFT_STATE
_original_create_journal = pysyncobj_syncobj.createJournal
_journal_factories: dict[str, Callable[[], MetadataJournal]] = {}


def _create_journal(journal_file: str | None = None) -> Any:
    """pysyncobj's journal factory, replaced: a quorum that registered its journal file
    gets a ``MetadataJournal`` (ordinary writes that report failure, timed)."""
    factory = _journal_factories.pop(journal_file or "", None)
    if factory is not None:
        return factory()
    return _original_create_journal(journal_file)


pysyncobj_syncobj.createJournal = _create_journal

SLOW_CANDIDACY_ELECTIONS: Final = 4
"""A voter whose journal was slow lately stands only after this many (longest) election
timeouts without a leader (``raft.elections.may_stand``)."""
SLOW_HOLD_S_MIN: Final = 30.0
"""How long one slow journal write keeps a voter from standing first, at least."""
HIGHER_TERM: Final = "higher_term"
"""A voter's answer to AppendEntries of a term older than its own: ``{"type":
"higher_term", "term": T}``. pysyncobj ignores such a message silently, and with PreVote
a voter whose term got ahead (a pause woke it into a new term) can win no election
either: the leader would never hear of the newer term and the voter would take nothing
from it, for as long as the leader lives. On this answer the leader takes the term and
steps down, as Raft has it (a message of a newer term makes any voter a follower of
that term), and the next election brings every voter to one term."""
_SILENT_WHILE_JOURNAL_FAILED: Final = frozenset(
    {
        "append_entries",
        "next_node_idx",
        "request_vote",
        "response_vote",
        "pre_vote",
        "pre_vote_response",
        "timeout_now",
        HIGHER_TERM,
    }
)
"""Raft messages a voter whose journal cannot be written does not send: it acknowledges
no entry and grants no vote it could not keep (it still forwards proposals)."""


class RaftFollowerGuard(SyncObj):  # type: ignore[misc]
    """pysyncobj's SyncObj, taking AppendEntries by the Raft rule (see
    ``headwater.raft.follower_append``), with PreVote in front of its elections and a
    voter whose journal fails or is slow kept out of them (``headwater.raft.elections``,
    ``headwater.raft.journal``), and AppendEntries of an older term answered with the
    voter's term so that the older leader steps down (HIGHER_TERM): every other
    message, and every other decision about terms, leaders, elections and replies, stays
    pysyncobj's.

    A voter whose journal cannot be written steps down if it leads, sends no
    acknowledgement, vote or pre-vote, and stands for no election (it keeps taking the
    leader's entries and commit index in memory, so its image stays current) until the
    journal is written whole again. A leader whose journal writes are slow hands
    leadership to its most caught-up follower (pysyncobj's TimeoutNow transfer).

    Every attribute is set before ``SyncObj.__init__``: pysyncobj snapshots each one set
    after it.

    pysyncobj registers ``self.__onMessageReceived`` (``_SyncObj__onMessageReceived``) as
    its transport's callback in ``SyncObj.__init__``; defining that name here puts this
    check in front of it. Whatever the guard does with a message's log part, pysyncobj
    still sees the message's term and sender (it follows the leader and defers its own
    election), and the commit index it is given never exceeds what the follower has
    proved it shares with the leader; the leader's own commit index is kept for
    pysyncobj's readiness check."""

    _SyncObj__recvTransmission: Any  # pysyncobj's buffer of a chunked entry (str or bytes)
    _SyncObj__raftElectionDeadline: float  # pysyncobj's, monotonic seconds
    _SyncObj__raftState: int
    _SyncObj__transferInProgress: bool

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        conf: SyncObjConf,
        consumers: Sequence[Any] = (),
        timings: QuorumTimings = QuorumTimings(),
        disk_slow: Callable[[], bool] = lambda: False,
    ) -> None:
        """``disk_slow``: are this node's other writes to the same disk slow (its
        partition logs')? Counted as the journal's own slowness."""
        self._timings = timings
        self._disk_slow = disk_slow
        self._journal: MetadataJournal | None = None
        self._leader_contact_s = float("-inf")
        self._pre_vote_round = 0
        self._pre_vote_grants: set[str] = set()
        self._pre_vote_won = False
        self._transfer_after_s = 0.0
        self._strangers_checked_s = 0.0
        self._leader_term = -1
        conf.onStateChanged = self._state_changed
        slow_hold_s = max(SLOW_HOLD_S_MIN, 10 * timings.election_max_s)
        journal_file = str(conf.journalFile)
        _journal_factories[journal_file] = lambda: MetadataJournal(
            Path(journal_file), timings.election_min_s / 2, slow_hold_s
        )
        try:
            super().__init__(self_address, partner_addresses, conf, consumers=list(consumers))
        finally:
            _journal_factories.pop(journal_file, None)
        journal = self._SyncObj__raftLog
        assert isinstance(journal, MetadataJournal)
        self._journal = journal
        transport = self._SyncObj__transport
        transport.send = self._guarded_send(transport.send)

    def _state_changed(self, _old_state: int, new_state: int) -> None:
        """pysyncobj's thread, right after its state changed: a leader's term is the one
        it was elected in (pysyncobj sets a candidate's term before it wins)."""
        self._leader_term = (
            int(self._SyncObj__raftCurrentTerm) if new_state == _RAFT_STATE.LEADER else -1
        )

    def leader_term(self) -> int:
        """The term this node leads, read so that no other thread can see a leader of a
        term it did not win; -1 when it does not lead.

        pysyncobj steps down on a message of a higher term by writing the new term (a
        journal write) and only then its state: in between, its term and its leader
        state read together name the new term, which another node leads. The term this
        node was elected in does not change until it steps down, so leading is "state
        leader and the current term is the elected one"."""
        elected = self._leader_term
        if elected < 0 or not self._isLeader():
            return -1
        return elected if int(self._getTerm()) == elected else -1

    def journal(self) -> MetadataJournal:
        """The voter's journal (a method: pysyncobj reads every property while it starts)."""
        assert self._journal is not None
        return self._journal

    # ------------------------------------------------------------------ elections

    def _guarded_send(self, send: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
        def guarded(node: Any, message: Any) -> bool:
            journal = self._journal
            if (
                journal is not None
                and journal.failure
                and isinstance(message, dict)
                and message.get("type") in _SILENT_WHILE_JOURNAL_FAILED
            ):
                return True  # as if sent and lost
            return send(node, message)

        return guarded

    def _onTick(self, timeToWait: float = 0.0) -> None:  # noqa: N802, N803 (pysyncobj's)
        try:
            self._before_tick()
        except Exception:  # pysyncobj's tick must go on
            _log.exception("the metadata quorum's election check failed")
        super()._onTick(timeToWait)

    def _before_tick(self) -> None:
        """Run before pysyncobj's tick, which starts an election once its deadline has
        passed: a leader with a failed journal steps down, one with a slow journal hands
        leadership over; a follower whose deadline passed asks for pre-votes first (the
        deadline moves on meanwhile), and lets the election start only with a majority."""
        now = time.monotonic()
        if now >= self._strangers_checked_s + 1.0:
            self._strangers_checked_s = now
            unknown = getattr(self._SyncObj__transport, "_unknownConnections", None)
            if unknown:
                drop_strangers(unknown, now)
        journal = self._journal
        if journal is None or self._SyncObj__selfNode is None:
            return
        slow = journal.slow or self._disk_slow()
        if self._SyncObj__raftState == _RAFT_STATE.LEADER:
            if journal.failure:
                _log.warning("this voter steps down: its metadata journal cannot be written")
                self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
                self._SyncObj__raftLeader = None
            elif slow and now >= self._transfer_after_s:
                self._transfer_after_s = now + self._timings.election_max_s
                self.transferLeadership()  # denied, harmlessly, when no follower caught up
            return
        if self._SyncObj__raftElectionDeadline >= now or self._SyncObj__transferInProgress:
            return  # no election due, or the leader asked this voter to stand (TimeoutNow)
        if self._pre_vote_won:
            self._pre_vote_won = False
            return  # pysyncobj starts the election in this tick
        self._SyncObj__raftElectionDeadline = now + self._SyncObj__generateRaftTimeout()
        if not may_stand(
            journal_failed=bool(journal.failure),
            journal_slow=slow,
            since_leader_s=now - self._leader_contact_s,
            slow_candidacy_delay_s=SLOW_CANDIDACY_ELECTIONS * self._timings.election_max_s,
        ):
            return
        self._pre_vote_round += 1
        self._pre_vote_grants = {self._SyncObj__selfNode.id}
        if self._maybe_won_pre_vote():
            return
        message = {
            "type": "pre_vote",
            "round": self._pre_vote_round,
            "term": self._getTerm() + 1,
            "last_log_index": self._SyncObj__getCurrentLogIndex(),
            "last_log_term": self._SyncObj__getCurrentLogTerm(),
        }
        for node in self._SyncObj__otherNodes:
            self._SyncObj__transport.send(node, message)

    def _maybe_won_pre_vote(self) -> bool:
        voters = len(self._SyncObj__otherNodes) + 1
        if has_majority(len(self._pre_vote_grants), voters):
            self._pre_vote_won = True
            self._SyncObj__raftElectionDeadline = 0  # the next tick starts the election
        return self._pre_vote_won

    def _answer_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        round_, term = message.get("round"), message.get("term")
        last_index, last_term = message.get("last_log_index"), message.get("last_log_term")
        if not (
            isinstance(round_, int)
            and isinstance(term, int)
            and isinstance(last_index, int)
            and isinstance(last_term, int)
        ):
            return
        granted = grant_pre_vote(
            own_term=self._getTerm(),
            own_log=LogPosition(
                self._SyncObj__getCurrentLogTerm(), self._SyncObj__getCurrentLogIndex()
            ),
            candidate_term=term,
            candidate_log=LogPosition(last_term, last_index),
            since_leader_s=time.monotonic() - self._leader_contact_s,
            # Two heartbeats short of the shortest election timeout: the candidate's timer
            # ran that long after the same leader's last heartbeat, which reached the
            # voters up to a heartbeat apart (a leader that died leaves no voter to wait).
            election_timeout_s=max(
                self._timings.election_min_s - 2 * self._timings.heartbeat_s,
                self._timings.heartbeat_s,
            ),
            is_leader=self._SyncObj__raftState == _RAFT_STATE.LEADER,
            journal_failed=bool(self.journal().failure),
        )
        self._SyncObj__transport.send(
            node, {"type": "pre_vote_response", "round": round_, "granted": granted}
        )

    def _count_pre_vote(self, node: Any, message: dict[str, Any]) -> None:
        if (
            message.get("round") == self._pre_vote_round
            and message.get("granted") is True
            and self._SyncObj__raftState != _RAFT_STATE.LEADER
            and not self._pre_vote_won
        ):
            self._pre_vote_grants.add(node.id)
            self._maybe_won_pre_vote()

    def _take_higher_term(self, node: Any, message: dict[str, Any]) -> None:
        """A voter answered this node's AppendEntries with a newer term (HIGHER_TERM):
        take it and follow, leading no more."""
        term = message.get("term")
        if not isinstance(term, int) or term <= self._getTerm():
            return
        _log.warning(
            "voter %s is at term %d, past this node's %d: this node takes that term and "
            "%s; an election follows",
            node,
            term,
            self._getTerm(),
            "steps down" if self._SyncObj__raftState == _RAFT_STATE.LEADER else "follows",
        )
        self._SyncObj__setCurrentTerm(term, None)
        self._SyncObj__setState(_RAFT_STATE.FOLLOWER)
        self._SyncObj__raftLeader = None

    # ------------------------------------------------------------------ AppendEntries

    def _SyncObj__onMessageReceived(self, node: Any, message: Any) -> None:  # noqa: N802
        handle = super()._SyncObj__onMessageReceived
        kind = message.get("type") if isinstance(message, dict) else None
        if kind == "pre_vote":
            self._answer_pre_vote(node, message)
            return
        if kind == "pre_vote_response":
            self._count_pre_vote(node, message)
            return
        if kind == HIGHER_TERM:
            self._take_higher_term(node, message)
            return
        if (
            kind == "append_entries"
            and isinstance(message.get("term"), int)
            and message["term"] < self._getTerm()
            and self._SyncObj__selfNode is not None
        ):
            self._SyncObj__transport.send(node, {"type": HIGHER_TERM, "term": self._getTerm()})
        if (
            kind == "append_entries"
            and isinstance(message.get("term"), int)
            and message["term"] >= self._getTerm()
        ):
            self._leader_contact_s = time.monotonic()
        if (
            not isinstance(message, dict)
            or message.get("type") != "append_entries"
            or not isinstance(message.get("term"), int)
            or message["term"] < self._getTerm()
        ):
            handle(node, message)
            return
        leader_commit = message.get("commit_index")
        if not isinstance(leader_commit, int):
            _log.critical("AppendEntries from %s without a commit index refused", node)
            return
        if "prevLogIdx" not in message:
            # A snapshot chunk: pysyncobj would commit up to its own last entry on every
            # chunk, before the snapshot replaced a log whose tail may be another term's.
            # It commits nothing new here; the next AppendEntries commits by the rule.
            self._with_commit_limit(node, message, handle, leader_commit, self._committed())
            return
        transmission = message.get("transmission")
        if transmission is not None:
            if transmission != "finish":
                handle(node, message)  # chunks of one large entry: pysyncobj collects them
                return
            collected = self._SyncObj__recvTransmission
            chunk = message.get("data")
            if not isinstance(collected, bytes) or not isinstance(chunk, bytes):
                _log.warning("AppendEntries chunk from %s without its start dropped", node)
                self._bookkeeping(node, message, handle, leader_commit)
                return
            data = collected + chunk
            try:
                entry = pysyncobj_pickle.loads(data)
            except Exception:
                # pysyncobj 0.3.17 marks a chunk "finish" by the command's length, not the
                # pickle's: for some sizes two chunks say "finish" and only the second
                # completes the entry. Keep what came, as pysyncobj does.
                self._SyncObj__recvTransmission = data
                self._bookkeeping(node, message, handle, leader_commit)
                return
            self._SyncObj__recvTransmission = ""
            message = {k: v for k, v in message.items() if k not in ("transmission", "data")}
            message["entries"] = [entry]
        self._append_entries(node, message, handle, leader_commit)

    def _committed(self) -> int:
        return max(int(self._SyncObj__raftCommitIndex), int(self._SyncObj__raftLastApplied))

    def _with_commit_limit(
        self, node: Any, message: dict[str, Any], handle: Any, leader_commit: int, limit: int
    ) -> None:
        """Hand ``message`` to pysyncobj with its commit index cut to ``limit``, then put
        the leader's commit index back where pysyncobj's readiness check reads it."""
        handle(node, {**message, "commit_index": min(leader_commit, limit)})
        self._SyncObj__leaderCommitIndex = leader_commit

    def _bookkeeping(
        self,
        node: Any,
        message: dict[str, Any],
        handle: Any,
        leader_commit: int,
        commit_limit: int | None = None,
    ) -> None:
        """pysyncobj's handling of the message's term and sender only: no log change, no
        reply, and nothing committed past ``commit_limit`` (default: nothing new)."""
        log_part = ("prevLogIdx", "prevLogTerm", "entries", "transmission", "data", "serialized")
        rest = {k: v for k, v in message.items() if k not in log_part}
        limit = self._committed() if commit_limit is None else commit_limit
        self._with_commit_limit(node, rest, handle, leader_commit, limit)

    def _append_entries(
        self, node: Any, message: dict[str, Any], handle: Any, leader_commit: int
    ) -> None:
        raft_log = self._SyncObj__raftLog
        first_index = raft_log[0][1]
        last_index = raft_log[-1][1]

        def term_at(index: int) -> int | None:
            if not isinstance(index, int) or index < first_index or index > last_index:
                return None
            return int(raft_log[index - first_index][2])

        entries = message.get("entries", [])
        if not isinstance(entries, list):
            _log.critical("AppendEntries from %s with malformed entries refused", node)
            self._bookkeeping(node, message, handle, leader_commit)
            return
        plan = plan_append(
            term_at,
            last_index,
            self._committed(),
            message["prevLogIdx"],
            message.get("prevLogTerm"),
            entries,
            leader_commit,
        )
        if plan.action is AppendAction.DEFER:
            handle(node, message)
        elif plan.action is AppendAction.APPEND:
            rewritten = dict(message)
            rewritten.update(
                prevLogIdx=plan.prev_index, prevLogTerm=plan.prev_term, entries=list(plan.entries)
            )
            handle(node, rewritten)
        elif plan.action is AppendAction.ACKNOWLEDGE:
            # Keep the longer log; commit no further than the shared prefix.
            self._bookkeeping(node, message, handle, leader_commit, plan.commit_limit)
            self._SyncObj__sendNextNodeIdx(node, nextNodeIdx=plan.prev_index + 1, success=True)
        else:
            _log.critical(
                "AppendEntries from %s refused: %s; this voter's log and the leader's "
                "disagree on committed entries",
                node,
                plan.reason,
            )
            self._bookkeeping(node, message, handle, leader_commit)


class MetadataQuorum:
    """One voter. Create on the main thread (pysyncobj's rule); ``close`` to stop."""

    def __init__(
        self,
        self_address: str,
        partner_addresses: list[str],
        data_dir: Path,
        on_applied: Callable[[MetadataImage, str | None], None],
        secret: str = "",
        timings: QuorumTimings = QuorumTimings(),
        bind_address: str = "",
        disk_slow: Callable[[], bool] = lambda: False,
    ) -> None:
        """``bind_address`` is what the Raft port binds (default: ``self_address``, the
        address the other voters dial); ``disk_slow``: are the node's other writes to
        its data folder slow (see ``RaftFollowerGuard``)?"""
        data_dir.mkdir(parents=True, exist_ok=True)
        _check_journal(data_dir, alone=not partner_addresses)
        bound_raft_reads()
        self.self_address = self_address
        self._log = _MetadataLog(on_applied)
        conf = SyncObjConf(
            password=secret or None,
            bindAddress=bind_address or self_address,
            # Voters named by host names (containers) may come back at a new address:
            # resolve names again after a few seconds, not pysyncobj's 10 minutes.
            dnsCacheTime=DNS_CACHE_S,
            dnsFailCacheTime=DNS_FAIL_CACHE_S,
            journalFile=str(data_dir / "journal"),
            fullDumpFile=str(data_dir / "snapshot"),
            # gRPC forbids fork() in its processes.
            useFork=False,
            # Without this, pysyncobj waits for the next append period: ~10 commits/s.
            appendEntriesUseBatch=False,
            appendEntriesPeriod=timings.heartbeat_s,
            raftMinTimeout=timings.election_min_s,
            raftMaxTimeout=timings.election_max_s,
            leaderFallbackTimeout=timings.leader_fallback_s,
            connectionRetryTime=0.5,
            connectionTimeout=2.0,
            commandsWaitLeader=False,
            maxBindRetries=8,
            bindRetryTime=0.25,
        )
        self._sync = RaftFollowerGuard(
            self_address,
            partner_addresses,
            conf,
            consumers=[self._log],
            timings=timings,
            disk_slow=disk_slow,
        )
        self._closed = threading.Event()
        try:
            self._sync.waitBinded()
        except SyncObjException as exc:
            self.close()
            raise QuorumBindError(f"cannot bind {bind_address or self_address}") from exc

    @property
    def image(self) -> MetadataImage:
        return self._log.image

    def ready(self) -> bool:
        """True once this voter has applied everything the leader had committed when they
        first spoke: its image is current, not a replay in progress."""
        return bool(self._sync.isReady())

    def status(self) -> QuorumStatus:
        """The node's Raft view. ``is_leader`` only with ``term`` the term it was elected
        in (``RaftFollowerGuard.leader_term``): a leader stepping down for a higher term
        never reports that term as its own, so a controller activation never claims a
        term another voter leads."""
        leader = self._sync._getLeader()
        journal = self._sync.journal()
        term = int(self._sync._getTerm())
        led = self._sync.leader_term()
        return QuorumStatus(
            term=led if led >= 0 else term,
            commit_index=int(self._sync.raftCommitIndex),
            is_leader=led >= 0,
            leader_address="" if leader is None else str(leader.address),
            journal_problem=journal.failure,
            journal_slow=journal.slow or self._sync._disk_slow(),
        )

    def propose(
        self, payload: bytes, done: Callable[[str | None, int, ProposalFailedError | None], None]
    ) -> None:
        """Replicate one encoded batch; ``done(refusal, offset, failure)`` runs in
        pysyncobj's thread once it is applied (``failure`` None; ``offset`` is the image's
        offset after it) or cannot be (``failure`` set)."""

        def callback(result: Any, error: int) -> None:
            if error == FAIL_REASON.SUCCESS:
                refusal, offset = result
                done(refusal, offset, None)
            else:
                done(None, -1, ProposalFailedError(_FAIL_NAMES.get(error, str(error))))

        self._log.apply_batch(frame(payload), callback=callback)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._sync.destroy_synchronous()
