"""The history of a chaos run: what the workload did and saw, as frozen values (pure).

A history is a sequence of events in the order the runner recorded them. The checker
(``headwater.tools.chaos.checker``) reads four kinds:

- ``Send``: one record a producer sent, with a value unique in the run, and its outcome:
  ``ok`` with the (partition, offset) the broker acknowledged, ``fail`` when the record
  was certainly not appended (an error answer that the broker gives only before an
  append, with no earlier attempt whose outcome is unknown), or ``info`` when it may or
  may not have been appended (a timeout, a lost connection, a retried request, the run
  ending first). An ``ok`` without an offset is a send acknowledged at an offset the
  client was not told: librdkafka's idempotent producer reports success without an
  offset for a message whose own request's answer it never got once a later batch of
  the partition succeeded (the broker accepts sequences only in order, so the earlier
  one was appended: an "implicit ack"), and for a retry the broker answered
  DUPLICATE_SEQUENCE_NUMBER (appended before, its offsets no longer known); the value
  must then be in its partition, somewhere.
  ``index`` is the send's place in its producer's send order (0, 1, ...):
  events are recorded when a send completes, which is not the order they were sent in.
  ``may_resend`` is False for a producer that makes one attempt per record.
  ``epoch_bumped`` is True for a send still unanswered when its producer bumped its
  producer epoch (librdkafka does, producer-wide, after some errors): librdkafka then
  sends it again under the new epoch with a new sequence, which no broker can tell from
  a new record if an earlier attempt was appended.
- ``Poll``: the records one ``Consumer.poll`` returned, in the order returned.
- ``Seek``: a consumer moved its position on a partition (the next record it reads
  there should be at ``offset``). A consumer's polls and seeks are in history order.
- ``FinalRead``: every record of one partition, from its log start to its high
  watermark ``end_offset`` (exclusive), read after the faults healed and every replica
  was back in sync.

``Nemesis`` and ``Note`` events describe the faults and what the runner noticed; the
checker ignores them, people reading a kept history do not.

Serialization: one JSON object per event (``to_json``/``from_json``), written one per
line (JSON lines). ``time_ms`` is milliseconds since the run started (informative only;
the checker never looks at it).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "Event",
    "FinalRead",
    "Nemesis",
    "Note",
    "Outcome",
    "Poll",
    "Record",
    "Seek",
    "Send",
    "from_json",
    "parse_lines",
    "to_json",
]


class Outcome(enum.StrEnum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Send:
    """One record sent by ``producer``; ``offset`` is set only if ``outcome`` is OK (an
    OK without one: acknowledged at an unknown offset)."""

    producer: str
    index: int
    partition: int
    value: str
    outcome: Outcome
    offset: int | None = None
    error: str = ""
    time_ms: int = 0
    may_resend: bool = True
    """False when the producer sends each record in one attempt (``retries=0``): then the
    value can be at two offsets only if a node appended one request twice."""
    epoch_bumped: bool = False
    """Unanswered when its producer bumped its epoch, so possibly sent again under the
    new epoch (see the module docstring)."""

    def __post_init__(self) -> None:
        assert self.index >= 0
        assert self.offset is None or self.outcome is Outcome.OK, self


@dataclass(frozen=True, slots=True, order=True)
class Record:
    """A record as read: its partition, offset and value."""

    partition: int
    offset: int
    value: str


@dataclass(frozen=True, slots=True)
class Poll:
    consumer: str
    records: tuple[Record, ...]
    time_ms: int = 0


@dataclass(frozen=True, slots=True)
class Seek:
    consumer: str
    partition: int
    offset: int
    time_ms: int = 0


@dataclass(frozen=True, slots=True)
class FinalRead:
    """All of ``partition`` in [log start, ``end_offset``), in offset order."""

    partition: int
    records: tuple[Record, ...]
    end_offset: int
    time_ms: int = 0

    def __post_init__(self) -> None:
        assert all(r.partition == self.partition for r in self.records), self


@dataclass(frozen=True, slots=True)
class Nemesis:
    """A fault cycle's ``phase`` ("start" or "end"): which nemesis, on which nodes."""

    cycle: int
    name: str
    phase: str
    nodes: tuple[int, ...] = ()
    detail: str = ""
    time_ms: int = 0


@dataclass(frozen=True, slots=True)
class Note:
    """Something the runner noticed (a consumer reset, a node slow to recover, ...)."""

    text: str
    time_ms: int = 0


Event = Send | Poll | Seek | FinalRead | Nemesis | Note


def _records_json(records: Iterable[Record]) -> list[list[Any]]:
    return [[r.partition, r.offset, r.value] for r in records]


def _records_from(rows: Iterable[Any]) -> tuple[Record, ...]:
    return tuple(Record(int(p), int(o), str(v)) for p, o, v in rows)


def to_json(event: Event) -> dict[str, Any]:
    """The JSON object of ``event``: its fields, plus ``"type"`` (the class name, lower)."""
    match event:
        case Send():
            return {
                "type": "send",
                "producer": event.producer,
                "index": event.index,
                "partition": event.partition,
                "value": event.value,
                "outcome": event.outcome.value,
                "offset": event.offset,
                "error": event.error,
                "time_ms": event.time_ms,
                "may_resend": event.may_resend,
                "epoch_bumped": event.epoch_bumped,
            }
        case Poll():
            return {
                "type": "poll",
                "consumer": event.consumer,
                "records": _records_json(event.records),
                "time_ms": event.time_ms,
            }
        case Seek():
            return {
                "type": "seek",
                "consumer": event.consumer,
                "partition": event.partition,
                "offset": event.offset,
                "time_ms": event.time_ms,
            }
        case FinalRead():
            return {
                "type": "final_read",
                "partition": event.partition,
                "records": _records_json(event.records),
                "end_offset": event.end_offset,
                "time_ms": event.time_ms,
            }
        case Nemesis():
            return {
                "type": "nemesis",
                "cycle": event.cycle,
                "name": event.name,
                "phase": event.phase,
                "nodes": list(event.nodes),
                "detail": event.detail,
                "time_ms": event.time_ms,
            }
        case Note():
            return {"type": "note", "text": event.text, "time_ms": event.time_ms}


def from_json(data: Mapping[str, Any]) -> Event:
    """The event ``to_json`` made; ValueError for an unknown ``type``."""
    kind = data.get("type")
    time_ms = int(data.get("time_ms", 0))
    if kind == "send":
        offset = data.get("offset")
        return Send(
            producer=str(data["producer"]),
            index=int(data["index"]),
            partition=int(data["partition"]),
            value=str(data["value"]),
            outcome=Outcome(data["outcome"]),
            offset=None if offset is None else int(offset),
            error=str(data.get("error", "")),
            time_ms=time_ms,
            may_resend=bool(data.get("may_resend", True)),
            epoch_bumped=bool(data.get("epoch_bumped", False)),
        )
    if kind == "poll":
        return Poll(str(data["consumer"]), _records_from(data["records"]), time_ms)
    if kind == "seek":
        return Seek(str(data["consumer"]), int(data["partition"]), int(data["offset"]), time_ms)
    if kind == "final_read":
        return FinalRead(
            int(data["partition"]),
            _records_from(data["records"]),
            int(data["end_offset"]),
            time_ms,
        )
    if kind == "nemesis":
        return Nemesis(
            int(data["cycle"]),
            str(data["name"]),
            str(data["phase"]),
            tuple(int(n) for n in data.get("nodes", ())),
            str(data.get("detail", "")),
            time_ms,
        )
    if kind == "note":
        return Note(str(data["text"]), time_ms)
    raise ValueError(f"unknown history event type {kind!r}")


def parse_lines(lines: Iterable[str]) -> Iterator[Event]:
    """Events of a JSON-lines history (blank lines skipped)."""
    for line in lines:
        if line.strip():
            yield from_json(json.loads(line))
