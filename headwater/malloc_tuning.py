"""Raise glibc's mmap and trim thresholds so large gRPC buffers reuse heap memory.

With the defaults every buffer above 128 KiB is a fresh mmap that page-faults on first
touch; measured here, raising the thresholds gives 2-3x on 1 MiB payloads. Called once at
start-up by the server and the benchmarks; a no-op where glibc is absent.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Final

M_TRIM_THRESHOLD: Final = -1
M_MMAP_THRESHOLD: Final = -3
MMAP_THRESHOLD_BYTES: Final = 32 << 20  # glibc's ceiling for M_MMAP_THRESHOLD on 64-bit
TRIM_THRESHOLD_BYTES: Final = 512 << 20


def tune_malloc() -> bool:
    """Return True when the thresholds were set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok_mmap = mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    ok_trim = mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    return bool(ok_mmap and ok_trim)
