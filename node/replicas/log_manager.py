"""The partition logs this node hosts, kept in line with the cluster metadata.

Layout::

    data_dir/
      .lock                       flock held while a node uses the folder
      meta.json                   {"node_id": ..., "format": 2}
      raft/                       the metadata quorum's journal and snapshot (voters)
      <topic>-<partition>/        one FileLog per hosted partition, plus
        partition.metadata          which incarnation of the topic (partition_metadata)
        damaged/                    what log recovery set aside (FileLog)
      damaged/                    partition folders whose metadata was unreadable: kept,
                                  never deleted by the node, reported at ERROR
      *-delete/                   being removed

Log-directory failure (Kafka's): when a write to a log's files fails (a full disk, an I/O
error), the log stops taking writes (``FileLog._fail``) and the folder goes *offline*:
one ERROR names the folder and the errno, ``on_log_dir_change`` tells the node (which
reports it to the controller in its heartbeats: its leaderships move to in-sync replicas
elsewhere, and it is taken out of every ISR), and the next ``reconcile`` closes every
hosted log and opens none. The maintenance thread then checks the folder every
``LOG_DIR_PROBE_S``: once it has ``log_dir_free_bytes_min`` free beyond the blocks its own
logs gave back when they closed (their segments' reserves, which the reopened logs take
again: counting them as room would bring a full folder back only to fill it at once), and
a test file can be written and fsynced there, the folder is back online, and the next
``reconcile`` opens the logs again through recovery; the replicas are followers and
rejoin the ISRs once they have caught up. Nothing acknowledged is lost on the way: every
failed write was rolled back before it was answered.

The node hosts exactly the partitions whose replicas include it in the metadata image.
``reconcile(image)`` opens the logs of newly assigned partitions and sets each one's role
(leader or follower, leader epoch). It removes logs only when told the image is current
(``may_delete``): a partially replayed journal must never delete a topic's data because
the record creating it has not been replayed yet. A log is removed when its topic is gone,
when the topic was recreated (another topic id), or when the partition moved off this
node.

Thread-safety: ``reconcile`` runs in a worker thread, one at a time (``_reconcile_lock``);
``_partitions`` is replaced, never mutated in place, so readers on the event loop see
either the old or the new map.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import resource
import secrets
import shutil
import stat
import tempfile
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import crc32c

from headwater.log.api import FlushPolicy, LogConfig
from headwater.log.checkpoint_files import write_atomically
from headwater.log.cleaner import (
    CleaningStoppedError,
    CleanResult,
    DamagedSegmentError,
    Throttle,
    clean,
)
from headwater.log.file_log import FileLog
from headwater.log.sealed_files import SEALED_FILES
from headwater.log.segment import Segment
from headwater.log.segment_swap import CleaningAbortedError
from headwater.node.clock import now_ms
from headwater.node.config import NodeConfig
from headwater.node.replicas.partition import Partition
from headwater.node.replicas.replica_roles import (
    ReconcileStep,
    ReplicaRole,
    take_role,
)
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.errors import HeadwaterError

META_FILE: Final = "meta.json"
LOCK_FILE: Final = ".lock"
RAFT_DIR: Final = "raft"
DAMAGED_DIR: Final = "damaged"
FILES_PER_PARTITION: Final = 3
"""A hosted partition keeps its active segment, offset index and time index open (its
sealed segments share the bounded set of ``headwater.log.sealed_files``)."""
FILES_RESERVED: Final = 512
"""Open files kept for connections, the Raft journal and everything else (the sealed
segments' handles, ``sealed_segment_files_max``, are kept besides)."""
SECRET_FILE: Final = "cluster.secret"  # noqa: S105 - a file name, not a secret
PARTITION_META_FILE: Final = "partition.metadata"
DELETE_SUFFIX: Final = "-delete"
META_FORMAT: Final = 2
HIGH_WATERMARK_CHECKPOINT_S: Final = 1.0

_log = logging.getLogger(__name__)


def partition_metadata(topic_id: str) -> bytes:
    """``partition.metadata``: JSON ``{"version": 1, "topic_id": ..., "crc32c": ...}``, the
    CRC32C of the topic id's UTF-8 bytes, so that a damaged file is told apart from one
    of another incarnation of the topic (which the node may delete)."""
    crc = crc32c.crc32c(topic_id.encode())
    return json.dumps({"version": 1, "topic_id": topic_id, "crc32c": crc}).encode()


def read_partition_metadata(path: Path) -> str | None:
    """The topic id in ``path``, or None when the file is missing, unreadable or damaged.
    A file from before the checksum (``{"topic_id": ...}`` alone) counts when its id has
    the form of one (32 lowercase hex digits)."""
    try:
        body = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("topic_id"), str):
        return None
    topic_id: str = body["topic_id"]
    if "crc32c" in body:
        return topic_id if body["crc32c"] == crc32c.crc32c(topic_id.encode()) else None
    legacy = len(topic_id) == 32 and all(c in "0123456789abcdef" for c in topic_id)
    return topic_id if legacy else None


def _open_files_limit() -> int | None:
    """The soft RLIMIT_NOFILE in force, None when unlimited."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def loopback_secret_path(quorum: str) -> Path:
    """Where the nodes of a loopback-only quorum with no cluster_secret share one: a file
    named after the quorum in ``headwater-<uid>``, a folder of this user's only, in
    ``$XDG_RUNTIME_DIR`` or else the temporary folder."""
    base = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir())
    name = hashlib.sha256(quorum.encode()).hexdigest()[:32]
    return base / f"headwater-{os.getuid()}" / f"loopback-{name}.secret"


def _check_private(path: Path, is_dir: bool) -> None:
    """DataDirError unless ``path`` is this user's own folder or file (not a link) that
    no one else may read or write."""
    info = path.lstat()
    kind_ok = stat.S_ISDIR(info.st_mode) if is_dir else stat.S_ISREG(info.st_mode)
    if not kind_ok or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise DataDirError(
            f"{path} is not private to this user (owner {info.st_uid}, mode "
            f"{stat.S_IMODE(info.st_mode):o}): remove it, or set HEADWATER_CLUSTER_SECRET"
        )


def shared_secret(path: Path) -> str:
    """The secret in ``path``, created by whichever node comes first (32 random bytes as
    hex, mode 0600, written whole before it appears: a link from a finished temporary
    file), in a folder of mode 0700; both must be this user's and private."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        _check_private(path.parent, is_dir=True)
        if not path.exists():
            temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
                file.flush()
                os.fsync(file.fileno())
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # another node of the cluster was first
            finally:
                temporary.unlink()
        _check_private(path, is_dir=False)
        secret = path.read_text().strip()
    except OSError as exc:
        raise DataDirError(f"cannot read or create {path}: {exc.strerror or exc}") from exc
    if len(secret) != 64:
        raise DataDirError(f"{path} does not hold a secret: remove it and start again")
    return secret


def _free_bytes_text(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder).free} bytes"
    except OSError as exc:
        return f"unknown ({exc.strerror or exc})"


def _holds_no_records(folder: Path) -> bool:
    return all(p.stat().st_size == 0 for p in folder.glob("*.log"))


class DataDirError(Exception):
    """The data folder cannot be used; the message says why (the node does not start)."""


CLEANER_RETRY_S: Final = 60.0
"""How long a partition whose cleaning pass failed waits before the cleaner tries again."""
LOG_DIR_PROBE_S: Final = 1.0
"""How often an offline data folder is checked for being writable again."""
LOG_DIR_PROBE_BYTES_MAX: Final = 1 << 20
"""Largest test file written to decide that an offline data folder is writable again."""
PROBE_FILE: Final = ".write-probe"
DISK_SLOW_HOLD_S: Final = 30.0
"""How long one slow append keeps the data folder counted as slow (``disk_slow``)."""


class LogManager:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        SEALED_FILES.capacity = config.sealed_segment_files_max
        self.data_dir = Path(config.data_dir).resolve()
        self._lock_fd = self._open_data_dir()
        self._check_meta()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._reconcile_lock = threading.Lock()
        self.offline_problem = ""
        """Why the data folder is offline ("" while it is online): see the module doc."""
        self.on_log_dir_change: Callable[[], None] | None = None
        """Called (from any thread) when the folder goes offline or comes back."""
        self._slow_until = 0.0  # monotonic; see disk_slow
        self._offline_lock = threading.Lock()
        self._reserves_given_back = 0
        """Bytes the logs closed since the folder went offline gave back (see the module
        doc): the folder needs that much free besides ``log_dir_free_bytes_min``."""
        self._stop = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintain, name="log-maintenance", daemon=True
        )
        self._maintenance.start()
        # log -> monotonic time to try again after a failed pass
        self._cleaner_failed: weakref.WeakKeyDictionary[FileLog, float] = (
            weakref.WeakKeyDictionary()
        )
        # log -> a segment of it the cleaner could not decode: no pass while the log holds
        # it (retention, a truncation or the log's deletion ends that; so does a restart)
        self._damaged: weakref.WeakKeyDictionary[FileLog, Segment] = weakref.WeakKeyDictionary()
        self.cleaner_throttle = Throttle(config.log_cleaner_io_max_bytes_per_s, self._stop)
        self._cleaner = threading.Thread(target=self._run_cleaner, name="log-cleaner", daemon=True)
        self._cleaner.start()

    @property
    def raft_dir(self) -> Path:
        return self.data_dir / RAFT_DIR

    def partition_capacity(self) -> int:
        """Most partition replicas this node can host: ``partitions_per_node_max``, or
        fewer when its open-file limit allows fewer (FILES_PER_PARTITION each, after
        FILES_RESERVED for connections, the Raft journal and the rest, and the sealed
        segments' handles)."""
        limit = _open_files_limit()
        if limit is None:
            return self.config.partitions_per_node_max
        reserved = FILES_RESERVED + self.config.sealed_segment_files_max
        by_files = max((limit - reserved) // FILES_PER_PARTITION, 0)
        return min(self.config.partitions_per_node_max, by_files)

    def _files_left(self) -> int:
        """Files this process may still open before the reserve (a large number when
        there is no limit or the count cannot be read)."""
        limit = _open_files_limit()
        try:
            open_now = len(os.listdir("/proc/self/fd"))
        except OSError:
            return 1 << 30
        if limit is None:
            return 1 << 30
        return limit - (FILES_RESERVED + self.config.sealed_segment_files_max) // 2 - open_now

    def cluster_secret(self) -> str:
        """``cluster_secret`` when configured; otherwise (a single node: the config
        refuses a multi-node cluster without one) the secret in ``cluster.secret``,
        created on the first start (32 random bytes as hex, readable by the owner only),
        so that even a lone node's Raft port and inter-broker listener refuse strangers."""
        if self.config.cluster_secret:
            return self.config.cluster_secret
        voters = self.config.quorum_voters
        if len(voters) > 1:  # all on loopback, or the config would have refused it
            quorum = ",".join(f"{i}@{a}" for i, a in sorted(voters.items()))
            shared = loopback_secret_path(quorum)
            _log.warning(
                "cluster_secret is not set: this loopback-only cluster shares the secret in "
                "%s (readable by this user only, so every node must run as this user); set "
                "HEADWATER_CLUSTER_SECRET for anything else",
                shared,
            )
            return shared_secret(shared)
        path = self.data_dir / SECRET_FILE
        try:
            existing = path.read_text().strip() if path.exists() else ""
            if existing:
                return existing
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as file:
                file.write(secrets.token_hex(32) + "\n")
                file.flush()
                os.fsync(file.fileno())
            return path.read_text().strip()
        except OSError as exc:
            raise DataDirError(f"cannot read or create {path}: {exc.strerror or exc}") from exc

    # ------------------------------------------------------------------ start-up

    def _open_data_dir(self) -> int:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.data_dir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
            probe = self.data_dir / ".write-probe"
            probe.write_bytes(b"ok")
            probe.unlink()
        except OSError as exc:
            raise DataDirError(
                f"data_dir {self.data_dir} is not usable: {exc.strerror or exc}; "
                "choose a writable folder with --data-dir"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise DataDirError(
                f"data_dir {self.data_dir} is in use by another headwater node"
            ) from exc
        return fd

    def _check_meta(self) -> None:
        path = self.data_dir / META_FILE
        if path.exists():
            meta = json.loads(path.read_text())
            if int(meta.get("node_id", self.config.node_id)) != self.config.node_id:
                raise DataDirError(
                    f"data_dir {self.data_dir} belongs to node {meta['node_id']}, not "
                    f"node {self.config.node_id}"
                )
            if int(meta.get("format", 1)) != META_FORMAT:
                raise DataDirError(
                    f"data_dir {self.data_dir} has layout format {meta.get('format', 1)}; "
                    f"this version reads format {META_FORMAT} (start with an empty folder)"
                )
            return
        write_atomically(
            path, json.dumps({"node_id": self.config.node_id, "format": META_FORMAT}).encode()
        )

    # ------------------------------------------------------------------ partitions

    def partition(self, topic: str, index: int) -> Partition | None:
        """The hosted log of ``topic``/``index``, or None when this node has no replica."""
        return self._partitions.get((topic, index))

    def hosted(self) -> list[Partition]:
        return list(self._partitions.values())

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def reconcile(
        self, image: MetadataImage, may_delete: bool, may_lead: bool = True
    ) -> list[tuple[Partition, ReplicaRole]]:
        """Host exactly the partitions ``image`` assigns to this node (see the module doc),
        as ``ReconcileStep`` says; return each hosted replica with its role, for the caller
        to take on the loop (``Partition.become``). A new leadership's epoch is recorded in
        the log here, only when the node ``may_lead`` (it will take the role). A replica of
        another topic of the same name takes no role until it may be removed."""
        node_id = self.config.node_id
        with self._reconcile_lock:
            if self.offline_problem:
                self._close_all()
                return []
            step = ReconcileStep(node_id)
            current = dict(self._partitions)
            hosting = step.hosting(image, {k: p.topic_id for k, p in current.items()})
            wanted = hosting.assigned
            changed = False
            roles: list[tuple[Partition, ReplicaRole]] = []
            log_configs: dict[str, LogConfig] = {}
            for key in hosting.remove:
                if not may_delete:
                    continue
                self._remove(current.pop(key))
                changed = True
            for key, (topic, state) in wanted.items():
                if self.is_offline():  # an open just failed: open no more
                    break
                hosted = current.get(key)
                if hosted is not None and hosted.topic_id != topic.topic_id:
                    continue  # another topic's, kept until deletes may run
                if hosted is None:
                    hosted = self._open(
                        topic.name, topic.topic_id, state.partition, topic.configs, may_delete
                    )
                    if hosted is None:
                        continue
                    current[key] = hosted
                    changed = True
                log_config = log_configs.get(topic.topic_id)
                if log_config is None:
                    log_config = log_configs[topic.topic_id] = self.config.log_config(topic.configs)
                if hosted.log_config != log_config:  # the topic's settings were altered
                    hosted.log_config = log_config
                    hosted.max_message_bytes = log_config.max_message_bytes
                    hosted.log.config = log_config
                    hosted.fsync_on_append = log_config.flush_policy is FlushPolicy.ACK
                role = step.role(state, hosted.log.latest_epoch, may_lead)
                take_role(hosted, topic.configs, role, self.config.min_insync_replicas)
                roles.append((hosted, role))
            if changed:
                self._partitions = current
            if self.is_offline():
                self._close_all()
                return []
        if may_delete:
            # Keep every folder the image assigns here, even one that failed to open.
            self._remove_strays(set(self._partitions) | set(wanted))
        return roles

    def _open(
        self,
        topic: str,
        topic_id: str,
        index: int,
        configs: Mapping[str, str],
        may_delete: bool,
    ) -> Partition | None:
        folder = self._partition_dir(topic, index)
        meta = folder / PARTITION_META_FILE
        damage = ""
        if folder.exists():
            found = read_partition_metadata(meta)
            if found is None and not meta.exists() and _holds_no_records(folder):
                found = topic_id  # created here, stopped before its metadata was written
            if found is None:
                if not may_delete:
                    return None  # decide once the image is current
                aside = self._set_aside(folder)
                damage = f"unreadable partition metadata: the folder was set aside in {aside}"
                _log.error(
                    "the partition metadata of %s-%d is unreadable: its folder is set aside in "
                    "%s (not deleted) and the replica starts empty (a follower fetches it "
                    "again from its leader)",
                    topic,
                    index,
                    aside,
                )
            elif found != topic_id:
                if not may_delete:
                    return None  # decide once the image is current
                _log.warning("removing %s: it holds topic id %s, not %s", folder, found, topic_id)
                self._discard(folder, str(found))
        log_config = self.config.log_config(configs)
        if self._files_left() < FILES_PER_PARTITION:
            # Opening it could starve the node of files for connections and its own
            # journal (a node out of files accepts nothing and cannot stop cleanly).
            _log.error(
                "cannot host %s-%d: the node is at its open-file limit (%d); raise the limit "
                "(ulimit -n) or move partitions away",
                topic,
                index,
                _open_files_limit(),
            )
            return None
        try:
            log = FileLog(folder, log_config, now_ms())
        except OSError as exc:
            self.storage_failed(f"opening the log of {topic}-{index} failed: {exc}")
            return None
        log.on_storage_failure = self._log_failed
        log.slow_append_s = self.config.raft_election_timeout_ms / 2000
        log.on_slow_append = self._log_slow
        try:
            if not meta.exists():
                write_atomically(meta, partition_metadata(topic_id))
        except OSError as exc:
            log.abandon()
            self.storage_failed(f"writing {meta} failed: {exc}")
            return None
        partition = Partition(
            topic,
            index,
            log,
            log_config,
            fsync_on_append=log_config.flush_policy is FlushPolicy.ACK,
            topic_id=topic_id,
            min_insync_replicas=int(
                configs.get("min_insync_replicas", self.config.min_insync_replicas)
            ),
            directory=folder,
        )
        partition.damage = damage
        return partition

    def _remove(self, partition: Partition) -> None:
        partition.close()
        partition.log.close()
        self._discard(self._partition_dir(partition.topic, partition.index), partition.topic_id)
        _log.info("removed the replica of %s-%d", partition.topic, partition.index)

    def _set_aside(self, folder: Path) -> Path:
        """Move ``folder`` into ``data_dir/damaged/`` (kept, never deleted by the node)."""
        target = self.data_dir / DAMAGED_DIR / f"{folder.name}.{now_ms()}"
        target.parent.mkdir(exist_ok=True)
        folder.rename(target)
        return target

    def _discard(self, folder: Path, tag: str) -> None:
        target = folder.with_name(f"{folder.name}.{tag}{DELETE_SUFFIX}")
        try:
            folder.rename(target)
        except OSError:
            target = folder
        threading.Thread(
            target=shutil.rmtree, args=(target, True), name="delete-log", daemon=True
        ).start()

    def _remove_strays(self, hosted: set[tuple[str, int]]) -> None:
        names = {f"{topic}-{index}" for topic, index in hosted}
        for child in self.data_dir.iterdir():
            if not child.is_dir() or child.name in (RAFT_DIR, DAMAGED_DIR) or child.name in names:
                continue
            meta = child / PARTITION_META_FILE
            has_meta = not child.name.endswith(DELETE_SUFFIX) and meta.exists()
            if has_meta and read_partition_metadata(meta) is None:
                aside = self._set_aside(child)
                _log.error("%s has unreadable partition metadata: set aside in %s", child, aside)
                continue
            if child.name.endswith(DELETE_SUFFIX) or meta.exists():
                _log.warning("removing %s: no partition of this node owns it", child)
                shutil.rmtree(child, ignore_errors=True)

    # ------------------------------------------------------------------ maintenance

    def run_retention(self, now: int) -> int:
        deleted = 0
        for partition in self.hosted():
            try:
                deleted += partition.log.delete_expired(now)
            except HeadwaterError:
                continue  # deleted concurrently
        return deleted

    def _maintain(self) -> None:
        """Background: retention every retention_check_interval_ms, interval flushes,
        high-watermark checkpoints; while the folder is offline, only the check that
        brings it back (every LOG_DIR_PROBE_S)."""
        next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1000
        next_checkpoint = time.monotonic() + HIGH_WATERMARK_CHECKPOINT_S
        next_probe = 0.0
        while not self._stop.wait(0.1):
            if self.offline_problem:
                if time.monotonic() >= next_probe:
                    next_probe = time.monotonic() + LOG_DIR_PROBE_S
                    self._maybe_bring_online()
                continue
            if time.monotonic() >= next_checkpoint:
                next_checkpoint = time.monotonic() + HIGH_WATERMARK_CHECKPOINT_S
                for partition in self.hosted():
                    try:
                        partition.maybe_checkpoint_high_watermark()
                    except OSError as exc:
                        self.storage_failed(
                            f"checkpointing the high watermark of {partition.topic}-"
                            f"{partition.index} failed: {exc}"
                        )
            for partition in self.hosted():
                log = partition.log
                if isinstance(log, FileLog) and log.config.flush_policy is FlushPolicy.INTERVAL:
                    try:
                        log.maybe_flush(now_ms())
                    except HeadwaterError as exc:
                        _log.debug("flush of %s failed: %s", log.directory, exc)
            if time.monotonic() >= next_retention:
                self.run_retention(now_ms())
                next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1000

    # ------------------------------------------------------------------ log-directory failure

    def disk_slow(self) -> bool:
        """Did an append to a hosted log take longer than half the Raft election timeout
        in the last DISK_SLOW_HOLD_S? (The metadata quorum then keeps this voter from
        standing for election first, and a controller here hands the role over: the
        node's event loop, which answers the brokers' heartbeats, waits on those writes.)"""
        return time.monotonic() < self._slow_until

    def _log_slow(self, log: FileLog, took: float) -> None:
        """A FileLog's append was slow (its lock is held: a flag and a log line)."""
        now = time.monotonic()
        if now >= self._slow_until:
            _log.warning(
                "an append to %s took %.2f s: the data folder %s counts as slow for %g s",
                log.directory.name,
                took,
                self.data_dir,
                DISK_SLOW_HOLD_S,
            )
        self._slow_until = now + DISK_SLOW_HOLD_S

    def is_offline(self) -> bool:
        """Is the data folder offline (``offline_problem`` set, by any thread)?"""
        return bool(self.offline_problem)

    def _log_failed(self, log: FileLog, _exc: OSError) -> None:
        """A FileLog's write failed (its lock is held: only flags are set here)."""
        self.storage_failed(f"{log.directory.name}: {log.failure}")

    def storage_failed(self, problem: str) -> None:
        """A write to the data folder failed: take it offline (see the module doc); the
        first failure is reported, once, at ERROR."""
        with self._offline_lock:
            if self.offline_problem or self._stop.is_set():
                return
            self.offline_problem = f"{self.data_dir}: {problem}"[:300]
        _log.error(
            "the data folder %s is offline: %s. Its replicas stop here and the controller "
            "moves their leadership to in-sync replicas on other nodes; the node brings the "
            "folder back by itself once it has %d bytes free and a test write there works "
            "(free now: %s)",
            self.data_dir,
            problem,
            self.config.log_dir_free_bytes_min,
            _free_bytes_text(self.data_dir),
        )
        self._changed()

    def _maybe_bring_online(self) -> bool:
        """Bring the offline folder back when it has room and a test file can be written
        and fsynced there (checked, not assumed); True when it did."""
        needed = self.config.log_dir_free_bytes_min
        try:
            if shutil.disk_usage(self.data_dir).free < needed + self._reserves_given_back:
                return False
            probe = self.data_dir / PROBE_FILE
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                size = max(min(needed, LOG_DIR_PROBE_BYTES_MAX), 1)
                written = os.write(fd, b"\0" * size)
                os.fsync(fd)
            finally:
                os.close(fd)
                probe.unlink(missing_ok=True)
            if written != size:
                return False
        except OSError as exc:
            _log.debug("the data folder %s is still offline: %s", self.data_dir, exc)
            return False
        with self._offline_lock:
            problem, self.offline_problem = self.offline_problem, ""
            self._reserves_given_back = 0
        _log.warning(
            "the data folder %s is online again (it was offline: %s; free now: %s): its "
            "logs are opened again and their replicas catch up as followers",
            self.data_dir,
            problem,
            _free_bytes_text(self.data_dir),
        )
        self._changed()
        return True

    def _changed(self) -> None:
        listener = self.on_log_dir_change
        if listener is not None:
            listener()

    def _close_all(self) -> None:
        """Close every hosted log (the folder went offline): cleanly where it can, and
        only in memory where its files cannot be written; no folder is deleted."""
        closing, self._partitions = self._partitions, {}
        for partition in closing.values():
            if isinstance(partition.log, FileLog):
                self._reserves_given_back += partition.log.reserve_bytes
            partition.close()
            try:
                partition.log.close()
            except Exception:  # the others are closed whatever one of them does
                _log.exception("closing the log of %s-%d failed", partition.topic, partition.index)
        if closing:
            _log.warning(
                "closed the %d partition log(s) of the offline data folder %s",
                len(closing),
                self.data_dir,
            )

    def clean_once(self) -> CleanResult | None:
        """Clean the compacted partition with the largest dirty ratio, if one has reached
        its topic's min_cleanable_dirty_ratio (below its high watermark only: nothing a
        truncation may cut is ever cleaned). The result of the pass, or None."""
        now = now_ms()
        best: tuple[float, Partition] | None = None
        for partition in self.hosted():
            log = partition.log
            if not isinstance(log, FileLog) or not log.config.compacted:
                continue
            if self._cleaner_failed.get(log, 0) > time.monotonic():
                continue  # its last pass failed: the others go first for a while
            if self._is_damaged(log):
                continue  # a pass would stop at the same damage
            ratio = log.cleanable_ratio(now, partition.high_watermark)
            wanted = ratio > 0 and ratio >= log.config.min_cleanable_dirty_ratio
            if wanted and (best is None or ratio > best[0]):
                best = (ratio, partition)
        if best is None:
            return None
        partition = best[1]
        assert isinstance(partition.log, FileLog)
        try:
            result = clean(
                partition.log,
                now,
                partition.high_watermark,
                self.config.log_cleaner_keys_max,
                self.cleaner_throttle,
            )
        except CleaningStoppedError:
            raise
        except DamagedSegmentError as exc:
            self._damaged[partition.log] = exc.segment
            _log.error(
                "cleaning %s-%d stopped: %s; the partition is not cleaned while offsets "
                "[%d, %d) are in its log (until retention or a truncation removes them, "
                "the topic is deleted, or the node restarts); readers get CORRUPT_MESSAGE "
                "there",
                partition.topic,
                partition.index,
                exc,
                exc.base_offset,
                exc.next_offset,
            )
            return None
        except Exception as exc:  # this partition waits; the others are cleaned meanwhile
            if isinstance(exc, OSError):  # writing the cleaned copies failed
                self.storage_failed(f"cleaning {partition.topic}-{partition.index} failed: {exc}")
            expected = isinstance(exc, CleaningAbortedError | HeadwaterError | OSError)
            _log.warning(
                "cleaning %s-%d stopped (next try in %g s): %s",
                partition.topic,
                partition.index,
                CLEANER_RETRY_S,
                exc,
                exc_info=not expected,
            )
            self._cleaner_failed[partition.log] = time.monotonic() + CLEANER_RETRY_S
            return None
        if result is not None:
            _log.info(
                "cleaned %s-%d below offset %d: %d segment(s), %d -> %d bytes, %d records removed",
                partition.topic,
                partition.index,
                result.cleaned_offset,
                result.segments,
                result.bytes_before,
                result.bytes_after,
                result.records_removed,
            )
        return result

    def uncleanable_partitions(self) -> int:
        """Hosted compacted partitions the cleaner leaves alone because a segment of
        theirs cannot be decoded (``headwater_log_cleaner_uncleanable_partitions``)."""
        return sum(
            1
            for log in (partition.log for partition in self.hosted())
            if isinstance(log, FileLog) and log.config.compacted and self._is_damaged(log)
        )

    def _is_damaged(self, log: FileLog) -> bool:
        damaged = self._damaged.get(log)
        return damaged is not None and log.holds_segment(damaged)

    def _run_cleaner(self) -> None:
        """Background: clean one partition after another; wait log_cleaner_backoff_ms
        when none needs it."""
        while not self._stop.is_set():
            try:
                result = self.clean_once()
            except CleaningStoppedError:
                return
            except Exception:  # a bug in a pass must not stop cleaning for good
                _log.exception("the log cleaner failed; it tries again after a pause")
                result = None
                self._stop.wait(CLEANER_RETRY_S)
            if result is None:
                self._stop.wait(self.config.log_cleaner_backoff_ms / 1000)

    def close(self) -> None:
        """Flush and close every log cleanly (writes clean-shutdown markers)."""
        self._stop.set()
        self._maintenance.join(timeout=5)
        self._cleaner.join(timeout=30)
        with self._reconcile_lock:
            for partition in self._partitions.values():
                partition.close()
                try:
                    partition.log.close()
                except Exception:  # every other log is still closed
                    _log.exception(
                        "closing the log of %s-%d failed", partition.topic, partition.index
                    )
            self._partitions = {}
        os.close(self._lock_fd)
