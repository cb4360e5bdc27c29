"""``headwater consume``: print values (or KEY<TAB>VALUE) one per line.

With ``--group`` the consumer is a member of that consumer group: it reads its share of
the topic's partitions from the group's committed offsets, and commits what it printed
(at-least-once). On exit (``--max-messages``, ``--timeout-ms``, Ctrl-C or SIGTERM) it
commits the offsets of exactly what it printed and leaves the group, so that its
partitions move to the other members at once.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import BinaryIO, Final

from headwater.client.consumer import Consumer, ConsumerRecord
from headwater.client.positions import TopicPartition
from headwater.errors import ErrorCode, HeadwaterError


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    del signum, frame
    raise KeyboardInterrupt  # the consumer's close() then commits and leaves


def consume_lines(
    out: BinaryIO,
    topic: str,
    from_beginning: bool,
    partition: int | None,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int | None,
    print_key: bool,
    bootstrap: str | None,
    group: str | None = None,
) -> int:
    """Print records until ``max_messages`` or ``timeout_ms`` without a record; return the count."""
    printed = 0
    reset = "earliest" if from_beginning else "latest"
    if group is not None:
        signal.signal(signal.SIGTERM, _stop_on_sigterm)
    with Consumer(bootstrap, auto_offset_reset=reset, fetch_max_wait_ms=200) as consumer:
        if group is not None:
            consumer.subscribe(topic, group_id=group)
        elif partition is not None:
            tp = TopicPartition(topic, partition)
            _while_starting(lambda: consumer.assign([tp]), timeout_ms)
            if offset is not None:
                consumer.seek(tp, offset)
        else:
            _while_starting(lambda: consumer.assign(topic), timeout_ms)
        last_record = time.monotonic()
        while max_messages is None or printed < max_messages:
            wait_ms = 200 if timeout_ms is None else min(200, timeout_ms)
            records = iter(consumer.poll(timeout_ms=wait_ms))
            lines = []
            for record in records:
                lines.append(_line(record, print_key))
                printed += 1
                if max_messages is not None and printed >= max_messages:
                    if group is not None:
                        _rewind(consumer, records)
                    break
            if lines:
                out.write(b"\n".join(lines) + b"\n")
                out.flush()
                last_record = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
                break
    return printed


STARTING_RETRY_S: Final = 0.1


def _while_starting(assign: Callable[[], None], timeout_ms: int | None) -> None:
    """``assign``, again while the node answers LEADER_NOT_AVAILABLE (it is starting and
    has not caught up with the cluster metadata: it says to retry), for up to
    ``timeout_ms`` (30 s without one). Any other error is raised at once: an unknown
    topic is named without waiting."""
    deadline = time.monotonic() + (30.0 if timeout_ms is None else timeout_ms / 1000)
    while True:
        try:
            assign()
            return
        except HeadwaterError as error:
            if error.code is not ErrorCode.LEADER_NOT_AVAILABLE or time.monotonic() >= deadline:
                raise
        time.sleep(STARTING_RETRY_S)


def _line(record: ConsumerRecord, print_key: bool) -> bytes:
    value = record.value if record.value is not None else b"null"
    if not print_key:
        return value
    key = record.key if record.key is not None else b"null"
    return key + b"\t" + value


def _rewind(consumer: Consumer, unprinted: Iterator[ConsumerRecord]) -> None:
    """Move each partition back to its first record that was handed out but not printed,
    so that the commit on close covers exactly what was printed."""
    first: dict[TopicPartition, int] = {}
    for record in unprinted:
        tp = TopicPartition(record.topic, record.partition)
        first.setdefault(tp, record.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)
