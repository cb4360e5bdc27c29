"""The disks of a chaos run's nodes, for the ``disk-full`` and ``slow-disk`` nemeses.

``full``: node i keeps its data in ``ROOT/n<i>/disk/data``, on a tmpfs of ``DISK_BYTES``
mounted at ``ROOT/n<i>/disk`` (root only); ``fill(i)`` writes ``disk/ballast`` until the
file system refuses more, ``empty(i)`` removes it. ``slow``: every node runs with the
slow-disk library (``headwater.tools.chaos.slow_disk``) and its own control file,
``ROOT/n<i>/slow-disk``; ``slow(i, write_ms, fsync_ms)`` delays node i's writes and
fsyncs to its data folder, ``slow(i, 0, 0)`` ends it. ``close`` unmounts what was
mounted. Runs on the runner's main thread.
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path
from typing import Final

from headwater.tools.chaos.slow_disk import SlowDisk, SlowDiskUnavailableError, build

DISK_BYTES: Final = 256 << 20
BALLAST_CHUNK_BYTES: Final = 1 << 20


class DisksUnavailableError(Exception):
    """The disk faults cannot run here (the message says why)."""


def full_unavailable_reason() -> str | None:
    """Why ``disk-full`` cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "mounting a file system per node needs root"
    if shutil.which("mount") is None or shutil.which("umount") is None:
        return "mount and umount are not installed"
    return None


class Disks:
    def __init__(self, root: Path, node_ids: tuple[int, ...], full: bool, slow: bool) -> None:
        """Raises DisksUnavailableError when ``full`` or ``slow`` cannot be set up."""
        self.root = root
        self._mounted: list[Path] = []
        self._slow: dict[int, SlowDisk] = {}
        self.full = full
        try:
            if full:
                reason = full_unavailable_reason()
                if reason is not None:
                    raise DisksUnavailableError(reason)
                for node_id in node_ids:
                    self._mount(self.disk(node_id))
            if slow:
                try:
                    library = build(root / "slow-disk-library")
                except SlowDiskUnavailableError as exc:
                    raise DisksUnavailableError(str(exc)) from None
                for node_id in node_ids:
                    self._slow[node_id] = SlowDisk(
                        library, self.data_dir(node_id), root / f"n{node_id}" / "slow-disk"
                    )
        except BaseException:
            self.close()
            raise

    def disk(self, node_id: int) -> Path:
        return self.root / f"n{node_id}" / "disk"

    def data_dir(self, node_id: int) -> Path:
        if self.full:
            return self.disk(node_id) / "data"
        return self.root / f"n{node_id}" / "data"

    def env(self, node_id: int) -> dict[str, str]:
        slow = self._slow.get(node_id)
        return slow.env() if slow is not None else {}

    def _mount(self, where: Path) -> None:
        where.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(where)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise DisksUnavailableError(f"cannot mount a tmpfs at {where}: {done.stderr.strip()}")
        self._mounted.append(where)

    def fill(self, node_id: int) -> int:
        """Fill node ``node_id``'s file system; the ballast's size in bytes."""
        ballast = self.disk(node_id) / "ballast"
        chunk = memoryview(b"\0" * BALLAST_CHUNK_BYTES)
        fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            while True:
                try:
                    if os.write(fd, chunk) == 0:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    if len(chunk) <= 4096:
                        break
                    chunk = chunk[: len(chunk) // 2]  # top up the last pages
            return os.fstat(fd).st_size
        finally:
            os.close(fd)

    def empty(self, node_id: int) -> None:
        (self.disk(node_id) / "ballast").unlink(missing_ok=True)

    def slow(self, node_id: int, write_ms: int, fsync_ms: int) -> None:
        self._slow[node_id].set(write_ms, fsync_ms)

    def close(self) -> None:
        """End every slowness and unmount every file system mounted here."""
        for slow in self._slow.values():
            slow.set(0, 0)
        for where in reversed(self._mounted):
            subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)
        self._mounted.clear()
