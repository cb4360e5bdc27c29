"""Reading Headwater from Spark: the streaming and batch readers of ``format("headwater")``
(pyspark's Python Data Source API, pyspark >= 4.2).

Driver side (``initialOffset``, ``latestOffset``, ``partitions``): the facts come from
the cluster (topics, partition counts, topic ids, earliest offsets and high watermarks)
and ``headwater.sparkconnector.planning`` decides the offsets and ranges. Executor side
(``read``): each input partition fetches one offset range of one topic-partition from its
leader and yields Arrow record batches in the Kafka source's schema, built column by
column from the fetched batches (no per-record Python). Reads stop at the range end,
which is never above the high watermark at planning time, so only committed records are
read and a replayed micro-batch reads the same records.

gRPC connections are cached per process (``clients_for``): the reader objects stay
picklable and Spark's reused Python workers keep their channels.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Protocol

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import (
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from headwater.client import Admin, ClientSecurity, LogReader, Producer
from headwater.client.connection import Cluster
from headwater.client.positions import TopicPartition
from headwater.log.batch import decode_batches_within
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.sparkconnector import planning
from headwater.sparkconnector.planning import Key, OffsetRange, SourceOptions

HEADERS_TYPE: Final = pa.list_(
    pa.field("element", pa.struct([("key", pa.string()), ("value", pa.binary())]))
)
SOURCE_COLUMNS: Final = (
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("offset", pa.int64(), "bigint"),
    ("timestamp", pa.timestamp("us", tz="UTC"), "timestamp"),
    ("timestampType", pa.int32(), "int"),
    ("headers", HEADERS_TYPE, "array<struct<key:string,value:binary>>"),
)
"""Every column the source can give (Spark's Kafka source's): name, Arrow type, Spark
type (as Spark's ``simpleString`` writes it, which its DDL parser reads)."""


def default_columns(include_headers: bool) -> list[str]:
    """The columns of a read that gives no schema: all, ``headers`` with
    ``include_headers``."""
    return [name for name, _, _ in SOURCE_COLUMNS if include_headers or name != "headers"]


def read_schema_ddl(include_headers: bool) -> str:
    """The read schema in Spark's DDL (``DataSource.schema``)."""
    spark_types = {name: spark for name, _, spark in SOURCE_COLUMNS}
    return ", ".join(f"{name} {spark_types[name]}" for name in default_columns(include_headers))


_NO_HEADERS: Final = pa.scalar([], HEADERS_TYPE)
FETCH_WAIT_MS: Final = 500
# How long a read waits for a range's records to become readable (a new leader's high
# watermark can trail the old one's for a moment) before giving up.
READ_PATIENCE_S: Final = 60.0
CALL_RETRY_S: Final = 30.0
_log = logging.getLogger(__name__)
_clients: dict[tuple[str, ClientSecurity], Clients] = {}
_clients_lock = threading.Lock()


class Clients:
    """One process's clients of one cluster: an Admin and a LogReader sharing connections
    and metadata, and an acks=all Producer made on first use (the sink's). They live as
    long as the process: Spark reuses its Python workers, and they keep their channels."""

    def __init__(self, bootstrap: str, security: ClientSecurity) -> None:
        self.security = security
        cluster = Cluster(bootstrap, request_timeout_s=CALL_RETRY_S, security=security)
        self.admin = Admin(cluster=cluster)
        self.reader = LogReader(cluster=cluster, retry_s=CALL_RETRY_S)
        self._producer: Producer | None = None
        self._named_producer: Producer | None = None
        self._lock = threading.Lock()

    def producer(self) -> Producer:
        """acks=all (idempotent), no linger, retrying each batch for up to CALL_RETRY_S."""
        with self._lock:
            if self._producer is None:
                self._producer = Producer(
                    self.admin.cluster.bootstrap,
                    acks="all",
                    linger_ms=0,
                    delivery_timeout_ms=int(CALL_RETRY_S * 1000),
                    security=self.security,
                )
            return self._producer

    def named_producer(self) -> Producer:
        """acks=all, no linger, retrying for up to CALL_RETRY_S, sending batches with the
        producer ids and sequences their writer gave them (the sink's chunks): not
        stamped with an id of its own (``enable_idempotence=False``), while the broker
        still checks their sequences."""
        with self._lock:
            if self._named_producer is None:
                self._named_producer = Producer(
                    self.admin.cluster.bootstrap,
                    acks="all",
                    linger_ms=0,
                    delivery_timeout_ms=int(CALL_RETRY_S * 1000),
                    enable_idempotence=False,
                    security=self.security,
                )
            return self._named_producer


def clients_for(bootstrap: str, security: ClientSecurity) -> Clients:
    """This process's clients of ``bootstrap`` with ``security`` (shared by every read
    and write)."""
    with _clients_lock:
        clients = _clients.get((bootstrap, security))
        if clients is None:
            clients = _clients[(bootstrap, security)] = Clients(bootstrap, security)
        return clients


class ClientOptions(Protocol):
    """What the source's and the sink's options say about reaching the cluster."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def security(self) -> ClientSecurity: ...


def clients_of(options: ClientOptions) -> Clients:
    """This process's clients of the cluster ``options`` name."""
    return clients_for(options.bootstrap, options.security)


def parse_source_options(options: Mapping[str, str], streaming: bool | None) -> SourceOptions:
    """The options, checked (``streaming`` None: what holds for batch and stream reads
    alike); TLS settings not given fall back to this (the driver's) environment, and their
    files are read once here so that a bad path fails now. ValueError names the
    problem."""
    try:
        parsed = planning.parse_options(options, streaming, ClientSecurity.from_env())
        parsed.security.check_files()
    except planning.OptionError as exc:
        raise ValueError(f"headwater source: {exc}") from None
    except HeadwaterError as exc:
        raise ValueError(f"headwater source: {exc.message}") from None
    return parsed


# --------------------------------------------------------------------------- facts


@dataclass(frozen=True, slots=True)
class Facts:
    """What the cluster holds now, for the subscribed partitions."""

    partitions: list[Key]
    topic_ids: dict[str, str]
    earliest: dict[Key, int]
    latest: dict[Key, int]  # high watermarks: the end of what consumers may read


def fetch_facts(options: SourceOptions) -> Facts:
    """Topics, partitions, ids and offset bounds of the subscription, from the cluster."""
    admin = clients_of(options).admin
    metadata = admin.cluster.refresh(retry_s=CALL_RETRY_S)
    counts = {t.name: len(t.partitions) for t in metadata.topics}
    ids = {t.name: t.topic_id for t in metadata.topics}
    missing = [t for t in options.subscription.named_topics() if t not in counts]
    if missing:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            f"topic(s) {', '.join(repr(t) for t in missing)} do not exist",
        )
    absent = options.subscription.missing_partitions(counts)
    if absent:
        raise HeadwaterError(
            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
            "assign names partitions that do not exist: "
            + ", ".join(f"{t}-{p} ({t} has {counts[t]})" for t, p in absent),
        )
    partitions = options.subscription.partitions_from(counts)
    earliest = admin.beginning_offsets(partitions)
    latest = admin.end_offsets(partitions)
    return Facts(partitions, {t: ids[t] for t, _ in partitions}, earliest, latest)


def _by_timestamp(
    options: SourceOptions, spec: planning.StartSpec, partitions: list[Key]
) -> dict[Key, int | None]:
    """The offsets the cluster finds for ``spec``'s timestamps (None: no record that
    recent); nothing for other kinds of spec. A per-partition spec names every partition
    of ``partitions`` (``_resolved`` checks the map rule first)."""
    if spec.kind not in ("timestamp", "timestamps"):
        return {}
    stamps = {
        k: spec.timestamp_ms if spec.kind == "timestamp" else spec.per_partition[k]
        for k in partitions
    }
    return clients_of(options).admin.offsets_matching_times(stamps)


def _report_data_loss(options: SourceOptions, findings: list[str], going_on: str) -> None:
    """Fail with ``findings`` (failOnDataLoss, the default), or log them and go on."""
    if not findings:
        return
    message = "; ".join(findings)
    if options.fail_on_data_loss:
        raise HeadwaterError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            message + ". Set failOnDataLoss=false to go on with a warning",
        )
    _log.warning("%s; %s (failOnDataLoss=false)", message, going_on)


def _resolved(
    options: SourceOptions, spec: planning.StartSpec, facts: Facts, side: str
) -> dict[Key, int]:
    """Offsets where reads start (``side`` "starting") or a batch read ends ("ending"):
    Kafka's map rule first (an option error), then offsets past the end (data loss),
    then the resolution. ValueError names an option's problem."""
    try:
        planning.check_partition_map(spec, facts.partitions)
        _report_data_loss(
            options, planning.past_the_end(spec, facts.latest), f"{side} at the partition's end"
        )
        found = _by_timestamp(options, spec, facts.partitions)
        if side == "starting":
            return planning.resolve_start(
                spec,
                facts.partitions,
                facts.earliest,
                facts.latest,
                found,
                options.no_match_strategy,
            )
        return planning.resolve_end(spec, facts.partitions, facts.latest, found)
    except planning.OptionError as exc:
        raise ValueError(f"headwater source: {exc}") from None


def starting_offsets(options: SourceOptions, facts: Facts) -> dict[Key, int]:
    """Where a new query (or a batch read) starts, by the starting options."""
    return _resolved(options, options.starting, facts, "starting")


def ending_offsets(options: SourceOptions, facts: Facts) -> dict[Key, int]:
    """Where a batch read ends (exclusive), by the ending options."""
    return _resolved(options, options.ending, facts, "ending")


# --------------------------------------------------------------------------- reading


class RangePartition(InputPartition):
    """One Spark input partition: an offset range of one topic-partition."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def output_schema(include_headers: bool, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema pyspark expects from ``read``: Spark's Kafka source columns
    (``headers`` with ``include_headers``), or ``columns`` of them in that order."""
    types = {name: arrow for name, arrow, _ in SOURCE_COLUMNS}
    if columns is None:
        columns = default_columns(include_headers)
    return pa.schema([(name, types[name]) for name in columns])


def requested_columns(schema: StructType, include_headers: bool) -> tuple[str, ...] | None:
    """The columns a read gives: None for all of them (the schema is the source's own),
    else those a schema given by the query names (``spark.read.schema(...)``), so that
    the columns a query does not use are never fetched into Spark (Spark 4.3 does not
    push a query's columns down to Python data sources). ValueError names a column that
    is not the source's, or has another type."""
    spark_types = {name.lower(): (name, spark) for name, _, spark in SOURCE_COLUMNS}
    names: list[str] = []
    for field in schema.fields:
        known = spark_types.get(field.name.lower())
        if known is None or known[0] in names:
            valid = ", ".join(f"{n} {t}" for n, _, t in SOURCE_COLUMNS)
            problem = "is given twice" if known else "is not a column of the source"
            raise ValueError(f"headwater source: column {field.name!r} {problem}; valid: {valid}")
        if field.dataType.simpleString() != known[1]:
            raise ValueError(
                f"headwater source: column {known[0]} is {field.dataType.simpleString()}; the "
                f"source gives {known[1]}"
            )
        names.append(known[0])
    return None if names == default_columns(include_headers) else tuple(names)


def to_output(
    data: bytes, offset_range: OffsetRange, position: int, schema: pa.Schema
) -> tuple[pa.RecordBatch | None, int, bool]:
    """The records of fetched ``data`` in [position, range end) as one record batch of
    ``schema``, and the offset after the last record seen (records a fetch returns
    before ``position``, from the first batch, are dropped). Decodes at most
    ``decoded_records_max(len(data))`` records and always the first batch; when that
    leaves batches undecoded, the offset returned is the last decoded batch's end and
    the third value is True (the caller fetches the rest again)."""
    columns: dict[str, list[pa.Array]] = {name: [] for name in schema.names}
    wanted = set(schema.names)
    next_offset = position
    rows = 0
    batches, resume = decode_batches_within(data)
    for decoded in batches:
        header = decoded.header
        records = decoded.records
        first = max(position - header.base_offset, 0)
        last = min(offset_range.until_offset - header.base_offset, records.num_rows)
        next_offset = max(next_offset, header.base_offset + records.num_rows)
        if last <= first or header.is_control:  # a control batch holds markers, not records
            continue
        records = records.slice(first, last - first)
        count = records.num_rows
        rows += count
        for name in ("key", "value", "offset"):
            if name in wanted:
                columns[name].append(records.column(name))
        if "timestamp" in wanted:
            columns["timestamp"].append(
                records.column("timestamp").cast(schema.field("timestamp").type)
            )
        if "timestampType" in wanted:
            columns["timestampType"].append(
                pa.repeat(pa.scalar(int(header.timestamp_type), pa.int32()), count)
            )
        if "headers" in wanted:
            headers = records.column("headers").cast(HEADERS_TYPE)
            if headers.null_count:  # records without headers: empty arrays, as in Kafka
                headers = pc.if_else(pc.is_null(headers), _NO_HEADERS, headers)
            columns["headers"].append(headers)
    if rows == 0:
        return None, next_offset, resume is not None
    if "topic" in wanted:
        columns["topic"] = [pa.repeat(pa.scalar(offset_range.topic, pa.string()), rows)]
    if "partition" in wanted:
        columns["partition"] = [pa.repeat(pa.scalar(offset_range.partition, pa.int32()), rows)]
    arrays = [
        parts[0] if len(parts) == 1 else pa.concat_arrays(parts)
        for parts in (columns[name] for name in schema.names)
    ]
    return pa.RecordBatch.from_arrays(arrays, schema=schema), next_offset, resume is not None


def read_range(
    options: SourceOptions, offset_range: OffsetRange, columns: Sequence[str] | None = None
) -> Iterator[pa.RecordBatch]:
    """Fetch ``offset_range`` from the partition's leader, as Arrow record batches of
    ``columns`` (``output_schema``)."""
    clients = clients_of(options)
    schema = output_schema(options.include_headers, columns)
    topic, partition = offset_range.topic, offset_range.partition
    position = offset_range.from_offset
    patience_until = time.monotonic() + READ_PATIENCE_S
    while position < offset_range.until_offset:
        try:
            response = clients.reader.fetch(
                topic,
                partition,
                position,
                max_bytes=options.fetch_max_bytes,
                max_wait_ms=FETCH_WAIT_MS,
            )
        except HeadwaterError as error:
            if error.code is not ErrorCode.OFFSET_OUT_OF_RANGE:
                raise
            position = _skip_lost(options, clients.admin, offset_range, position, error)
            continue
        batch, after, cut = to_output(response.records, offset_range, position, schema)
        if not cut:
            # Offsets a compacted topic no longer holds are skipped (the fetch's next
            # offset is past them, with no records between).
            after = max(after, min(response.next_offset, offset_range.until_offset))
        if batch is not None:
            yield batch
            patience_until = time.monotonic() + READ_PATIENCE_S
        if after == position and time.monotonic() > patience_until:
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT,
                f"{topic}-{partition}: offsets [{position}, {offset_range.until_offset}) "
                f"did not become readable within {READ_PATIENCE_S:g} s (high watermark "
                f"{response.high_watermark})",
            )
        position = after


def _skip_lost(
    options: SourceOptions,
    admin: Admin,
    offset_range: OffsetRange,
    position: int,
    cause: HeadwaterError,
) -> int:
    """Records from ``position`` are gone: fail (failOnDataLoss, the default) or warn and
    go on from the partition's log start."""
    key = (offset_range.topic, offset_range.partition)
    start = admin.beginning_offsets([key])[key]
    message = (
        f"{key[0]}-{key[1]}: offsets from {position} are no longer available "
        f"(the log starts at {start}; {cause.message})"
    )
    if start > position:
        resume = start
    else:  # out of range above the log end
        message += "; the topic was probably deleted and created again"
        resume = offset_range.until_offset
    if options.fail_on_data_loss:
        raise HeadwaterError(
            ErrorCode.OFFSET_OUT_OF_RANGE,
            message + ". Set failOnDataLoss=false to skip lost records with a warning",
        )
    _log.warning("%s; going on from %d (failOnDataLoss=false)", message, resume)
    return resume


class HeadwaterBatchReader(DataSourceReader):
    """``spark.read.format("headwater")``: from startingOffsets (default earliest) to
    endingOffsets (default latest), as of when the read is planned."""

    def __init__(self, options: SourceOptions, columns: Sequence[str] | None = None) -> None:
        self.options = options
        self.columns = columns

    def partitions(self) -> list[InputPartition]:
        facts = fetch_facts(self.options)
        start = starting_offsets(self.options, facts)
        end = ending_offsets(self.options, facts)
        inverted = planning.inverted_ranges(
            start, end, self.options.starting.option, self.options.ending.option
        )
        if inverted:
            raise ValueError(f"headwater source: {'; '.join(inverted)}")
        lost = planning.data_loss(start, facts.earliest, {}, {})
        if lost and self.options.fail_on_data_loss:
            raise HeadwaterError(ErrorCode.OFFSET_OUT_OF_RANGE, "; ".join(lost))
        ranges = planning.plan_ranges(
            start, end, self.options.min_partitions, self.options.max_records_per_partition
        )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):  # Spark's stand-in when there is none
            return iter(())
        return read_range(self.options, partition.range, self.columns)


class HeadwaterStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("headwater")``. Offsets are described in
    ``headwater.sparkconnector.planning``."""

    def __init__(self, options: SourceOptions, columns: Sequence[str] | None = None) -> None:
        self.options = options
        self.columns = columns
        self._target: dict[Key, int] | None = None  # Trigger.AvailableNow's end
        self._last_trigger_s = time.monotonic()
        self._last_facts: Facts | None = None  # as latestOffset last fetched them
        self._group_committed: dict[Key, int] | None = None  # groupId: what was committed

    def initialOffset(self) -> dict[str, Any]:
        facts = fetch_facts(self.options)
        return planning.encode_offsets(starting_offsets(self.options, facts), facts.topic_ids)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is not None:
            return ReadMaxRows(self.options.max_offsets_per_trigger)
        if self.options.min_offsets_per_trigger is not None:
            return ReadMinRows(self.options.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = dict(fetch_facts(self.options).latest)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        offsets, topic_ids = planning.decode_offsets(start)
        self._commit_to_group(offsets)
        facts = self._last_facts = fetch_facts(self.options)
        lost = planning.data_loss(offsets, facts.earliest, topic_ids, facts.topic_ids)
        if lost:
            message = "; ".join(lost)
            if self.options.fail_on_data_loss:
                raise HeadwaterError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    message + ". Set failOnDataLoss=false to go on with a warning",
                )
            _log.warning("%s (failOnDataLoss=false: going on)", message)
        recreated = {t for t, i in topic_ids.items() if facts.topic_ids.get(t, i) != i}
        # Where this trigger reads from, as partitions() will: partitions new to the query
        # (or of a recreated topic) from 0, as in Spark's Kafka source; offsets lost to
        # retention from the log start (read() skips them, failOnDataLoss=false).
        begin = {
            k: 0 if k not in offsets or k[0] in recreated else max(offsets[k], facts.earliest[k])
            for k in facts.partitions
        }
        latest = dict(facts.latest)
        if self._target is not None:
            latest = {k: min(latest[k], self._target[k]) for k in latest if k in self._target}
            begin = {k: v for k, v in begin.items() if k in latest}
        backlog = sum(max(latest[k] - begin[k], 0) for k in latest)
        end = latest
        if not isinstance(limit, ReadAllAvailable):
            minimum = self.options.min_offsets_per_trigger
            if isinstance(limit, ReadMinRows):
                minimum = limit.min_rows
            waited_ms = (time.monotonic() - self._last_trigger_s) * 1000
            if (
                minimum is not None
                and backlog < minimum
                and (waited_ms < self.options.max_trigger_delay_ms)
            ):
                return start
            maximum = self.options.max_offsets_per_trigger
            if isinstance(limit, ReadMaxRows):
                maximum = limit.max_rows
            if maximum is not None:
                end = planning.cap_by_limit(begin, latest, maximum)
        if backlog:
            self._last_trigger_s = time.monotonic()
        return planning.encode_offsets(end, facts.topic_ids)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The latest offsets as this trigger's latestOffset fetched them (Spark asks right
        after it, for the query's status)."""
        facts = self._last_facts or fetch_facts(self.options)
        return planning.encode_offsets(facts.latest, facts.topic_ids)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        begin, begin_ids = planning.decode_offsets(start)
        until, until_ids = planning.decode_offsets(end)
        from_offsets = {
            k: begin[k] if k in begin and begin_ids.get(k[0]) == until_ids.get(k[0]) else 0
            for k in until
        }
        ranges = planning.plan_ranges(
            from_offsets,
            until,
            self.options.min_partitions,
            self.options.max_records_per_partition,
        )
        return [RangePartition(r) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, RangePartition):  # Spark's stand-in when there is none
            return iter(())
        return read_range(self.options, partition.range, self.columns)

    def commit(self, end: dict[str, Any]) -> None:
        """The query's checkpoint holds its offsets (as in Spark's Kafka source, they are
        the source of truth); see ``_commit_to_group`` for the ``groupId`` option."""
        self._commit_to_group(planning.decode_offsets(end)[0])

    def _commit_to_group(self, done: Mapping[Key, int]) -> None:
        """With ``groupId``: store ``done``, the end of a finished micro-batch, as the
        group's committed offsets, so that ``headwater groups describe`` shows the query's
        lag. Called from ``latestOffset``, whose start is always the end of a finished
        batch (Spark plans the next batch only once the last one is in its commit log),
        so the lag is exact even after the last batch of ``availableNow``; Spark's own
        ``commit`` comes a batch later. A failed commit is logged, never fatal: the next
        one catches up."""
        group_id = self.options.group_id
        if group_id is None or dict(done) == self._group_committed:
            return
        try:
            clients_of(self.options).admin.alter_group_offsets(
                group_id, {TopicPartition(t, p): o for (t, p), o in done.items()}
            )
        except HeadwaterError as error:
            _log.warning("committing offsets to group %r failed: %s", group_id, error)
            return
        self._group_committed = dict(done)


class RefusedStreamReader(DataSourceStreamReader):
    """A stream whose options were refused: every question Spark asks fails with the
    options' error (``HeadwaterDataSource.streamReader`` says why it is not raised at
    once); ``stop`` succeeds, so that the error is the one Spark reports."""

    def __init__(self, error: ValueError) -> None:
        self.error = error

    def initialOffset(self) -> dict[str, Any]:
        raise self.error

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        raise self.error

    def getDefaultReadLimit(self) -> ReadLimit:
        raise self.error

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        raise self.error

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        raise self.error

    def stop(self) -> None:
        return None
