"""``headwater consume``: print values (or KEY<TAB>VALUE) one per line."""

from __future__ import annotations

import time
from typing import BinaryIO

from headwater.client.consumer import Consumer
from headwater.client.positions import TopicPartition


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
) -> int:
    """Print records until ``max_messages`` or ``timeout_ms`` without a record; return the count."""
    printed = 0
    reset = "earliest" if from_beginning else "latest"
    with Consumer(bootstrap, auto_offset_reset=reset, fetch_max_wait_ms=200) as consumer:
        if partition is not None:
            tp = TopicPartition(topic, partition)
            consumer.assign([tp])
            if offset is not None:
                consumer.seek(tp, offset)
        else:
            consumer.assign(topic)
        last_record = time.monotonic()
        while max_messages is None or printed < max_messages:
            wait_ms = 200 if timeout_ms is None else min(200, timeout_ms)
            result = consumer.poll(timeout_ms=wait_ms)
            lines = []
            for record in result:
                value = record.value if record.value is not None else b"null"
                if print_key:
                    key = record.key if record.key is not None else b"null"
                    lines.append(key + b"\t" + value)
                else:
                    lines.append(value)
                printed += 1
                if max_messages is not None and printed >= max_messages:
                    break
            if lines:
                out.write(b"\n".join(lines) + b"\n")
                out.flush()
                last_record = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
                break
    return printed
