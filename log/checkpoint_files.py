"""Small files replaced atomically, and the checked offset format of offset checkpoints.

Atomic replacement (``write_atomically``): the bytes go to ``<name>.tmp``, which is
fsynced, renamed over ``<name>``, and the directory fsynced; a crash leaves the old file
or the new one whole, never a mix (a partition's ``*.tmp`` files are deleted when its log
opens). A failed write removes its temporary file, so that a full disk gets its blocks
back.

Checked offset format (``write_checked_offset``): ``"<value> <crc>\\n"``, the offset in
decimal and the CRC32C of its digits in 8 lowercase hex digits. A reader
(``read_checked_offset``) takes a missing file, and a damaged one (its checksum does not
match, or it holds no offset of at most 19 digits), as no offset; damage is logged at
ERROR. A bare decimal offset, without its checksum, is read as is. The partition's
offset checkpoints (recovery point, cleaner offset, gap bound) and the node's high
watermarks use it.

I/O; no state of its own (thread-safety is the callers').
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path

import crc32c

_log = logging.getLogger(__name__)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: write a temporary file, fsync it, rename, fsync dir."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # give its blocks back (a full disk)
            temporary.unlink(missing_ok=True)
        raise
    fsync_directory(path.parent)


def write_checked_offset(path: Path, value: int) -> None:
    """Write an offset checkpoint atomically as ``"<value> <crc>\\n"``: the decimal value
    and the CRC32C of its digits in 8 hex digits."""
    digits = str(value).encode()
    write_atomically(path, digits + b" %08x\n" % crc32c.crc32c(digits))


def read_checked_offset(path: Path) -> int | None:
    """The offset of a checkpoint written by ``write_checked_offset``; None when the file
    is missing or damaged (its checksum does not match, or it holds no offset), logged
    when damaged. A bare decimal offset (no checksum) is read as is."""
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        _log.error("cannot read %s: %s", path, exc)
        return None
    parts = text.split()
    digits = parts[0] if parts else b""
    if (
        digits.isdigit()
        and len(digits) <= 19
        and (len(parts) == 1 or (len(parts) == 2 and parts[1] == b"%08x" % crc32c.crc32c(digits)))
    ):
        return int(digits)
    _log.error("%s is damaged (%r): it is ignored", path, text[:64])
    return None


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (files created, renamed or removed) durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
