"""Real disk faults for tests: small file systems that fill up, and ballast that fills them.

``small_filesystem`` mounts a tmpfs of a given size (root only) and removes it afterwards;
``ext4_filesystem`` makes an ext4 file system on a loop device (root only), where
fallocate and block allocation behave as on a real disk. Where the machine cannot mount
(not root, no loop devices), the test is skipped with the reason.

``fill`` writes a ballast file until the file system refuses more (ENOSPC); removing the
ballast frees the space again.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

BALLAST_CHUNK_BYTES = 64 << 10


def _require_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a small file system to fill needs root")


def _mount(args: list[str], target: Path) -> None:
    done = subprocess.run(args, capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a file system at {target}: {done.stderr.decode().strip()}")


def _unmount(target: Path) -> None:
    subprocess.run(["umount", "-l", str(target)], capture_output=True, check=False)


@contextlib.contextmanager
def small_filesystem(where: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``where`` (created), unmounted on exit."""
    _require_root()
    where.mkdir(parents=True, exist_ok=True)
    _mount(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)], where)
    try:
        yield where
    finally:
        _unmount(where)


@contextlib.contextmanager
def ext4_filesystem(where: Path, size_bytes: int) -> Iterator[Path]:
    """An ext4 file system of ``size_bytes`` in an image file next to ``where``, mounted
    at ``where`` through a loop device; unmounted and the image removed on exit."""
    _require_root()
    if shutil.which("mkfs.ext4") is None:
        pytest.skip("mkfs.ext4 is not installed")
    image = where.with_name(where.name + ".img")
    where.mkdir(parents=True, exist_ok=True)
    with open(image, "wb") as file:
        file.truncate(size_bytes)
    made = subprocess.run(
        ["mkfs.ext4", "-q", "-F", "-m", "0", str(image)], capture_output=True, check=False
    )
    if made.returncode != 0:
        pytest.skip(f"mkfs.ext4 failed: {made.stderr.decode().strip()}")
    _mount(["mount", "-o", "loop", str(image), str(where)], where)
    try:
        yield where
    finally:
        _unmount(where)
        image.unlink(missing_ok=True)


def fill(ballast: Path, leave_bytes: int = 0) -> int:
    """Write ``ballast`` until the file system is full, then give ``leave_bytes`` back
    (by cutting the ballast short); return the ballast's size."""
    chunk = memoryview(b"\0" * BALLAST_CHUNK_BYTES)
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        while True:
            try:
                written = os.write(fd, chunk)
            except OSError as exc:
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    raise
                break
            if written == 0:
                break
        size = os.fstat(fd).st_size
        if leave_bytes:
            os.ftruncate(fd, max(size - leave_bytes, 0))
        return os.fstat(fd).st_size
    finally:
        os.close(fd)


def free_bytes(path: Path) -> int:
    return shutil.disk_usage(path).free
