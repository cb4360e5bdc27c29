"""SIGKILL while producing: nothing acknowledged is lost; restart recovers quickly."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from headwater.client import Admin, Consumer, Producer
from headwater.log.api import FlushPolicy, LogConfig
from headwater.log.batch import encode_batch
from headwater.log.file_log import FileLog
from headwater.shared.errors import HeadwaterError
from tests.node_process import NodeProcess, wait_until


def read_values(address: str, topic: str, expected_at_least: int) -> list[bytes]:
    values: list[bytes] = []
    with Consumer(address, auto_offset_reset="earliest") as consumer:
        consumer.assign(topic)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            got = [r.value for r in consumer.poll(timeout_ms=500)]
            values += got
            if not got and len(values) >= expected_at_least:
                break
    return values


def produce_until_killed(node: NodeProcess, topic: str, acks: str) -> set[bytes]:
    acknowledged: set[bytes] = set()
    lock = threading.Lock()
    stop = threading.Event()

    def run() -> None:
        producer = Producer(
            node.address, acks=acks, linger_ms=1, retries=0, request_timeout_ms=5000
        )
        i = 0
        try:
            while not stop.is_set():
                value = f"v{i}".encode()
                future = producer.send(topic, value)
                future.add_done_callback(
                    lambda done, value=value: (
                        done.exception(0) is None
                        and (lock.acquire(), acknowledged.add(value), lock.release())
                    )
                )
                i += 1
                if i % 200 == 0:
                    time.sleep(0.001)
        except HeadwaterError:
            pass
        finally:
            with contextlib.suppress(HeadwaterError):
                producer.close(timeout_s=10)

    thread = threading.Thread(target=run)
    thread.start()
    wait_until(lambda: len(acknowledged) > 3000, 30, "acknowledged records before the kill")
    node.kill(signal.SIGKILL)
    stop.set()
    thread.join(timeout=30)
    with lock:
        return set(acknowledged)


def test_sigkill_during_produce_with_fsync_before_ack_loses_nothing_acknowledged(
    tmp_path: Path,
) -> None:
    node = NodeProcess(tmp_path / "data")
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic(
                "durable", 1, configs={"flush_policy": "ack", "segment_bytes": "65536"}
            )
        acknowledged = produce_until_killed(node, "durable", acks="all")
        node.start()
        values = read_values(node.address, "durable", len(acknowledged))
        assert acknowledged <= set(values), (
            f"{len(acknowledged - set(values))} acknowledged records lost"
        )
        assert len(values) == len(set(values)), "a record appears twice"
        # The log continues after recovery.
        with Producer(node.address) as producer:
            meta = producer.send("durable", b"after-restart").result(timeout=30)
        assert meta.offset == len(values)
    finally:
        node.kill()


def test_sigkill_with_os_flush_keeps_data_written_before_the_crash(tmp_path: Path) -> None:
    """flush_policy os: a process crash (not a power loss) loses nothing acknowledged."""
    node = NodeProcess(tmp_path / "data")
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("pagecache", 2)
        acknowledged = produce_until_killed(node, "pagecache", acks="1")
        node.start()
        values = read_values(node.address, "pagecache", len(acknowledged))
        assert acknowledged <= set(values)
    finally:
        node.kill()


def _unsynced_after_each_append(directory: Path, policy: FlushPolicy, monkeypatch: Any) -> int:
    """Appends 30 batches (rolling segments) to a log with ``policy``, recording every
    write and fdatasync the process makes; returns how many appends returned while a
    file they wrote had not been fdatasync'ed since the write."""
    events: list[tuple[str, str]] = []
    real_writev, real_fdatasync = os.writev, os.fdatasync

    def path_of(fd: int) -> str:
        return os.readlink(f"/proc/self/fd/{fd}")

    def writev(fd: int, parts: Any) -> int:
        events.append(("write", path_of(fd)))
        return real_writev(fd, parts)

    def fdatasync(fd: int) -> None:
        events.append(("sync", path_of(fd)))
        real_fdatasync(fd)

    monkeypatch.setattr(os, "writev", writev)
    monkeypatch.setattr(os, "fdatasync", fdatasync)
    log = FileLog(directory, LogConfig(flush_policy=policy, segment_bytes=4096), now_ms=0)
    unsynced = 0
    try:
        for i in range(30):
            events.clear()
            log.append(encode_batch([b"%d" % i * 200]), 0, 0)
            pending = set()
            for kind, path in events:
                if kind == "write":
                    pending.add(path)
                else:
                    pending.discard(path)
            unsynced += bool(pending) or not any(kind == "write" for kind, _ in events)
    finally:
        monkeypatch.undo()
        log.close()
    return unsynced


def test_flush_policy_ack_syncs_each_batch_before_the_append_returns(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Issue 12: the SIGKILL test above passes with the fsync removed (a killed process
    leaves its writes in the page cache). This one sees the system calls: with
    flush_policy ack every batch's bytes are fdatasync'ed before the append returns, and
    the same check finds the gap when they are not (flush_policy os)."""
    assert _unsynced_after_each_append(tmp_path / "ack", FlushPolicy.ACK, monkeypatch) == 0
    assert _unsynced_after_each_append(tmp_path / "os", FlushPolicy.OS, monkeypatch) == 30
