"""A slow disk for one process: an LD_PRELOAD library, built with the system's C compiler
when it is needed, that delays writes and fsyncs to files under one folder.

``build(folder)`` compiles the library into ``folder`` and returns its path (raises
``SlowDiskUnavailableError`` without a compiler). A process started with
``SlowDisk.env()`` in its environment has its writes under ``data_dir`` (write, pwrite,
writev, pwritev, fallocate) delayed by the control file's first number of
milliseconds and its fsyncs (fsync, fdatasync) by the second. The file
(``SlowDisk.control``: two little-endian uint32) is mapped into the process, so
``SlowDisk.set`` changes the delays of a running process at once, and a process whose
delays are 0 pays no more than a load per call. The delay is a sleep in the calling
thread before the real call, as when a disk's queue is full; writes elsewhere
(sockets, pipes, other folders) are untouched.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from pathlib import Path
from typing import Final

CONTROL: Final = struct.Struct("<II")

SOURCE: Final = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

/* [0]: delay of a write in ms, [1]: delay of an fsync in ms (SLOW_DISK_CONTROL). */
static volatile uint32_t *delays = NULL;
static int mapped = 0;

static volatile uint32_t *control(void) {
    if (!mapped) {
        mapped = 1;
        const char *path = getenv("SLOW_DISK_CONTROL");
        if (path != NULL) {
            int fd = open(path, O_RDONLY | O_CLOEXEC);
            if (fd >= 0) {
                void *map = mmap(NULL, 8, PROT_READ, MAP_SHARED, fd, 0);
                if (map != MAP_FAILED) delays = map;
                close(fd);
            }
        }
    }
    return delays;
}

/* Whether fd is a file under SLOW_DISK_DIR. */
static int slow_fd(int fd) {
    const char *dir = getenv("SLOW_DISK_DIR");
    if (dir == NULL) return 0;
    size_t n = strlen(dir);
    if (n == 0) return 0;
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t got = readlink(link, path, sizeof path - 1);
    if (got <= 0) return 0;
    path[got] = 0;
    return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == 0);
}

static void maybe_pause(int fd, int which) {
    volatile uint32_t *d = control();
    if (d == NULL) return;
    uint32_t ms = d[which];
    if (ms == 0 || !slow_fd(fd)) return;
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0) {}
}

#define REAL(name) static __typeof__(name) *real_##name; \
    if (!real_##name) real_##name = dlsym(RTLD_NEXT, #name)

ssize_t write(int fd, const void *buf, size_t count) {
    REAL(write); maybe_pause(fd, 0); return real_write(fd, buf, count);
}
ssize_t pwrite(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite); maybe_pause(fd, 0); return real_pwrite(fd, buf, count, offset);
}
ssize_t pwrite64(int fd, const void *buf, size_t count, off_t offset) {
    REAL(pwrite64); maybe_pause(fd, 0); return real_pwrite64(fd, buf, count, offset);
}
ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    REAL(writev); maybe_pause(fd, 0); return real_writev(fd, iov, iovcnt);
}
ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t offset) {
    REAL(pwritev); maybe_pause(fd, 0); return real_pwritev(fd, iov, iovcnt, offset);
}
int fallocate(int fd, int mode, off_t offset, off_t len) {
    REAL(fallocate); maybe_pause(fd, 0); return real_fallocate(fd, mode, offset, len);
}
int fallocate64(int fd, int mode, off_t offset, off_t len) {
    REAL(fallocate64); maybe_pause(fd, 0); return real_fallocate64(fd, mode, offset, len);
}
int fsync(int fd) {
    REAL(fsync); maybe_pause(fd, 1); return real_fsync(fd);
}
int fdatasync(int fd) {
    REAL(fdatasync); maybe_pause(fd, 1); return real_fdatasync(fd);
}
"""


class SlowDiskUnavailableError(Exception):
    """The library cannot be built here (the message says why)."""


def build(folder: Path) -> Path:
    """Compile the library into ``folder``; return its path."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise SlowDiskUnavailableError("a slow disk needs a C compiler (cc) to build its library")
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "slow_disk.c"
    library = folder / "slow_disk.so"
    source.write_text(SOURCE)
    built = subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(source), "-ldl"],
        capture_output=True,
        check=False,
    )
    if built.returncode != 0:
        raise SlowDiskUnavailableError(f"building the slow-disk library failed: {built.stderr!r}")
    return library


class SlowDisk:
    """The delays of one process's writes under ``data_dir`` (see the module doc)."""

    def __init__(self, library: Path, data_dir: Path, control: Path) -> None:
        self.library = library
        self.data_dir = data_dir
        self.control = control
        self.set(0, 0)

    def env(self) -> dict[str, str]:
        """What the process's environment needs (add it before the process starts)."""
        return {
            "LD_PRELOAD": str(self.library),
            "SLOW_DISK_DIR": str(self.data_dir.resolve()),
            "SLOW_DISK_CONTROL": str(self.control),
        }

    def set(self, write_ms: int, fsync_ms: int) -> None:
        """Delay each write by ``write_ms`` and each fsync by ``fsync_ms`` (0: none)."""
        self.control.parent.mkdir(parents=True, exist_ok=True)
        data = CONTROL.pack(write_ms, fsync_ms)
        if self.control.exists():
            with open(self.control, "r+b") as file:  # the same pages the process maps
                file.write(data)
        else:
            self.control.write_bytes(data)
