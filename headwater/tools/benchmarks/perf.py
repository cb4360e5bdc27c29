"""``headwater bench produce|consume|e2e``: throughput and latency, like Kafka's perf tools.

Each prints records/s, MB/s (of record values) and latency percentiles (p50, p99,
p99.9, max, in ms), as a line for humans or JSON with ``--json``. The pure summary math
is ``summarize``; the rest drives a real client against real nodes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import click
import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

from headwater.cli.lazy import LazyGroup
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.runtime_tuning import tune_runtime

_err = Console(stderr=True, highlight=False)
E2E_DRAIN_S = 30.0


@dataclass(frozen=True, slots=True)
class BenchResult:
    test: str
    records: int
    record_bytes: int
    seconds: float
    records_per_s: float
    mb_per_s: float
    latency_ms_p50: float | None
    latency_ms_p99: float | None
    latency_ms_p999: float | None
    latency_ms_max: float | None
    settings: dict[str, Any]
    # e2e only: send to acknowledgement (the produce latency at the chosen acks).
    ack_latency_ms_p50: float | None = None
    ack_latency_ms_p99: float | None = None
    ack_latency_ms_max: float | None = None


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of already sorted values (fraction in [0, 1])."""
    assert sorted_values
    rank = max(0, min(len(sorted_values) - 1, round(fraction * len(sorted_values) + 0.5) - 1))
    return sorted_values[rank]


def summarize(
    test: str,
    records: int,
    value_bytes: int,
    seconds: float,
    latencies_ms: list[float],
    settings: dict[str, Any],
) -> BenchResult:
    latencies = sorted(latencies_ms)

    def pick(fraction: float) -> float | None:
        return round(percentile(latencies, fraction), 3) if latencies else None

    return BenchResult(
        test=test,
        records=records,
        record_bytes=value_bytes // max(records, 1),
        seconds=round(seconds, 3),
        records_per_s=round(records / seconds, 1) if seconds > 0 else 0.0,
        mb_per_s=round(value_bytes / seconds / 1e6, 2) if seconds > 0 else 0.0,
        latency_ms_p50=pick(0.50),
        latency_ms_p99=pick(0.99),
        latency_ms_p999=pick(0.999),
        latency_ms_max=round(latencies[-1], 3) if latencies else None,
        settings=settings,
    )


def report(result: BenchResult, as_json: bool) -> None:
    if as_json:
        print(json.dumps(asdict(result)))
        return
    line = (
        f"{result.test}: {result.records} records of {result.record_bytes} B "
        f"in {result.seconds} s: "
        f"{result.records_per_s:,.0f} records/s, {result.mb_per_s} MB/s"
    )
    if result.latency_ms_p50 is not None:
        line += (
            f"; latency ms p50 {result.latency_ms_p50} p99 {result.latency_ms_p99} "
            f"p99.9 {result.latency_ms_p999} max {result.latency_ms_max}"
        )
    if result.ack_latency_ms_p50 is not None:
        line += (
            f"; acknowledged after ms p50 {result.ack_latency_ms_p50} "
            f"p99 {result.ack_latency_ms_p99} max {result.ack_latency_ms_max}"
        )
    print(line)


def _progress(label: str, disabled: bool) -> Progress:
    return Progress(
        TextColumn(label),
        BarColumn(),
        TextColumn("{task.completed:,}/{task.total:,}"),
        TimeRemainingColumn(),
        console=_err,
        transient=True,
        disable=disabled,
    )


def ensure_topic(bootstrap: str | None, topic: str, partitions: int) -> None:
    from headwater.client import Admin

    with Admin(bootstrap) as admin:
        try:
            admin.create_topic(topic, partitions)
        except HeadwaterError as error:
            if error.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise


def make_values(count: int, size: int) -> list[bytes]:
    """``count`` distinct random values of ``size`` bytes (incompressible, like Kafka's tool)."""
    pool = os.urandom(size * count)
    return [pool[i * size : (i + 1) * size] for i in range(count)]


_BASE_OPTIONS = [
    click.option("--topic", default="bench", show_default=True),
    click.option("--records", type=click.IntRange(min=1), default=1_000_000, show_default=True),
    click.option("--json", "as_json", is_flag=True),
    click.option("--bootstrap", envvar="HEADWATER_BOOTSTRAP", default=None),
]
_PRODUCE_OPTIONS = [
    click.option(
        "--record-size", type=click.IntRange(min=8, max=64 << 20), default=100, show_default=True
    ),
    click.option(
        "--partitions",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="Partitions if the topic is created.",
    ),
]


def with_common(function: Any) -> Any:
    for option in reversed(_BASE_OPTIONS):
        function = option(function)
    return function


def with_produce_options(function: Any) -> Any:
    for option in reversed(_PRODUCE_OPTIONS):
        function = option(function)
    return with_common(function)


@click.group(
    cls=LazyGroup,
    lazy_subcommands={
        "cluster": "headwater.tools.benchmarks.cluster:bench_cluster",
        "replication": "headwater.tools.benchmarks.cluster:bench_replication",
        "groups": "headwater.tools.benchmarks.groups:bench_groups",
        "clean": "headwater.tools.benchmarks.compaction:bench_clean",
        "metrics": "headwater.tools.benchmarks.metrics_cost:bench_metrics",
        "tls": "headwater.tools.benchmarks.tls_cost:bench_tls",
        "acls": "headwater.tools.benchmarks.acl_cost:bench_acls",
        "login-flood": "headwater.tools.benchmarks.login_flood:bench_login_flood",
        "spark": "headwater.tools.benchmarks.spark:bench_spark",
        "kafka": "headwater.tools.benchmarks.kafka:bench_kafka",
        "kafka-requests": "headwater.tools.benchmarks.kafka_requests:bench_kafka_requests",
        "kafka-attacks": "headwater.tools.benchmarks.kafka_attacks:bench_kafka_attacks",
    },
)
def bench() -> None:
    """Measure produce, consume and end-to-end performance against running nodes."""
    tune_runtime()


@bench.command("produce")
@with_produce_options
@click.option(
    "--mode",
    type=click.Choice(["batch", "record"]),
    default="batch",
    show_default=True,
    help="send_batch calls or per-record send.",
)
@click.option(
    "--batch-records",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Records per send_batch call.",
)
@click.option(
    "--batch-bytes",
    type=click.IntRange(min=1),
    default=1 << 20,
    show_default=True,
    help="Producer batch size.",
)
@click.option("--linger-ms", type=click.IntRange(min=0), default=5, show_default=True)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="1", show_default=True)
@click.option(
    "--compression", type=click.Choice(["none", "lz4", "zstd"]), default="none", show_default=True
)
@click.option(
    "--idempotence",
    type=click.Choice(["default", "on", "off"]),
    default="default",
    show_default=True,
    help="The producer's enable_idempotence: default is on with acks=all, off otherwise.",
)
@click.option(
    "--keys",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Distinct keys the records cycle through (key-0, key-1, ...); 0: keyless.",
)
def bench_produce(
    topic: str,
    records: int,
    record_size: int,
    partitions: int,
    as_json: bool,
    bootstrap: str | None,
    mode: str,
    batch_records: int,
    batch_bytes: int,
    linger_ms: int,
    acks: str,
    compression: str,
    idempotence: str,
    keys: int,
) -> None:
    """Produce RECORDS records of RECORD_SIZE bytes as fast as possible."""
    from headwater.client import Producer

    ensure_topic(bootstrap, topic, partitions)
    values = make_values(min(records, batch_records if mode == "batch" else 65_536), record_size)
    # Record i has key_pool[i % len(values) % keys]: the pool lines up with the values.
    key_pool = [b"key-%d" % (i % keys) for i in range(len(values))] if keys else None
    latencies: list[float] = []
    lock = threading.Lock()
    producer = Producer(
        bootstrap,
        acks=acks,
        compression=compression,
        linger_ms=linger_ms,
        batch_bytes=batch_bytes,
        enable_idempotence=None if idempotence == "default" else idempotence == "on",
    )
    sent = 0
    try:
        with _progress("produce", as_json) as progress:
            task = progress.add_task("produce", total=records)
            start = time.perf_counter()
            if mode == "batch":
                while sent < records:
                    count = min(batch_records, records - sent)
                    began = time.perf_counter()
                    batch_keys = key_pool[:count] if key_pool is not None else None
                    for batch_future in producer.send_batch(topic, values[:count], batch_keys):
                        batch_future.add_done_callback(_latency_callback(latencies, lock, began))
                    sent += count
                    progress.update(task, completed=sent)
            else:
                pool = len(values)
                send = producer.send
                sample_every = 1000  # records per latency sample
                while sent < records:
                    # The first record of each run of ``sample_every`` is timed; the loop
                    # over the rest does nothing but send.
                    first = sent % pool
                    run = values[first : first + min(sample_every, records - sent)]
                    began = time.perf_counter()
                    if key_pool is None:
                        future = send(topic, run[0])
                        for value in run[1:]:
                            send(topic, value)
                    else:
                        run_keys = key_pool[first : first + len(run)]
                        future = send(topic, run[0], run_keys[0])
                        for value, key in zip(run[1:], run_keys[1:], strict=True):
                            send(topic, value, key)
                    future.add_done_callback(_latency_callback(latencies, lock, began))
                    sent += len(run)
                    if sent % 65_536 < len(run):
                        progress.update(task, completed=sent)
            producer.flush()
            elapsed = time.perf_counter() - start
    finally:
        producer.close()
    settings = {
        "mode": mode,
        "acks": acks,
        "idempotent": producer.idempotent,
        "compression": compression,
        "batch_records": batch_records,
        "batch_bytes": batch_bytes,
        "linger_ms": linger_ms,
        "partitions": partitions,
        "keys": keys,
    }
    report(
        summarize("produce", records, records * record_size, elapsed, latencies, settings), as_json
    )


def _latency_callback(
    latencies: list[float], lock: threading.Lock, began: float
) -> Callable[[object], None]:
    """A future's done callback that records ms since ``began``."""

    def record(_future: object) -> None:
        with lock:
            latencies.append((time.perf_counter() - began) * 1000)

    return record


@bench.command("consume")
@with_common
@click.option("--fetch-bytes", type=click.IntRange(min=1), default=16 << 20, show_default=True)
@click.option(
    "--mode",
    type=click.Choice(["columnar", "record"]),
    default="columnar",
    show_default=True,
    help="columnar: read each poll's Arrow batches; record: iterate its records "
    "(for record in result), touching each record's value.",
)
def bench_consume(
    topic: str,
    records: int,
    as_json: bool,
    bootstrap: str | None,
    fetch_bytes: int,
    mode: str,
) -> None:
    """Read RECORDS records from the beginning of TOPIC, through the columnar view or
    record by record."""
    from headwater.client import Consumer

    consumer = Consumer(
        bootstrap, auto_offset_reset="earliest", fetch_max_bytes=fetch_bytes, check_crcs=True
    )
    consumer.assign(topic)
    consumer.seek_to_beginning()
    received = 0
    value_bytes = 0
    last_progress = time.monotonic()
    try:
        with _progress("consume", as_json) as progress:
            task = progress.add_task("consume", total=records)
            start = time.perf_counter()
            while received < records:
                result = consumer.poll(timeout_ms=1000)
                if mode == "record":
                    for record in result:
                        received += 1
                        value_bytes += len(record.value or b"")
                else:
                    for fetched in result.batches:
                        received += fetched.records.num_rows
                        value_bytes += _value_bytes(fetched.records)
                if result.batches:
                    last_progress = time.monotonic()
                    progress.update(task, completed=min(received, records))
                elif time.monotonic() - last_progress > 10:
                    raise HeadwaterError(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"only {received} of {records} records in topic {topic!r} "
                        "after 10 s without data",
                    )
            elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    report(
        summarize(
            "consume",
            received,
            value_bytes,
            elapsed,
            [],
            {"fetch_bytes": fetch_bytes, "mode": mode},
        ),
        as_json,
    )


def _value_bytes(records: pa.RecordBatch) -> int:
    values = records.column("value")
    total = pc.sum(pc.binary_length(values)).as_py()
    return int(total or 0)


async def _e2e(
    bootstrap: str | None,
    topic: str,
    records: int,
    record_size: int,
    rate: int,
    acks: str,
) -> tuple[list[float], list[float], float]:
    """(end-to-end latencies in ms, acknowledgement latencies in ms, seconds): one task
    paces the producer, another polls the consumer."""
    from headwater.client.aio import AsyncConsumer, AsyncProducer

    latencies: list[float] = []
    ack_latencies: list[float] = []

    def acked(sent_ns: int) -> Callable[[asyncio.Future[Any]], None]:
        def done(future: asyncio.Future[Any]) -> None:
            if not future.cancelled() and future.exception() is None:
                ack_latencies.append((time.perf_counter_ns() - sent_ns) / 1e6)

        return done

    async with (
        AsyncConsumer(bootstrap) as consumer,
        AsyncProducer(bootstrap, acks=acks) as producer,
    ):
        await consumer.assign_at(topic)

        async def consume() -> None:
            while len(latencies) < records:
                result = await consumer.poll(timeout_ms=E2E_DRAIN_S * 1000)
                if not result.batches:
                    raise HeadwaterError(
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"{records - len(latencies)} records not consumed within {E2E_DRAIN_S} s",
                    )
                now = time.time_ns()
                for fetched in result.batches:
                    stamps = pc.binary_slice(fetched.records.column("value"), 0, 8).to_pylist()
                    latencies.extend((now - int.from_bytes(s, "little")) / 1e6 for s in stamps)

        reader = asyncio.create_task(consume())
        padding = os.urandom(record_size - 8)
        start = time.perf_counter()
        sent = 0
        while sent < records:
            due = min(records, int((time.perf_counter() - start) * rate) + 1)
            while sent < due:
                sent_ns = time.perf_counter_ns()
                future = await producer.send(topic, time.time_ns().to_bytes(8, "little") + padding)
                future.add_done_callback(acked(sent_ns))
                sent += 1
            await asyncio.sleep(max(0.0, start + sent / rate - time.perf_counter()))
        await producer.flush()
        await reader
        return latencies, ack_latencies, time.perf_counter() - start


@bench.command("e2e")
@with_produce_options
@click.option(
    "--rate",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Records per second to produce.",
)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="1", show_default=True)
def bench_e2e(
    topic: str,
    records: int,
    record_size: int,
    partitions: int,
    as_json: bool,
    bootstrap: str | None,
    rate: int,
    acks: str,
) -> None:
    """Produce at RATE records/s and measure produce-to-consume latency of each record.

    Producer and consumer run on one asyncio event loop (headwater.client.aio), so a
    record's path in this process crosses no threads.
    """
    ensure_topic(bootstrap, topic, partitions)
    # No live progress bar here: its refresh thread competes with the path being measured
    # (p99 5-6 ms without it, 10-17 ms with it).
    latencies, acks_ms, elapsed = asyncio.run(
        _e2e(bootstrap, topic, records, record_size, rate, acks)
    )
    settings = {"rate": rate, "acks": acks, "partitions": partitions, "client": "asyncio"}
    result = summarize(
        "e2e", len(latencies), len(latencies) * record_size, elapsed, latencies, settings
    )
    ordered = sorted(acks_ms)
    if ordered:
        result = dataclasses.replace(
            result,
            ack_latency_ms_p50=round(percentile(ordered, 0.5), 3),
            ack_latency_ms_p99=round(percentile(ordered, 0.99), 3),
            ack_latency_ms_max=round(ordered[-1], 3),
        )
    report(result, as_json)
