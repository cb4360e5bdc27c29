"""The CPU per record of the two ways to store a batch produced over Kafka's protocol, on
the same batches in one run (in-process: it times the node's own transcoding code).

    make bench-kafka-storage                     # python -m tests.bench_kafka_storage
    python -m tests.bench_kafka_storage --records 10000 --rounds 3 --json

- **transcode in**: ``node.kafka.records.to_stored``, what the Kafka listener does with
  every produced batch (checked, records parsed, one stored batch built);
- **kept as is**: what storing the Kafka batch itself would take: its CRC-32C checked,
  its header read and its base offset written;
- **transcode out**: ``node.kafka.records.to_kafka``, what a Kafka fetch does with every
  stored batch (a Kafka batch kept as is would be sent as stored).

Batches of RECORDS records of RECORD_SIZE bytes (keys of 10 bytes), built like
librdkafka's, with each codec; the best of ROUNDS timings.
"""

from __future__ import annotations

import functools
import json
import struct
import time
from collections.abc import Callable

import click
import crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headwater.node.kafka import records

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


def kept_as_is(batch: bytes) -> bytes:
    """What storing ``batch`` unchanged takes: CRC-32C, header, base offset."""
    view = memoryview(batch)
    header = records.read_kafka_header(view)
    if crc32c.crc32c(view[records.CRC_START :]) != header.crc:
        raise ValueError("CRC-32C does not match")
    stored = bytearray(batch)
    struct.pack_into(">q", stored, 0, 1 << 20)
    return bytes(stored)


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
    """Microseconds of CPU per record: Kafka batches transcoded into the stored format and
    back, against kept as they come (see the module doc)."""
    results = []
    for name, codec in CODECS:
        batch = kafka_batch(count, record_size, codec)
        stored = records.to_stored(batch, 1 << 30).stored
        transcode_in = best_seconds(
            functools.partial(records.to_stored, batch, 1 << 30), 20, rounds
        )
        as_is = best_seconds(functools.partial(kept_as_is, batch), 500, rounds)
        transcode_out = best_seconds(
            functools.partial(records.to_kafka, stored, 1 << 30), 20, rounds
        )
        results.append(
            {
                "codec": name,
                "transcode_in_us_per_record": round(transcode_in / count * 1e6, 4),
                "kept_as_is_us_per_record": round(as_is / count * 1e6, 4),
                "transcode_out_us_per_record": round(transcode_out / count * 1e6, 4),
                "in_over_as_is": round(transcode_in / as_is, 1),
            }
        )
    if as_json:
        click.echo(json.dumps({"records": count, "record_size": record_size, "codecs": results}))
        return
    click.echo(f"{count} records of {record_size} B per batch, us of CPU per record")
    click.echo("codec  transcode in  kept as is  transcode out  in / as is")
    for row in results:
        click.echo(
            f"{row['codec']:<6} {row['transcode_in_us_per_record']:>12} "
            f"{row['kept_as_is_us_per_record']:>11} {row['transcode_out_us_per_record']:>14} "
            f"{row['in_over_as_is']:>11}x"
        )


if __name__ == "__main__":
    bench_kafka_storage()
