"""Checksummed metadata batches, and a check of pysyncobj's journal before it is replayed.

pysyncobj's journal (``data_dir/raft/journal``) carries no checksum: one flipped byte
in a batch renamed a topic on replay, and the node then removed the real topic's
partition folders as strays. So every batch the controller proposes is *framed*::

    b"HWM1"  magic
    uint32   CRC32C of the batch (little-endian)
    bytes    the batch (``headwater.raft.metadata.records`` JSON)

``unframe`` checks it (a batch journaled before framing, which starts with ``[``, is read
as it is), and ``journal_problem`` walks a journal file in pysyncobj 0.3.17's format
(a header, then records ``uint32 size | uint64 index | uint64 term | command | uint32
size``) and unpickles each regular command to check the framed batch inside: the
quorum runs it before pysyncobj replays anything (``MetadataQuorum``), so a damaged
journal is never applied. Pure: bytes in, a problem or None out.
"""

from __future__ import annotations

import struct
from typing import Final

import crc32c
import pysyncobj.pickle as pysyncobj_pickle

MAGIC: Final = b"HWM1"
_FRAME: Final = struct.Struct("<4sI")
# pysyncobj 0.3.17, journal.py
_NAME_SIZE: Final = 24
_VERSION_SIZE: Final = 8
_LAST_RECORD_OFFSET_OFFSET: Final = _NAME_SIZE + _VERSION_SIZE + 4
_FIRST_RECORD_OFFSET: Final = _NAME_SIZE + _VERSION_SIZE + 8
_ENTRY_HEAD: Final = struct.Struct("<IQQ")
_COMMAND_REGULAR: Final = 0


class DamagedBatchError(ValueError):
    """A framed metadata batch whose checksum or frame does not hold."""


def frame(batch: bytes) -> bytes:
    return _FRAME.pack(MAGIC, crc32c.crc32c(batch)) + batch


def unframe(payload: bytes) -> bytes:
    """The batch inside ``payload``; DamagedBatchError when the frame does not hold."""
    if payload[:1] == b"[":
        return payload  # journaled before batches were framed
    if len(payload) < _FRAME.size:
        raise DamagedBatchError(f"a metadata batch of {len(payload)} bytes has no frame")
    magic, crc = _FRAME.unpack_from(payload)
    if magic != MAGIC:
        raise DamagedBatchError(f"a metadata batch starts with {magic!r}, not {MAGIC!r}")
    batch = payload[_FRAME.size :]
    actual = crc32c.crc32c(batch)
    if actual != crc:
        raise DamagedBatchError(
            f"a metadata batch's CRC32C is {actual:#010x}, its frame says {crc:#010x}"
        )
    return batch


def journal_problem(data: bytes) -> str | None:
    """What is wrong with a journal file's bytes, or None when every entry holds."""
    if len(data) < _FIRST_RECORD_OFFSET:
        return f"the journal is {len(data)} bytes, shorter than its header"
    (last,) = struct.unpack_from("<I", data, _LAST_RECORD_OFFSET_OFFSET)
    if not _FIRST_RECORD_OFFSET <= last <= len(data):
        return f"its end offset {last} lies outside [{_FIRST_RECORD_OFFSET}, {len(data)}]"
    position = _FIRST_RECORD_OFFSET
    previous = -1
    while position < last:
        if position + _ENTRY_HEAD.size > last:
            return f"a torn entry at byte {position}"
        size, index, _term = _ENTRY_HEAD.unpack_from(data, position)
        end = position + 4 + size
        if size < 16 or end + 4 > last:
            return f"the entry at byte {position} claims {size} bytes, past the journal's end"
        (trailer,) = struct.unpack_from("<I", data, end)
        if trailer != size:
            return f"the entry at byte {position} ends with size {trailer}, begins with {size}"
        if previous >= 0 and index != previous + 1:
            return f"entry index {index} at byte {position} follows {previous}"
        problem = _command_problem(data[position + 20 : end])
        if problem is not None:
            return f"entry {index} (byte {position}): {problem}"
        previous = index
        position = end + 4
    return None


def _command_problem(command: bytes) -> str | None:
    if not command:
        return "an empty command"
    if command[0] != _COMMAND_REGULAR:
        return None  # no-op, membership, version: pysyncobj's own
    try:
        # The node's own file; only a batch (bytes) is expected inside.
        call = pysyncobj_pickle.loads(command[1:])
        args = call[1] if isinstance(call, tuple) and len(call) >= 2 else ()
    except Exception as exc:
        return f"the command does not decode ({type(exc).__name__}: {exc})"
    for arg in args:
        if isinstance(arg, bytes):
            try:
                unframe(arg)
            except DamagedBatchError as exc:
                return str(exc)
    return None
