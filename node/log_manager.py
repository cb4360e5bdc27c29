"""The topics and partition logs of one node, persisted under ``data_dir``.

Layout::

    data_dir/
      .lock                     flock held while a node uses the folder
      meta.json                 {"cluster_id": ..., "node_id": ..., "format": 1}
      topics.json               {"topics": [TopicRecord JSON, ...]}, replaced atomically
      <topic>-<partition>/      one FileLog per partition
      <topic>-<partition>.<topic_id>-delete/   being removed after DeleteTopics

A topic exists once topics.json names it; partition folders are created before that
write and removed after the deleting write, so a crash between the two leaves at worst a
stray folder, which start-up removes.

Thread-safety: ``_lock`` guards the topic map; each Partition guards itself.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from headwater.config import NodeConfig, parse_topic_configs
from headwater.errors import ErrorCode, HeadwaterError
from headwater.log.api import FlushPolicy
from headwater.log.file_log import FileLog, write_atomically
from headwater.node.partition import Partition
from headwater.node.topics import TopicRecord, check_topic_name, unknown_topic

TOPICS_FILE: Final = "topics.json"
META_FILE: Final = "meta.json"
LOCK_FILE: Final = ".lock"
DELETE_SUFFIX: Final = "-delete"

_log = logging.getLogger(__name__)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


class DataDirError(Exception):
    """The data folder cannot be used; the message says why (the node does not start)."""


class LogManager:
    def __init__(self, config: NodeConfig) -> None:
        self.config = config
        self.data_dir = Path(config.data_dir).resolve()
        self._lock = threading.RLock()
        self._topics: dict[str, TopicRecord] = {}
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._lock_fd = self._open_data_dir()
        self.cluster_id = self._load_meta()
        self._load_topics()
        self._stop = threading.Event()
        self._maintenance = threading.Thread(
            target=self._maintain, name="log-maintenance", daemon=True
        )
        self._maintenance.start()

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

    def _load_meta(self) -> str:
        path = self.data_dir / META_FILE
        if path.exists():
            meta = json.loads(path.read_text())
            if int(meta.get("node_id", self.config.node_id)) != self.config.node_id:
                raise DataDirError(
                    f"data_dir {self.data_dir} belongs to node {meta['node_id']}, not "
                    f"node {self.config.node_id}"
                )
            return str(meta["cluster_id"])
        cluster_id = uuid.uuid4().hex
        write_atomically(
            path,
            json.dumps(
                {"cluster_id": cluster_id, "node_id": self.config.node_id, "format": 1}
            ).encode(),
        )
        return cluster_id

    def _load_topics(self) -> None:
        path = self.data_dir / TOPICS_FILE
        records = []
        if path.exists():
            records = [TopicRecord.from_json(t) for t in json.loads(path.read_text())["topics"]]
        expected = set()
        for record in records:
            self._topics[record.name] = record
            log_config = self.config.log_config(record.configs)
            for p in range(record.partitions):
                folder = self._partition_dir(record.name, p)
                expected.add(folder.name)
                self._partitions[(record.name, p)] = Partition(
                    record.name,
                    p,
                    FileLog(folder, log_config, now_ms()),
                    log_config.max_message_bytes,
                    fsync_on_append=log_config.flush_policy is FlushPolicy.ACK,
                )
        for child in self.data_dir.iterdir():
            if child.is_dir() and child.name not in expected:
                _log.warning("removing %s: no topic owns it", child)
                shutil.rmtree(child, ignore_errors=True)

    def _partition_dir(self, topic: str, partition: int) -> Path:
        return self.data_dir / f"{topic}-{partition}"

    def _write_topics(self) -> None:
        document = {
            "topics": [t.to_json() for t in sorted(self._topics.values(), key=lambda t: t.name)]
        }
        write_atomically(self.data_dir / TOPICS_FILE, json.dumps(document, indent=1).encode())

    # ------------------------------------------------------------------ topics

    def topics(self) -> list[TopicRecord]:
        with self._lock:
            return sorted(self._topics.values(), key=lambda t: t.name)

    def topic(self, name: str) -> TopicRecord:
        record = self._topics.get(name)
        if record is None:
            raise unknown_topic(name)
        return record

    def partition(self, topic: str, index: int) -> Partition:
        record = self.topic(topic)
        record.check_partition(index)
        partition = self._partitions.get((topic, index))
        if partition is None:
            raise unknown_topic(topic)
        return partition

    def check_new_topic(
        self,
        name: str,
        partitions: int | None,
        replication_factor: int | None,
        configs: Mapping[str, str],
    ) -> tuple[int, int, dict[str, str]]:
        """Validate a CreateTopics entry (None: the node's default); return (partitions,
        replication factor, configs)."""
        check_topic_name(name)
        if partitions is None:
            partitions = self.config.default_partitions
        if not 1 <= partitions <= self.config.partitions_max:
            raise HeadwaterError(
                ErrorCode.INVALID_PARTITIONS,
                f"partitions is {partitions}; valid range is [1, {self.config.partitions_max}]",
            )
        if replication_factor is None:
            replication_factor = self.config.default_replication_factor
        brokers = 1
        if not 1 <= replication_factor <= brokers:
            raise HeadwaterError(
                ErrorCode.INVALID_REPLICATION_FACTOR,
                f"replication factor is {replication_factor}; valid range is [1, {brokers}] "
                f"({brokers} broker(s) available)",
            )
        parse_topic_configs(configs, self.config)
        if name in self._topics:
            raise HeadwaterError(ErrorCode.TOPIC_ALREADY_EXISTS, f"topic {name!r} already exists")
        if len(self._topics) >= self.config.topics_max:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                f"the node holds {len(self._topics)} topics, its limit (topics_max)",
            )
        return partitions, replication_factor, dict(configs)

    def create_topic(
        self,
        name: str,
        partitions: int | None,
        replication_factor: int | None,
        configs: Mapping[str, str],
    ) -> TopicRecord:
        with self._lock:
            partitions, replication_factor, overrides = self.check_new_topic(
                name, partitions, replication_factor, configs
            )
            record = TopicRecord(name, uuid.uuid4().hex, partitions, replication_factor, overrides)
            log_config = self.config.log_config(overrides)
            created: list[Partition] = []
            try:
                for p in range(partitions):
                    folder = self._partition_dir(name, p)
                    if folder.exists():
                        shutil.rmtree(folder)
                    log = FileLog(folder, log_config, now_ms())
                    created.append(
                        Partition(
                            name,
                            p,
                            log,
                            log_config.max_message_bytes,
                            fsync_on_append=log_config.flush_policy is FlushPolicy.ACK,
                        )
                    )
                self._topics[name] = record
                self._write_topics()
            except OSError as exc:
                self._topics.pop(name, None)
                for partition in created:
                    partition.log.close()
                    shutil.rmtree(self._partition_dir(name, partition.index), ignore_errors=True)
                raise HeadwaterError(
                    ErrorCode.KAFKA_STORAGE_ERROR, f"cannot create topic {name!r}: {exc}"
                ) from exc
            for partition in created:
                self._partitions[(name, partition.index)] = partition
            _log.info("created topic %s with %d partition(s)", name, partitions)
            return record

    def delete_topic(self, name: str) -> None:
        with self._lock:
            record = self.topic(name)
            del self._topics[name]
            self._write_topics()
            doomed = []
            for p in range(record.partitions):
                partition = self._partitions.pop((name, p))
                partition.close()
                partition.log.close()
                folder = self._partition_dir(name, p)
                target = folder.with_name(f"{folder.name}.{record.topic_id}{DELETE_SUFFIX}")
                folder.rename(target)
                doomed.append(target)

        def remove() -> None:
            for folder in doomed:
                shutil.rmtree(folder, ignore_errors=True)

        threading.Thread(
            target=remove,
            name=f"delete-{name}",
            daemon=True,
        ).start()
        _log.info("deleted topic %s", name)

    # ------------------------------------------------------------------ maintenance

    def run_retention(self, now: int) -> int:
        with self._lock:
            partitions = list(self._partitions.values())
        deleted = 0
        for partition in partitions:
            try:
                deleted += partition.log.delete_expired(now)
            except HeadwaterError:
                continue  # deleted concurrently
        return deleted

    def _maintain(self) -> None:
        """Background: retention every retention_check_interval_ms, interval flushes."""
        next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1000
        while not self._stop.wait(0.1):
            with self._lock:
                partitions = list(self._partitions.values())
            for partition in partitions:
                log = partition.log
                if isinstance(log, FileLog):
                    try:
                        log.maybe_flush(now_ms())
                    except (HeadwaterError, OSError) as exc:
                        _log.error("flush of %s failed: %s", log.directory, exc)
            if time.monotonic() >= next_retention:
                self.run_retention(now_ms())
                next_retention = time.monotonic() + self.config.retention_check_interval_ms / 1000

    def close(self) -> None:
        """Flush and close every log cleanly (writes clean-shutdown markers)."""
        self._stop.set()
        self._maintenance.join(timeout=5)
        with self._lock:
            for partition in self._partitions.values():
                partition.close()
                partition.log.close()
            self._partitions.clear()
        os.close(self._lock_fd)
