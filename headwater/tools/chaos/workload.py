"""The workload of a chaos run: acks=all producers of unique values, consumers reading
every partition from the beginning, and the final read; all through
``headwater.client``, all recorded in the history (``headwater.tools.chaos.history``).

Producers. Each sends one record at a time to a partition drawn from its seeded rng,
about ``rate_per_s`` a second, with at most ``in_flight_max`` unanswered. Values are
``<producer>-<index>``, unique in the run; ``index`` is the send order. Outcomes:

- ``ok`` with the acknowledged offset;
- ``fail`` only when it is certain that nothing was appended: ``send`` raised (the
  record was never queued), or a producer without retries (``retries=0``: one attempt)
  got an error that the broker answers before any append (``DEFINITE_FAILURES``);
- ``info`` otherwise: a producer with retries may have had an earlier attempt whose
  outcome is unknown, and timeouts and broken connections say nothing either way. Sends
  still unanswered when the producer is closed are ``info`` too.

Consumers. Each assigns every partition, seeks to the beginning (recorded as ``Seek``),
and polls until stopped; each non-empty poll is one ``Poll`` event. A position that moves
back without a seek (the client's automatic reset after OFFSET_OUT_OF_RANGE) is recorded
as a ``Note``; the checker then sees it as a non-monotonic poll, which it is: a position
a consumer reached below the high watermark must stay in range.

Final read. A fresh consumer reads every partition from its log start to the high
watermark that ``ListOffsets`` reports once the producers have stopped; its reads are
recorded as the polls of consumer ``final`` and as one ``FinalRead`` per partition.
"""

from __future__ import annotations

import functools
import json
import random
import threading
import time
from pathlib import Path
from typing import IO, Final

from headwater.client import (
    Admin,
    Consumer,
    OffsetSpec,
    Producer,
    RecordFuture,
    TopicPartition,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.chaos.history import (
    Event,
    FinalRead,
    Note,
    Outcome,
    Poll,
    Record,
    Seek,
    Send,
    to_json,
)

DEFINITE_FAILURES: Final = frozenset(
    {
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_RECORD,
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.INVALID_REQUIRED_ACKS,
        ErrorCode.INVALID_TIMESTAMP,
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        ErrorCode.INVALID_TOPIC_EXCEPTION,
    }
)
"""Errors the broker answers before appending anything (see node/replicas/partition.py)."""
FINAL_CONSUMER: Final = "final"
POLL_TIMEOUT_MS: Final = 250


class Recorder:
    """The history of a run: kept in memory and appended, one JSON line per event, to
    ``path`` as it happens (a run that dies still leaves what it saw).

    Thread-safety: ``add`` may be called from any thread."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: IO[str] = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close)
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._start = time.monotonic()

    def now_ms(self) -> int:
        return int((time.monotonic() - self._start) * 1000)

    def add(self, event: Event) -> None:
        line = json.dumps(to_json(event))
        with self._lock:
            self._events.append(event)
            self._file.write(line + "\n")

    def note(self, text: str) -> None:
        self.add(Note(text, self.now_ms()))

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def close(self) -> None:
        with self._lock:
            self._file.close()


class ProducerWorker:
    def __init__(
        self,
        name: str,
        bootstrap: str,
        topic: str,
        partitions: int,
        seed: int,
        retries: int,
        recorder: Recorder,
        rate_per_s: float,
        in_flight_max: int = 200,
    ) -> None:
        self.name = name
        self.topic = topic
        self.partitions = partitions
        self.retries = retries
        self.recorder = recorder
        self.interval_s = 1.0 / rate_per_s
        self.in_flight_max = in_flight_max
        self._rng = random.Random(seed)
        self._producer = Producer(
            bootstrap,
            acks="all",
            linger_ms=2,
            retries=retries,
            request_timeout_ms=10_000,
            delivery_timeout_ms=30_000,
            append_timeout_ms=5_000,
            max_block_ms=5_000,
        )
        self._cond = threading.Condition()
        self._in_flight: dict[int, tuple[int, str]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{name}", daemon=True)
        self.sent = 0
        self.acknowledged = 0
        self.stopped = False

    def start(self) -> None:
        self._thread.start()

    def _record(self, index: int, outcome: Outcome, offset: int | None, error: str) -> None:
        with self._cond:
            sent = self._in_flight.pop(index, None)
            if sent is None:
                return  # already recorded as unknown when the producer closed
            partition, value = sent
            if outcome is Outcome.OK:
                self.acknowledged += 1
            self._cond.notify_all()
        self.recorder.add(
            Send(
                self.name,
                index,
                partition,
                value,
                outcome,
                offset,
                error,
                self.recorder.now_ms(),
                may_resend=self.retries > 0,
            )
        )

    def _done(self, index: int, future: RecordFuture) -> None:
        error = future.exception(0)
        if error is None:
            self._record(index, Outcome.OK, future.result(0).offset, "")
            return
        certain = self.retries == 0 and error.code in DEFINITE_FAILURES
        self._record(index, Outcome.FAIL if certain else Outcome.INFO, None, str(error))

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            with self._cond:
                if len(self._in_flight) >= self.in_flight_max:
                    self._cond.wait(0.1)
                    continue
                partition = self._rng.randrange(self.partitions)
                value = f"{self.name}-{index}"
                self._in_flight[index] = (partition, value)
            try:
                future = self._producer.send(self.topic, value.encode(), partition=partition)
            except HeadwaterError as error:
                self._record(index, Outcome.FAIL, None, f"not queued: {error}")
            else:
                future.add_done_callback(functools.partial(self._done, index))
            index += 1
            self.sent = index
            self._stop.wait(self.interval_s)

    def stop(self, flush_timeout_s: float) -> None:
        """Stop sending, wait up to ``flush_timeout_s`` for answers, record the rest as
        unknown."""
        if self.stopped:
            return
        self.stopped = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._producer.close(timeout_s=flush_timeout_s)
        except HeadwaterError as error:
            self.recorder.note(f"producer {self.name}: close: {error}")
        with self._cond:
            left = sorted(self._in_flight)
        for index in left:
            self._record(index, Outcome.INFO, None, "no answer before the producer closed")


class ConsumerWorker:
    def __init__(
        self, name: str, bootstrap: str, topic: str, partitions: int, recorder: Recorder
    ) -> None:
        self.name = name
        self.topic = topic
        self.recorder = recorder
        self.assignment = [TopicPartition(topic, p) for p in range(partitions)]
        self._consumer = Consumer(
            bootstrap,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=500,
            request_timeout_ms=10_000,
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{name}", daemon=True)
        self.polled = 0
        self.stopped = False

    def start(self) -> None:
        """Assign and seek to the beginning (raises if the cluster cannot tell where that
        is), then poll in a thread."""
        self._consumer.assign(self.assignment)
        self._consumer.seek_to_beginning()
        for tp in self.assignment:
            offset = self._consumer.position(tp)
            self.recorder.add(Seek(self.name, tp.partition, offset, self.recorder.now_ms()))
        self._thread.start()

    def _positions(self) -> dict[int, int]:
        out = {}
        for tp in self.assignment:
            try:
                out[tp.partition] = self._consumer.position(tp)
            except HeadwaterError:
                continue
        return out

    def _run(self) -> None:
        errors = 0
        while not self._stop.is_set():
            before = self._positions()
            try:
                result = self._consumer.poll(timeout_ms=POLL_TIMEOUT_MS)
            except HeadwaterError as error:
                errors += 1
                if errors <= 20 or errors % 100 == 0:
                    self.recorder.note(f"consumer {self.name}: poll #{errors} failed: {error}")
                self._stop.wait(0.2)
                continue
            records = tuple(
                Record(r.partition, r.offset, (r.value or b"").decode("utf-8", "replace"))
                for r in result
            )
            if records:
                self.recorder.add(Poll(self.name, records, self.recorder.now_ms()))
                self.polled += len(records)
            for partition, after in self._positions().items():
                if partition in before and after < before[partition]:
                    self.recorder.note(
                        f"consumer {self.name}: position of partition {partition} went back "
                        f"from {before[partition]} to {after} without a seek (reset)"
                    )

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self._consumer.close()


def final_read(
    bootstrap: str, topic: str, partitions: int, recorder: Recorder, deadline_s: float
) -> tuple[list[FinalRead], list[str]]:
    """Read every partition from its log start to its high watermark; returns the
    complete reads and a line per partition that could not be read whole in time (no
    FinalRead for those: the checker reports them as missing)."""
    problems: list[str] = []
    with Admin(bootstrap, request_timeout_s=10.0) as admin:
        ends = {
            p: admin.list_offsets(topic, OffsetSpec.LATEST, partitions=[p])[p]
            for p in range(partitions)
        }
    assignment = [TopicPartition(topic, p) for p in range(partitions)]
    read: dict[int, list[Record]] = {p: [] for p in range(partitions)}
    with Consumer(bootstrap, auto_offset_reset="earliest", fetch_max_wait_ms=200) as consumer:
        consumer.assign(assignment)
        consumer.seek_to_beginning()
        for tp in assignment:
            recorder.add(
                Seek(FINAL_CONSUMER, tp.partition, consumer.position(tp), recorder.now_ms())
            )
        deadline = time.monotonic() + deadline_s

        def behind() -> list[int]:
            return [tp.partition for tp in assignment if consumer.position(tp) < ends[tp.partition]]

        while behind() and time.monotonic() < deadline:
            try:
                result = consumer.poll(timeout_ms=500)
            except HeadwaterError as error:
                recorder.note(f"final read: poll failed: {error}")
                time.sleep(0.2)
                continue
            records = tuple(
                Record(r.partition, r.offset, (r.value or b"").decode("utf-8", "replace"))
                for r in result
            )
            if records:
                recorder.add(Poll(FINAL_CONSUMER, records, recorder.now_ms()))
                for r in records:
                    read[r.partition].append(r)
        missing = set(behind())
    finals = []
    for p in range(partitions):
        if p in missing:
            problems.append(
                f"partition {p}: final read stopped short of the high watermark {ends[p]}"
            )
            continue
        kept = tuple(r for r in read[p] if r.offset < ends[p])
        final = FinalRead(p, kept, ends[p], recorder.now_ms())
        recorder.add(final)
        finals.append(final)
    return finals, problems
