"""The Spark source and sink with real pyspark (local mode) against real nodes.

One SparkSession serves the module (starting one takes 6-8 s). The session never calls
``register``: ``format("headwater")`` is found through the ``pyspark_headwater`` module.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headwater.client import Admin, Consumer, OffsetSpec, Producer
from headwater.client.positions import TopicPartition
from headwater.sparkconnector import planning, sink
from headwater.sparkconnector.session import local_session
from headwater.tools.ports import free_port, free_port_block
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, wait_until

pyspark = pytest.importorskip("pyspark")
from pyspark.sql import SparkSession  # noqa: E402

pytestmark = pytest.mark.slow
DEMO_DEADLINE_S = 180


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = local_session("headwater-tests")
    session.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    # Retention runs every 200 ms so that the data-loss test need not wait a minute.
    process = NodeProcess(
        tmp_path_factory.mktemp("spark-node") / "data",
        env={"HEADWATER_RETENTION_CHECK_INTERVAL_MS": "200"},
        kafka_port=free_port(),
    )
    process.start()
    try:
        yield process
    finally:
        process.kill()


def produce(address: str, topic: str, values: list[bytes], keyed: bool = True) -> None:
    with Producer(address, acks="all", linger_ms=5) as producer:
        futures = [
            producer.send(topic, v, key=(b"k%d" % (i % 13)) if keyed else None)
            for i, v in enumerate(values)
        ]
        producer.flush()
    for future in futures:
        future.result(timeout=30)


def to_parquet(frame: Any, out: Path, checkpoint: Path, **trigger: Any) -> Any:
    """Start writing ``frame`` as Parquet files to ``out``."""
    writer = frame.writeStream.format("parquet").option("path", str(out))
    return writer.option("checkpointLocation", str(checkpoint)).trigger(**trigger).start()


def read_values(spark: SparkSession, path: Path) -> list[str]:
    return [r.v for r in spark.read.parquet(str(path)).collect()]


def stream(spark: SparkSession, address: str, **options: str) -> Any:
    reader = spark.readStream.format("headwater").option("bootstrap", address)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


# --------------------------------------------------------------------------- source


def test_streaming_read_restarts_from_its_checkpoint_exactly_once(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("ex", 3)
    produce(node.address, "ex", [b"a%d" % i for i in range(6000)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run() -> list[int]:
        frame = stream(
            spark,
            node.address,
            subscribe="ex",
            startingOffsets="earliest",
            maxOffsetsPerTrigger="2500",
            groupId="spark-ex",
        )
        query = to_parquet(
            frame.selectExpr("CAST(value AS STRING) v"), out, checkpoint, availableNow=True
        )
        query.awaitTermination(120)
        assert not query.isActive
        return [p["numInputRows"] for p in query.recentProgress]

    def group_lag() -> list[int | None]:
        # groupId: each finished micro-batch's end offsets are committed to the group.
        with Admin(node.address) as admin:
            return [row.lag for row in admin.group_lag(admin.describe_group("spark-ex"))]

    first = run()
    assert sum(first) == 6000
    assert max(first) <= 2500, f"maxOffsetsPerTrigger not honoured: {first}"
    assert group_lag() == [0, 0, 0]
    produce(node.address, "ex", [b"b%d" % i for i in range(3000)])
    assert sum(group_lag()) == 3000  # type: ignore[arg-type]
    second = run()
    assert sum(second) == 3000  # only the new records: the checkpoint held the offsets
    assert group_lag() == [0, 0, 0]
    values = read_values(spark, out)
    assert len(values) == 9000
    assert sorted(values) == sorted([f"a{i}" for i in range(6000)] + [f"b{i}" for i in range(3000)])


def test_stopping_mid_stream_and_restarting_loses_and_repeats_nothing(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("mid", 2)
    produce(node.address, "mid", [b"%d" % i for i in range(4000)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def start() -> Any:
        frame = stream(
            spark,
            node.address,
            subscribe="mid",
            startingOffsets="earliest",
            maxOffsetsPerTrigger="500",
        )
        return to_parquet(
            frame.selectExpr("CAST(value AS STRING) v"),
            out,
            checkpoint,
            processingTime="100 milliseconds",
        )

    query = start()
    wait_until(
        lambda: query.lastProgress and query.lastProgress["batchId"] >= 2,
        120,
        "three micro-batches",
    )
    query.stop()  # mid-stream: most of the backlog is unread
    produce(node.address, "mid", [b"%d" % i for i in range(4000, 5000)])
    query = start()
    try:
        wait_until(lambda: len(read_values(spark, out)) >= 5000, 120, "every record")
    finally:
        query.stop()
    values = sorted(int(v) for v in read_values(spark, out))
    assert values == list(range(5000))


def test_batch_read_with_offsets_headers_and_schema(spark: SparkSession, node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("br", 2)
    with Producer(node.address, acks="all") as producer:
        for i in range(100):
            producer.send("br", b"v%d" % i, key=b"k", headers=[("h", b"%d" % i)], partition=i % 2)
        producer.flush()
    reader = spark.read.format("headwater").option("bootstrap", node.address)
    frame = (
        reader.option("subscribe", "br")
        .option("includeHeaders", "true")
        .option("startingOffsets", json.dumps({"br": {"0": 10, "1": -2}}))
        .option("endingOffsets", json.dumps({"br": {"0": 20, "1": -1}}))
        .load()
    )
    assert [f.name for f in frame.schema.fields] == [
        "key",
        "value",
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestampType",
        "headers",
    ]
    rows = frame.collect()
    p0 = sorted(r.offset for r in rows if r.partition == 0)
    p1 = sorted(r.offset for r in rows if r.partition == 1)
    assert p0 == list(range(10, 20))
    assert p1 == list(range(50))
    row = next(r for r in rows if r.partition == 0 and r.offset == 10)
    assert (row.key, row.value, row.topic, row.timestampType) == (b"k", b"v20", "br", 0)
    assert [(h.key, h.value) for h in row.headers] == [("h", b"20")]
    assert row.timestamp is not None
    plain = (
        spark.read.format("headwater").option("bootstrap", node.address).option("subscribe", "br")
    ).load()
    assert "headers" not in plain.columns
    assert plain.count() == 100


def test_records_produced_by_a_kafka_client_read_the_same_through_spark(
    spark: SparkSession, node: NodeProcess
) -> None:
    """Batches a Kafka client produced (kept as they came, lz4) reach Spark with the
    keys, values, headers, timestamps and offsets the client sent."""
    kafka_producer = pytest.importorskip("confluent_kafka").Producer
    with Admin(node.address) as admin:
        admin.create_topic("from-kafka", 1)
    stamp = int(time.time() * 1000) - 60_000
    assert node.kafka_address is not None
    producer = kafka_producer(
        {"bootstrap.servers": node.kafka_address, "compression.type": "lz4", "linger.ms": 20}
    )
    for i in range(300):
        producer.produce(
            "from-kafka",
            key=None if i % 7 == 0 else b"k%d" % i,
            value=b"v%d" % i,
            headers=[("h", b"%d" % i)],
            timestamp=stamp + i,
        )
    assert producer.flush(30) == 0
    rows = (
        spark.read.format("headwater")
        .option("bootstrap", node.address)
        .option("subscribe", "from-kafka")
        .option("includeHeaders", "true")
        .load()
        .collect()
    )
    got = sorted(
        (
            r.offset,
            r.key,
            r.value,
            [(h.key, h.value) for h in r.headers],
            int(r.timestamp.timestamp() * 1000 + 0.5),
        )
        for r in rows
    )
    assert got == [
        (i, None if i % 7 == 0 else b"k%d" % i, b"v%d" % i, [("h", b"%d" % i)], stamp + i)
        for i in range(300)
    ]


def test_subscribe_pattern_picks_up_new_topics_and_partitions(
    spark: SparkSession, node: NodeProcess
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("pat-a", 1)
    produce(node.address, "pat-a", [b"a%d" % i for i in range(10)])
    query = (
        stream(spark, node.address, subscribePattern=r"pat-.*", startingOffsets="earliest")
        .selectExpr("topic", "CAST(value AS STRING) v")
        .writeStream.format("memory")
        .queryName("pattern")
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: spark.table("pattern").count() == 10, 60, "pat-a records")
        with Admin(node.address) as admin:
            admin.create_topic("pat-b", 2)
            admin.create_partitions("pat-a", 2)
        produce(node.address, "pat-b", [b"b%d" % i for i in range(20)])
        produce(node.address, "pat-a", [b"c%d" % i for i in range(20)])
        wait_until(lambda: spark.table("pattern").count() == 50, 60, "records of new topics")
    finally:
        query.stop()
    rows = spark.table("pattern").collect()
    assert sorted(r.v for r in rows) == sorted(
        [f"a{i}" for i in range(10)] + [f"b{i}" for i in range(20)] + [f"c{i}" for i in range(20)]
    )


def test_fail_on_data_loss_when_retention_deletes_unread_records(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("lossy", 1, configs={"segment_bytes": "4096", "retention_bytes": "8192"})
    for _ in range(5):  # small batches, so that segments roll and retention can act
        produce(node.address, "lossy", [b"x" * 100 for _ in range(10)], keyed=False)
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run(**extra: str) -> Any:
        frame = stream(spark, node.address, subscribe="lossy", startingOffsets="earliest", **extra)
        return to_parquet(frame.selectExpr("offset"), out, checkpoint, availableNow=True)

    query = run()
    query.awaitTermination(120)
    assert query.exception() is None
    read_before = spark.read.parquet(str(out)).count()
    # Write enough that retention deletes records the query has not read yet.
    for _ in range(40):
        produce(node.address, "lossy", [b"y" * 100 for _ in range(10)], keyed=False)
    with Admin(node.address) as admin:
        wait_until(
            lambda: admin.list_offsets("lossy", OffsetSpec.EARLIEST)[0] > read_before + 10,
            30,
            "retention to delete unread records",
        )
    query = run()
    with pytest.raises(Exception, match=r"offsets 50 to \d+ were deleted before they were read"):
        query.awaitTermination(120)
    query = run(failOnDataLoss="false")
    query.awaitTermination(120)
    assert query.exception() is None
    offsets = [r.offset for r in spark.read.parquet(str(out)).collect()]
    assert len(offsets) == len(set(offsets))  # the rest was read once, after a warning
    assert max(offsets) == 449


def test_a_schema_given_reads_only_its_columns(spark: SparkSession, node: NodeProcess) -> None:
    """Spark 4.3 pushes no column list down to Python data sources; a schema the query
    gives names the columns to read, in its order, and nothing else crosses into Spark."""
    with Admin(node.address) as admin:
        admin.create_topic("narrow", 2)
    produce(node.address, "narrow", [b"n%d" % i for i in range(200)])

    def read(schema: str) -> Any:
        frame = spark.read.format("headwater").schema(schema).option("bootstrap", node.address)
        return frame.option("subscribe", "narrow").load()

    narrow = read("offset BIGINT, value BINARY")
    assert narrow.columns == ["offset", "value"]
    rows = narrow.collect()
    assert sorted(bytes(r.value) for r in rows) == sorted(b"n%d" % i for i in range(200))
    full = spark.read.format("headwater").option("bootstrap", node.address)
    full = full.option("subscribe", "narrow").load()
    expected = full.selectExpr("offset", "value").orderBy("offset", "value").collect()
    assert narrow.orderBy("offset", "value").collect() == expected
    counted = read("timestamp TIMESTAMP, partition INT").groupBy("partition").count()
    assert sum(r["count"] for r in counted.collect()) == 200
    with pytest.raises(Exception, match="column 'offsets' is not a column of the source"):
        read("offsets BIGINT").collect()
    with pytest.raises(Exception, match="column offset is int; the source gives bigint"):
        read("offset INT").collect()
    stream_frame = spark.readStream.format("headwater").schema("value BINARY")
    stream_frame = stream_frame.option("bootstrap", node.address).option("subscribe", "narrow")
    query = (
        stream_frame.option("startingOffsets", "earliest")
        .load()
        .writeStream.format("memory")
        .queryName("narrow_values")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    assert spark.table("narrow_values").count() == 200


def test_bad_options_are_named(spark: SparkSession, node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("bad-opts", 2)
    with Producer(node.address, acks="all") as producer:
        for i in range(100):
            producer.send("bad-opts", b"v%d" % i, partition=i % 2)
        producer.flush()
    cases = [
        ({}, "exactly one of subscribe"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, "exactly one of subscribe"),
        ({"subscribe": "nosuch"}, "do not exist"),
        ({"subscribe": "bad-opts", "startingOffsets": "{bad"}, "not valid JSON"),
        (
            {"subscribe": "bad-opts", "endingOffsets": '{"bad-opts": {"0": -2}}'},
            "cannot be earliest",
        ),
        ({"subscribe": "bad-opts", "maxOffsetsPerTrigger": "0"}, "must be >= 1"),
        ({"subscribePattern": "("}, "not a valid regex"),
        ({"subscribe": "bad-opts", "groupId": "g"}, "groupId is for streams"),
        # Silently ignored before the options table (docs/spark.md):
        ({"subscribe": "bad-opts", "startingOffset": "earliest"}, "did you mean startingOffsets"),
        ({"subscribe": "bad-opts", "kafka.group.id": "g"}, "option kafka.group.id is refused"),
        # Kafka's rules, silently bent before: a partial map started the partitions it
        # left out at earliest, an offset past the end was clamped.
        (
            {"subscribe": "bad-opts", "startingOffsets": '{"bad-opts": {"0": 1}}'},
            "it leaves out bad-opts-1",
        ),
        (
            {"subscribe": "bad-opts", "endingOffsets": '{"bad-opts": {"0": 9999, "1": -1}}'},
            "bad-opts-0 ends at offset 50, before the 9999 asked for",
        ),
        (
            {
                "subscribe": "bad-opts",
                "startingOffsets": '{"bad-opts": {"0": 30, "1": 0}}',
                "endingOffsets": '{"bad-opts": {"0": 20, "1": -1}}',
            },
            "bad-opts-0: the starting offset 30 is after the ending offset 20",
        ),
    ]
    for options, expected in cases:
        frame = spark.read.format("headwater").option("bootstrap", node.address)
        for key, value in options.items():
            frame = frame.option(key, value)
        with pytest.raises(Exception, match=expected):
            frame.load().collect()
    # failOnDataLoss=false: the end is where the partition ends, with a warning.
    past = json.dumps({"bad-opts": {"0": 9999, "1": -1}})
    frame = spark.read.format("headwater").option("bootstrap", node.address)
    frame = frame.option("subscribe", "bad-opts").option("endingOffsets", past)
    assert frame.option("failOnDataLoss", "false").load().count() == 100


def test_options_fail_at_load_in_one_line(spark: SparkSession, node: NodeProcess) -> None:
    """Bad values failed only when the query started, and in a stream with pyspark's
    own ``UnboundLocalError`` after a Python traceback; without a bootstrap option the
    source dialled 127.0.0.1:7700 (on a shared machine, another cluster)."""
    for reader in (spark.read, spark.readStream):
        frame = reader.format("headwater").option("subscribe", "bad-opts")
        with pytest.raises(Exception, match=r"kafka\.bootstrap\.servers is required") as raised:
            frame.load()  # no query yet
        assert "Traceback" not in str(raised.value)  # the session hides tracebacks
        frame = frame.option("bootstrap", node.address).option("startingOffset", "earliest")
        with pytest.raises(Exception, match="did you mean startingOffsets"):
            frame.load()
    frame = spark.readStream.format("headwater").option("bootstrap", node.address)
    frame = frame.option("subscribe", "bad-opts").option("endingTimestamp", "5").load()
    query = frame.writeStream.format("noop").start()
    with pytest.raises(Exception, match="endingTimestamp is for batch reads") as raised:
        query.awaitTermination(60)
    assert "UnboundLocalError" not in str(raised.value)


def test_offset_planning_splits_by_backlog_and_size() -> None:
    start = {("t", 0): 0, ("t", 1): 100, ("t", 2): 50}
    latest = {("t", 0): 1000, ("t", 1): 200, ("t", 2): 50}
    end = planning.cap_by_limit(start, latest, 330)
    assert sum(end[k] - start[k] for k in start) == 330
    assert end == {("t", 0): 300, ("t", 1): 130, ("t", 2): 50}
    ranges = planning.plan_ranges(start, latest, max_records_per_partition=400)
    assert [(r.partition, r.from_offset, r.until_offset) for r in ranges] == [
        (0, 0, 333),
        (0, 333, 666),
        (0, 666, 1000),
        (1, 100, 200),
    ]


# --------------------------------------------------------------------------- sink


def test_sink_round_trip_batch_and_stream(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("sink-out", 3)
        admin.create_topic("sink-in", 2)
    rows = spark.range(1000).selectExpr(
        "CAST(id % 7 AS STRING) AS key",
        "CAST(id AS STRING) AS value",
        "array(named_struct('key', 'n', 'value', CAST(CAST(id AS STRING) AS BINARY))) AS headers",
    )
    rows.write.mode("append").format("headwater").option("bootstrap", node.address).option(
        "topic", "sink-out"
    ).save()
    with Consumer(node.address, auto_offset_reset="earliest") as consumer:
        consumer.assign("sink-out")
        got: list[Any] = []
        wait_until(
            lambda: got.extend(consumer.poll(timeout_ms=200)) or len(got) >= 1000,
            30,
            "the written records",
        )
    assert sorted(int(r.value) for r in got) == list(range(1000))
    for record in got:  # keyed records land where Kafka's partitioner puts them
        assert record.headers == [("n", record.value)]
    by_key: dict[bytes, set[int]] = {}
    for record in got:
        by_key.setdefault(record.key, set()).add(record.partition)
    assert all(len(parts) == 1 for parts in by_key.values())

    produce(node.address, "sink-in", [b"s%d" % i for i in range(500)])
    query = (
        stream(spark, node.address, subscribe="sink-in", startingOffsets="earliest")
        .selectExpr("key", "value")
        .writeStream.format("headwater")
        .option("bootstrap", node.address)
        .option("topic", "sink-out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    back = (
        spark.read.format("headwater")
        .option("bootstrap", node.address)
        .option("subscribe", "sink-out")
        .load()
    )
    assert back.count() == 1500


def test_sink_complete_mode_appends_the_whole_table(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    """Spark's complete mode (overwrite=True to the stream writer): each micro-batch
    appends the whole result table, as Kafka's sink does; the last row of each key is
    the total."""
    with Admin(node.address) as admin:
        admin.create_topic("complete-in", 1)
        admin.create_topic("complete-out", 1)
    produce(node.address, "complete-in", [b"c%d" % i for i in range(260)])  # keys k0..k12
    counts = (
        stream(spark, node.address, subscribe="complete-in", startingOffsets="earliest")
        .groupBy("key")
        .count()
        .selectExpr("key", "CAST(count AS STRING) AS value")
    )
    query = (
        counts.writeStream.outputMode("complete")
        .queryName("complete_counts")  # Spark passes queryName to the sink as an option
        .format("headwater")
        .option("bootstrap", node.address)
        .option("topic", "complete-out")
        .option("checkpointLocation", str(tmp_path / "ck"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination(120)
    assert query.exception() is None
    rows = (
        spark.read.format("headwater")
        .option("bootstrap", node.address)
        .option("subscribe", "complete-out")
        .load()
        .orderBy("offset")
        .collect()
    )
    latest = {bytes(r.key): int(r.value) for r in rows}
    assert latest == {b"k%d" % k: 20 for k in range(13)}
    assert len(rows) % 13 == 0


def _forget_last_commit(checkpoint: Path) -> int:
    """Remove Spark's record that the last micro-batch was done (as a crash between the
    sink's write and Spark's commit log leaves it): Spark runs it again on restart."""
    done = [int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit()]
    last = max(done)
    (checkpoint / "commits" / str(last)).unlink()
    for crc in (checkpoint / "commits").glob(f".{last}.crc"):
        crc.unlink()
    return last


def _roll_back_sink_state(address: str, checkpoint: Path) -> None:
    """Re-append the sink state before the last commit, as if the sink's own commit of
    the last micro-batch had not happened either (a crash right after the tasks wrote).
    The sink is named by its checkpoint location."""
    topic = sink.state_topic(str(checkpoint))
    with Admin(address) as admin:
        end = admin.list_offsets(topic, OffsetSpec.LATEST)[0]
    with Consumer(address) as consumer:
        consumer.assign([(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), end - 2)
        previous = next(iter(consumer.poll(timeout_ms=10_000))).value
    with Producer(address, acks="all") as producer:
        producer.send(topic, previous, partition=0).result(timeout=30)


def test_sink_replayed_micro_batch_writes_nothing_twice(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("replay-in", 2)
        admin.create_topic("replay-out", 2)
    produce(node.address, "replay-in", [b"r%d" % i for i in range(3000)])
    checkpoint = tmp_path / "ck"

    def run() -> None:
        query = (
            stream(
                spark,
                node.address,
                subscribe="replay-in",
                startingOffsets="earliest",
                maxOffsetsPerTrigger="1000",
            )
            .selectExpr("key", "value")
            .writeStream.format("headwater")
            .option("bootstrap", node.address)
            .option("topic", "replay-out")
            .option("batchBytes", "4096")  # several chunks per task and partition
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    def written() -> list[bytes]:
        frame = spark.read.format("headwater").option("bootstrap", node.address)
        return [r.value for r in frame.option("subscribe", "replay-out").load().collect()]

    run()
    _forget_last_commit(checkpoint)  # the crash came after the sink's commit
    run()
    assert len(written()) == 3000
    produce(node.address, "replay-in", [b"r%d" % i for i in range(3000, 4000)])
    run()
    _forget_last_commit(checkpoint)  # the crash came before the sink's commit
    _roll_back_sink_state(node.address, checkpoint)
    run()
    values = written()
    assert len(values) == 4000, f"{len(values) - len(set(values))} duplicates"
    assert sorted(values) == sorted(b"r%d" % i for i in range(4000))


def test_sink_bad_input_is_named(spark: SparkSession, node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("sink-bad", 3)
    frame = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="save mode overwrite is not supported"):  # appended
        frame.write.mode("overwrite").format("headwater").option("bootstrap", node.address).option(
            "topic", "sink-bad"
        ).save()
    with pytest.raises(Exception, match=r"ErrorIfExists|not supported"):  # Spark's default mode
        frame.write.format("headwater").option("bootstrap", node.address).option(
            "topic", "sink-bad"
        ).save()
    with pytest.raises(Exception, match="did you mean topic"):  # ignored before
        frame.write.mode("append").format("headwater").option("bootstrap", node.address).option(
            "topc", "sink-bad"
        ).save()
    frame = spark.range(3).selectExpr("CAST(id AS STRING) AS v")
    with pytest.raises(Exception, match="a value column is required"):
        frame.write.mode("append").format("headwater").option("bootstrap", node.address).option(
            "topic", "sink-bad"
        ).save()
    frame = spark.range(3).selectExpr("CAST(id AS STRING) AS value")
    with pytest.raises(Exception, match="give a topic option or a topic column"):
        frame.write.mode("append").format("headwater").option("bootstrap", node.address).save()
    frame = spark.range(3).selectExpr("CAST(id AS STRING) AS value", "7 AS partition")
    with pytest.raises(Exception, match=r"valid range is \[0, 3\)"):
        frame.write.mode("append").format("headwater").option("bootstrap", node.address).option(
            "topic", "sink-bad"
        ).save()


# --------------------------------------------------------------------------- cluster


def test_streaming_read_survives_a_killed_leader(spark: SparkSession, tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path / "cluster", 3)
    cluster.start()
    try:
        bootstrap = cluster.bootstrap()
        with Admin(bootstrap) as admin:
            admin.create_topic("ha", 2, replication_factor=3, configs={"min_insync_replicas": "2"})
        produce(bootstrap, "ha", [b"%d" % i for i in range(3000)])
        out, checkpoint = tmp_path / "out", tmp_path / "ck"
        frame = (
            spark.readStream.format("headwater")
            .option("bootstrap", bootstrap)
            .option("subscribe", "ha")
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", "500")
            .load()
            .selectExpr("CAST(value AS STRING) v")
        )
        query = to_parquet(frame, out, checkpoint, processingTime="200 milliseconds")
        try:
            wait_until(
                lambda: query.lastProgress and query.lastProgress["batchId"] >= 1,
                120,
                "two micro-batches",
            )
            leader = cluster.partitions(cluster.alive()[0], "ha")[0].leader
            cluster.nodes[leader].kill()
            survivors = cluster.bootstrap()
            produce(survivors, "ha", [b"%d" % i for i in range(3000, 4000)])
            wait_until(lambda: len(read_values(spark, out)) >= 4000, 180, "every record")
            assert query.exception() is None
        finally:
            query.stop()
        values = sorted(int(v) for v in read_values(spark, out))
        assert values == list(range(4000))
    finally:
        cluster.close()


def test_start_by_timestamp_and_assign(spark: SparkSession, node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("ts", 2)
    base = int(time.time() * 1000) - 3_600_000  # an hour ago: inside the retention
    with Producer(node.address, acks="all") as producer:
        for i in range(40):  # record i: partition i % 2, timestamp base + 1000 * i
            producer.send("ts", b"%d" % i, partition=i % 2, timestamp_ms=base + 1000 * i)
        producer.flush()

    def read(**options: str) -> list[tuple[int, int]]:
        frame = spark.read.format("headwater").option("bootstrap", node.address)
        for key, value in options.items():
            frame = frame.option(key, value)
        return sorted((r.partition, int(r.value)) for r in frame.load().collect())

    assert read(subscribe="ts", startingTimestamp=str(base + 30_000)) == sorted(
        (i % 2, i) for i in range(30, 40)
    )
    by_partition = json.dumps({"ts": {"0": base + 36_000, "1": base + 1000}})
    assert read(subscribe="ts", startingOffsetsByTimestamp=by_partition) == sorted(
        [(0, 36), (0, 38)] + [(1, i) for i in range(1, 40, 2)]
    )
    assert read(assign=json.dumps({"ts": [1]})) == [(1, i) for i in range(1, 40, 2)]
    # Kafka's precedence: startingTimestamp over startingOffsetsByTimestamp (the per
    # partition map used to win).
    assert read(
        subscribe="ts",
        startingTimestamp=str(base + 30_000),
        startingOffsetsByTimestamp=by_partition,
    ) == sorted((i % 2, i) for i in range(30, 40))
    # Ending by timestamp (ignored before: a read returned every record): before the
    # first record at or after the time; at the end where there is none.
    assert read(subscribe="ts", endingTimestamp=str(base + 10_000)) == sorted(
        (i % 2, i) for i in range(10)
    )
    ending = json.dumps({"ts": {"0": base + 4_000, "1": base + 3_600_000}})
    assert read(
        subscribe="ts", startingTimestamp=str(base + 1_000), endingOffsetsByTimestamp=ending
    ) == [(0, 2)] + [(1, i) for i in range(1, 40, 2)]
    # No record that recent: the query fails (Kafka's default strategy), or, with
    # startingOffsetsByTimestampStrategy=latest, such partitions start at their end.
    later = str(base + 38_500)
    with pytest.raises(Exception, match="ts-0 has no record with a timestamp at or after"):
        read(subscribe="ts", startingTimestamp=later)
    assert read(
        subscribe="ts", startingTimestamp=later, startingOffsetsByTimestampStrategy="latest"
    ) == [(1, 39)]


def test_min_offsets_per_trigger_waits_for_enough_records(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("mins", 1)
    produce(node.address, "mins", [b"%d" % i for i in range(50)])
    query = (
        stream(
            spark,
            node.address,
            subscribe="mins",
            startingOffsets="earliest",
            minOffsetsPerTrigger="200",
            maxTriggerDelay="10m",
        )
        .selectExpr("offset")
        .writeStream.format("memory")
        .queryName("mins")
        .trigger(processingTime="100 milliseconds")
        .start()
    )
    try:
        wait_until(lambda: query.lastProgress is not None, 60, "the query to run")
        # 50 records wait for 150 more; with 200 there, one micro-batch takes them all.
        assert spark.table("mins").count() == 0
        produce(node.address, "mins", [b"%d" % i for i in range(50, 200)])
        wait_until(lambda: spark.table("mins").count() == 200, 60, "one batch of 200")
    finally:
        query.stop()
    sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    assert sizes == [200]


def test_recreated_topic_is_data_loss(
    spark: SparkSession, node: NodeProcess, tmp_path: Path
) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("again", 1)
    produce(node.address, "again", [b"old%d" % i for i in range(100)])
    out, checkpoint = tmp_path / "out", tmp_path / "ck"

    def run(**extra: str) -> Any:
        frame = stream(spark, node.address, subscribe="again", startingOffsets="earliest", **extra)
        return to_parquet(
            frame.selectExpr("CAST(value AS STRING) v"), out, checkpoint, availableNow=True
        )

    run().awaitTermination(120)
    with Admin(node.address) as admin:
        admin.delete_topic("again")
        wait_until(lambda: "again" not in {t.name for t in admin.list_topics()}, 30, "deletion")
        admin.create_topic("again", 1)
    produce(node.address, "again", [b"new%d" % i for i in range(30)])
    with pytest.raises(Exception, match="was deleted and created again"):
        run().awaitTermination(120)
    run(failOnDataLoss="false").awaitTermination(120)
    values = sorted(read_values(spark, out))
    assert values == sorted([f"old{i}" for i in range(100)] + [f"new{i}" for i in range(30)])


def test_empty_topic_reads_nothing(spark: SparkSession, node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("empty", 1)
    frame = spark.read.format("headwater").option("bootstrap", node.address)
    assert frame.option("subscribe", "empty").load().count() == 0


# --------------------------------------------------------------------------- demo


@pytest.mark.demo
def test_demo_pipeline_runs_and_stops_cleanly(tmp_path: Path) -> None:
    """``make demo`` in short: 3 nodes, the generator and the Spark job run until closed
    windows reach the output topic; then Ctrl-C (SIGINT) stops everything cleanly."""
    base_port = free_port_block(6)
    bootstrap = ",".join(f"127.0.0.1:{base_port + 2 * i}" for i in range(3))
    demo = subprocess.Popen(  # its data in a temporary folder (under TMPDIR)
        [
            sys.executable,
            "-m",
            "headwater.sparkconnector.demo",
            "--base-port",
            str(base_port),
            "--rate",
            "300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:

        def windows_written() -> bool:
            assert demo.poll() is None, "the demo ended early"
            with Admin(bootstrap) as admin:
                return sum(admin.list_offsets("sales-per-retailer").values()) > 0

        # Spark's first micro-batches are slow on a loaded 2-core machine; a window closes
        # 10 s of event time plus the 5 s watermark after it opens.
        wait_until(windows_written, DEMO_DEADLINE_S, "closed windows in 'sales-per-retailer'")
    finally:
        demo.send_signal(signal.SIGINT)
        stdout, stderr = demo.communicate(timeout=DEMO_DEADLINE_S)
    assert demo.returncode == 0, stderr[-2000:]
    assert "|window  |retailer|sales" in stdout
    match = re.search(r"'sales-per-retailer' holds (\d+) window results", stdout)
    assert match and int(match.group(1)) > 0, stdout[-2000:]
    assert "stopped 3 node(s)" in stdout
    # It wrote into the checkout's ./demo-data before; the temporary folder is gone.
    assert f"(logs in {tmp_path}/headwater-demo-" in stdout
    assert not list(tmp_path.glob("headwater-demo-*"))


def test_readme_spark_example_runs(spark: SparkSession, node: NodeProcess, tmp_path: Path) -> None:
    """The README's PySpark example, pointed at this test's node and a tmp checkpoint."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    section = readme.split("## Spark Structured Streaming", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    script = code.group(1).replace("127.0.0.1:7700", node.address)
    script = script.replace("/tmp/checkpoints/orders-shouted", str(tmp_path / "ck"))
    with Admin(node.address) as admin:
        admin.create_topic("orders", 2)
        admin.create_topic("orders-shouted", 2)
    produce(node.address, "orders", [b"o%d" % i for i in range(130)])
    exec(compile(script, "README.md", "exec"), {})
    try:
        with Admin(node.address) as admin:
            wait_until(
                lambda: sum(admin.list_offsets("orders-shouted").values()) >= 130,
                120,
                "records in orders-shouted",
            )
    finally:
        for query in spark.streams.active:
            query.stop()
    back = spark.read.format("headwater").option("bootstrap", node.address)
    rows = back.option("subscribe", "orders-shouted").load().collect()
    assert sorted(r.value for r in rows) == sorted(b"O%d" % i for i in range(130))
    assert {r.key for r in rows} == {b"k%d" % i for i in range(13)}


def test_read_and_write_through_mutual_tls_with_kafka_option_names(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Kafka's security options reach every client the connector makes, on the driver
    and in the executors; a bad file path is
    refused before anything is read."""
    from headwater.client import ClientSecurity
    from headwater.tools.devcluster import LocalNode
    from headwater.tools.tls_certs import create_dev_pki

    pki = create_dev_pki(tmp_path / "pki", (1,))
    secured = LocalNode(tmp_path / "data", tls=pki.nodes[1], tls_client_auth=True)
    keystore = tmp_path / "client.pem"  # Kafka's PEM keystore: chain and key in one file
    keystore.write_bytes(pki.client.cert_file.read_bytes() + pki.client.key_file.read_bytes())
    tls_options = {
        "kafka.security.protocol": "SSL",
        "kafka.ssl.truststore.type": "PEM",
        "kafka.ssl.truststore.location": str(pki.ca_file),
        "kafka.ssl.keystore.type": "PEM",
        "kafka.ssl.keystore.location": str(keystore),
    }
    security = ClientSecurity(
        "tls", str(pki.ca_file), str(pki.client.cert_file), str(pki.client.key_file)
    )
    try:
        secured.start()
        with Admin(secured.address, security=security) as admin:
            admin.create_topic("tls-in", 2)
            admin.create_topic("tls-out", 1)
        with Producer(secured.address, acks="all", security=security) as producer:
            for i in range(300):
                producer.send("tls-in", b"t%d" % i, partition=i % 2)
        frame = (
            spark.read.format("headwater")
            .option("bootstrap", secured.address)
            .option("subscribe", "tls-in")
            .options(**tls_options)
            .load()
        )
        assert frame.count() == 300
        frame.selectExpr("value").write.mode("append").format("headwater").option(
            "bootstrap", secured.address
        ).option("topic", "tls-out").options(**tls_options).save()
        back = (
            spark.read.format("headwater")
            .option("bootstrap", secured.address)
            .option("subscribe", "tls-out")
            .options(**tls_options)
            .load()
        )
        assert sorted(r.value for r in back.collect()) == sorted(b"t%d" % i for i in range(300))
        with pytest.raises(Exception, match=r"tls_ca_file /nonexistent.pem cannot be read"):
            spark.read.format("headwater").option("bootstrap", secured.address).option(
                "subscribe", "tls-in"
            ).options(
                **{**tls_options, "kafka.ssl.truststore.location": "/nonexistent.pem"}
            ).load().count()
    finally:
        secured.kill()
