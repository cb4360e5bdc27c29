"""``headwater produce``: one record per input line, every future checked before exit."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO, Final

import click

from headwater.cli.options import bootstrap_option
from headwater.cli.output import WAIT_NOTE_S, fail
from headwater.client.accumulator import RECORD_BYTES_MAX
from headwater.client.producer import Producer, RecordFuture
from headwater.shared.errors import ErrorCode, HeadwaterError

PENDING_FUTURES_MAX: Final = 65_536
"""Completed futures are pruned once this many are pending, bounding memory on long runs."""


SKIP_CHUNK_BYTES: Final = 1 << 20


@click.command()
@click.argument("topic")
@click.option(
    "--key-separator", metavar="SEP", help="Split each line at the first SEP into key and value."
)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="all", show_default=True)
@click.option("--partition", type=int, default=None, help="Send every record to this partition.")
@click.option(
    "--compression", type=click.Choice(["none", "lz4", "zstd"]), default="none", show_default=True
)
@click.option("--linger-ms", type=click.IntRange(0, 60_000), default=5, show_default=True)
@bootstrap_option
def produce(
    topic: str,
    key_separator: str | None,
    acks: str,
    partition: int | None,
    compression: str,
    linger_ms: int,
    bootstrap: str | None,
) -> None:
    """Send one record per line of standard input to TOPIC.

    Exits with status 1 if any record was not acknowledged.
    """
    separator = key_separator.encode() if key_separator is not None else None
    sent, failed, first_error = produce_lines(
        sys.stdin.buffer, topic, separator, acks, partition, compression, linger_ms, bootstrap
    )
    if failed:
        fail(f"{failed} of {sent + failed} records not acknowledged; first error: {first_error}")


def bounded_lines(stream: BinaryIO, limit: int) -> Iterator[bytes | None]:
    """Each line of ``stream`` without its newline, or None for a line of more than
    ``limit`` bytes: lines are read in chunks of SKIP_CHUNK_BYTES, and a line is dropped
    as soon as it passes ``limit``, so it is never held whole (nor copied)."""
    while True:
        pieces: list[bytes] = []
        held = 0
        while True:
            piece = stream.readline(SKIP_CHUNK_BYTES)
            if not piece:
                break
            if piece.endswith(b"\n"):
                held += len(piece) - 1
                pieces.append(piece[:-1] if held <= limit else b"")
                break
            held += len(piece)
            if held > limit:
                pieces.clear()  # too long: give the memory back, read on to its end
            else:
                pieces.append(piece)
        if not piece and held == 0 and not pieces:
            return
        if held > limit:
            yield None
        else:
            yield pieces[0] if len(pieces) == 1 else b"".join(pieces)
        if not piece:
            return


def flush_telling_why(producer: Producer, unsettled: Callable[[], int]) -> None:
    """``producer.flush()``, saying once on stderr what it waits for when that takes
    longer than WAIT_NOTE_S (a partition whose leader died waits for the controller to
    elect another, after the broker session timeout)."""
    told = False
    while True:
        try:
            producer.flush(timeout_s=WAIT_NOTE_S)
            return
        except HeadwaterError as error:
            if error.code is not ErrorCode.REQUEST_TIMED_OUT:
                raise
        if not told:
            told = True
            click.echo(
                f"waiting for {unsettled()} record(s) to be acknowledged: a partition whose "
                "leader is unreachable waits for a new leader (the producer retries for up "
                f"to {producer.delivery_timeout_s:.0f} s)",
                err=True,
            )


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
        for number, line in enumerate(bounded_lines(lines, RECORD_BYTES_MAX), start=1):
            if line is None:
                failed += 1
                first_error = first_error or str(
                    HeadwaterError(
                        ErrorCode.MESSAGE_TOO_LARGE,
                        f"line {number} is more than {RECORD_BYTES_MAX} bytes, the largest "
                        "record a node takes",
                    )
                )
                continue
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
        flush_telling_why(producer, lambda: sum(1 for f in pending if not f.done()))
        settle(pending, wait=True)
    return acknowledged, failed, first_error
