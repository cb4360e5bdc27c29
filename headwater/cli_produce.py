"""``headwater produce``: one record per input line, every future checked before exit."""

from __future__ import annotations

from typing import BinaryIO, Final

from headwater.client.producer import Producer, RecordFuture
from headwater.errors import HeadwaterError

PENDING_FUTURES_MAX: Final = 65_536
"""Completed futures are pruned once this many are pending, bounding memory on long runs."""


def produce_lines(
    lines: BinaryIO,
    topic: str,
    separator: bytes | None,
    acks: str,
    partition: int | None,
    compression: str,
    linger_ms: int,
    bootstrap: str | None,
) -> tuple[int, int, str]:
    """Send every line; return (acknowledged, failed, first error message)."""
    acknowledged = failed = 0
    first_error = ""
    pending: list[RecordFuture] = []

    def settle(futures: list[RecordFuture], wait: bool) -> list[RecordFuture]:
        nonlocal acknowledged, failed, first_error
        still = []
        for future in futures:
            if not wait and not future.done():
                still.append(future)
                continue
            error = future.exception()
            if error is None:
                acknowledged += 1
            else:
                failed += 1
                first_error = first_error or str(error)
        return still

    with Producer(bootstrap, acks=acks, compression=compression, linger_ms=linger_ms) as producer:
        for number, raw in enumerate(lines, start=1):
            line = raw[:-1] if raw.endswith(b"\n") else raw
            key = None
            if separator is not None:
                key, sep, value = line.partition(separator)
                if not sep:
                    failed += 1
                    first_error = (
                        first_error or f"line {number} has no key separator {separator.decode()!r}"
                    )
                    continue
            else:
                value = line
            try:
                pending.append(producer.send(topic, value, key=key, partition=partition))
            except HeadwaterError as error:
                # send() itself failed: records cannot even be routed (unknown topic, no
                # node reachable, buffer full), so stop reading instead of failing each line.
                failed += 1
                first_error = first_error or f"{error} (stopped at line {number})"
                break
            if len(pending) >= PENDING_FUTURES_MAX:
                pending = settle(pending, wait=False)
        producer.flush()
        settle(pending, wait=True)
    return acknowledged, failed, first_error
