"""Log compaction on real files (headwater.log.cleaner over a FileLog): seeded random
keyed histories with tombstones, cleaned in passes with a small key map, checked against
an oracle; reads across the gaps compaction leaves; a follower copying a compacted log;
and a crash at every step of the swap, recovered on open with nothing lost."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from aiokafka.record.default_records import DefaultRecordBatchBuilder

from headwater.cli.topics import describe_json
from headwater.client import Admin, Consumer, Producer, TopicPartition
from headwater.log import batch as batch_format
from headwater.log import kafka_records, segment_swap
from headwater.log.api import LogConfig, ReadResult
from headwater.log.cleaner import Throttle, clean
from headwater.log.file_log import FileLog
from headwater.log.memory_log import MemoryLog
from headwater.log.segment_swap import CLEANING_DIR, SWAP_DIR
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.ports import free_port
from tests.node_process import NodeProcess, wait_until

NOW_MS = 1_700_000_000_000
DAY_MS = 86_400_000
Row = tuple[int, bytes | None, bytes | None]
"""(offset, key, value)"""


def config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {"segment_bytes": 2048, "cleanup_policy": "compact"}
    return LogConfig(**{**base, **overrides})  # type: ignore[arg-type]


def fill(
    log: FileLog, seed: int, batches: int, keys: int, ts: int = NOW_MS, kafka: bool = False
) -> None:
    """Append ``batches`` random keyed batches (tombstones, headers); with ``kafka`` as
    Kafka batches the Kafka listener checked and kept (a random codec each)."""
    rng = random.Random(seed)
    counter = 0
    for _ in range(batches):
        count = rng.randint(1, 6)
        chosen = [b"k%d" % rng.randrange(keys) for _ in range(count)]
        values = []
        for _ in range(count):
            counter += 1
            values.append(None if rng.random() < 0.15 else b"v%d" % counter)
        headers = [[("h", b"%d" % counter)] if rng.random() < 0.3 else None for _ in chosen]
        if kafka:
            stored = kafka_batch(chosen, values, headers, ts, codec=rng.choice((0, 1, 2, 3, 4)))
        else:
            stored = batch_format.encode_batch(
                values, keys=chosen, headers=headers, timestamps_ms=ts
            )
        log.append(stored, 0, NOW_MS)


def kafka_batch(
    keys: list[bytes],
    values: list[bytes | None],
    headers: list[list[tuple[str, bytes]] | None],
    ts: int,
    codec: int,
) -> bytes:
    """A Kafka batch of these records as the Kafka listener stores it."""
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 30,
    )
    for delta, (key, value, pairs) in enumerate(zip(keys, values, headers, strict=True)):
        builder.append(delta, ts + delta, key, value, pairs or [])
    return kafka_records.to_stored(bytes(builder.build()), 1 << 20, require_keys=True).stored


def rows(log: FileLog | MemoryLog, offset: int = 0, max_bytes: int = 1 << 30) -> list[Row]:
    out: list[Row] = []
    while True:
        result = log.read(offset, max_bytes)
        if not result.data:
            return out
        data, _cut_at = kafka_records.to_columnar(result.data, 1 << 30)
        for item in batch_format.decode_batches(data):
            out.extend(
                (row["offset"], row["key"], row["value"])
                for row in item.records.to_pylist()
                if row["offset"] >= offset
            )
        offset = result.next_offset


def expected(history: list[Row], cleaned: int, tombstones_expired: bool) -> list[Row]:
    """The oracle: below ``cleaned`` the newest record of each key (tombstones dropped
    when expired); from ``cleaned`` on, everything."""
    newest = {key: offset for offset, key, _ in history if offset < cleaned}
    return [
        (offset, key, value)
        for offset, key, value in history
        if offset >= cleaned
        or (newest[key] == offset and not (value is None and tombstones_expired))
    ]


def clean_all(log: FileLog, keys_max: int, now_ms: int = NOW_MS) -> int:
    passes = 0
    while clean(log, now_ms, log.log_end_offset, keys_max, Throttle(1 << 40)) is not None:
        passes += 1
    return passes


@pytest.mark.parametrize("seed", range(8))
def test_compaction_keeps_the_newest_record_of_each_key_at_its_offset(
    seed: int, tmp_path: Path
) -> None:
    log = FileLog(tmp_path, config(), NOW_MS)
    fill(log, seed, batches=150, keys=12)
    history = rows(log)
    segments = log.segment_count
    passes = clean_all(log, keys_max=5)  # a small map: several passes
    assert passes >= 2
    cleaned = log.cleaned_offset
    assert cleaned == log._segments[-1].base_offset  # everything but the active segment
    kept = rows(log)
    assert kept == expected(history, cleaned, tombstones_expired=False)
    assert log.segment_count <= segments  # emptied segments go (but the first)
    # Every offset of the history is still readable: from a removed one, the next kept.
    survivors = [offset for offset, _, _ in kept]
    for offset, _, _ in history[::7]:
        following = rows(log, offset, max_bytes=1)
        assert following and following[0][0] == min(o for o in survivors if o >= offset)
    log.close()
    reopened = FileLog(tmp_path, config(), NOW_MS)
    assert rows(reopened) == kept and reopened.cleaned_offset == cleaned
    # Appends go on after the gaps; a second round cleans the new records too.
    fill(reopened, seed + 100, batches=60, keys=12)
    history2 = rows(reopened)
    clean_all(reopened, keys_max=1000)
    assert rows(reopened) == expected(history2, reopened.cleaned_offset, False)
    reopened.close()


@pytest.mark.parametrize("seed", range(3))
def test_kafka_batches_are_compacted_like_any_other(seed: int, tmp_path: Path) -> None:
    """Batches produced over Kafka's protocol (kept as they came) are compacted by the
    same rules: the kept records of a partly kept batch are written again in the
    columnar form, a batch kept whole stays a Kafka batch; timestamps are found in
    both."""
    log = FileLog(tmp_path, config(), NOW_MS)
    fill(log, seed, batches=150, keys=12, kafka=True)
    history = rows(log)
    stamps = [
        (row["offset"], row["timestamp"])
        for data in whole_batches(log)
        for item in batch_format.decode_batches(kafka_records.to_columnar(data, 1 << 30)[0])
        for row in item.records.cast(NO_TZ).to_pylist()
    ]
    first_late = next((o, t) for o, t in stamps if t >= NOW_MS + 3)
    assert log.offset_for_timestamp(NOW_MS + 3) == first_late
    clean_all(log, keys_max=5, now_ms=NOW_MS + 10)  # its records are up to 5 ms newer
    kept = rows(log)
    assert kept == expected(history, log.cleaned_offset, tombstones_expired=False)
    forms = {
        header.is_kafka_records
        for data in whole_batches(log)
        for _position, header in batch_format.iter_headers(data)
    }
    assert forms == {True, False}  # some batches kept whole, some written again
    log.close()
    reopened = FileLog(tmp_path, config(), NOW_MS)
    assert rows(reopened) == kept
    reopened.close()


NO_TZ = pa.schema(
    [
        field.with_type(pa.int64()) if field.name == "timestamp" else field
        for field in batch_format.RECORD_SCHEMA
    ]
)


def whole_batches(log: FileLog) -> Iterator[bytes]:
    """Every read of the log from its start, as stored."""
    offset = 0
    while (result := log.read(offset, 1 << 30)).data:
        yield result.data
        offset = result.next_offset


def test_tombstones_go_after_delete_retention(tmp_path: Path) -> None:
    old = NOW_MS - 2 * DAY_MS
    log = FileLog(tmp_path, config(delete_retention_ms=DAY_MS), NOW_MS)
    fill(log, 3, batches=120, keys=10, ts=old)
    history = rows(log)
    assert any(value is None for _, _, value in history)
    clean_all(log, keys_max=1000)
    assert rows(log) == expected(history, log.cleaned_offset, tombstones_expired=True)
    log.close()


def test_the_lag_and_the_upper_bound_keep_recent_segments_dirty(tmp_path: Path) -> None:
    log = FileLog(tmp_path, config(min_compaction_lag_ms=DAY_MS), NOW_MS)
    fill(log, 4, batches=80, keys=5)
    history = rows(log)
    assert clean(log, NOW_MS, log.log_end_offset, 100, Throttle(1 << 40)) is None  # too new
    assert rows(log) == history
    assert clean(log, NOW_MS + 2 * DAY_MS, 0, 100, Throttle(1 << 40)) is None  # above bound
    assert log.cleanable_ratio(NOW_MS + 2 * DAY_MS, log.log_end_offset) == 1.0
    assert clean(log, NOW_MS + 2 * DAY_MS, log.log_end_offset, 100, Throttle(1 << 40))
    assert log.cleanable_ratio(NOW_MS + 2 * DAY_MS, log.log_end_offset) == 0.0
    log.close()


def copy_log(leader: FileLog | MemoryLog, follower: FileLog | MemoryLog) -> None:
    """What a follower's fetches do: append the leader's batches as they are."""
    offset = follower.log_end_offset
    while offset < leader.log_end_offset:
        result = leader.read(offset, 300)
        position = 0
        while position < len(result.data):
            header = batch_format.read_header(result.data, position)
            follower.append_replicated(result.data[position : position + header.total_size], NOW_MS)
            position += header.total_size
        offset = result.next_offset


def test_a_follower_copies_a_compacted_log_with_its_gaps(tmp_path: Path) -> None:
    leader = FileLog(tmp_path / "leader", config(), NOW_MS)
    fill(leader, 5, batches=100, keys=6)
    clean_all(leader, keys_max=100)
    kept = rows(leader)
    memory = MemoryLog(config())
    copy_log(leader, memory)
    assert rows(memory) == kept and memory.log_end_offset == leader.log_end_offset
    follower = FileLog(tmp_path / "follower", config(), NOW_MS)
    copy_log(leader, follower)
    assert rows(follower) == kept and follower.log_end_offset == leader.log_end_offset
    follower.abandon()  # a crash: everything is scanned again, gaps included
    (tmp_path / "follower" / "recovery-point").unlink(missing_ok=True)
    follower = FileLog(tmp_path / "follower", config(), NOW_MS)
    assert follower.damage == "" and rows(follower) == kept
    # The follower compacts on its own, with a small key map, over the leader's gaps.
    fill(follower, 6, batches=60, keys=6)
    history = rows(follower)
    clean_all(follower, keys_max=2)
    assert rows(follower) == expected(history, follower.cleaned_offset, False)
    follower.close()
    leader.close()


def test_a_follower_of_a_topic_that_is_not_compacted_allows_no_gap(tmp_path: Path) -> None:
    """Its gap bound stays 0, so a lost middle segment is damage, found and set aside."""
    plain = LogConfig(segment_bytes=2048)
    leader = FileLog(tmp_path / "leader", plain, NOW_MS)
    fill(leader, 8, batches=80, keys=6)
    follower = FileLog(tmp_path / "follower", plain, NOW_MS)
    copy_log(leader, follower)
    assert follower.gaps.offset == 0 and not (tmp_path / "follower" / "compacted-below").exists()
    gap = batch_format.set_base_offset(
        batch_format.encode_batch([b"x"], keys=[b"k"], timestamps_ms=NOW_MS),
        follower.log_end_offset + 5,
        0,
    )
    with pytest.raises(HeadwaterError) as refused:
        follower.append_replicated(gap, NOW_MS)
    assert refused.value.code is ErrorCode.OFFSET_OUT_OF_RANGE
    segments = sorted((tmp_path / "follower").glob("*.log"))
    follower.abandon()
    segments[len(segments) // 2].unlink()  # a middle segment lost
    (tmp_path / "follower" / "recovery-point").unlink(missing_ok=True)
    reopened = FileLog(tmp_path / "follower", plain, NOW_MS)
    assert reopened.damage != ""
    assert len(rows(reopened)) < len(rows(leader))
    reopened.close()
    leader.close()


@pytest.mark.parametrize("crash", ["before_swap", "inside_swap"])
def test_a_crash_during_cleaning_loses_nothing(
    crash: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = FileLog(tmp_path, config(), NOW_MS)
    fill(log, 6, batches=120, keys=8)
    history = rows(log)
    original_finish = segment_swap.finish_swap

    def crashing_finish(directory: Path) -> None:
        swap = directory / SWAP_DIR
        if crash == "inside_swap" and swap.is_dir():
            first = sorted(swap.iterdir())[0]  # one file moved, then the crash
            first.rename(directory / first.name)
        raise OSError("crash")

    def crashing_rename(*_args: object) -> None:
        raise OSError("crash")

    if crash == "before_swap":
        monkeypatch.setattr(segment_swap.os, "rename", crashing_rename)
    else:
        monkeypatch.setattr(segment_swap, "finish_swap", crashing_finish)
    with pytest.raises(HeadwaterError, match="cleaning swap failed: crash") as failed:
        clean(log, NOW_MS, log.log_end_offset, 1000, Throttle(1 << 40))
    assert failed.value.code is ErrorCode.KAFKA_STORAGE_ERROR and log.failure
    log.abandon()
    monkeypatch.undo()
    assert segment_swap.finish_swap is original_finish
    recovered = FileLog(tmp_path, config(), NOW_MS)
    found = rows(recovered)
    if crash == "before_swap":
        assert found == history
    else:  # the swap was committed: the open finished it
        cleaned = recovered._segments[-1].base_offset
        assert found == expected(history, cleaned, tombstones_expired=False)
    assert not (tmp_path / SWAP_DIR).exists() and not (tmp_path / CLEANING_DIR).exists()
    recovered.close()


# ----------------------------------------------------------------------------- a node

TOPIC_CONFIGS = {
    "cleanup_policy": "compact",
    "segment_bytes": "8192",
    "min_cleanable_dirty_ratio": "0.01",
}


def produce_table(address: str, records: int, keys: int, seed: int) -> dict[bytes, bytes | None]:
    """Send ``records`` keyed records (some tombstones); the newest value of each key."""
    rng = random.Random(seed)
    newest: dict[bytes, bytes | None] = {}
    # Batches of at most 16 KiB: on a loaded machine a 5 ms linger gathered thousands of
    # records into one batch, which then sat in the active segment, where the cleaner
    # never goes (the cleaner test then waited for it in vain).
    with Producer(address, linger_ms=5, batch_bytes=16 << 10) as producer:
        for i in range(records):
            key = b"key-%d" % rng.randrange(keys)
            value = None if rng.random() < 0.05 else b"value-%d-" % i + b"x" * 40
            producer.send("table", value, key=key)
            newest[key] = value
    return newest


def read_table(address: str) -> tuple[dict[bytes, bytes | None], list[tuple[int, bytes]]]:
    """The topic read from offset 0 to its end: the newest value per key, and every
    (offset, key) read."""
    table: dict[bytes, bytes | None] = {}
    read: list[tuple[int, bytes]] = []
    with Consumer(address) as consumer:
        consumer.assign([TopicPartition("table", 0)])
        consumer.seek_to_beginning()
        with Admin(address) as admin:
            (end,) = admin.end_offsets([("table", 0)]).values()
        position = 0
        while position < end:
            for record in consumer.poll(timeout_ms=2000):
                assert record.key is not None
                table[record.key] = record.value
                read.append((record.offset, record.key))
                position = record.offset + 1
            position = max(position, consumer.position(TopicPartition("table", 0)))
    return table, read


def describe_partition(address: str) -> dict[str, Any]:
    with Admin(address) as admin:
        (description,) = admin.describe_topics(["table"])
    partition: dict[str, Any] = describe_json(description)["partitions"][0]
    return partition


def test_a_compacted_topic_read_from_zero_holds_the_newest_value_per_key(
    tmp_path: Path,
) -> None:
    node = NodeProcess(tmp_path / "n", env={"HEADWATER_LOG_CLEANER_BACKOFF_MS": "100"})
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("table", 1, 1, TOPIC_CONFIGS)
        newest = produce_table(node.address, 20_000, 150, seed=1)

        def mostly_clean() -> dict[str, Any] | None:
            described = describe_partition(node.address)
            done = described["cleaned_offset"] > 10_000 and described["cleanable_ratio"] < 0.5
            return described if done else None

        described = wait_until(mostly_clean, 60, "the cleaner to clean most of the log")
        cleaned_offset = described["cleaned_offset"]
        assert len(described["producers"]) == 1  # the idempotent producer above
        table, read = read_table(node.address)
        assert {k: v for k, v in table.items() if v is not None} == {
            k: v for k, v in newest.items() if v is not None
        }
        below = [key for offset, key in read if offset < cleaned_offset]
        assert len(below) == len(set(below)), "a key twice below the cleaned offset"
        assert len(read) < 20_000 // 4
        offsets = [offset for offset, _ in read]
        assert offsets == sorted(set(offsets))
        with Producer(node.address) as producer:  # keyless records are refused
            keyless = producer.send("table", b"no key")
            with pytest.raises(HeadwaterError) as refused:
                keyless.result(10)
        assert refused.value.code is ErrorCode.INVALID_RECORD
    finally:
        node.stop()


def test_a_sigkill_during_cleaning_loses_nothing(tmp_path: Path) -> None:
    env = {
        "HEADWATER_LOG_CLEANER_BACKOFF_MS": "100",
        "HEADWATER_LOG_CLEANER_IO_MAX_BYTES_PER_S": "100000",  # a pass takes seconds
    }
    node = NodeProcess(tmp_path / "n", env=env)
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("table", 1, 1, TOPIC_CONFIGS)
        newest = produce_table(node.address, 15_000, 100, seed=2)
        folder = node.data_dir / "table-0"
        wait_until((folder / "cleaning").is_dir, 60, "a cleaning pass under way")
        node.kill()
        node.start()
        table, _ = read_table(node.address)
        assert {k: v for k, v in table.items() if v is not None} == {
            k: v for k, v in newest.items() if v is not None
        }
        wait_until(
            lambda: describe_partition(node.address)["cleaned_offset"] > 0,
            120,
            "a cleaning pass to finish after the restart",
        )
        after, read = read_table(node.address)
        assert after == table
        assert len(read) < 15_000
    finally:
        node.stop()


def test_consumer_offsets_is_compacted_and_a_restarted_coordinator_reads_it_back(
    tmp_path: Path,
) -> None:
    """__consumer_offsets is compacted: a group's offsets committed again and again
    shrink to the newest per partition, deleted groups go, and a coordinator that loads
    the compacted log after a SIGKILL has every group's last offsets."""
    env = {"HEADWATER_LOG_CLEANER_BACKOFF_MS": "100", "HEADWATER_SEGMENT_BYTES": "16384"}
    node = NodeProcess(tmp_path / "n", env=env)
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("t", 4, 1)
            partitions = [TopicPartition("t", p) for p in range(4)]
            for round_ in range(150):
                for group in ("g1", "g2"):
                    admin.alter_group_offsets(
                        group, {tp: round_ * 10 + tp.partition for tp in partitions}
                    )
            admin.delete_group("g2")
            (offsets_topic,) = admin.describe_topics(["__consumer_offsets"])
            assert offsets_topic.configs["cleanup_policy"] == "compact"

            def compacted() -> bool:
                (described,) = admin.describe_topics(["__consumer_offsets"])
                return any(p.cleaned_offset > 0 for p in described.partitions)

            wait_until(compacted, 60, "the cleaner to compact __consumer_offsets")
        node.kill()
        node.start()
        with Admin(node.address) as admin:
            expected = {tp: 1490 + tp.partition for tp in partitions}
            assert wait_until(lambda: admin.group_offsets("g1") == expected, 30, "g1's offsets")
            assert admin.group_offsets("g2") == {}
            assert "g2" not in {g.group_id for g in admin.list_groups().groups}
    finally:
        node.stop()


def test_a_gap_outside_the_compacted_bound_is_damage(tmp_path: Path) -> None:
    """Gaps are allowed only below the offset compaction reached (``compacted-below``, or
    the cleaner's own offset when that file is lost): anywhere else a gap means the files
    changed, and recovery sets the rest aside."""
    log = FileLog(tmp_path, config(), NOW_MS)
    fill(log, 7, batches=120, keys=8)
    clean_all(log, keys_max=1000)
    kept = rows(log)
    log.abandon()

    def damage() -> str:
        reopened = FileLog(tmp_path, config(), NOW_MS)
        found = reopened.damage
        reopened.abandon()
        return found

    assert damage() == ""  # with its bound: sound
    (tmp_path / "compacted-below").unlink()
    assert damage() == ""  # the cleaner's offset stands in
    (tmp_path / "cleaner-offset").unlink()
    (tmp_path / "recovery-point").unlink(missing_ok=True)  # scan everything again
    damaged = FileLog(tmp_path, config(), NOW_MS)
    assert "starts at" in damaged.damage or "expected" in damaged.damage
    assert len(rows(damaged)) < len(kept)
    damaged.close()


@pytest.mark.parametrize("kind", ["file", "memory"])
def test_a_read_from_a_gap_that_runs_to_the_bound_moves_past_it(kind: str, tmp_path: Path) -> None:
    """No record between the offset and the bound (the high watermark): the read says
    so with the bound as its next offset, so that a consumer goes on from there instead
    of asking again and again (a fetch's long poll would otherwise spin)."""
    log: FileLog | MemoryLog = (
        FileLog(tmp_path, config(), NOW_MS) if kind == "file" else MemoryLog(config())
    )
    for base in (0, 10):
        data = batch_format.encode_batch(
            [b"a", b"b"], keys=[b"k", b"j"], timestamps_ms=NOW_MS, base_offset=base
        )
        log.append_replicated(data, NOW_MS)
    assert log.read(3, 1 << 20, upper_bound=10) == ReadResult(b"", 10)
    assert log.read(3, 1 << 20, upper_bound=2) == ReadResult(b"", 3)  # at the bound already
    found = log.read(3, 1 << 20)
    assert found.next_offset == 12 and batch_format.read_header(found.data).base_offset == 10
    log.close()


def test_a_damaged_segment_blocks_cleaning_only_while_the_log_holds_it(tmp_path: Path) -> None:
    """The cleaner skips a log while it holds the segment it could not decode; once a
    truncation (or retention, or a cleaning swap) removes that segment, the log is
    cleanable again even though its start offset did not move."""
    log = FileLog(tmp_path, config(), NOW_MS)
    fill(log, 7, batches=120, keys=8)
    plan = log.cleaning_plan(NOW_MS, log.log_end_offset)
    assert plan is not None and len(plan.segments) > 2
    damaged = plan.segments[1]
    assert log.holds_segment(damaged.segment)
    log.truncate_to(damaged.base_offset, NOW_MS)
    assert log.log_start_offset == 0 and not log.holds_segment(damaged.segment)
    assert log.holds_segment(plan.segments[0].segment)
    log.close()
    assert not log.holds_segment(plan.segments[0].segment)


def test_a_segment_that_cannot_be_decoded_stops_cleaning_of_its_partition_once(
    tmp_path: Path,
) -> None:
    """Bit rot in a closed segment: each pass failed on the same batch, and the cleaner
    came back to it every minute, for ever, rereading the log up to it each time. Now the
    partition is left alone while the segment is in its log, counted in a metric."""
    from tests.test_metrics import scrape, value

    node = NodeProcess(
        tmp_path / "n",
        env={"HEADWATER_LOG_CLEANER_BACKOFF_MS": "100"},
        metrics_port=free_port(),
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("table", 1, 1, TOPIC_CONFIGS)
        produce_table(node.address, 5_000, 100, seed=3)
        wait_until(
            lambda: describe_partition(node.address)["cleaned_offset"] > 0,
            60,
            "a first cleaning pass",
        )
        node.stop()
        segments = sorted((node.data_dir / "table-0").glob("*.log"))
        damaged = next(p for p in segments if p.stat().st_size > 2 * batch_format.HEADER_BYTES)
        assert damaged != segments[-1]  # a closed segment: the active one is never cleaned
        data = bytearray(damaged.read_bytes())
        data[batch_format.HEADER_BYTES + 4] ^= 0xFF  # inside its first batch's body
        damaged.write_bytes(bytes(data))
        node.start()
        produce_table(node.address, 2_000, 100, seed=4)  # dirty again: a pass is due

        def uncleanable() -> float | None:
            assert node.metrics_address is not None
            found = value(scrape(node.metrics_address), UNCLEANABLE)
            return found if found else None

        assert wait_until(uncleanable, 60, "the partition counted as uncleanable") == 1
        stopped = [line for line in node.log().splitlines() if "cleaning table-0 stopped" in line]
        assert len(stopped) == 1, stopped
        assert "CRC32C mismatch" in stopped[0]
        assert f"segment {int(damaged.stem)}:" in stopped[0]
    finally:
        node.stop()


UNCLEANABLE = "headwater_log_cleaner_uncleanable_partitions"
