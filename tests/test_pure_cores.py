"""Pure modules: partitioner, retry, the client core, retention, errors, and the rule that
they do no I/O."""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headwater.client.partitioner import StickyPartitioner, murmur2, partition_for_key
from headwater.client.retry import RetryPolicy
from headwater.log.retention import SegmentSummary, segments_to_delete
from headwater.shared.errors import GRPC_STATUS_OF, ErrorCode, HeadwaterError, is_retriable
from headwater.v1 import headwater_pb2 as pb

ROOT = Path(__file__).resolve().parent.parent
PURE_MODULES = [
    "log/batch.py",
    "log/index.py",
    "log/retention.py",
    "log/producer_state.py",
    "log/compaction.py",
    "log/api.py",
    "client/partitioner.py",
    "headwater/shared/partitioning.py",
    "client/retry.py",
    "client/accumulator.py",
    "client/positions.py",
    "headwater/shared/errors.py",
    "headwater/shared/topics.py",
    "raft/records.py",
    "raft/image.py",
    "raft/decisions.py",
    "node/replication.py",
    "node/broker_session.py",
    "node/replica_roles.py",
    "node/replica_checks.py",
    "node/groups/records.py",
    "node/groups/image.py",
    "node/groups/assignors.py",
    "node/groups/decisions.py",
    "node/groups/classic.py",
    "node/kafka/protocol.py",
    "node/kafka/admission.py",
    "node/host_rates.py",
    "log/kafka_records.py",
    "client/membership.py",
    "log/leader_epochs.py",
    "sparkconnector/planning.py",
    "headwater/tools/chaos/history.py",
    "headwater/tools/chaos/checker.py",
    "headwater/tools/chaos/nemesis.py",
    "headwater/tools/chaos/read_gaps.py",
]
FORBIDDEN = {
    "grpc",
    "socket",
    "os",
    "time",
    "threading",
    "asyncio",
    "pysyncobj",
    "subprocess",
    "random",
    "pyspark",
}


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_modules_import_no_io(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    imported = set()
    # Imports under `if TYPE_CHECKING:` are annotations only (a seeded random.Random is
    # passed in, never created), so they are skipped.
    statements = [
        s
        for s in tree.body
        if not (isinstance(s, ast.If) and getattr(s.test, "id", "") == "TYPE_CHECKING")
    ]
    for node in (n for statement in statements for n in ast.walk(statement)):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            imported.add(node.module.split(".")[0])
    bad = imported & FORBIDDEN
    assert not bad, f"{module} imports {bad}"


# Kafka's own test vectors (clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java).
KAFKA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
    b"1": -1993445489,
    b"12": 126087238,
    b"123": -267702483,
    b"1234": -1614185708,
    b"12345": -1188365604,
}


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2.items())
def test_murmur2_matches_kafka(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


def test_partition_for_key_is_kafkas_default_partitioner() -> None:
    for key, hashed in KAFKA_MURMUR2.items():
        for partitions in (1, 3, 7, 100):
            assert partition_for_key(key, partitions) == (hashed & 0x7FFFFFFF) % partitions


def test_sticky_partitioner_sticks_then_moves() -> None:
    sticky = StickyPartitioner(random.Random(7))
    first = sticky.partition("t", 5)
    assert all(sticky.partition("t", 5) == first for _ in range(10))
    sticky.on_batch_sent("t", first, 5)
    assert sticky.partition("t", 5) != first
    assert StickyPartitioner(random.Random(1)).partition("one", 1) == 0


def test_retry_backoff_grows_and_is_capped() -> None:
    policy = RetryPolicy(retries=5, backoff_base_ms=100, backoff_max_ms=1000)
    rng = random.Random(3)
    waits = [policy.backoff_ms(n, rng) for n in range(1, 8)]
    assert 80 <= waits[0] <= 120 and 160 <= waits[1] <= 240
    assert all(800 <= w <= 1200 for w in waits[4:])


def test_retry_decisions_of_both_producers() -> None:
    """RetryPolicy.retry_after_s: the one retry decision of the threaded and the asyncio
    producers."""
    policy = RetryPolicy(retries=3, backoff_base_ms=100, backoff_max_ms=1000)
    rng = random.Random(5)
    moved = HeadwaterError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "moved")
    quiet = HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, "no answer")
    bad = HeadwaterError(ErrorCode.INVALID_RECORD, "bad")
    wait = policy.retry_after_s(moved, True, 0, 10.0, 100.0, 4000, rng)
    assert wait is not None and 0.08 <= wait <= 0.12  # answered: backoff only
    wait = policy.retry_after_s(quiet, True, 0, 10.0, 100.0, 4000, rng)
    assert wait is not None and wait >= 4.1  # unknown outcome: past the append deadline
    wait = policy.retry_after_s(moved, False, 0, 10.0, 100.0, 4000, rng)
    assert wait is not None and wait >= 4.1  # no answer at all: unknown too
    assert policy.retry_after_s(bad, True, 0, 10.0, 100.0, 0, rng) is None  # not retriable
    assert policy.retry_after_s(moved, True, 3, 10.0, 100.0, 0, rng) is None  # retries spent
    assert policy.retry_after_s(quiet, True, 0, 10.0, 12.0, 4000, rng) is None  # past delivery
    margin = RetryPolicy(backoff_base_ms=0).retry_after_s(quiet, True, 0, 0.0, 99.0, 0, rng)
    assert margin == 0.1  # the clock margin never drops below CLOCK_MARGIN_MS_MIN


def _oracle_retention(
    segments: list[SegmentSummary], now: int, retention_ms: int, retention_bytes: int
) -> int:
    count = 0
    remaining = sum(s.size_bytes for s in segments)
    while count < len(segments) and segments[count].record_count:
        s = segments[count]
        if not (
            (retention_ms >= 0 and now - s.max_timestamp > retention_ms)
            or (retention_bytes >= 0 and remaining - s.size_bytes >= retention_bytes)
        ):
            break
        remaining -= s.size_bytes
        count += 1
    return count


@given(
    st.lists(
        st.tuples(st.integers(1, 1000), st.integers(0, 10_000), st.integers(0, 5)), max_size=12
    ),
    st.integers(0, 20_000),
    st.sampled_from([-1, 0, 100, 5_000]),
    st.sampled_from([-1, 0, 500, 3_000]),
)
def test_retention_matches_oracle(
    raw: list[tuple[int, int, int]], now: int, retention_ms: int, retention_bytes: int
) -> None:
    segments = [SegmentSummary(i, size, stamp, count) for i, (size, stamp, count) in enumerate(raw)]
    assert segments_to_delete(segments, now, retention_ms, retention_bytes) == _oracle_retention(
        segments, now, retention_ms, retention_bytes
    )


def test_error_codes_match_the_proto_enum() -> None:
    proto = {v.name: v.number for v in pb.ErrorCode.DESCRIPTOR.values}
    assert proto == {c.name: int(c) for c in ErrorCode}
    assert set(GRPC_STATUS_OF) == set(ErrorCode) - {ErrorCode.NONE}
    assert is_retriable(ErrorCode.NOT_LEADER_OR_FOLLOWER) and not is_retriable(
        ErrorCode.INVALID_CONFIG
    )
