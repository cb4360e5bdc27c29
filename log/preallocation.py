"""Reserving disk blocks for a file: fallocate(2) through ctypes (Python has no binding
for its modes).

``fallocate(fd, mode, offset, length)`` returns 0 when the blocks of ``[offset, offset +
length)`` are allocated, else the errno (ENOSYS where the C library has no fallocate).
``KEEP_SIZE`` (``FALLOC_FL_KEEP_SIZE``) reserves blocks past the end without changing the
file's size. A call that fails may keep what it allocated before it stopped (ext4
does): callers give that back (ftruncate to the size they had).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
from typing import Any, Final

KEEP_SIZE: Final = 0x01


def _load() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).fallocate
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_longlong]
    function.restype = ctypes.c_int
    return function


_fallocate = _load()
AVAILABLE: Final = _fallocate is not None


def fallocate(fd: int, mode: int, offset: int, length: int) -> int:
    """0, or the errno of the failed call (see the module doc)."""
    if _fallocate is None:
        return errno.ENOSYS
    if _fallocate(fd, mode, offset, length) == 0:
        return 0
    return ctypes.get_errno()
