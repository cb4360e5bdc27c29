"""The Rust example client (examples/rust), a second-language client built only from
the proto, docs/record-batch-format.md and the shared test vectors: its own tests, then
its binary against a real node.

- ``cargo test``: murmur2 against the Python client's values, one case per decoder
  check, the strict zstd/LZ4 frame rules, and tests/vectors.rs (every vector decoded,
  every byte_exact one re-encoded byte for byte, every decoder rejection refused).
- ``run``: 10,000 keyed records produced with its own encoder (idempotent, acks=all, on
  ProduceStream), partitioned by its own murmur2, read back with FetchStream and its own
  decoder: each exactly once, in order, on murmur2's partition, unchanged.
- ``bad-partition``: a partition number past the count is a non-retriable ErrorInfo.
- ``large-batch``: a 6 MiB batch is FETCH_RESPONSE_TOO_LARGE (an ErrorInfo, not a
  transport error) for tonic's default 4 MiB receive limit, and arrives once the channel
  and max_response_bytes are raised to 16 MiB.
- ``conformance``: the shared vectors produced to the node through tonic: valid ones
  stored byte for byte, each rejection refused with its ErrorCode, on Produce and on
  ProduceStream.

Needs a Rust toolchain (cargo): skipped without one. The first build fetches crates from
crates.io and compiles them (about a minute on 2 cores); later runs reuse
examples/rust/target (or CARGO_TARGET_DIR).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.node_process import NodeProcess

CRATE = Path(__file__).resolve().parent.parent / "examples" / "rust"
CARGO_TIMEOUT_S = 900
"""A build from scratch takes one to two minutes on 2 cores; a cold crates.io cache and
a loaded machine, much longer."""
RUN_TIMEOUT_S = 180
"""Each command's own deadline (--timeout-s) is 120 s; this is the backstop."""
MIB = 1 << 20

pytestmark = [pytest.mark.slow, pytest.mark.timeout(CARGO_TIMEOUT_S + 300)]


def cargo(*args: str) -> None:
    """Run ``cargo ARGS --release --locked`` in the crate; fail with its output. The
    tests build at opt-level 1 (a third less compile time than release's 3 on 2 cores;
    the same program), since they check what the client does, not how fast."""
    executable = shutil.which("cargo")
    if executable is None:
        message = "cargo not found: the Rust example client needs a Rust toolchain (rustup.rs)"
        if os.environ.get("HEADWATER_REQUIRE_CARGO"):
            pytest.fail(f"{message}; HEADWATER_REQUIRE_CARGO is set (CI)")
        pytest.skip(message)
    result = subprocess.run(
        [executable, *args, "--release", "--locked"],
        cwd=CRATE,
        env={**os.environ, "CARGO_PROFILE_RELEASE_OPT_LEVEL": "1"},
        capture_output=True,
        text=True,
        timeout=CARGO_TIMEOUT_S,
        check=False,
    )
    assert result.returncode == 0, (
        f"cargo {' '.join(args)} exited {result.returncode}:\n"
        f"{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    )


@pytest.fixture(scope="module")
def binary() -> Path:
    cargo("build")
    target = Path(os.environ.get("CARGO_TARGET_DIR", "target"))
    path = (target if target.is_absolute() else CRATE / target) / "release" / "headwater-example"
    assert path.is_file(), f"cargo build left no {path}"
    return path


def example(binary: Path, node: NodeProcess, command: str, *args: str) -> dict[str, Any]:
    """Run one command of the example against ``node``; its JSON summary line, which
    must say ok (exit status 0)."""
    result = subprocess.run(
        [str(binary), command, "--bootstrap", node.address, "--timeout-s", "120", *args],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        check=False,
    )
    lines = result.stdout.strip().splitlines()
    assert lines, f"{command}: no summary (exit {result.returncode}):\n{result.stderr}"
    summary: dict[str, Any] = json.loads(lines[-1])
    assert result.returncode == 0, (
        f"{command} exited {result.returncode}: {lines[-1]}\n{result.stderr}"
    )
    assert summary["ok"] is True, lines[-1]
    return summary


def test_cargo_tests_pass() -> None:
    cargo("test")


def test_every_record_comes_back_once_in_order_on_its_murmur2_partition(
    binary: Path, shared_node: NodeProcess
) -> None:
    first = example(binary, shared_node, "run", "--topic", "rust-orders", "--records", "10000")
    assert first["created"] is True
    assert first["partitions"] == 3
    assert first["produced"] == first["consumed"] == 10_000
    for problem in ("missing", "duplicates", "out_of_order", "misplaced", "mismatched"):
        assert first[problem] == 0, first["problems"]
    partitions = first["per_partition"]
    assert [p["partition"] for p in partitions] == [0, 1, 2]
    assert all(p["produced"] == p["consumed"] > 0 for p in partitions), partitions
    assert sum(p["consumed"] for p in partitions) == 10_000

    # Again on the same topic: it exists, and only this run's records are read back.
    second = example(binary, shared_node, "run", "--topic", "rust-orders", "--records", "2000")
    assert second["created"] is False
    assert second["produced"] == second["consumed"] == 2000
    starts = [p["start_offset"] for p in second["per_partition"]]
    assert starts == [p["end_offset"] for p in partitions]


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_compressed_batches_round_trip(
    binary: Path, shared_node: NodeProcess, compression: str
) -> None:
    summary = example(
        binary,
        shared_node,
        "run",
        "--topic",
        f"rust-{compression}",
        "--records",
        "3000",
        "--compression",
        compression,
    )
    assert summary["compression"] == compression
    assert summary["produced"] == summary["consumed"] == 3000


def test_a_partition_past_the_count_is_a_non_retriable_error(
    binary: Path, shared_node: NodeProcess
) -> None:
    summary = example(binary, shared_node, "bad-partition", "--topic", "rust-bad-partition")
    error = summary["error"]
    assert summary["partition_asked"] == summary["partitions"] == 3
    assert error["transport_error"] is False, error
    # Brokers before PARTITION_OUT_OF_RANGE answered UNKNOWN_TOPIC_OR_PARTITION (flagged
    # retriable): the example accepts that from them, but this broker must not answer it.
    assert error["reason"] == "PARTITION_OUT_OF_RANGE", error
    assert (error["code"], error["retriable"]) == (1004, False), error
    assert error["grpc_code"] == "InvalidArgument", error
    assert "[0, 3)" in error["message"], error


def test_a_batch_over_the_default_receive_limit(binary: Path, shared_node: NodeProcess) -> None:
    summary = example(binary, shared_node, "large-batch", "--topic", "rust-large")
    assert 4 * MIB < summary["batch_bytes"] < 8 * MIB
    refused = summary["default_limits"]
    assert refused["reason"] == "FETCH_RESPONSE_TOO_LARGE", refused
    assert (refused["code"], refused["retriable"]) == (1003, False), refused
    assert (refused["transport_error"], refused["grpc_code"]) == (False, "FailedPrecondition")
    # max_response_bytes raised alone: the node sends it and tonic refuses it itself.
    local = summary["max_response_bytes_raised_only"]
    assert (local["transport_error"], local["grpc_code"]) == (True, "OutOfRange"), local
    arrived = summary["both_raised"]
    assert arrived["ok"] is True
    assert arrived["records"] == summary["records"]


def test_the_shared_vectors_against_the_node(binary: Path, shared_node: NodeProcess) -> None:
    summary = example(binary, shared_node, "conformance", "--topic", "rust-conformance")
    vectors_path = CRATE.parent.parent / "docs" / "testvectors" / "record-batches.json"
    document = json.loads(vectors_path.read_text())
    rejections = document.get("rejections", [])
    assert len(summary["rejections"]) == len(rejections)
    assert all(r["ok"] for r in summary["rejections"]), summary["rejections"]
    assert all(v["ok"] for v in summary["vectors"]), summary["vectors"]
    assert summary["stream_problems"] == []
    produced = len(summary["vectors"]) + len(rejections)
    assert summary["stream_answers"] == produced
