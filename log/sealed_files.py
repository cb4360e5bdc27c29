"""The open ``.log`` handles of sealed segments: a bounded, least-recently-used set shared
by every log in the process.

A partition's active segment keeps three files open (its ``.log`` and both index
writers). A sealed segment (one that is no longer written) keeps none of its own: its
index lives in memory, and its ``.log`` handle is opened by the first read that needs it
and held here. When more than ``capacity`` sealed segments hold a handle, the least
recently used one that is not in use is closed; its next read opens it again. So a node's
open files grow with its partitions, not with their segments (``LogManager`` counts
``capacity``, the node's ``sealed_segment_files_max``, in the files it keeps in reserve).

"Not in use": a handle is closed only by a thread that takes its segment's owner lock
(the lock of the ``FileLog`` that serializes every use of the segment) without waiting.
A segment whose log is busy in another thread is skipped, so a handle is never closed
under a read that is using it. (The thread that holds the lock may close handles of its
own log's other segments: it is not using them at that moment.)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Final, Protocol

SEALED_FILES_DEFAULT: Final = 256


class SealedHandle(Protocol):
    """A segment as the set sees it."""

    @property
    def owner_lock(self) -> threading.RLock:
        """The lock every use of the segment's handle holds."""

    def drop_handle(self) -> None:
        """Close the ``.log`` handle (the owner lock is held); the next use opens it."""


class SealedFiles:
    """The bounded set (see the module doc). Thread-safe."""

    def __init__(self, capacity: int = SEALED_FILES_DEFAULT) -> None:
        assert capacity >= 1
        self.capacity = capacity
        self._lock = threading.Lock()
        self._open: OrderedDict[int, SealedHandle] = OrderedDict()
        self.closed_total = 0
        """Handles closed to make room (a measure of churn)."""

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, segment: SealedHandle) -> None:
        """``segment`` holds an open handle now (it is the most recently used); close
        others while the set is over capacity."""
        with self._lock:
            self._open[id(segment)] = segment
            self._open.move_to_end(id(segment))
            over = len(self._open) - self.capacity
            if over <= 0:
                return
            victims = [s for key, s in self._open.items() if key != id(segment)]
        for victim in victims:
            if over <= 0:
                break
            if not victim.owner_lock.acquire(blocking=False):
                continue  # in use by another thread: never close under a read
            try:
                with self._lock:
                    if self._open.pop(id(victim), None) is None:
                        continue  # closed or forgotten meanwhile
                victim.drop_handle()
                with self._lock:
                    self.closed_total += 1
                over -= 1
            finally:
                victim.owner_lock.release()

    def touched(self, segment: SealedHandle) -> None:
        """``segment``'s handle was used: it is the most recently used."""
        with self._lock:
            if id(segment) in self._open:
                self._open.move_to_end(id(segment))

    def forget(self, segment: SealedHandle) -> None:
        """``segment`` closed its handle itself, or is active again (not counted here)."""
        with self._lock:
            self._open.pop(id(segment), None)


SEALED_FILES = SealedFiles()
"""The process's set, shared by every FileLog."""
