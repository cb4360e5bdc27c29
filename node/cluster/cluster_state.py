"""This node's view of the cluster metadata: the latest image, and who waits for it.

Images arrive from another thread (pysyncobj's, on voters) or from the metadata follower
task (broker-only nodes). ``publish`` is thread-safe; it hands the image to the event
loop, where ``image`` is replaced and listeners run, in arrival order. Handlers read
``image`` once per request and use that one immutable snapshot throughout.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from headwater.raft.metadata.image import MetadataImage

_log = logging.getLogger(__name__)
ImageListener = Callable[[MetadataImage], None]


class ClusterState:
    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.image = MetadataImage()
        self._listeners: list[ImageListener] = []
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        # Offset of the newest image whose partition assignments the logs reflect.
        self.reconciled_offset = 0
        # True once this node has seen a current image (not a replay of its journal, nor
        # nothing yet): before that, a topic missing from the image may well exist.
        self.current = False
        self._reconcile_waiters: list[tuple[int, asyncio.Future[None]]] = []

    def add_listener(self, listener: ImageListener) -> None:
        self._listeners.append(listener)

    def publish(self, image: MetadataImage) -> None:
        """Thread-safe: make ``image`` current on the loop (older images are ignored)."""
        self._loop.call_soon_threadsafe(self._set, image)

    def publish_now(self, image: MetadataImage) -> None:
        """On the loop: make ``image`` current at once."""
        self._set(image)

    def _set(self, image: MetadataImage) -> None:
        if image.offset < self.image.offset:
            return
        self.image = image
        for listener in self._listeners:
            try:
                listener(image)
            except Exception:
                _log.exception("metadata listener failed")
        self._waiters = _wake_reached(self._waiters, image.offset)

    async def wait_for_offset(self, offset: int, timeout_s: float) -> bool:
        """True once the image has applied ``offset`` batches; False after ``timeout_s``."""
        if self.image.offset >= offset:
            return True
        return await self._wait(self._waiters, offset, timeout_s)

    async def _wait(
        self, waiters: list[tuple[int, asyncio.Future[None]]], offset: int, timeout_s: float
    ) -> bool:
        future: asyncio.Future[None] = self._loop.create_future()
        waiters.append((offset, future))
        try:
            async with asyncio.timeout(timeout_s):
                await future
            return True
        except TimeoutError:
            return False

    def mark_reconciled(self, offset: int) -> None:
        """On the loop: the hosted logs now follow the image at ``offset``."""
        self.reconciled_offset = max(self.reconciled_offset, offset)
        self._reconcile_waiters = _wake_reached(self._reconcile_waiters, offset)

    async def wait_reconciled(self, offset: int, timeout_s: float) -> bool:
        """True once the hosted logs follow the image at ``offset`` (False on timeout)."""
        if self.reconciled_offset >= offset:
            return True
        return await self._wait(self._reconcile_waiters, offset, timeout_s)

    async def wait_until(
        self, predicate: Callable[[MetadataImage], bool], timeout_s: float
    ) -> bool:
        """True once ``predicate(image)`` holds; False after ``timeout_s``."""
        deadline = self._loop.time() + timeout_s
        while not predicate(self.image):
            remaining = deadline - self._loop.time()
            if remaining <= 0:
                return False
            if not await self.wait_for_offset(self.image.offset + 1, remaining):
                return predicate(self.image)
        return True


def _wake_reached(
    waiters: list[tuple[int, asyncio.Future[None]]], offset: int
) -> list[tuple[int, asyncio.Future[None]]]:
    """Resolve the waiters for offsets up to ``offset``; return the others."""
    for wanted, future in waiters:
        if wanted <= offset and not future.done():
            future.set_result(None)
    return [w for w in waiters if w[0] > offset]
