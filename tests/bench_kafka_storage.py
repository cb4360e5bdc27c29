"""The CPU per record of each step a Kafka batch takes through the node, and of the
alternative of transcoding it at the edge, on the same batches in one run (in-process: it
times the node's own code).

    make bench-kafka-storage                     # python -m tests.bench_kafka_storage
    python -m tests.bench_kafka_storage --records 10000 --rounds 3 --json

- **check and keep**: ``log.kafka_records.to_stored``, what the Kafka listener does with
  every produced batch (header, CRC-32C, every record parsed and checked, wrapped);
- **transcode**: ``log.kafka_records.kafka_columnar``, the records parsed and built into
  a columnar batch: what storing at the edge in the columnar form would add, and what a
  gRPC fetch of a Kafka batch costs;
- **Kafka fetch, Kafka batch**: ``log.kafka_records.to_kafka`` on a kept Kafka batch (its
  prefix rebuilt, its CRC-32C computed);
- **Kafka fetch, gRPC batch**: ``to_kafka`` on a columnar batch of the same records
  (transcoded into an uncompressed Kafka batch).

Batches of RECORDS records of RECORD_SIZE bytes (keys of 10 bytes), built like
librdkafka's, with each codec; the best of ROUNDS timings.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable

import click
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headwater.log import batch as batch_format
from headwater.log import kafka_records as records

CODECS = (("none", 0), ("lz4", records.LZ4), ("zstd", records.ZSTD))


def kafka_batch(count: int, record_size: int, codec: int) -> bytes:
    """A produced Kafka batch of ``count`` keyed records of ``record_size`` bytes."""
    builder = DefaultRecordBatchBuilder(
        magic=records.MAGIC,
        compression_type=codec,
        is_transactional=0,
        producer_id=7,
        producer_epoch=0,
        base_sequence=0,
        batch_size=1 << 30,
    )
    for i in range(count):
        value = (b"%010d" % i).ljust(record_size, b"x")[:record_size]
        builder.append(i, 1_767_225_600_000 + i, b"key-%06d" % i, value, [])
    return bytes(builder.build())


def best_seconds(step: Callable[[], object], repeats: int, rounds: int) -> float:
    """The best of ``rounds`` timings of ``repeats`` calls, per call."""
    best = float("inf")
    for _ in range(rounds):
        began = time.perf_counter()
        for _ in range(repeats):
            step()
        best = min(best, (time.perf_counter() - began) / repeats)
    return best


@click.command()
@click.option("--records", "count", type=click.IntRange(min=1), default=1000, show_default=True)
@click.option("--record-size", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=5, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def bench_kafka_storage(count: int, record_size: int, rounds: int, as_json: bool) -> None:
    """Microseconds of CPU per record of each step a Kafka batch takes (see the module
    doc)."""
    results = []
    for name, codec in CODECS:
        batch = kafka_batch(count, record_size, codec)
        stored = records.to_stored(batch, 1 << 30).stored
        header = batch_format.read_header(stored)
        columnar = records.kafka_columnar(stored, 0, header)
        steps = {
            "check_and_keep": functools.partial(records.to_stored, batch, 1 << 30),
            "transcode": functools.partial(records.kafka_columnar, stored, 0, header),
            "kafka_fetch_kafka_batch": functools.partial(records.to_kafka, stored, 1 << 30),
            "kafka_fetch_grpc_batch": functools.partial(records.to_kafka, columnar, 1 << 30),
        }
        row: dict[str, object] = {"codec": name}
        for step, call in steps.items():
            seconds = best_seconds(call, max(1, 20_000 // count), rounds)
            row[f"{step}_us_per_record"] = round(seconds / count * 1e6, 4)
        results.append(row)
    if as_json:
        click.echo(json.dumps({"records": count, "record_size": record_size, "codecs": results}))
        return
    click.echo(f"{count} records of {record_size} B per batch, us of CPU per record")
    click.echo("codec  check+keep  transcode  Kafka fetch: Kafka batch  gRPC batch")
    for result in results:
        click.echo(
            f"{result['codec']:<6} {result['check_and_keep_us_per_record']:>10} "
            f"{result['transcode_us_per_record']:>10} "
            f"{result['kafka_fetch_kafka_batch_us_per_record']:>25} "
            f"{result['kafka_fetch_grpc_batch_us_per_record']:>11}"
        )


if __name__ == "__main__":
    bench_kafka_storage()
