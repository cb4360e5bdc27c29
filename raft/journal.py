"""The metadata quorum's journal: pysyncobj's file format, written with ordinary writes
that report failure, and timed.

pysyncobj 0.3.17's own journal memory-maps its file and grows it with ``ftruncate``: on
a full disk the next write into the new page kills the process with SIGBUS, and a
``journal.meta`` write that fails raises out of pysyncobj's tick every second. This
journal keeps pysyncobj's ``Journal`` interface and file format (so ``journal_check``
reads it and older journals replay), and changes how it writes:

- ``journal``: the header (``PYSYNCOBJ`` padded to 24 bytes, the pysyncobj version
  padded to 8, ``uint32`` format 1, ``uint32`` offset of the end of the last entry), then
  entries ``uint32 size | uint64 index | uint64 term | command | uint32 size`` (little-
  endian; ``size`` = 16 + the command's length). Entries are written with ``pwrite`` at
  the end offset, then the header's end offset; blocks are reserved ahead of the end in
  chunks (``fallocate``), so the file may be longer than its entries (readers stop at
  the header's offset). Deleting entries from the start (log compaction) writes a new
  file and renames it over the old one.
- ``journal.meta``: pysyncobj's pickled dict of ``currentTerm``, ``votedForNodeId`` and
  ``raftCommitIndex``, replaced by a rename. A term or vote change is written before
  ``setCurrentTerm`` returns (Raft: before any message reflects it); commit-index
  changes are written by a background thread, at most once a second (the index is
  volatile state in Raft; pysyncobj reads it back only to apply sooner after a restart).

Nothing is fsynced but a compaction's new file, as in pysyncobj: an entry is in the page
cache when ``add`` returns (it survives a SIGKILL, not a power loss; see
``headwater.raft.quorum`` for what that means for committed metadata).

Failure: the first write that raises an OSError (ENOSPC, EIO, ...) *fails* the journal
(``failure`` says why; ``on_change`` is called). The entries and the meta stay whole in
memory, and every later change is kept in memory only, so pysyncobj's view stays
consistent; the quorum (``RaftFollowerGuard``) then has this voter send no
acknowledgement or vote and stand for no election. Once a second (``onOneSecondTimer``)
the journal tries to write itself whole again (a new file, fsynced, renamed over the
old one, then the meta); when that works the failure is over and ``on_change`` is called
again. The file on disk never holds an entry that memory does not.

Slowness: every write is timed; one that takes longer than ``slow_write_s`` marks the
journal slow for ``slow_hold_s`` (``slow``), which the quorum uses to keep a voter with
a slow disk from standing for election or staying leader.

Thread-safety: pysyncobj calls everything on its own thread; the commit-index writer
thread shares ``_meta_lock`` with meta writes, and touches nothing else.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import struct
import threading
import time
from array import array
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import pysyncobj.pickle as pysyncobj_pickle
from pysyncobj.journal import Journal
from pysyncobj.version import VERSION as PYSYNCOBJ_FILE_VERSION

from headwater.log import preallocation

_log = logging.getLogger(__name__)

_APP_NAME: Final = b"PYSYNCOBJ"
_NAME_SIZE: Final = 24
_VERSION_SIZE: Final = 8
_FORMAT_VERSION: Final = 1
_END_OFFSET_AT: Final = _NAME_SIZE + _VERSION_SIZE + 4
FIRST_ENTRY_OFFSET: Final = _NAME_SIZE + _VERSION_SIZE + 8
_ENTRY_HEAD: Final = struct.Struct("<IQQ")
_SIZE: Final = struct.Struct("<I")
RESERVE_BYTES: Final = 1 << 20
"""Blocks reserved ahead of the journal's end at a time."""
JOURNAL_BYTES_MAX: Final = (1 << 32) - 1
"""The format's end offset is a uint32."""
COMMIT_INDEX_WRITE_S: Final = 1.0

Entry = tuple[bytes, int, int]
"""(command, index, term), as pysyncobj's journal holds them."""


def header(end_offset: int) -> bytes:
    name = _APP_NAME.ljust(_NAME_SIZE, b"\0")
    version = str(PYSYNCOBJ_FILE_VERSION).encode().ljust(_VERSION_SIZE, b"\0")[:_VERSION_SIZE]
    return name + version + struct.pack("<II", _FORMAT_VERSION, end_offset)


def encode_entry(command: bytes, index: int, term: int) -> bytes:
    size = _ENTRY_HEAD.size - 4 + len(command)
    return _ENTRY_HEAD.pack(size, index, term) + command + _SIZE.pack(size)


def decode_entries(data: bytes) -> tuple[list[Entry], array[int]]:
    """The entries of a journal file's bytes and each one's byte offset (the file was
    checked by ``journal_check`` first: a torn tail ends the walk)."""
    entries: list[Entry] = []
    offsets: array[int] = array("Q")
    if len(data) < FIRST_ENTRY_OFFSET:
        return entries, offsets
    (end,) = _SIZE.unpack_from(data, _END_OFFSET_AT)
    end = min(end, len(data))
    position = FIRST_ENTRY_OFFSET
    while position + _ENTRY_HEAD.size <= end:
        size, index, term = _ENTRY_HEAD.unpack_from(data, position)
        stop = position + 4 + size
        if size < 16 or stop + 4 > end:
            break
        entries.append((bytes(data[position + _ENTRY_HEAD.size : stop]), index, term))
        offsets.append(position)
        position = stop + 4
    return entries, offsets


class MetadataJournal(Journal):  # type: ignore[misc]
    """See the module docstring. ``on_change`` is called on pysyncobj's thread when the
    journal fails or recovers."""

    def __init__(
        self,
        path: Path,
        slow_write_s: float,
        slow_hold_s: float,
        on_change: Callable[[MetadataJournal], None] | None = None,
    ) -> None:
        self.path = path
        self.meta_path = path.with_name(path.name + ".meta")
        self.slow_write_s = slow_write_s
        self.slow_hold_s = slow_hold_s
        self.on_change = on_change
        self.failure = ""
        """Why the journal stopped writing ("" while it writes): see the module doc."""
        self._slow_until = 0.0
        self._entries: list[Entry] = []
        self._offsets: array[int] = array("Q")
        self._end = FIRST_ENTRY_OFFSET
        self._reserved = 0
        self._fd: int | None = None
        self._meta: dict[str, Any] = self._read_meta()
        self._meta_lock = threading.Lock()
        self._meta_written_commit = self._meta.get("raftCommitIndex", 1)
        self._stop = threading.Event()
        self._commit_changed = threading.Event()
        try:
            data = path.read_bytes() if path.exists() else b""
            self._entries, self._offsets = decode_entries(data)
            if self._offsets:
                last = self._offsets[-1]
                self._end = last + _SIZE.size + _SIZE.unpack_from(data, last)[0] + _SIZE.size
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            self._reserved = os.fstat(self._fd).st_size
            if len(data) < FIRST_ENTRY_OFFSET:
                self._pwrite(header(FIRST_ENTRY_OFFSET), 0)
        except OSError as exc:
            self._fail("opening the journal", exc)
        self._writer = threading.Thread(
            target=self._write_commit_index_forever, name="raft-journal-meta", daemon=True
        )
        self._writer.start()

    # ------------------------------------------------------------------ state

    @property
    def slow(self) -> bool:
        """Did a write take longer than ``slow_write_s`` in the last ``slow_hold_s``?"""
        return time.monotonic() < self._slow_until

    def _fail(self, what: str, exc: OSError) -> None:
        if self.failure:
            return
        self.failure = f"{what} failed: {exc}"
        _log.error(
            "the metadata journal %s cannot be written (%s): this voter stops voting and "
            "standing for election until it can (it tries again every second)",
            self.path,
            self.failure,
        )
        if self.on_change is not None:
            self.on_change(self)

    @contextlib.contextmanager
    def _timed(self) -> Any:
        started = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - started
            if took > self.slow_write_s:
                if not self.slow:
                    _log.warning(
                        "a metadata journal write took %.2f s (more than %.2f s): this voter "
                        "does not stand for election while its disk is this slow",
                        took,
                        self.slow_write_s,
                    )
                self._slow_until = time.monotonic() + self.slow_hold_s

    def _pwrite(self, data: bytes, offset: int) -> None:
        assert self._fd is not None
        view = memoryview(data)
        with self._timed():
            while view:
                written = os.pwrite(self._fd, view, offset)
                if written <= 0:
                    raise OSError(errno.EIO, "short write")
                view = view[written:]
                offset += written

    def _reserve(self, needed_end: int) -> None:
        """Allocate blocks up to past ``needed_end`` (a full disk fails here, before any
        byte of the entry is written)."""
        if needed_end <= self._reserved:
            return
        if needed_end > JOURNAL_BYTES_MAX:
            raise OSError(errno.EFBIG, f"the journal would pass {JOURNAL_BYTES_MAX} bytes")
        target = min(needed_end + RESERVE_BYTES, JOURNAL_BYTES_MAX)
        assert self._fd is not None
        with self._timed():
            code = preallocation.fallocate(self._fd, 0, self._reserved, target - self._reserved)
        if code == 0:
            self._reserved = target
            return
        if code not in (errno.EOPNOTSUPP, errno.ENOSYS):
            # Give back what a failing fallocate kept (ext4), then report it.
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._reserved)
            raise OSError(code, os.strerror(code))
        self._reserved = needed_end  # no fallocate here: the writes allocate

    # ------------------------------------------------------------------ pysyncobj's Journal

    def add(self, command: bytes, idx: int, term: int) -> None:
        command = pysyncobj_pickle.to_bytes(command)
        record = encode_entry(command, idx, term)
        offset = self._end
        self._entries.append((command, idx, term))
        self._offsets.append(offset)
        self._end = offset + len(record)
        if self.failure:
            return
        try:
            self._reserve(self._end)
            self._pwrite(record, offset)
            self._pwrite(_SIZE.pack(self._end), _END_OFFSET_AT)
        except OSError as exc:
            self._fail(f"appending entry {idx}", exc)

    def clear(self) -> None:
        self._entries = []
        self._offsets = array("Q")
        self._end = FIRST_ENTRY_OFFSET
        self._write_end("clearing the journal")

    def deleteEntriesFrom(self, entryFrom: int) -> None:  # noqa: N802, N803 (pysyncobj's)
        if entryFrom >= len(self._entries):
            return
        self._end = self._offsets[entryFrom]
        del self._entries[entryFrom:]
        del self._offsets[entryFrom:]
        self._write_end(f"deleting entries from {entryFrom}")

    def deleteEntriesTo(self, entryTo: int) -> None:  # noqa: N802, N803 (pysyncobj's)
        kept = self._entries[entryTo:]
        self._entries = []
        self._offsets = array("Q")
        self._end = FIRST_ENTRY_OFFSET
        for command, index, term in kept:
            self._entries.append((command, index, term))
            self._offsets.append(self._end)
            self._end += len(command) + _ENTRY_HEAD.size + _SIZE.size
        if not self.failure:
            try:
                self._rewrite()
            except OSError as exc:
                self._fail("compacting the journal", exc)

    def __getitem__(self, item: Any) -> Any:
        return self._entries[item]

    def __len__(self) -> int:
        return len(self._entries)

    def _destroy(self) -> None:
        self._stop.set()
        self._commit_changed.set()
        self._writer.join(timeout=5)
        if not self.failure:
            try:
                self._write_meta()
            except OSError as exc:
                _log.warning("the metadata journal's meta was not written at close: %s", exc)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def flush(self) -> None:
        """pysyncobj's interface; nothing is buffered here."""

    def setRaftCommitIndex(self, raftCommitIndex: int) -> None:  # noqa: N802, N803
        self._meta["raftCommitIndex"] = raftCommitIndex
        self._commit_changed.set()

    def getRaftCommitIndex(self) -> int:  # noqa: N802
        return int(self._meta.get("raftCommitIndex", 1))

    def setCurrentTerm(self, term: int, votedForNodeId: Any) -> None:  # noqa: N802, N803
        self._meta["currentTerm"] = term
        self._meta["votedForNodeId"] = votedForNodeId
        if self.failure:
            return
        try:
            self._write_meta()
        except OSError as exc:
            self._fail("writing the term and vote", exc)

    def getCurrentTerm(self) -> int:  # noqa: N802
        return int(self._meta.get("currentTerm", 0))

    def getVotedForNodeId(self) -> Any:  # noqa: N802
        return self._meta.get("votedForNodeId")

    def onOneSecondTimer(self) -> None:  # noqa: N802
        if self.failure:
            self._maybe_recover()

    # ------------------------------------------------------------------ writing

    def _write_end(self, what: str) -> None:
        if self.failure:
            return
        try:
            self._pwrite(_SIZE.pack(self._end), _END_OFFSET_AT)
        except OSError as exc:
            self._fail(what, exc)

    def _rewrite(self) -> None:
        """Write every entry to a new file, fsync it and rename it over the journal."""
        temporary = self.path.with_name(self.path.name + ".new")
        body = [header(self._end)]
        body += [encode_entry(command, index, term) for command, index, term in self._entries]
        data = b"".join(body)
        try:
            fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                with self._timed():
                    preallocation.fallocate(fd, 0, 0, len(data) + RESERVE_BYTES)
                    view = memoryview(data)
                    offset = 0
                    while offset < len(view):
                        offset += os.pwrite(fd, view[offset:], offset)
                    os.fsync(fd)
                os.replace(temporary, self.path)
            except BaseException:
                os.close(fd)
                raise
        except OSError:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)
            raise
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._reserved = os.fstat(fd).st_size
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def _read_meta(self) -> dict[str, Any]:
        try:
            meta = pysyncobj_pickle.loads(self.meta_path.read_bytes())
        except FileNotFoundError:
            return {}
        except Exception as exc:  # pysyncobj's own reader ignores a bad file too
            _log.warning("the metadata journal's meta %s is unreadable: %s", self.meta_path, exc)
            return {}
        return meta if isinstance(meta, dict) else {}

    def _write_meta(self) -> None:
        with self._meta_lock:
            snapshot = dict(self._meta)
            temporary = self.meta_path.with_name(self.meta_path.name + ".tmp")
            try:
                with self._timed(), open(temporary, "wb") as file:
                    file.write(pysyncobj_pickle.dumps(snapshot))
                os.replace(temporary, self.meta_path)
            except OSError:
                with contextlib.suppress(OSError):
                    temporary.unlink(missing_ok=True)
                raise
            self._meta_written_commit = snapshot.get("raftCommitIndex", 1)

    def _write_commit_index_forever(self) -> None:
        """Background: write the meta when the commit index moved, at most once per
        COMMIT_INDEX_WRITE_S (off pysyncobj's thread: a slow disk must not stall it)."""
        while not self._stop.is_set():
            self._commit_changed.wait()
            if self._stop.is_set():
                return
            self._commit_changed.clear()
            if not self.failure and self._meta.get("raftCommitIndex") != (
                self._meta_written_commit
            ):
                try:
                    self._write_meta()
                except OSError as exc:
                    # pysyncobj's thread notices at its next write; the index is not
                    # needed for safety.
                    _log.debug("the commit index was not written: %s", exc)
            self._stop.wait(COMMIT_INDEX_WRITE_S)

    def _maybe_recover(self) -> None:
        try:
            self._rewrite()
            self._write_meta()
        except OSError as exc:
            _log.debug("the metadata journal is still not writable: %s", exc)
            return
        problem, self.failure = self.failure, ""
        _log.warning(
            "the metadata journal %s is writable again (it failed: %s): this voter votes "
            "and may stand for election again",
            self.path,
            problem,
        )
        if self.on_change is not None:
            self.on_change(self)
