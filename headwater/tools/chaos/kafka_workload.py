"""The Kafka-client workload of a chaos run (``--client kafka``): librdkafka (the
``confluent_kafka`` package) idempotent acks=all producers and consumers in one consumer
group, through the nodes' Kafka listeners, recorded in the same history as the gRPC
workload (``headwater.tools.chaos.workload``) and checked by the same checker.

Producers. Each is a ``confluent_kafka.Producer`` with ``enable.idempotence=true`` and
``acks=all``; it sends one record at a time to a partition drawn from its seeded rng
(an explicit partition: the partitioner plays no part), about ``rate_per_s`` a second,
with at most ``in_flight_max`` unanswered, and calls ``poll`` in its own thread to serve
the delivery reports. librdkafka retries every send until ``message.timeout.ms``
(``MESSAGE_TIMEOUT_MS``, 30 s: longer than any fault and its recovery), so every value
may be sent more than once (``may_resend``) and the broker's idempotence must write it
once. Even producers pipeline up to 5 requests per connection (librdkafka's most with
idempotence: the broker's sequence checks across pipelined requests), odd ones send one
at a time (``max.in.flight.requests.per.connection=1``). Values are
``<producer>-<index>`` as in the gRPC workload.

Epoch bumps. librdkafka bumps its producer epoch, for all partitions at once, after some
errors (an OUT_OF_ORDER_SEQUENCE_NUMBER on a pipelined request behind one that failed,
e.g. with NOT_ENOUGH_REPLICAS; a message timeout), then sends every message still
unanswered again under the new epoch from sequence 0, including messages whose earlier
attempt may have been appended (their connection to a leader that died): no broker can
tell those from new records (confluentinc/librdkafka#4953). The worker watches
librdkafka's log for the bump (``BUMPED``, debug context ``eos``), records a ``Note`` and
marks every send unanswered then ``epoch_bumped``; the checker reports a duplicate of
such a value as ``duplicate-epoch-bump``, not as the broker's ``duplicate``. Outcomes:

- ``ok`` with the offset of a delivery report without error; ``ok`` without an offset
  for one without error and without an offset. librdkafka reports those for a message
  whose request's answer was lost (a broken connection, a timeout) once a later batch of
  the same partition succeeds: the broker takes an idempotent producer's sequences only
  in order, so the earlier batch was appended (librdkafka's "implicit ack", logged as
  IMPLICITACK), and for a retry the broker answers DUPLICATE_SEQUENCE_NUMBER (appended
  before, and older than the batches whose offsets the broker still knows). Either way
  the value must be in its partition, somewhere: the checker looks for it at any
  offset;
- ``fail`` only when ``produce`` raised (``BufferError``: the local queue is full, or a
  ``KafkaException``, e.g. after a fatal error): the record was never queued;
- ``info`` for every delivery report with an error. librdkafka retries retriable
  errors itself, so the error it reports is the last of possibly several attempts, any of
  which may have been appended (``_MSG_TIMED_OUT`` and ``_PURGE_*`` say nothing either
  way); librdkafka knows whether a message was possibly persisted, but confluent_kafka
  does not expose it. A fatal error (``KafkaError.fatal()``: the idempotent producer
  cannot go on, e.g. ``OUT_OF_ORDER_SEQUENCE_NUMBER`` it cannot recover from) fails the
  in-flight messages too, whose outcome is unknown, so it is ``info`` as well; but a
  fatal error is always a problem of the run (a broker that keeps its idempotence
  promises never causes one), and the producer stops sending. Sends still unanswered
  when the producer is stopped are ``info`` too.

Consumers. Each is a ``confluent_kafka.Consumer`` in group ``GROUP`` (the classic group
protocol, an eager assignor) that ``subscribe``s to the topic, with
``auto.offset.reset=earliest`` and auto commit every ``AUTO_COMMIT_MS`` (librdkafka also
commits the offsets of revoked partitions before giving them up). A consumer reads only
the partitions the group gives it, from the group's committed offset, so at each
assignment (``on_assign``) it asks the coordinator for the committed offsets (retrying
until it gets them), takes the log start (the low watermark) for a partition without one,
records a ``Seek`` to that offset per partition and assigns explicitly at those offsets:
the recorded seek is exactly where the client starts, and the checker sees a move back to
a committed offset after a rebalance as a seek, not as a non-monotonic poll. Revocations
and lost assignments are recorded as ``Note``s (a consumer reads a revoked partition no
more; its next read there follows the seek of a new assignment). Records are polled one
``poll`` at a time (callbacks run inside ``poll``, so a seek is recorded before any record
of its assignment) and recorded in ``Poll`` events of consecutive records, each flushed
before any seek or revocation is recorded. A position that moves back without an
assignment (librdkafka's reset after ``OFFSET_OUT_OF_RANGE``) therefore shows as a
non-monotonic poll, as in the gRPC workload.

The final read stays on the gRPC client (``headwater.tools.chaos.workload.final_read``): it
reads the log, which is what must hold everything acknowledged.

librdkafka's own log lines go to ``kafka-clients.log`` in the run's directory, not to the
terminal, with its debug contexts ``eos`` (producers: producer ids, epochs, sequence
resets) and ``cgrp`` (consumers: coordinator, joins, assignments, commits), to tell what
the clients saw when a run finds something.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final

import confluent_kafka as ck

from headwater.tools.chaos.history import Outcome, Poll, Record, Seek, Send
from headwater.tools.chaos.workload import Recorder

GROUP: Final = "chaos"
CONSUMER_GROUP: Final = "chaos-848"
"""The group of the consumer-protocol (KIP-848) members."""
CLASSIC: Final = "classic"
CONSUMER: Final = "consumer"
LOG_FILE: Final = "kafka-clients.log"
MESSAGE_TIMEOUT_MS: Final = 30_000
REQUEST_TIMEOUT_MS: Final = 10_000
METADATA_REFRESH_MS: Final = 2_000
SESSION_TIMEOUT_MS: Final = 10_000
HEARTBEAT_INTERVAL_MS: Final = 1_000
AUTO_COMMIT_MS: Final = 1_000
POLL_TIMEOUT_S: Final = 0.25
OFFSETS_TIMEOUT_S: Final = 5.0
POLL_RECORDS_MAX: Final = 500
POLL_RECORDS_AGE_S: Final = 0.2
"""A recorded Poll event holds consecutive ``poll`` results: at most POLL_RECORDS_MAX
records, the first at most POLL_RECORDS_AGE_S old."""
REJOIN_AFTER_S: Final = (15.0, 40.0)
"""A consumer leaves the group and joins it again after a time drawn from this range
(its own seeded rng), again and again until the run ends."""
UNPLACED: Final = (
    "acknowledged without an offset (implicitly by a later batch's success, or a retry "
    "answered DUPLICATE_SEQUENCE_NUMBER)"
)
BUMPED: Final = re.compile(r"bumped epoch to (PID\{[^}]*\})")
"""librdkafka's log line (debug context ``eos``) once its producer epoch is bumped."""
BUMP_REASON: Final = re.compile(r"epoch bump for .*?: (.+)$")
NOTES_PER_KIND_MAX: Final = 20
"""Notes of one kind a client records in full; after that every 100th."""

_COMMON: Final[dict[str, object]] = {
    "socket.timeout.ms": REQUEST_TIMEOUT_MS,
    "topic.metadata.refresh.interval.ms": METADATA_REFRESH_MS,
    "metadata.max.age.ms": 3 * METADATA_REFRESH_MS,
    "reconnect.backoff.ms": 100,
    "reconnect.backoff.max.ms": 1_000,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 1_000,
}


def client_logger(run_dir: Path) -> logging.Logger:
    """The logger librdkafka's log lines of one run go to (``run_dir / LOG_FILE``); close
    it with ``close_logger``."""
    logger = logging.getLogger(f"headwater.tools.chaos.kafka.{id(run_dir)}.{time.monotonic_ns()}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    handler = logging.FileHandler(run_dir / LOG_FILE, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logger.addHandler(handler)
    return logger


def close_logger(logger: logging.Logger) -> None:
    for handler in list(logger.handlers):
        logger.removeHandler(handler)
        handler.close()


class _Notes:
    """Notes of one client, each kind recorded in full NOTES_PER_KIND_MAX times, then
    every 100th (a node down for seconds makes thousands of identical errors)."""

    def __init__(self, who: str, recorder: Recorder) -> None:
        self.who = who
        self.recorder = recorder
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def add(self, kind: str, text: str) -> None:
        with self._lock:
            n = self._counts.get(kind, 0) + 1
            self._counts[kind] = n
        if n <= NOTES_PER_KIND_MAX or n % 100 == 0:
            self.recorder.note(f"{self.who}: {text}" + (f" (#{n})" if n > 1 else ""))


class _EpochWatch(logging.Handler):
    """Calls ``on_bump(pid, reason)`` for librdkafka's "bumped epoch" log line (served by
    ``poll`` in the producer's thread, in order with the delivery reports)."""

    def __init__(self, on_bump: Callable[[str, str], None]) -> None:
        super().__init__(logging.DEBUG)
        self.on_bump = on_bump
        self.reason = "reason not logged"

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        reason = BUMP_REASON.search(text)
        if reason is not None:
            self.reason = reason.group(1)
        bumped = BUMPED.search(text)
        if bumped is not None:
            self.on_bump(bumped.group(1), self.reason)


class KafkaProducerWorker:
    """An idempotent acks=all librdkafka producer of unique values (module docstring)."""

    def __init__(
        self,
        name: str,
        servers: str,
        topic: str,
        partitions: int,
        seed: int,
        recorder: Recorder,
        rate_per_s: float,
        logger: logging.Logger,
        max_in_flight: int = 5,
        in_flight_max: int = 200,
    ) -> None:
        """``max_in_flight``: librdkafka's ``max.in.flight.requests.per.connection`` (1 to
        5 with idempotence); ``in_flight_max``: most sends unanswered."""
        self.name = name
        self.topic = topic
        self.partitions = partitions
        self.recorder = recorder
        self.interval_s = 1.0 / rate_per_s
        self.in_flight_max = in_flight_max
        self._rng = random.Random(seed)
        self._notes = _Notes(f"producer {name}", recorder)
        self._log = logging.getLogger(f"{logger.name}.{name}")  # propagates to ``logger``
        self._log.setLevel(logging.DEBUG)
        self._watch = _EpochWatch(self._on_bump)
        self._log.addHandler(self._watch)
        self._producer = ck.Producer(
            {
                **_COMMON,
                "bootstrap.servers": servers,
                "client.id": f"chaos-{name}",
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": MESSAGE_TIMEOUT_MS,
                "request.timeout.ms": REQUEST_TIMEOUT_MS,
                "max.in.flight.requests.per.connection": max_in_flight,
                "debug": "eos",
                "logger": self._log,
                "error_cb": self._on_error,
            }
        )
        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[int, str]] = {}
        self._bumped: set[int] = set()
        """Sends unanswered when librdkafka bumped the producer epoch."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{name}", daemon=True)
        self.sent = 0
        self.acknowledged = 0
        self.epoch_bumps = 0
        self.stopped = False
        self.fatal: list[str] = []
        """Fatal librdkafka errors (each a problem of the run)."""

    def start(self) -> None:
        self._thread.start()

    def _fatal(self, error: ck.KafkaError, where: str) -> None:
        with self._lock:
            first = not self.fatal
            self.fatal.append(f"{where}: {error}")
        if first:
            self.recorder.note(f"producer {self.name}: FATAL {where}: {error}; stops sending")
        self._stop.set()

    def _on_error(self, error: ck.KafkaError) -> None:
        if error.fatal():
            self._fatal(error, "error callback")
        else:
            self._notes.add(error.name(), f"client error: {error}")

    def _on_bump(self, pid: str, reason: str) -> None:
        """librdkafka bumped the producer epoch: every send still unanswered may be sent
        again under the new one (``Send.epoch_bumped``)."""
        with self._lock:
            self._bumped.update(self._in_flight)
            count = len(self._in_flight)
            self.epoch_bumps += 1
        self.recorder.note(
            f"producer {self.name}: librdkafka bumped its epoch to {pid} ({reason}); "
            f"{count} send(s) unanswered may be sent again under it"
        )

    def _record(self, index: int, outcome: Outcome, offset: int | None, error: str) -> None:
        with self._lock:
            sent = self._in_flight.pop(index, None)
            if sent is None:
                return  # already recorded as unknown when the producer stopped
            partition, value = sent
            bumped = index in self._bumped
            self._bumped.discard(index)
            if outcome is Outcome.OK:
                self.acknowledged += 1
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
                may_resend=True,  # librdkafka retries every send
                epoch_bumped=bumped,
            )
        )

    def _delivered(self, index: int) -> Callable[[ck.KafkaError | None, ck.Message], None]:
        def report(error: ck.KafkaError | None, message: ck.Message) -> None:
            if error is None:
                offset = message.offset()
                if offset is None or offset < 0:
                    # an implicit ack or DUPLICATE_SEQUENCE_NUMBER (module docstring)
                    self._record(index, Outcome.OK, None, UNPLACED)
                else:
                    self._record(index, Outcome.OK, offset, "")
                return
            if error.fatal():
                self._fatal(error, "delivery report")
            self._record(index, Outcome.INFO, None, f"{error.name()}: {error.str()}")

        return report

    def _run(self) -> None:
        index = 0
        next_send = time.monotonic()
        while not self._stop.is_set():
            self._producer.poll(0)
            with self._lock:
                full = len(self._in_flight) >= self.in_flight_max
            if full:
                self._producer.poll(0.1)
                continue
            wait = next_send - time.monotonic()
            if wait > 0:
                self._producer.poll(min(wait, 0.05))
                continue
            next_send = max(next_send + self.interval_s, time.monotonic() - 1.0)
            partition = self._rng.randrange(self.partitions)
            value = f"{self.name}-{index}"
            with self._lock:
                self._in_flight[index] = (partition, value)
            try:
                self._producer.produce(
                    self.topic,
                    value=value.encode(),
                    partition=partition,
                    on_delivery=self._delivered(index),
                )
            except BufferError as full:
                self._record(index, Outcome.FAIL, None, f"not queued: queue full: {full}")
            except ck.KafkaException as exc:
                cause = exc.args[0] if exc.args else None
                self._record(index, Outcome.FAIL, None, f"not queued: {exc}")
                if isinstance(cause, ck.KafkaError) and cause.fatal():
                    self._fatal(cause, "produce")
            index += 1
            self.sent = index

    def stop(self, flush_timeout_s: float) -> None:
        """Stop sending, serve delivery reports for up to ``flush_timeout_s``, record the
        rest as unknown, then drop them and close the client."""
        if self.stopped:
            return
        self.stopped = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        left_in_client = self._producer.flush(flush_timeout_s)
        with self._lock:
            left = sorted(self._in_flight)
        for index in left:
            self._record(index, Outcome.INFO, None, "no answer before the producer stopped")
        if left_in_client:
            self.recorder.note(
                f"producer {self.name}: {left_in_client} message(s) undelivered after "
                f"{flush_timeout_s:g} s; purged"
            )
            self._producer.purge(in_queue=True, in_flight=True, blocking=True)
            self._producer.flush(1.0)
        self._producer.close()
        self._log.removeHandler(self._watch)


class KafkaConsumerWorker:
    """A librdkafka consumer in group ``group`` of the classic protocol (GROUP) or of the
    consumer protocol (KIP-848, ``protocol`` CONSUMER: CONSUMER_GROUP; assignments then
    change a partition at a time, with ``incremental_assign`` and ``incremental_unassign``,
    and the session timeout is the group's, set on the nodes) (module docstring)."""

    def __init__(
        self,
        name: str,
        servers: str,
        topic: str,
        seed: int,
        recorder: Recorder,
        logger: logging.Logger,
        protocol: str = CLASSIC,
    ) -> None:
        assert protocol in (CLASSIC, CONSUMER), protocol
        self.name = name
        self.protocol = protocol
        self.group = GROUP if protocol == CLASSIC else CONSUMER_GROUP
        self.topic = topic
        self.recorder = recorder
        self._rng = random.Random(seed)
        self._rejoin_at = time.monotonic() + self._rng.uniform(*REJOIN_AFTER_S)
        self._settle = threading.Event()
        self._notes = _Notes(f"consumer {name}", recorder)
        membership: dict[str, object] = (
            {
                "session.timeout.ms": SESSION_TIMEOUT_MS,
                "heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS,
            }
            if protocol == CLASSIC
            else {"group.protocol": CONSUMER}
        )
        self._consumer = ck.Consumer(
            {
                **_COMMON,
                **membership,
                "bootstrap.servers": servers,
                "client.id": f"chaos-{name}",
                "group.id": self.group,
                "auto.offset.reset": "earliest",
                "enable.auto.commit": True,
                "auto.commit.interval.ms": AUTO_COMMIT_MS,
                "fetch.wait.max.ms": 500,
                "enable.partition.eof": False,
                "debug": "cgrp",
                "logger": logger,
                "error_cb": self._on_error,
            }
        )
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"chaos-{name}", daemon=True)
        self._buffer: list[Record] = []
        self._buffer_since = 0.0
        self._lock = threading.Lock()
        self._positions: dict[int, int] = {}
        self.polled = 0
        self.assignments = 0
        self.rejoins = 0
        self.stopped = False
        self.fatal: list[str] = []

    def start(self) -> None:
        self._subscribe()
        self._thread.start()

    def _subscribe(self) -> None:
        self._consumer.subscribe(
            [self.topic],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def settle(self) -> None:
        """Leave and rejoin the group no more (the run is ending)."""
        self._settle.set()

    def positions(self) -> dict[int, int]:
        """{partition: the offset this consumer reads next there}, for the partitions it
        holds (its seek, then one past each record it read)."""
        with self._lock:
            return dict(self._positions)

    # ----------------------------------------------------------------- callbacks

    def _on_error(self, error: ck.KafkaError) -> None:
        if error.fatal():
            self.fatal.append(f"error callback: {error}")
            self.recorder.note(f"consumer {self.name}: FATAL {error}")
        else:
            self._notes.add(error.name(), f"client error: {error}")

    def _start_offsets(self, partitions: list[int]) -> dict[int, int] | None:
        """{partition: the group's committed offset, or the log start without one};
        None when the worker stops first. Retries until the coordinator and the leaders
        answer (a rebalance during a fault waits for them)."""
        wanted = [ck.TopicPartition(self.topic, p) for p in partitions]
        attempt = 0
        while not self._stop.is_set():
            attempt += 1
            try:
                committed = self._consumer.committed(wanted, timeout=OFFSETS_TIMEOUT_S)
                failed = [tp for tp in committed if tp.error is not None]
                if failed:
                    raise ck.KafkaException(failed[0].error)
                out: dict[int, int] = {}
                for tp in committed:
                    if tp.offset >= 0:
                        out[tp.partition] = tp.offset
                        continue
                    marks = self._consumer.get_watermark_offsets(
                        ck.TopicPartition(self.topic, tp.partition), timeout=OFFSETS_TIMEOUT_S
                    )
                    if marks is None:
                        raise ck.KafkaException(f"no watermarks of partition {tp.partition}")
                    out[tp.partition] = marks[0]
                return out
            except ck.KafkaException as exc:
                self._notes.add(
                    "start-offsets", f"committed offsets of {partitions}: attempt {attempt}: {exc}"
                )
                self._stop.wait(0.5)
        return None

    def _on_assign(self, consumer: ck.Consumer, assigned: list[ck.TopicPartition]) -> None:
        try:
            self._flush()
            partitions = sorted(tp.partition for tp in assigned if tp.topic == self.topic)
            starts = self._start_offsets(partitions)
            if starts is None:  # stopping: take nothing
                consumer.assign([])
                return
            for p in partitions:
                self.recorder.add(Seek(self.name, p, starts[p], self.recorder.now_ms()))
            with self._lock:
                if self.protocol == CLASSIC:
                    self._positions = dict(starts)
                else:  # these are added to what it holds
                    self._positions.update(starts)
            self.assignments += 1
            self.recorder.note(
                f"consumer {self.name} ({consumer.memberid()}): assigned "
                + (", ".join(f"{p}@{starts[p]}" for p in partitions) or "nothing")
            )
            chosen = [ck.TopicPartition(self.topic, p, starts[p]) for p in partitions]
            if self.protocol == CLASSIC:
                consumer.assign(chosen)
            else:
                consumer.incremental_assign(chosen)
        except Exception as exc:  # raised out of poll() otherwise
            self.recorder.note(f"consumer {self.name}: on_assign failed: {exc!r}")

    def _give_up(self, lost: bool, revoked: list[ck.TopicPartition]) -> None:
        self._flush()
        partitions = sorted(tp.partition for tp in revoked)
        with self._lock:
            for p in partitions:
                self._positions.pop(p, None)
        if self.protocol == CONSUMER:
            try:
                self._consumer.incremental_unassign(revoked)
            except (ck.KafkaException, RuntimeError) as exc:
                self._notes.add("unassign", f"giving up {partitions} failed: {exc}")
        self.recorder.note(
            f"consumer {self.name}: {'lost' if lost else 'revoked'} partitions {partitions}"
        )

    def _on_revoke(self, _consumer: ck.Consumer, revoked: list[ck.TopicPartition]) -> None:
        self._give_up(False, revoked)

    def _on_lost(self, _consumer: ck.Consumer, lost: list[ck.TopicPartition]) -> None:
        self._give_up(True, lost)

    # ----------------------------------------------------------------- polling

    def _flush(self) -> None:
        if self._buffer:
            records, self._buffer = tuple(self._buffer), []
            self.recorder.add(Poll(self.name, records, self.recorder.now_ms()))
            self.polled += len(records)

    def _rejoin(self) -> None:
        """Leave the group and join it again: the others take this member's partitions,
        then the group rebalances again and every member resumes from the committed
        offsets (the churn that makes committed offsets matter)."""
        self._flush()
        self._rejoin_at = time.monotonic() + self._rng.uniform(*REJOIN_AFTER_S)
        self.rejoins += 1
        self.recorder.note(f"consumer {self.name}: leaves the group and joins it again")
        try:
            self._consumer.unsubscribe()
            self._subscribe()
        except (ck.KafkaException, RuntimeError) as exc:
            self._notes.add("rejoin", f"leaving and joining again failed: {exc}")

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self._settle.is_set() and time.monotonic() >= self._rejoin_at:
                self._rejoin()
            try:
                message = self._consumer.poll(POLL_TIMEOUT_S)
            except (ck.KafkaException, RuntimeError) as exc:
                self._notes.add("poll", f"poll failed: {exc}")
                self._stop.wait(0.2)
                continue
            if message is None:
                self._flush()
                continue
            error = message.error()
            if error is not None:
                if error.fatal():
                    self.fatal.append(f"poll: {error}")
                self._notes.add(error.name(), f"poll: {error}")
                continue
            partition, offset = message.partition(), message.offset()
            if partition is None or offset is None:
                self._notes.add("no-offset", f"a record without partition or offset: {message}")
                continue
            value = (message.value() or b"").decode("utf-8", "replace")
            if not self._buffer:
                self._buffer_since = time.monotonic()
            self._buffer.append(Record(partition, offset, value))
            with self._lock:
                self._positions[partition] = offset + 1
            if (
                len(self._buffer) >= POLL_RECORDS_MAX
                or time.monotonic() - self._buffer_since >= POLL_RECORDS_AGE_S
            ):
                self._flush()
        self._flush()

    def stop(self) -> None:
        """Stop polling, then close (commits and leaves the group; revocation noted)."""
        if self.stopped:
            return
        self.stopped = True
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._consumer.close()
        except (ck.KafkaException, RuntimeError) as exc:
            self.recorder.note(f"consumer {self.name}: close: {exc}")
