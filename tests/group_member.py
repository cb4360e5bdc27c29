"""A consumer group member as its own process, for the group tests (SIGKILL, SIGSTOP).

    python -m tests.group_member BOOTSTRAP TOPIC GROUP OUT [SESSION_TIMEOUT_MS]

Polls until SIGTERM. For each poll it writes one line per record, ``R partition offset
value``, then commits the positions (manual commit after processing: at-least-once) and
writes ``C partition offset`` per committed partition once the commit returned. A commit
that fails is written as ``F error`` and the member goes on. Rebalances are written as
``A partitions`` (assigned), ``V partitions`` (revoked) and ``L partitions`` (lost), each
a comma-separated list.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import TextIO

from headwater.client import Consumer
from headwater.client.positions import TopicPartition
from headwater.shared.errors import HeadwaterError

stopping = False


class Listener:
    def __init__(self, log: TextIO) -> None:
        self.log = log

    def _write(self, kind: str, partitions: list[TopicPartition]) -> None:
        self.log.write(f"{kind} {','.join(str(p.partition) for p in partitions)}\n")

    def on_assigned(self, partitions: list[TopicPartition]) -> None:
        self._write("A", partitions)

    def on_revoked(self, partitions: list[TopicPartition]) -> None:
        self._write("V", partitions)

    def on_lost(self, partitions: list[TopicPartition]) -> None:
        self._write("L", partitions)


def _stop(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    global stopping
    stopping = True


def main() -> None:
    bootstrap, topic, group, out = sys.argv[1:5]
    session_ms = int(sys.argv[5]) if len(sys.argv) > 5 else 0
    signal.signal(signal.SIGTERM, _stop)
    with (
        open(out, "a", buffering=1) as log,
        Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=100) as consumer,
    ):
        consumer.subscribe(
            topic,
            group_id=group,
            enable_auto_commit=False,
            session_timeout_ms=session_ms,
            listener=Listener(log),
        )
        log.write("S started\n")
        while not stopping:
            try:
                result = consumer.poll(timeout_ms=200)
            except HeadwaterError as error:
                log.write(f"F poll {error.code.name}\n")
                continue
            positions: dict[TopicPartition, int] = {}
            lines = []
            for record in result:
                lines.append(f"R {record.partition} {record.offset} {record.value.decode()}\n")
                tp = TopicPartition(record.topic, record.partition)
                positions[tp] = record.offset + 1
            log.write("".join(lines))
            if not positions:
                continue
            try:
                consumer.commit(positions)
            except HeadwaterError as error:
                log.write(f"F commit {error.code.name}\n")
                continue
            log.write("".join(f"C {tp.partition} {o}\n" for tp, o in positions.items()))


if __name__ == "__main__":
    main()
