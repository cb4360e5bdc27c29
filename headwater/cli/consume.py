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
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any, BinaryIO, Final

import click

from headwater.cli.output import WAIT_NOTE_S
from headwater.client.consumer import Consumer, ConsumerRecord
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError


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
