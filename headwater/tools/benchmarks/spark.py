"""``headwater bench spark``: the Spark connector's figures on a local node.

- **Ingest**: ``spark.read.format("headwater")`` of the whole topic into Spark's ``noop``
  sink, against the peer, the same rows and columns read from a Parquet file into
  ``noop``. The two alternate for ``--rounds`` rounds after one warm-up each, and the
  medians are compared.
- **Aggregate**: the same, for a query that aggregates every record (``AGGREGATE``:
  count, total value length, sum of offsets, latest timestamp); both answers must agree.
  Also with the query's columns given as a schema (``AGGREGATE_COLUMNS``: Spark 4.3
  pushes no column list down to Python data sources, so a schema is how a query names
  them).
- **Ceiling**: what Spark's Python data source path itself allows: a Python source
  (``CeilingSource``) yielding prebuilt Arrow batches of the same columns and rows,
  with no fetching or decoding, into ``noop`` and the aggregate query, against Parquet.
- **Streaming ingest**: a streaming query's steady state: the backlog read in five
  micro-batches, as Spark reports their rows and execution time (the first excluded).
- **Sink**: ``df.write.format("headwater")`` of generated 100-byte values, rows/s.
- **Micro-batch latency**: a producer sends one timestamped record every 100 ms; a
  streaming query (default trigger: the next micro-batch starts when the last ends) hands
  each micro-batch to ``foreachBatch``, which notes when each record became visible.
"""

from __future__ import annotations

import itertools
import json
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from headwater.client import NewTopic
from headwater.sparkconnector.session import local_session
from headwater.sparkconnector.source import output_schema, read_schema_ddl
from headwater.tools.benchmarks.cluster import bench_cluster_of, run_bench, wait_all_running
from headwater.tools.benchmarks.perf import percentile

LATENCY_INTERVAL_S = 0.1
AGGREGATE = (
    "count(*) AS records",
    "sum(length(value)) AS value_bytes",
    "sum(offset) AS offsets",
    "max(timestamp) AS latest",
)
AGGREGATE_COLUMNS = "value BINARY, offset BIGINT, timestamp TIMESTAMP"
PARTS = ("ingest", "aggregate", "ceiling", "streaming", "sink", "latency", "restart")
CEILING_BATCH_ROWS = 65536


def _timed(run: Any) -> float:
    began = time.perf_counter()
    run()
    return time.perf_counter() - began


def run_spark_bench(
    records: int, partitions: int, rounds: int, samples: int, parts: tuple[str, ...] = PARTS
) -> dict[str, Any]:
    """The figures of ``parts`` (all by default), as a dict for ``--json``."""
    results: dict[str, Any] = {"records": records, "partitions": partitions, "value_bytes": 100}
    root = Path(tempfile.mkdtemp(prefix="headwater-bench-spark-"))
    cluster = bench_cluster_of(1, root)
    try:
        cluster.start(wait=False)
        wait_all_running(cluster)
        bootstrap = cluster.nodes[1].address
        cluster.admin(1).create_topics(
            [
                NewTopic("ingest", partitions, 1),
                NewTopic("sink", partitions, 1),
                NewTopic("latency", 1, 1),
                NewTopic("restart", partitions, 1),
            ]
        )
        produced = run_bench(
            bootstrap,
            "produce",
            "--topic",
            "ingest",
            "--records",
            str(records),
            "--partitions",
            str(partitions),
        )
        results["produce_records_per_s"] = produced["records_per_s"]
        spark = local_session("headwater-bench")
        try:
            parquet = root / "ingest.parquet"
            if {"ingest", "aggregate", "ceiling"} & set(
                parts
            ):  # the peer: the same rows in Parquet
                _headwater(spark, bootstrap).load().write.parquet(str(parquet))
            if "ingest" in parts:
                results.update(_ingest(spark, bootstrap, parquet, records, rounds))
            if "aggregate" in parts:
                results.update(_aggregate(spark, bootstrap, parquet, records, rounds))
            if "ceiling" in parts:
                results.update(_ceiling(spark, parquet, records, partitions, rounds))
            if "streaming" in parts:
                results.update(_streaming_ingest(spark, bootstrap, root, records))
            if "sink" in parts:
                results.update(_sink(spark, bootstrap, records))
            if "latency" in parts:
                results.update(_latency(spark, bootstrap, root, samples))
            if "restart" in parts:
                results.update(_restart(spark, bootstrap, root, records, partitions))
        finally:
            spark.stop()
    finally:
        cluster.close()
        shutil.rmtree(root, ignore_errors=True)
    return results


def _against_parquet(
    headwater_run: Any, parquet_run: Any, records: int, rounds: int, prefix: str
) -> dict[str, Any]:
    """Time the two runs alternately for ``rounds`` rounds after a warm-up of each
    (Python workers, JIT, page cache); rows/s of the medians and their ratio."""
    headwater_run()
    parquet_run()
    headwater_s: list[float] = []
    parquet_s: list[float] = []
    for _ in range(rounds):
        headwater_s.append(_timed(headwater_run))
        parquet_s.append(_timed(parquet_run))
    headwater_rate = records / statistics.median(headwater_s)
    parquet_rate = records / statistics.median(parquet_s)
    return {
        f"{prefix}rows_per_s": round(headwater_rate),
        f"{prefix}rows_per_s_by_round": [round(records / s) for s in headwater_s],
        f"{prefix}parquet_rows_per_s": round(parquet_rate),
        f"{prefix}parquet_rows_per_s_by_round": [round(records / s) for s in parquet_s],
        f"{prefix}ratio_to_parquet": round(headwater_rate / parquet_rate, 3),
    }


def _noop(frame: Any) -> None:
    """Read all of ``frame`` into Spark's ``noop`` sink."""
    frame.write.format("noop").mode("overwrite").save()


def _aggregated(frame: Any) -> list[Any]:
    """The AGGREGATE query's answer over ``frame``."""
    return list(frame.selectExpr(*AGGREGATE).collect())


def _ingest(spark: Any, bootstrap: str, parquet: Path, records: int, rounds: int) -> dict[str, Any]:
    return _against_parquet(
        lambda: _noop(_headwater(spark, bootstrap).load()),
        lambda: _noop(spark.read.parquet(str(parquet))),
        records,
        rounds,
        "batch_read_",
    )


def _aggregate(
    spark: Any, bootstrap: str, parquet: Path, records: int, rounds: int
) -> dict[str, Any]:
    answers: dict[str, Any] = {}

    def headwater_query() -> None:
        answers["headwater"] = _aggregated(_headwater(spark, bootstrap).load())

    def parquet_query() -> None:
        answers["parquet"] = _aggregated(spark.read.parquet(str(parquet)))

    def headwater_columns_query() -> None:
        frame = _headwater(spark, bootstrap, AGGREGATE_COLUMNS).load()
        answers["headwater_columns"] = _aggregated(frame)

    results = _against_parquet(headwater_query, parquet_query, records, rounds, "aggregate_")
    results |= _against_parquet(
        headwater_columns_query, parquet_query, records, rounds, "aggregate_columns_"
    )
    if not answers["headwater"] == answers["headwater_columns"] == answers["parquet"]:
        raise click.ClickException(
            f"the aggregate query's answers differ: {answers['headwater']} and "
            f"{answers['headwater_columns']} against {answers['parquet']}"
        )
    return results


class CeilingSource(DataSource):
    """``format("headwater-bench-ceiling")``: ``records`` rows of the Kafka source's
    columns (100-byte values) in ``partitions`` input partitions, yielded as slices of
    one prebuilt Arrow batch: Spark's Python data source path with no work in Python."""

    @classmethod
    def name(cls) -> str:
        return "headwater-bench-ceiling"

    def schema(self) -> str:
        return read_schema_ddl(include_headers=False)

    def reader(self, schema: StructType) -> DataSourceReader:  # noqa: ARG002 (pyspark's)
        return _CeilingReader(int(self.options["records"]), int(self.options["partitions"]))


class _CeilingReader(DataSourceReader):
    def __init__(self, records: int, partitions: int) -> None:
        self.records = records
        self.partitions_count = partitions

    def partitions(self) -> list[InputPartition]:
        share = -(-self.records // self.partitions_count)
        bounds = [min(i * share, self.records) for i in range(self.partitions_count + 1)]
        return [InputPartition((a, b)) for a, b in itertools.pairwise(bounds)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        first, end = partition.value
        rows = CEILING_BATCH_ROWS
        batch = pa.RecordBatch.from_arrays(
            [
                pa.nulls(rows, pa.binary()),
                pa.array([b"x" * 100] * rows, pa.binary()),
                pa.repeat(pa.scalar("ingest", pa.string()), rows),
                pa.repeat(pa.scalar(0, pa.int32()), rows),
                pa.array(range(rows), pa.int64()),
                pa.repeat(pa.scalar(1_700_000_000_000_000, pa.timestamp("us", tz="UTC")), rows),
                pa.repeat(pa.scalar(0, pa.int32()), rows),
            ],
            schema=output_schema(include_headers=False),
        )
        for start in range(first, end, rows):
            yield batch.slice(0, min(rows, end - start))


def _ceiling(
    spark: Any, parquet_path: Path, records: int, partitions: int, rounds: int
) -> dict[str, Any]:
    spark.dataSource.register(CeilingSource)

    def ceiling() -> Any:
        reader = spark.read.format(CeilingSource.name()).option("records", str(records))
        return reader.option("partitions", str(partitions)).load()

    def parquet() -> Any:
        return spark.read.parquet(str(parquet_path))

    return _against_parquet(
        lambda: _noop(ceiling()), lambda: _noop(parquet()), records, rounds, "ceiling_noop_"
    ) | _against_parquet(
        lambda: _aggregated(ceiling()),
        lambda: _aggregated(parquet()),
        records,
        rounds,
        "ceiling_aggregate_",
    )


def _headwater(spark: Any, bootstrap: str, schema: str | None = None) -> Any:
    reader = spark.read.format("headwater").option("bootstrap", bootstrap)
    if schema is not None:
        reader = reader.schema(schema)
    return reader.option("subscribe", "ingest")


def _streaming_ingest(spark: Any, bootstrap: str, root: Path, records: int) -> dict[str, Any]:
    """Steady-state streaming ingest: the backlog in micro-batches of a fifth of it; the
    rate is Spark's own (rows over trigger execution time), first micro-batch excluded."""
    query = (
        spark.readStream.format("headwater")
        .option("bootstrap", bootstrap)
        .option("subscribe", "ingest")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(max(records // 5, 1)))
        .load()
        .writeStream.format("noop")
        .option("checkpointLocation", str(root / "ck-ingest"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    steady = [p for p in query.recentProgress if p["numInputRows"]][1:]
    rows = sum(p["numInputRows"] for p in steady)
    seconds = sum(p["durationMs"]["triggerExecution"] for p in steady) / 1000
    return {
        "streaming_ingest_rows_per_s": round(rows / seconds) if seconds else None,
        "streaming_ingest_microbatches": len(steady),
    }


def _sink(spark: Any, bootstrap: str, records: int) -> dict[str, Any]:
    frame = spark.range(records).selectExpr(
        "CAST(concat(lpad(CAST(id AS STRING), 12, '0'), repeat('x', 88)) AS BINARY) AS value"
    )
    frame.cache().count()  # generate once, so that the write alone is timed

    def write() -> None:
        frame.write.mode("append").format("headwater").option("bootstrap", bootstrap).option(
            "topic", "sink"
        ).save()

    seconds = _timed(write)
    return {"sink_rows_per_s": round(records / seconds)}


def _latency(spark: Any, bootstrap: str, root: Path, samples: int) -> dict[str, Any]:
    """Produce-to-visible latency in steady state: warm-up records (``w`` and a time)
    until one is seen, which also gives the first micro-batch's delay after the query
    starts; then one timestamped record every LATENCY_INTERVAL_S."""
    from headwater.client import Producer

    seen_ms: list[float] = []
    warm = threading.Event()
    done = threading.Event()

    def on_batch(frame: Any, _batch_id: int) -> None:
        now = time.time_ns()
        for row in frame.select("value").collect():
            value = bytes(row.value)
            if value.startswith(b"w"):
                warm.set()
            else:
                seen_ms.append((now - int(value)) / 1e6)
        if len(seen_ms) >= samples:
            done.set()

    started = time.monotonic()
    query = (
        spark.readStream.format("headwater")
        .option("bootstrap", bootstrap)
        .option("subscribe", "latency")
        .option("startingOffsets", "latest")
        .load()
        .writeStream.foreachBatch(on_batch)
        .option("checkpointLocation", str(root / "ck-latency"))
        .start()
    )
    first_visible_s = None
    try:
        with Producer(bootstrap, acks="1", linger_ms=0) as producer:
            deadline = time.monotonic() + samples * LATENCY_INTERVAL_S * 20 + 120
            while not done.is_set() and time.monotonic() < deadline:
                if first_visible_s is None and warm.is_set():
                    first_visible_s = time.monotonic() - started
                prefix = b"" if first_visible_s is not None else b"w"
                producer.send("latency", prefix + b"%d" % time.time_ns())
                producer.flush()
                time.sleep(LATENCY_INTERVAL_S)
    finally:
        query.stop()
    ordered = sorted(seen_ms[:samples])
    if not ordered:
        raise click.ClickException("no record reached the streaming query")
    return {
        "microbatch_first_visible_s": round(first_visible_s or 0.0, 2),
        "microbatch_latency_samples": len(ordered),
        "microbatch_latency_ms_p50": round(percentile(ordered, 0.5), 1),
        "microbatch_latency_ms_p99": round(percentile(ordered, 0.99), 1),
        "microbatch_spark_ms_p50": spark_phases(query.recentProgress),
    }


def _restart(
    spark: Any, bootstrap: str, root: Path, records: int, partitions: int
) -> dict[str, Any]:
    """The first micro-batch after a restart: a query reads topic ``restart`` from its
    end and stops; a backlog of a fifth of ``records`` is produced while it is down; the
    query starts again from its checkpoint. Measured three times: ``first`` and
    ``default`` with the whole backlog in the first micro-batch (Spark's default, as in
    Kafka's source), ``capped`` with ``maxOffsetsPerTrigger`` a tenth of the backlog.
    Run alone (``--parts restart``), ``first`` is the session's first job that reads
    records, which starts Spark's Python workers. For each: seconds from ``start()``
    to the first micro-batch with records done, its rows and Spark's phases, and
    seconds to the backlog's end."""
    backlog = max(records // 5, partitions)
    results: dict[str, Any] = {"restart_backlog_records": backlog}
    capped = max(backlog // 10, 1)
    for label, limit in (("first", None), ("default", None), ("capped", capped)):
        checkpoint = str(root / f"ck-restart-{label}")

        def started(checkpoint: str = checkpoint, limit: int | None = limit) -> Any:
            reader = (
                spark.readStream.format("headwater")
                .option("bootstrap", bootstrap)
                .option("subscribe", "restart")
                .option("startingOffsets", "latest")
            )
            if limit is not None:
                reader = reader.option("maxOffsetsPerTrigger", str(limit))
            return (
                reader.load()
                .writeStream.format("noop")
                .option("checkpointLocation", checkpoint)
                .trigger(processingTime="100 milliseconds")
                .start()
            )

        query = started()
        deadline = time.monotonic() + 300
        while not query.recentProgress and time.monotonic() < deadline:
            time.sleep(0.05)  # the first micro-batch pins the start offsets
        query.stop()
        if not query.recentProgress:
            raise click.ClickException("restart: the query made no micro-batch in 300 s")
        run_bench(
            bootstrap,
            "produce",
            "--topic",
            "restart",
            "--records",
            str(backlog),
            "--partitions",
            str(partitions),
        )
        began = time.monotonic()
        query = started()
        first_s = None
        first: dict[str, Any] = {}
        try:
            read = 0
            while read < backlog and time.monotonic() < began + 300:
                progress = [p for p in query.recentProgress if p["numInputRows"]]
                if progress and first_s is None:
                    first_s = time.monotonic() - began
                    first = progress[0]
                read = sum(p["numInputRows"] for p in progress)
                time.sleep(0.05)
            caught_up_s = time.monotonic() - began
        finally:
            query.stop()
        if first_s is None or read < backlog:
            raise click.ClickException(
                f"restart: {read} of the {backlog} backlog records read in {caught_up_s:.0f} s"
            )
        results[f"restart_{label}_first_microbatch_s"] = round(first_s, 2)
        results[f"restart_{label}_first_microbatch_rows"] = first.get("numInputRows")
        results[f"restart_{label}_first_microbatch_spark_ms"] = first.get("durationMs")
        results[f"restart_{label}_caught_up_s"] = round(caught_up_s, 2)
    return results


def spark_phases(progress: list[dict[str, Any]]) -> dict[str, float]:
    """What Spark spent per micro-batch that read records, by phase (its own
    ``durationMs``: ``latestOffset`` and ``getBatch`` ask the source, ``addBatch`` runs
    the batch, ``walCommit`` and ``commitOffsets`` write the checkpoint), medians."""
    phases: dict[str, list[float]] = {}
    for event in progress:
        if event.get("numInputRows"):
            for phase, ms in event.get("durationMs", {}).items():
                phases.setdefault(phase, []).append(float(ms))
    return {phase: statistics.median(values) for phase, values in sorted(phases.items())}


@click.command("spark")
@click.option("--records", type=click.IntRange(1000), default=5_000_000, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--rounds", type=click.IntRange(1, 10), default=3, show_default=True)
@click.option("--latency-samples", type=click.IntRange(5, 10_000), default=100, show_default=True)
@click.option(
    "--parts",
    default=",".join(PARTS),
    show_default=True,
    help="Which figures, comma-separated.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_spark(
    records: int, partitions: int, rounds: int, latency_samples: int, parts: str, as_json: bool
) -> None:
    """Spark connector figures on a local node (local[2]): batch reads (noop and an
    aggregate query) against Parquet in the same run, streaming ingest, sink rows/s, and
    produce-to-visible micro-batch latency."""
    chosen = tuple(p.strip() for p in parts.split(",") if p.strip())
    unknown = sorted(set(chosen) - set(PARTS))
    if unknown or not chosen:
        raise click.BadParameter(f"{unknown or parts!r}; valid: {', '.join(PARTS)}")
    results = run_spark_bench(records, partitions, rounds, latency_samples, chosen)
    if as_json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        click.echo(f"{key}: {value}")
