"""``headwater consume``: print values (or KEY<TAB>VALUE) one per line, each record in a
format of kcat's placeholders (``--format``), or one JSON object a line (``--json``).

With ``--group`` the consumer is a member of that consumer group: it reads its share of
the topic's partitions from the group's committed offsets, and commits what it printed
(at-least-once). On exit (``--max-messages``, ``--timeout-ms``, Ctrl-C or SIGTERM) it
commits the offsets of exactly what it printed and leaves the group, so that its
partitions move to the other members at once.
"""

from __future__ import annotations

import base64
import json
import signal
import sys
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, BinaryIO, Final

import click

from headwater.cli.options import bootstrap_option, json_flag
from headwater.cli.output import WAIT_NOTE_S, fail
from headwater.client.consumer import Consumer, ConsumerRecord
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError


@click.command()
@click.argument("topic")
@click.option(
    "--from-beginning", is_flag=True, help="Start at the earliest offset (default: the end)."
)
@click.option(
    "--partition", type=click.IntRange(min=0), default=None, help="Read only this partition."
)
@click.option(
    "--offset", type=click.IntRange(min=0), default=None, help="Start offset (needs --partition)."
)
@click.option(
    "--max-messages", type=click.IntRange(min=1), default=None, help="Exit after this many records."
)
@click.option(
    "--timeout-ms",
    type=click.IntRange(min=0),
    default=None,
    help="Exit when no record arrives for this long.",
)
@click.option("--print-key", is_flag=True, help="Print KEY<TAB>VALUE.")
@click.option(
    "--format",
    "record_format",
    default=None,
    metavar="FMT",
    help="Print each record in FMT, kcat's -f placeholders: %t topic, %p partition, "
    "%o offset, %k key, %s (or %v) value, %T timestamp (ms), %h headers (k=v,...), "
    "%K and %S key and value lengths; escapes \\n \\t; no newline is added.",
)
@json_flag("Print each record as one JSON object a line.")
@click.option(
    "--group",
    default=None,
    metavar="GROUP",
    help="Read as a member of consumer group GROUP: its share of the partitions, from the "
    "group's committed offsets (else per --from-beginning); commits what it printed, and on "
    "exit (Ctrl-C too) commits and leaves.",
)
@bootstrap_option
def consume(
    topic: str,
    from_beginning: bool,
    partition: int | None,
    offset: int | None,
    max_messages: int | None,
    timeout_ms: int | None,
    print_key: bool,
    record_format: str | None,
    as_json: bool,
    group: str | None,
    bootstrap: str | None,
) -> None:
    """Print TOPIC's records, one value per line (or as --print-key, --format or --json
    say)."""
    if sum((print_key, record_format is not None, as_json)) > 1:
        fail("--print-key, --format and --json do not mix: pick one", status=2)
    try:
        render = renderer(print_key, record_format, as_json)
    except ValueError as error:
        fail(str(error), status=2)
    if offset is not None and partition is None:
        fail("--offset needs --partition", status=2)
    if group is not None and partition is not None:
        fail("--group and --partition do not mix: the group assigns the partitions", status=2)
    consume_lines(
        sys.stdout.buffer,
        topic,
        from_beginning,
        partition,
        offset,
        max_messages,
        timeout_ms,
        print_key,
        bootstrap,
        group,
        render,
    )


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
    render: Callable[[ConsumerRecord], bytes] | None = None,
) -> int:
    """Print records until ``max_messages`` or ``timeout_ms`` without a record; return the
    count. Each record is ``render``ed (default: its value, or KEY<TAB>VALUE with
    ``print_key``, and a newline)."""
    if render is None:
        render = _key_value_line if print_key else _value_line
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
        last_record = began = time.monotonic()
        told = group is None
        while max_messages is None or printed < max_messages:
            wait_ms = 200 if timeout_ms is None else min(200, timeout_ms)
            records = iter(consumer.poll(timeout_ms=wait_ms))
            lines = []
            for record in records:
                lines.append(render(record))
                printed += 1
                if max_messages is not None and printed >= max_messages:
                    if group is not None:
                        _rewind(consumer, records)
                    break
            if lines:
                out.write(b"".join(lines))
                out.flush()
                last_record = time.monotonic()
            elif timeout_ms is not None and (time.monotonic() - last_record) * 1000 >= timeout_ms:
                break
            elif not told and time.monotonic() - began > WAIT_NOTE_S and not consumer.assignment():
                told = True
                click.echo(
                    f"waiting for group {group} to give this member partitions: the "
                    "coordinator moves a partition once its member gives it up (or leaves, "
                    "or misses its session timeout)",
                    err=True,
                )
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


def renderer(print_key: bool, spec: str | None, as_json: bool) -> Callable[[ConsumerRecord], bytes]:
    """How each record is printed: one JSON object a line, kcat's format ``spec``
    (``record_format``), KEY<TAB>VALUE, or the value, each line ending in a newline (a
    format says its own). ValueError for a format that does not parse."""
    if as_json:
        return json_line
    if spec is not None:
        return record_format(spec)
    return _key_value_line if print_key else _value_line


def _value_line(record: ConsumerRecord) -> bytes:
    return (record.value if record.value is not None else b"null") + b"\n"


def _key_value_line(record: ConsumerRecord) -> bytes:
    key = record.key if record.key is not None else b"null"
    return key + b"\t" + (record.value if record.value is not None else b"null") + b"\n"


_ESCAPES: Final = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", "0": "\0"}
PLACEHOLDERS: Final = "tpokKsSvTh%"
"""kcat's ``-f`` placeholders: %t topic, %p partition, %o offset, %k key, %K key length,
%s (or %v) value, %S value length, %T timestamp (ms), %h headers (k=v,...), %% a %."""


def record_format(spec: str) -> Callable[[ConsumerRecord], bytes]:
    """A renderer of ``spec``, kcat's ``-f`` format: its placeholders (PLACEHOLDERS) and
    escapes (\\n \\t \\r \\0 \\\\), nothing added (a line ends where the format says). A
    null key or value prints as nothing, a length as -1. ValueError names an unknown
    placeholder or escape."""
    parts: list[str | bytes] = []  # str: a placeholder letter; bytes: literal text
    text: list[str] = []
    i = 0
    while i < len(spec):
        char = spec[i]
        if char in "%\\" and i + 1 < len(spec):
            following = spec[i + 1]
            if char == "%":
                if following not in PLACEHOLDERS:
                    raise ValueError(
                        f"unknown placeholder %{following} in the format; valid: "
                        + " ".join(f"%{p}" for p in PLACEHOLDERS)
                    )
                if following == "%":
                    text.append("%")
                else:
                    parts.append("".join(text).encode())
                    text = []
                    parts.append(following)
            else:
                if following not in _ESCAPES:
                    raise ValueError(
                        f"unknown escape \\{following} in the format; valid: \\n \\t \\r \\0 \\\\"
                    )
                text.append(_ESCAPES[following])
            i += 2
            continue
        if char in "%\\":
            raise ValueError(f"the format ends with a lone {char}")
        text.append(char)
        i += 1
    parts.append("".join(text).encode())

    def render(record: ConsumerRecord) -> bytes:
        return b"".join(part if isinstance(part, bytes) else _field(record, part) for part in parts)

    return render


def _field(record: ConsumerRecord, letter: str) -> bytes:
    if letter == "t":
        return record.topic.encode()
    if letter == "p":
        return b"%d" % record.partition
    if letter == "o":
        return b"%d" % record.offset
    if letter == "T":
        return b"%d" % record.timestamp_ms
    if letter == "k":
        return record.key or b""
    if letter == "K":
        return b"%d" % (-1 if record.key is None else len(record.key))
    if letter in "sv":
        return record.value or b""
    if letter == "S":
        return b"%d" % (-1 if record.value is None else len(record.value))
    return b",".join(key.encode() + b"=" + (value or b"") for key, value in record.headers)


def json_line(record: ConsumerRecord) -> bytes:
    """One JSON object and a newline: topic, partition, offset, timestamp_ms, key, value
    and headers ([{"key", "value"}]). Bytes that are UTF-8 are strings; others are
    base64, said by a ``*_encoding`` of "base64" beside them (``key_encoding``,
    ``value_encoding``, a header's ``encoding``); null stays null."""
    document: dict[str, Any] = {
        "topic": record.topic,
        "partition": record.partition,
        "offset": record.offset,
        "timestamp_ms": record.timestamp_ms,
    }
    for name, data in (("key", record.key), ("value", record.value)):
        document[name], encoding = _text(data)
        if encoding:
            document[f"{name}_encoding"] = encoding
    headers = []
    for key, data in record.headers:
        value, encoding = _text(data)
        headers.append({"key": key, "value": value, **({"encoding": encoding} if encoding else {})})
    document["headers"] = headers
    return json.dumps(document, ensure_ascii=False).encode() + b"\n"


def _text(data: bytes | None) -> tuple[str | None, str]:
    if data is None:
        return None, ""
    try:
        return data.decode(), ""
    except UnicodeDecodeError:
        return base64.b64encode(data).decode(), "base64"


def _rewind(consumer: Consumer, unprinted: Iterator[ConsumerRecord]) -> None:
    """Move each partition back to its first record that was handed out but not printed,
    so that the commit on close covers exactly what was printed."""
    first: dict[TopicPartition, int] = {}
    for record in unprinted:
        tp = TopicPartition(record.topic, record.partition)
        first.setdefault(tp, record.offset)
    for tp, offset in first.items():
        consumer.seek(tp, offset)
