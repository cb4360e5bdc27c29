"""``headwater bench clean``: the log cleaner's throughput and CPU cost, on real files.

Writes a compacted partition log of ``--megabytes`` of keyed records (``--keys`` distinct
keys, ``--record-size`` bytes each, 1,000 records a batch, segments of an eighth of it, at
most 64 MiB, and one more segment that stays active) into a
temporary folder, then runs cleaning passes (``headwater.log.cleaner.clean``, the code a
node's cleaner thread runs) until nothing is dirty, and reports: MB of log cleaned per
second of wall time, the share of one core the passes used (process CPU time over wall
time), bytes before and after, and records removed. ``--rate`` is the cleaner's I/O bound
(``log_cleaner_io_max_bytes_per_s``); 0 measures it unbounded.
"""

from __future__ import annotations

import json
import random
import tempfile
import time
from pathlib import Path

import click

from headwater.log import batch as batch_format
from headwater.log.api import LogConfig
from headwater.log.cleaner import Throttle, clean
from headwater.log.file_log import FileLog

BATCH_RECORDS = 1000
SEGMENT_BYTES_MAX = 64 << 20


def _fill(log: FileLog, total_bytes: int, keys: int, record_size: int, seed: int) -> int:
    rng = random.Random(seed)
    value = b"x" * max(record_size - 12, 1)
    now_ms = int(time.time() * 1000)
    written = 0
    while log.size_bytes < total_bytes:
        batch_keys = [b"key-%09d" % rng.randrange(keys) for _ in range(BATCH_RECORDS)]
        data = batch_format.encode_batch(
            [value] * BATCH_RECORDS, keys=batch_keys, timestamps_ms=now_ms
        )
        log.append(data, 0, now_ms)
        written += BATCH_RECORDS
    return written


@click.command("clean")
@click.option("--megabytes", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True)
@click.option("--record-size", type=click.IntRange(min=16), default=100, show_default=True)
@click.option(
    "--rate",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="The cleaner's I/O bound in bytes/s (log_cleaner_io_max_bytes_per_s); 0: none.",
)
@click.option("--keys-max", type=click.IntRange(min=1), default=1_000_000, show_default=True)
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="One JSON object.")
def bench_clean(
    megabytes: int, keys: int, record_size: int, rate: int, keys_max: int, seed: int, as_json: bool
) -> None:
    """Clean a compacted log of MEGABYTES of keyed records; report MB/s and CPU share."""
    with tempfile.TemporaryDirectory(prefix="headwater-bench-clean-") as folder:
        segment_bytes = min(SEGMENT_BYTES_MAX, max(1 << 20, (megabytes << 20) // 8))
        config = LogConfig(segment_bytes=segment_bytes, cleanup_policy="compact")
        log = FileLog(Path(folder), config, int(time.time() * 1000))
        try:
            records = _fill(log, (megabytes << 20) + segment_bytes, keys, record_size, seed)
            log.flush()
            plan = log.cleaning_plan(int(time.time() * 1000), log.log_end_offset)
            cleanable = sum(v.size for v in plan.segments) if plan else 0
            throttle = Throttle(rate if rate else 1 << 62)
            removed = passes = 0
            wall, cpu = time.perf_counter(), time.process_time()
            while True:
                result = clean(log, int(time.time() * 1000), log.log_end_offset, keys_max, throttle)
                if result is None:
                    break
                passes += 1
                removed += result.records_removed
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            after = log.size_bytes
        finally:
            log.close()
    summary = {
        "test": "clean",
        "records": records,
        "keys": keys,
        "record_size": record_size,
        "rate_bytes_per_s": rate,
        "cleanable_bytes": cleanable,
        "log_bytes_after": after,
        "records_removed": removed,
        "passes": passes,
        "seconds": round(wall, 3),
        "mb_per_s": round(cleanable / wall / 1e6, 1) if wall else None,
        "cpu_share": round(cpu / wall, 3) if wall else None,
    }
    if as_json:
        print(json.dumps(summary))
        return
    print(
        f"clean: {cleanable / 1e6:.0f} MB cleanable ({records:,} records, {keys:,} keys) in "
        f"{passes} pass(es), {wall:.2f} s: {summary['mb_per_s']} MB/s, "
        f"{summary['cpu_share']} of a core; {removed:,} records removed, "
        f"{after / 1e6:.1f} MB left"
    )
