"""Pure modules: partitioner, retry, the client core, retention, errors, and the rule that
they do no I/O."""

from __future__ import annotations

import ast
import concurrent.futures
import json
import random
import subprocess
import sys
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
    "headwater/shared/json_records.py",
    "raft/metadata/records.py",
    "raft/metadata/image.py",
    "raft/metadata/decisions.py",
    "node/replicas/replication.py",
    "node/cluster/broker_session.py",
    "node/cluster/broker_liveness.py",
    "node/replicas/replica_roles.py",
    "node/replicas/replica_checks.py",
    "node/replicas/fetch_session.py",
    "node/groups/records.py",
    "node/groups/image.py",
    "node/groups/assignors.py",
    "node/groups/decisions.py",
    "node/transactions/state.py",
    "node/transactions/decisions.py",
    "node/groups/classic.py",
    "node/kafka/protocol.py",
    "node/kafka/admission.py",
    "node/security/host_rates.py",
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


LOADED_FORBIDDEN = {"grpc", "pysyncobj", "pyspark"}
"""What no pure module may load, by any path: the I/O frameworks the node drives."""
IO_IMPORTS = {"grpc", "socket", "asyncio", "pysyncobj", "subprocess", "threading", "pyspark"}
"""What no Headwater module a pure module loads may import itself."""
LOAD_ONE = """
import importlib, importlib.util, json, sys
name = sys.argv[1]
parts = name.split(".")
for i in range(1, len(parts)):  # the module's packages, without running their __init__
    parent = ".".join(parts[:i])
    sys.modules[parent] = importlib.util.module_from_spec(importlib.util.find_spec(parent))
before = set(sys.modules)
importlib.import_module(name)
loaded = set(sys.modules) - before
print(json.dumps({
    "top": sorted({m.split(".")[0] for m in loaded}),
    "ours": sorted(
        getattr(sys.modules[m], "__file__", None) or ""
        for m in loaded if m.startswith("headwater.")
    ),
}))
"""


def module_name(path: str) -> str:
    """``node/groups/core.py`` as ``headwater.node.groups.core`` (``pyproject.toml``'s
    mapping: ``headwater/x`` is ``headwater.x``, another top-level folder ``headwater.<it>``)."""
    dotted = path.removesuffix(".py").replace("/", ".")
    return dotted if dotted.startswith("headwater.") else f"headwater.{dotted}"


def loads(path: str) -> dict[str, list[str]]:
    """What importing the pure module at ``path`` loads, in a fresh interpreter: the
    top-level names of every module, and the files of Headwater's own."""
    done = subprocess.run(
        [sys.executable, "-c", LOAD_ONE, module_name(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def io_imports(file: Path) -> set[str]:
    """The I/O libraries a module imports when it is loaded: ``TYPE_CHECKING`` blocks and
    function bodies (run only when called) aside."""
    names: set[str] = set()
    waiting: list[ast.AST] = [ast.parse(file.read_text())]
    while waiting:
        node = waiting.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            waiting.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        waiting.extend(ast.iter_child_nodes(node))
    return names & IO_IMPORTS


def load_violations(path: str, loaded: dict[str, list[str]]) -> list[str]:
    found = [f"{path} loads {name}" for name in sorted(set(loaded["top"]) & LOADED_FORBIDDEN)]
    for file in loaded["ours"]:
        bad = io_imports(Path(file)) if file else set()
        if bad:
            found.append(
                f"{path} loads {Path(file).relative_to(ROOT)}, which imports {sorted(bad)}"
            )
    return found


def test_pure_modules_load_no_io_in_a_fresh_interpreter() -> None:
    """What a pure module loads, by any chain of imports (its packages' ``__init__``
    aside, which re-export an API): none of gRPC, pysyncobj or Spark, and no Headwater
    module that imports an I/O library. The direct-import check above cannot see a pure
    module that imports an impure one."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        found = [
            line
            for path, loaded in zip(PURE_MODULES, pool.map(loads, PURE_MODULES), strict=True)
            for line in load_violations(path, loaded)
        ]
    assert found == []


def test_an_impure_module_loaded_through_another_is_caught() -> None:
    """The check above, on a pure module that imports the node's controller driver
    (which runs on asyncio and pysyncobj's Raft)."""
    loaded = {
        "top": ["pysyncobj", "headwater"],
        "ours": [str(ROOT / "node" / "cluster" / "controller.py")],
    }
    assert load_violations("node/cluster/broker_session.py", loaded) == [
        "node/cluster/broker_session.py loads pysyncobj",
        "node/cluster/broker_session.py loads node/cluster/controller.py, which imports "
        "['asyncio']",
    ]


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
