"""SIGKILL while producing: nothing acknowledged is lost; restart recovers quickly."""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from pathlib import Path

from headwater.client import Admin, Consumer, Producer
from headwater.errors import HeadwaterError
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
                    lambda batch, value=value: (
                        batch.error is None
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
