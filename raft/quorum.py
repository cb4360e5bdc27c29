"""The metadata quorum: replicates metadata record batches with Raft (pysyncobj).

This is the only module that imports pysyncobj. Voters (nodes with the controller role)
each run one ``MetadataQuorum``. Its Raft leader is the active controller; it proposes
record batches with ``propose``; every voter applies each committed batch, in log order,
in pysyncobj's thread, and hands the new image to ``on_applied``.

Transport: pysyncobj's own TCP protocol, bound to this voter's quorum address and, when
``secret`` is set, encrypted and authenticated with it (Fernet, a key derived from the
secret). The protocol unpickles what it receives, so the quorum address must sit on the
cluster network, never where clients reach it, and multi-node clusters should set
``raft_secret``.

Durability of metadata, exactly (pysyncobj 0.3.17):
- Every entry is appended to the journal file (``data_dir/raft/journal``, memory-mapped)
  when received, but the journal is not fsynced before the entry counts towards a commit.
  A committed batch survives the SIGKILL of any number of nodes (the page cache holds it)
  and the power loss of a minority of voters; losing power on a majority at once may lose
  the most recently committed batches.
- A full snapshot of the image is written to ``data_dir/raft/snapshot`` on log compaction
  (every ``logCompactionMinEntries`` entries or ``logCompactionMinTime`` seconds), and the
  journal is replayed over it at start-up.
- pysyncobj truncates a follower's log after ``prevLogIdx`` without comparing terms; the
  controller epoch on every record (``headwater.raft.image.apply`` refuses records of an
  older epoch than the image's) stops a deposed controller's records from taking effect.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from pysyncobj import (
    FAIL_REASON,
    SyncObj,
    SyncObjConf,
    SyncObjConsumer,
    SyncObjException,
    replicated,
)

from headwater.raft.image import ApplyResult, MetadataImage, apply
from headwater.raft.records import RecordFormatError, decode_batch

_log = logging.getLogger(__name__)
_FAIL_NAMES: Final = {
    getattr(FAIL_REASON, name): name for name in dir(FAIL_REASON) if name.isupper()
}


class QuorumBindError(Exception):
    """The Raft address cannot be bound (in use, or not an address of this machine)."""


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


class _MetadataLog(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state: the image. pysyncobj snapshots attributes set after
    ``SyncObjConsumer.__init__`` (only ``image``); callbacks are set before it."""

    def __init__(self, on_applied: Callable[[MetadataImage, str | None], None]) -> None:
        self._on_applied = on_applied
        super().__init__()
        self.image = MetadataImage()

    @replicated  # type: ignore[untyped-decorator]
    def apply_batch(self, payload: bytes) -> tuple[str | None, int]:
        """Apply one committed batch; return (why it was refused or None, the image's offset
        after it)."""
        try:
            result = apply(self.image, decode_batch(payload))
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
    ) -> None:
        data_dir.mkdir(parents=True, exist_ok=True)
        self.self_address = self_address
        self._log = _MetadataLog(on_applied)
        conf = SyncObjConf(
            password=secret or None,
            bindAddress=self_address,
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
        self._sync = SyncObj(self_address, partner_addresses, conf, consumers=[self._log])
        self._closed = threading.Event()
        try:
            self._sync.waitBinded()
        except SyncObjException as exc:
            self.close()
            raise QuorumBindError(f"cannot bind {self_address}") from exc

    @property
    def image(self) -> MetadataImage:
        return self._log.image

    def ready(self) -> bool:
        """True once this voter has applied everything the leader had committed when they
        first spoke: its image is current, not a replay in progress."""
        return bool(self._sync.isReady())

    def status(self) -> QuorumStatus:
        leader = self._sync._getLeader()
        return QuorumStatus(
            term=int(self._sync._getTerm()),
            commit_index=int(self._sync.raftCommitIndex),
            is_leader=bool(self._sync._isLeader()),
            leader_address="" if leader is None else str(leader.address),
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

        self._log.apply_batch(payload, callback=callback)

    def close(self) -> None:
        if not self._closed.is_set():
            self._closed.set()
            self._sync.destroy_synchronous()
