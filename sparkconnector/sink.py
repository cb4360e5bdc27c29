"""The ``headwater`` sink: ``df.writeStream.format("headwater")`` and
``df.write.format("headwater")``.

**Input columns** (as Spark's Kafka sink): ``value`` (binary or string, required),
``key`` (binary or string), ``headers`` (array of struct<key: string, value: binary>),
``partition`` (int), ``topic`` (string), ``timestamp`` (the records' create time; default:
when the task writes them). The ``topic`` option, when given, wins over the
column. A record goes to its ``partition`` when set, else to murmur2(key) % partitions
(Kafka's default partitioner) when it has a key, else to the task's own partition
(task id % partitions, the same on every attempt). Each task appends its records of a
partition as batches of up to ``batchBytes`` (default 1 MiB) with acks=all.

**No duplicates on replay.** A chunk (one appended batch) is named by its writer and its
place, as an idempotent producer's batch the broker checks: producer id = ``2^62 |
hash62(writer, Spark partition id, batch id)`` (a writer-named id: ``SELF_NAMED_PRODUCER_ID_MIN``
in docs/record-batch-format.md), epoch 0, base sequence = the records that task wrote
to that partition before the chunk. The writer is the ``sinkId`` (default: the query's
``checkpointLocation``), or a random name per query run or batch write when there is
none. So the broker answers a chunk sent again (a retried request, a retried task, a
replayed micro-batch) with the offsets it already has, or DUPLICATE_SEQUENCE_NUMBER
when it is older than the producer's last 5 chunks there (taken as written). Besides,
before a write that may repeat an earlier attempt (a task retry, or the first
micro-batch after a query restart: the one Spark replays after a crash), the task lists
the chunks of its producer id already in each target partition, from the end offsets
recorded when the previous micro-batch was committed, and skips them. The driver records
those end offsets at every micro-batch commit in the sink's state topic
(``headwater-sink-state.<hash of sinkId>``, one partition; its last record is the state).

The guarantee: for a deterministic query (a replayed micro-batch holds the same rows in
the same Spark partitions, as a query reading Headwater or files is), every row is
written exactly once. Without a ``sinkId`` or checkpoint location, a query restarted
writes its replayed micro-batch again (at least once). A non-deterministic query is not
exactly once: a replayed chunk is taken as written when its sequences were written by
the first attempt, whatever its rows, and chunks cut differently may be refused
(OUT_OF_ORDER_SEQUENCE_NUMBER fails the task). A task appends the chunks of a partition
in order, one at a time, and of different partitions at once.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from headwater.client import Admin, BatchFuture, ClientSecurity, LogReader
from headwater.client.partitioner import partition_for_key
from headwater.log.batch import (
    MESSAGE_BYTES_DEFAULT,
    SELF_NAMED_PRODUCER_ID_MIN,
    decode_batches,
    encode_batch,
    iter_headers,
    split_by_timestamp_span,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.sparkconnector import planning
from headwater.sparkconnector.source import CALL_RETRY_S, Clients, clients_of

STATE_TOPIC_PREFIX: Final = "headwater-sink-state."
STATE_TOPIC_CONFIGS: Final = {
    "retention_ms": "-1",
    "retention_bytes": str(64 << 20),
    "segment_bytes": str(8 << 20),
}
CHUNK_BYTES_DEFAULT: Final = 1 << 20
CHUNK_BYTES_MAX: Final = MESSAGE_BYTES_DEFAULT  # the broker's default max_message_bytes
SEQUENCE_SPACE: Final = 1 << 31
BATCH_OVERHEAD_BYTES: Final = 256
"""Bytes of an encoded batch besides its records' shares (log/batch.py's format): the
80-byte header, each section's extra offset entry and padding to 8 bytes, with room."""
RECORD_OVERHEAD_BYTES: Final = 13
"""Per record: key and value offsets (4 + 4), timestamp delta (4), validity bits."""
HEADERS_RECORD_BYTES: Final = 4  # per record, with a headers column: its list offset
HEADER_OVERHEAD_BYTES: Final = 9  # per header: key and value offsets, validity bit
NO_BATCH: Final = 0xFFFFFFFF  # the batch id part of producer ids of batch (not stream) writes
NAMED_ID_BITS: Final = SELF_NAMED_PRODUCER_ID_MIN - 1

Key = tuple[str, int]


class SinkOptionError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class SinkOptions:
    bootstrap: str
    topic: str | None
    sink_id: str | None
    chunk_bytes: int
    security: ClientSecurity = field(default_factory=ClientSecurity)


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The sink's options, checked (``planning.SINK_OPTIONS`` lists them); SinkOptionError
    names the problem."""
    try:
        planning.check_option_names(options, sink=True)
        bootstrap = planning.required_bootstrap(options)
    except planning.OptionError as exc:
        raise SinkOptionError(f"headwater sink: {exc}") from None
    lowered = {k.lower(): v for k, v in options.items()}
    topic = lowered.get("topic")
    if topic is not None and not topic.strip():
        raise SinkOptionError("headwater sink: the topic option is empty")
    sink_id = lowered.get("sinkid") or lowered.get("checkpointlocation") or lowered.get("path")
    raw_chunk = lowered.get("batchbytes", str(CHUNK_BYTES_DEFAULT))
    try:
        chunk_bytes = int(raw_chunk)
    except ValueError:
        raise SinkOptionError(
            f"headwater sink: batchBytes is {raw_chunk!r}; give a number of bytes in "
            f"[1024, {CHUNK_BYTES_MAX}]"
        ) from None
    if not 1024 <= chunk_bytes <= CHUNK_BYTES_MAX:
        raise SinkOptionError(
            f"headwater sink: batchBytes is {chunk_bytes}; valid range is [1024, {CHUNK_BYTES_MAX}]"
        )
    try:
        security = planning.security_options(options, ClientSecurity.from_env())
        security.check_files()
    except planning.OptionError as exc:
        raise SinkOptionError(f"headwater sink: {exc}") from None
    except HeadwaterError as exc:
        raise SinkOptionError(f"headwater sink: {exc.message}") from None
    return SinkOptions(bootstrap, topic.strip() if topic else None, sink_id, chunk_bytes, security)


def check_input_schema(schema: StructType, options: SinkOptions) -> None:
    """Fail before any task runs when the columns cannot be written."""
    names = {f.name.lower(): f.dataType.simpleString() for f in schema.fields}
    if "value" not in names:
        raise SinkOptionError(
            f"headwater sink: a value column is required (binary or string); got columns "
            f"{sorted(names)}"
        )
    allowed = {
        "value": ("binary", "string"),
        "key": ("binary", "string"),
        "topic": ("string",),
        "partition": ("int", "bigint", "smallint", "tinyint"),
        "headers": ("array<struct<key:string,value:binary>>",),
        "timestamp": ("timestamp", "timestamp_ntz"),
    }
    for column, types in allowed.items():
        if column in names and names[column] not in types:
            raise SinkOptionError(
                f"headwater sink: column {column} is {names[column]}; it must be "
                f"{' or '.join(types)}"
            )
    if options.topic is None and "topic" not in names:
        raise SinkOptionError("headwater sink: give a topic option or a topic column")


def producer_id(writer: str, spark_partition: int, batch_id: int) -> int:
    """The producer id of one task's output in one micro-batch (see the module
    docstring): a writer-named id, at or above SELF_NAMED_PRODUCER_ID_MIN."""
    digest = hashlib.sha256(f"{writer}\0{spark_partition}\0{batch_id}".encode()).digest()
    return SELF_NAMED_PRODUCER_ID_MIN | (int.from_bytes(digest[:8], "big") & NAMED_ID_BITS)


def state_topic(sink_id: str) -> str:
    return STATE_TOPIC_PREFIX + hashlib.sha256(sink_id.encode()).hexdigest()[:24]


# --------------------------------------------------------------------------- cluster I/O


def _latest_offsets(admin: Admin, topics: Sequence[str]) -> dict[Key, int]:
    """High watermarks of every partition of ``topics``."""
    partitions = [
        (topic, p)
        for topic in sorted(set(topics))
        for p in range(admin.cluster.layout(topic).partitions)
    ]
    return admin.end_offsets(partitions)


@dataclass(frozen=True, slots=True)
class SinkState:
    """The last committed micro-batch and every written partition's end offset then."""

    batch_id: int
    ends: dict[Key, int]

    def encode(self) -> bytes:
        return json.dumps(
            {"batch": self.batch_id, "ends": [[t, p, o] for (t, p), o in sorted(self.ends.items())]}
        ).encode()

    @staticmethod
    def decode(data: bytes) -> SinkState:
        parsed = json.loads(data)
        return SinkState(int(parsed["batch"]), {(t, int(p)): int(o) for t, p, o in parsed["ends"]})


def read_state(clients: Clients, sink_id: str) -> SinkState | None:
    topic = state_topic(sink_id)
    try:
        end = _latest_offsets(clients.admin, [topic])[(topic, 0)]
    except HeadwaterError as error:
        if error.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            return None
        raise
    if end == 0:
        return None
    fetched = clients.reader.fetch(topic, 0, end - 1)
    last = decode_batches(fetched.records)[-1].records.column("value")[-1].as_py()
    return SinkState.decode(last)


def write_state(clients: Clients, sink_id: str, state: SinkState) -> None:
    topic = state_topic(sink_id)
    try:
        clients.admin.cluster.layout(topic)
    except HeadwaterError as error:
        if error.code is not ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        _create_state_topic(clients.admin, topic)
    clients.producer().send_encoded(topic, 0, encode_batch([state.encode()])).result()


def _create_state_topic(admin: Admin, topic: str) -> None:
    brokers = len(admin.cluster.refresh(retry_s=CALL_RETRY_S).brokers)
    try:
        admin.create_topic(
            topic,
            partitions=1,
            replication_factor=min(3, max(brokers, 1)),
            configs=STATE_TOPIC_CONFIGS,
        )
    except HeadwaterError as error:
        if error.code is not ErrorCode.TOPIC_ALREADY_EXISTS:
            raise
    admin.cluster.invalidate(topic)


def written_chunks(reader: LogReader, key: Key, from_offset: int, producer: int) -> set[int]:
    """Base sequences of the batches ``producer`` wrote to ``key`` at or after
    ``from_offset`` (headers only: the bodies are not decoded)."""
    topic, partition = key
    found: set[int] = set()
    position = from_offset
    while True:
        try:
            fetched = reader.fetch(topic, partition, position, max_bytes=8 << 20)
        except HeadwaterError as error:
            if error.code is ErrorCode.OFFSET_OUT_OF_RANGE:  # below the log start
                position = Admin(cluster=reader.cluster).beginning_offsets([key])[key]
                continue
            raise
        for _position, header in iter_headers(fetched.records, verify_crc=False):
            if header.producer_id == producer:
                found.add(header.base_sequence)
        if fetched.next_offset <= position or fetched.next_offset >= fetched.high_watermark:
            return found
        position = fetched.next_offset


# --------------------------------------------------------------------------- writing


@dataclass
class SinkCommit(WriterCommitMessage):
    """What one task wrote: records and skipped (already written) chunks per partition."""

    records: dict[Key, int] = field(default_factory=dict)
    skipped_chunks: int = 0


def _binary(column: pa.Array) -> pa.Array:
    return column.cast(pa.binary()) if column.type != pa.binary() else column


def _check_partitions(topic: str, partitions: pa.Array, count: int) -> None:
    low_high = pc.min_max(partitions).as_py()
    low, high = low_high["min"], low_high["max"]
    if low is not None and (low < 0 or high >= count):
        bad = low if low < 0 else high
        raise HeadwaterError(
            ErrorCode.PARTITION_OUT_OF_RANGE,
            f"partition {bad} of topic {topic!r} does not exist; valid range is [0, {count})",
        )


class _TaskWriter:
    """One task's output: rows grouped by partition, appended in chunks, chunks that an
    earlier attempt wrote skipped."""

    def __init__(
        self,
        options: SinkOptions,
        writer: str,
        batch_id: int,
        lower_bounds: dict[Key, int] | None,
    ) -> None:
        context = TaskContext.get()
        self.spark_partition = context.partitionId() if context is not None else 0
        self.options = options
        self.clients = clients_of(options)
        self.producer = producer_id(writer, self.spark_partition, batch_id)
        self.lower_bounds = lower_bounds  # None: this task cannot be a repeat
        self.sequences: dict[Key, int] = {}  # records written per partition so far
        self.already: dict[Key, set[int]] = {}
        self.commit = SinkCommit()
        self.sent: list[BatchFuture] = []
        self.last_sent: dict[Key, BatchFuture] = {}

    def write(self, batches: Iterator[pa.RecordBatch]) -> SinkCommit:
        """Append every row; return once every chunk is acknowledged (acks=all), else
        raise the first chunk's error (a retried task skips the chunks that landed)."""
        try:
            for batch in batches:
                if batch.num_rows:
                    self._write_batch(batch)
        finally:
            errors = [e for e in (f.exception() for f in self.sent) if e is not None]
        for error in errors:
            if error.code is not ErrorCode.DUPLICATE_SEQUENCE_NUMBER:
                raise error
            self.commit.skipped_chunks += 1  # written before, older than the last 5
        return self.commit

    def _write_batch(self, batch: pa.RecordBatch) -> None:
        names = {n.lower(): n for n in batch.schema.names}
        if self.options.topic is not None:
            by_topic = [(self.options.topic, batch)]
        else:
            topics = batch.column(names["topic"])
            if topics.null_count:
                raise HeadwaterError(
                    ErrorCode.INVALID_TOPIC_EXCEPTION, "a row has a null topic and no topic option"
                )
            by_topic = [
                (topic, batch.filter(pc.equal(topics, topic)))
                for topic in sorted(pc.unique(topics).to_pylist())
            ]
        for topic, rows in by_topic:
            count = self.clients.admin.cluster.layout(topic).partitions
            partitions = self._partitions(topic, rows, names, count)
            for partition in sorted(pc.unique(partitions).to_pylist()):
                selected = rows.filter(pc.equal(partitions, partition))
                self._write_group((topic, partition), selected, names)

    def _partitions(
        self, topic: str, rows: pa.RecordBatch, names: dict[str, str], count: int
    ) -> pa.Array:
        """The partition of every row: the partition column, else murmur2 of the key (one
        Python call per key, as the client's partitioner), else the task's partition."""
        own = self.spark_partition % count
        if "key" in names:
            keys = _binary(rows.column(names["key"])).to_pylist()
            computed = pa.array(
                [own if k is None else partition_for_key(k, count) for k in keys], pa.int32()
            )
        else:
            computed = pa.repeat(pa.scalar(own, pa.int32()), rows.num_rows)
        if "partition" not in names:
            return computed
        explicit = rows.column(names["partition"]).cast(pa.int32())
        _check_partitions(topic, explicit, count)
        return pc.coalesce(explicit, computed)

    def _write_group(self, key: Key, rows: pa.RecordBatch, names: dict[str, str]) -> None:
        """Append ``rows`` (all of one partition) in chunks of about ``chunk_bytes``."""
        values = _binary(rows.column(names["value"]))
        keys = _binary(rows.column(names["key"])) if "key" in names else None
        headers = rows.column(names["headers"]) if "headers" in names else None
        stamps = _timestamps(rows.column(names["timestamp"]) if "timestamp" in names else None)
        sizes = record_sizes(values, keys, headers)
        for start, end in chunk_bounds(sizes, stamps, self.options.chunk_bytes):
            number = self.sequences.get(key, 0)
            self.sequences[key] = (number + end - start) % SEQUENCE_SPACE
            if number in self._already_written(key):
                self.commit.skipped_chunks += 1
                continue
            encoded = encode_batch(
                values.slice(start, end - start),
                timestamps_ms=stamps if isinstance(stamps, int) else stamps[start:end],
                keys=keys.slice(start, end - start) if keys is not None else None,
                headers=_header_pairs(headers.slice(start, end - start))
                if headers is not None
                else None,
                producer_id=self.producer,
                producer_epoch=0,
                base_sequence=number,
            )
            previous = self.last_sent.get(key)
            if previous is not None:
                # A partition's chunks land in order: the next is sent once the last is
                # acknowledged (a failed one fails the task here, before anything after
                # it is written). Chunks of different partitions are in flight together.
                previous.result()
            future = self.clients.named_producer().send_encoded(key[0], key[1], encoded)
            self.sent.append(future)
            self.last_sent[key] = future
            self.commit.records[key] = self.commit.records.get(key, 0) + end - start

    def _already_written(self, key: Key) -> set[int]:
        if self.lower_bounds is None:
            return set()
        found = self.already.get(key)
        if found is None:
            found = self.already[key] = written_chunks(
                self.clients.reader, key, self.lower_bounds.get(key, 0), self.producer
            )
        return found


def record_sizes(values: pa.Array, keys: pa.Array | None, headers: pa.Array | None) -> pa.Array:
    """Each record's share of an encoded batch, at most (int64): its key, value and
    header bytes and their offsets (``RECORD_OVERHEAD_BYTES``, ``HEADERS_RECORD_BYTES``,
    ``HEADER_OVERHEAD_BYTES``), computed on columns."""
    sizes = pc.add(pc.binary_length(values).fill_null(0).cast(pa.int64()), RECORD_OVERHEAD_BYTES)
    if keys is not None:
        sizes = pc.add(sizes, pc.binary_length(keys).fill_null(0).cast(pa.int64()))
    if headers is not None and len(headers):
        pairs = headers.flatten()
        pair_sizes = pc.add(
            pc.add(
                pc.binary_length(pairs.field("key")).fill_null(0).cast(pa.int64()),
                pc.binary_length(pairs.field("value")).fill_null(0).cast(pa.int64()),
            ),
            HEADER_OVERHEAD_BYTES,
        )
        running = pa.concat_arrays(
            [pa.array([0], pa.int64()), pc.cumulative_sum(pair_sizes).cast(pa.int64())]
        )
        offsets = pc.subtract(headers.offsets, headers.offsets[0]).cast(pa.int64())
        per_row = pc.subtract(
            pc.take(running, offsets.slice(1)), pc.take(running, offsets.slice(0, len(headers)))
        )
        sizes = pc.add(sizes, pc.add(per_row, HEADERS_RECORD_BYTES))
    return sizes


def chunk_bounds(
    sizes: pa.Array, stamps: int | list[int], chunk_bytes: int
) -> list[tuple[int, int]]:
    """[start, end) row ranges whose encoded batch is at most ``chunk_bytes`` (``sizes``:
    ``record_sizes``) and whose timestamps lie within an int32 delta of their first (the
    format's rule). A record larger than a chunk is a chunk of its own.

    Computed on columns: the chunk of a row is its starting byte // the room for records;
    a chunk's last record may run past that room, and then moves on to the next chunk. Rows
    spanning more than the delta (a backfill of old events beside new ones) are split in
    order. The bounds depend on the rows alone (null timestamps are the write's time, the
    same for a group), so a replayed micro-batch is cut the same way, which its exactly-
    once check relies on."""
    count = len(sizes)
    if count == 0:
        return []
    room = max(chunk_bytes - BATCH_OVERHEAD_BYTES, 1)
    ends_at = pc.cumulative_sum(sizes).cast(pa.int64())
    starts_at = pc.subtract(ends_at, sizes)
    chunk_of = pc.divide(starts_at, pa.scalar(room, pa.int64()))
    run_ends = pc.run_end_encode(chunk_of).run_ends.to_pylist()

    def running(index: int) -> int:  # bytes of rows [0, index)
        return int(ends_at[index - 1].as_py()) if index else 0

    bounds: list[tuple[int, int]] = []
    start = 0
    for end in run_ends:
        while start < end:
            cut = end
            while cut - start > 1 and running(cut) - running(start) > room:
                cut -= 1  # the record running past the room moves on to the next chunk
            bounds.append((start, cut))
            start = cut
            if end != count:
                break  # [cut, end) goes on with the next window's rows
    if isinstance(stamps, int):
        return bounds
    return [piece for start, end in bounds for piece in split_by_timestamp_span(stamps, start, end)]


def _timestamps(stamps: pa.Array | None) -> int | list[int]:
    """Create times in ms of a group's rows: the timestamp column's (the write's time
    where null), else the write's time for all."""
    now = int(time.time() * 1000)
    if stamps is None:
        return now
    millis = pc.cast(stamps, pa.timestamp("ms", tz="UTC")).cast(pa.int64())
    return pc.fill_null(millis, now).to_pylist()  # type: ignore[no-any-return]


def _header_pairs(headers: pa.Array) -> list[list[tuple[str, bytes | None]]]:
    """Headers as encode_batch takes them (the header section is encoded per record)."""
    return [[(h["key"], h["value"]) for h in (row or [])] for row in headers.to_pylist()]


class HeadwaterBatchWriter(DataSourceArrowWriter):
    """``df.write.format("headwater")``: a retried task skips what its failed attempt
    wrote (end offsets are taken when the write is planned)."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = _sink_options(options)
        check_input_schema(schema, self.options)
        admin = clients_of(self.options).admin
        self.ends = _latest_offsets(admin, [self.options.topic]) if self.options.topic else {}
        # This write's name: its retried tasks share it; another write never does.
        self.writer = f"{self.options.sink_id or ''}\0batch\0{secrets.token_hex(16)}"

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = TaskContext.get()
        retry = context is not None and context.attemptNumber() > 0
        writer = _TaskWriter(self.options, self.writer, NO_BATCH, self.ends if retry else None)
        return writer.write(iterator)


class HeadwaterStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("headwater")``; see the module docstring for the
    exactly-once protocol."""

    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self.options = _sink_options(options)
        check_input_schema(schema, self.options)
        self.state: SinkState | None = None
        # The query's name: its sinkId (a restarted run names its chunks the same), else
        # one of this run only.
        self.writer = self.options.sink_id or f"\0run\0{secrets.token_hex(16)}"
        if self.options.sink_id is not None:
            clients = clients_of(self.options)
            self.state = read_state(clients, self.options.sink_id)
            if self.state is None:  # the query's first start
                topics = [self.options.topic] if self.options.topic else []
                self.state = SinkState(-1, _latest_offsets(clients.admin, topics))
                write_state(clients, self.options.sink_id, self.state)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommit:
        context = TaskContext.get()
        raw = context.getLocalProperty("streaming.sql.batchId") if context else None
        batch_id = int(raw) if raw is not None else NO_BATCH
        if self.options.sink_id is None or self.state is None or raw is None:
            return _TaskWriter(self.options, self.writer, batch_id, None).write(iterator)
        if batch_id <= self.state.batch_id:  # committed before: Spark replays it only
            for _ in iterator:  # when it crashed between our commit and its own
                pass
            return SinkCommit()
        retry = context is not None and context.attemptNumber() > 0
        bounds: dict[Key, int] | None = None
        if batch_id == self.state.batch_id + 1:
            bounds = self.state.ends  # the batch a restarted query may be repeating
        elif retry:
            latest = read_state(clients_of(self.options), self.options.sink_id)
            bounds = latest.ends if latest is not None else {}
        return _TaskWriter(self.options, self.writer, batch_id, bounds).write(iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Record the end offsets after ``batchId`` (the lower bounds of the next one)."""
        if self.options.sink_id is None:
            return
        topics = {t for m in messages if isinstance(m, SinkCommit) for t, _ in m.records}
        if self.state is not None:
            topics |= {t for t, _ in self.state.ends}
        if self.options.topic:
            topics.add(self.options.topic)
        clients = clients_of(self.options)
        ends = _latest_offsets(clients.admin, sorted(topics))
        write_state(clients, self.options.sink_id, SinkState(batchId, ends))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Nothing to undo: what the tasks wrote stays, and a retry of the micro-batch
        skips it (the state is left at the previous commit)."""


def _sink_options(options: Mapping[str, str]) -> SinkOptions:
    try:
        return parse_sink_options(options)
    except SinkOptionError as exc:
        raise ValueError(str(exc)) from None
