"""Run every benchmark of BENCHMARKS.md against a fresh local node (``make bench``).

Usage: python scripts/bench_all.py [--quick]

Starts ``headwater serve`` (headwater.tools.devcluster) on a free loopback port with data in a temporary folder, runs
``headwater bench`` for each figure (one client process at a time), measures bytes on disk
per record and the restart time after SIGKILL with a 1 GiB log, and prints a Markdown table
with the machine and the date. --quick uses smaller counts (a smoke run, not for the record).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from headwater.tools.devcluster import LocalNode, wait_until

CLI = [sys.executable, "-m", "headwater.cli.main"]


def start_node(node: LocalNode) -> float:
    """Start ``node`` and return the seconds until it serves (health polled every 10 ms)."""
    began = time.monotonic()
    node.start(wait=False)
    wait_until(node.serving, 120, "the node to serve", interval_s=0.01)
    return time.monotonic() - began


def bench(address: str, *args: str) -> dict[str, Any]:
    command = [*CLI, "bench", *args, "--json", "--bootstrap", address]
    output = subprocess.run(command, capture_output=True, check=True, text=True).stdout
    result: dict[str, Any] = json.loads(output)
    result["command"] = "headwater bench " + " ".join(args)
    return result


def describe(address: str, topic: str) -> dict[str, Any]:
    output = subprocess.run(
        [*CLI, "topics", "describe", topic, "--json", "--bootstrap", address],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    data: dict[str, Any] = json.loads(output)
    return data


def machine() -> str:
    cpu = "unknown cpu"
    with contextlib.suppress(OSError, StopIteration):
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return f"{os.cpu_count()} cores ({cpu}), Python {platform.python_version()}, {platform.system()} {platform.release()}"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only",
        choices=("single", "cluster", "replication", "spark"),
        help="run one group of figures (default: all)",
    )
    options = parser.parse_args()
    if options.only in (None, "single"):
        single_node_bench(options.quick)
    if options.only in (None, "cluster"):
        cluster_bench(options.quick)
    if options.only in (None, "replication"):
        replication_bench(options.quick)
    if options.only in (None, "spark"):
        spark_bench(options.quick)


def single_node_bench(quick: bool) -> None:
    scale = 10 if quick else 1
    root = Path(tempfile.mkdtemp(prefix="hwbench-"))
    node = LocalNode(root / "data")
    address = node.address
    start_node(node)
    rows: list[tuple[str, dict[str, Any], str]] = []
    try:
        n = 5_000_000 // scale
        rows.append(
            (
                "produce 100 B, send_batch, acks=1, 1 partition",
                bench(address, "produce", "--topic", "b1", "--records", str(n), "--acks", "1"),
                "records_per_s",
            )
        )
        rows.append(
            (
                "produce 100 B, send_batch, acks=1, 4 partitions",
                bench(
                    address,
                    "produce",
                    "--topic",
                    "b4",
                    "--partitions",
                    "4",
                    "--records",
                    str(n),
                    "--acks",
                    "1",
                ),
                "records_per_s",
            )
        )
        rows.append(
            (
                "produce 100 B, per-record send, acks=1",
                bench(
                    address,
                    "produce",
                    "--topic",
                    "r1",
                    "--mode",
                    "record",
                    "--records",
                    str(n // 2),
                    "--acks",
                    "1",
                ),
                "records_per_s",
            )
        )
        rows.append(
            (
                "produce 1 MiB batches (1024 x 1 KiB), acks=1, 4 partitions",
                bench(
                    address,
                    "produce",
                    "--topic",
                    "m4",
                    "--partitions",
                    "4",
                    "--record-size",
                    "1024",
                    "--batch-records",
                    "1024",
                    "--records",
                    str(2_000_000 // scale),
                    "--acks",
                    "1",
                ),
                "mb_per_s",
            )
        )
        rows.append(
            (
                "consume 100 B, columnar view",
                bench(address, "consume", "--topic", "b4", "--records", str(n)),
                "records_per_s",
            )
        )
        rows.append(
            (
                "end-to-end at 10,000 records/s, acks=1",
                bench(
                    address,
                    "e2e",
                    "--topic",
                    "lat",
                    "--rate",
                    "10000",
                    "--records",
                    str(100_000 // scale),
                ),
                "latency_ms_p50",
            )
        )
        b1 = describe(address, "b1")
        r1 = describe(address, "r1")
        disk_batch = sum(p["size_bytes"] for p in b1["partitions"]) / n
        disk_record = sum(p["size_bytes"] for p in r1["partitions"]) / (n // 2)
        # Restart after SIGKILL with a 1 GiB log.
        gib_records = (1 << 30) // 1024 // scale
        bench(
            address,
            "produce",
            "--topic",
            "gib",
            "--record-size",
            "1024",
            "--batch-records",
            "1024",
            "--records",
            str(gib_records),
            "--acks",
            "1",
        )
        log_bytes = sum(p["size_bytes"] for p in describe(address, "gib")["partitions"])
        node.kill(signal.SIGKILL)
        restart_s = start_node(node)
    finally:
        node.kill()
        shutil.rmtree(root, ignore_errors=True)
    print(
        f"Machine: {machine()}; date {datetime.date.today()}; one node process, one client process.\n"
    )
    print("| figure | result | records/s | MB/s | latency ms p50 / p99 / p99.9 / max | command |")
    print("|---|---|---|---|---|---|")
    for name, result, key in rows:
        latency = " / ".join(
            str(result[k])
            for k in ("latency_ms_p50", "latency_ms_p99", "latency_ms_p999", "latency_ms_max")
        )
        print(
            f"| {name} | {result[key]} {key} | {result['records_per_s']:,.0f} | {result['mb_per_s']} | {latency} | `{result['command']}` |"
        )
    print(
        f"| bytes on disk per 100 B record (send_batch batches) | {disk_batch:.1f} B | | | | `topics describe b1 --json` |"
    )
    print(
        f"| bytes on disk per 100 B record (per-record send batches) | {disk_record:.1f} B | | | | `topics describe r1 --json` |"
    )
    print(
        f"| restart after SIGKILL with a {log_bytes / 2**30:.2f} GiB log, to serving | {restart_s:.2f} s | | | | `scripts/bench_all.py` |"
    )


def replication_bench(quick: bool) -> None:
    """RF 3 against RF 1 (headwater bench replication starts its own 3 nodes)."""
    args = ["--records", "200000", "--e2e-records", "10000"] if quick else []
    output = subprocess.run(
        [*CLI, "bench", "replication", "--json", *args], capture_output=True, check=True, text=True
    ).stdout
    r = json.loads(output)
    command = "headwater bench replication " + " ".join(args)
    rf1, rf3, e2e = r["rf1_acks_1"], r["rf3_acks_all"], r["e2e_rf3_acks_all"]
    print(f"\n3 combined nodes on loopback, {r['partitions']} partitions, 100 B records.\n")
    print("| figure | result | command |")
    print("|---|---|---|")
    print(f"| produce RF 1, acks=1 | {rf1['records_per_s']:,.0f} records/s | `{rf1['command']}` |")
    print(
        f"| produce RF 3, acks=all, min_insync_replicas 2 | {rf3['records_per_s']:,.0f} records/s | `{rf3['command']}` |"
    )
    print(
        f"| ratio RF 3 acks=all / RF 1 acks=1 (same run, median of {r['rounds']} alternating rounds; by round {r['ratio_by_round']}) | {r['ratio_rf3_all_to_rf1_1']} | `{command}` |"
    )
    print(
        f"| node CPU per million records, RF 1 / RF 3 | {rf1['node_cpu_s_per_million_records']} / {rf3['node_cpu_s_per_million_records']} s | `{command}` |"
    )
    print(
        f"| acks=all at {e2e['settings']['rate']:,} records/s: produce (acknowledgement) latency p50 / p99 / max | {e2e['ack_latency_ms_p50']} / {e2e['ack_latency_ms_p99']} / {e2e['ack_latency_ms_max']} ms | `{e2e['command']}` |"
    )
    print(
        f"| same run, end to end (produce to consume) p50 / p99 | {e2e['latency_ms_p50']} / {e2e['latency_ms_p99']} ms | `{e2e['command']}` |"
    )
    for key, name in (
        ("follower_lag_records_at_steady_rate", "follower lag at 10,000 records/s, records"),
        (
            "follower_lag_records_under_full_load",
            "follower lag during the RF 3 produce run, records",
        ),
        (
            "follower_caught_up_ms_ago_at_steady_rate",
            "time since a follower was caught up, at 10,000 records/s, ms",
        ),
    ):
        lag = r[key]
        print(
            f"| {name}: p50 / p99 / max ({lag.get('samples', 0)} samples) | {lag.get('p50')} / {lag.get('p99')} / {lag.get('max')} | `{command}` |"
        )


def cluster_bench(quick: bool) -> None:
    """The control plane's figures (headwater bench cluster starts its own 3 nodes)."""
    args = ["--trials", "3", "--topics", "20", "--partitions", "300"] if quick else []
    output = subprocess.run(
        [*CLI, "bench", "cluster", "--json", *args], capture_output=True, check=True, text=True
    ).stdout
    result = json.loads(output)
    command = "headwater bench cluster " + " ".join(args)
    print(
        f"\n3 combined nodes on loopback, broker_session_timeout_ms {result['broker_session_timeout_ms']}.\n"
    )
    print("| figure | p50 | p99 | max | command |")
    print("|---|---|---|---|---|")
    for key, name in (
        ("controller_failover", "controller failover: SIGKILL to a new active controller"),
        ("leader_failover", "partition leader failover: SIGKILL to the first produce"),
    ):
        r = result[key]
        print(
            f"| {name} ({r['trials']} trials) | {r['p50_ms']} ms | {r['p99_ms']} ms | {r['max_ms']} ms | `{command}` |"
        )
    rates = result["topic_creations"]
    big = result["big_topic"]
    print(
        f"| topic creations/s, one per request / many per request | {rates['one_per_request_per_s']} / {rates['many_per_request_per_s']} | | | `{command}` |"
    )
    print(
        f"| create a {big['partitions']}-partition RF 3 topic | {big['create_s']} s | | | `{command}` |"
    )
    print(
        f"| restart all 3 nodes with {big['partitions_in_cluster']} partitions, to ready | {big['restart_to_ready_s']} s | | | `{command}` |"
    )
    for key, when in (("metadata_rpc", "before"), ("metadata_rpc_after_restart", "after")):
        m = big[key]
        print(
            f"| Metadata RPC, {big['partitions_in_cluster']} partitions ({when} the restart) | {m['p50_ms']} ms | {m['p99_ms']} ms | | `{command}` |"
        )


def spark_bench(quick: bool) -> None:
    """The Spark connector on one local node (headwater bench spark starts it)."""
    args = ["--records", "500000", "--latency-samples", "20"] if quick else []
    output = subprocess.run(
        [*CLI, "bench", "spark", "--json", *args], capture_output=True, check=True, text=True
    ).stdout
    r = json.loads(output)
    command = "headwater bench spark " + " ".join(args)
    print(
        f"\nSpark local[2], one node, {r['records']:,} records of 100 B in {r['partitions']} partitions.\n"
    )
    print("| figure | result | command |")
    print("|---|---|---|")
    print(
        f"| batch read into noop, median of rounds {r['batch_read_rows_per_s_by_round']} | {r['batch_read_rows_per_s']:,} rows/s | `{command}` |"
    )
    print(
        f"| the same rows from Parquet into noop, median of rounds {r['batch_read_parquet_rows_per_s_by_round']} | {r['batch_read_parquet_rows_per_s']:,} rows/s | `{command}` |"
    )
    print(
        f"| ratio Headwater / Parquet, noop (same run) | {r['batch_read_ratio_to_parquet']} | `{command}` |"
    )
    print(
        f"| aggregate query (count, sum(length(value)), sum(offset), max(timestamp)), median of rounds {r['aggregate_rows_per_s_by_round']} | {r['aggregate_rows_per_s']:,} rows/s | `{command}` |"
    )
    print(
        f"| the same query on Parquet, median of rounds {r['aggregate_parquet_rows_per_s_by_round']} | {r['aggregate_parquet_rows_per_s']:,} rows/s | `{command}` |"
    )
    print(
        f"| ratio Headwater / Parquet, aggregate (same run) | {r['aggregate_ratio_to_parquet']} | `{command}` |"
    )
    print(
        f"| the aggregate query with its columns given as a schema, median of rounds {r['aggregate_columns_rows_per_s_by_round']} | {r['aggregate_columns_rows_per_s']:,} rows/s ({r['aggregate_columns_ratio_to_parquet']} of Parquet) | `{command}` |"
    )
    print(
        f"| ceiling: a Python source yielding prebuilt batches, noop / aggregate, of Parquet | {r['ceiling_noop_ratio_to_parquet']} / {r['ceiling_aggregate_ratio_to_parquet']} | `{command}` |"
    )
    print(
        f"| streaming ingest, steady state ({r['streaming_ingest_microbatches']} micro-batches) | {r['streaming_ingest_rows_per_s']:,} rows/s | `{command}` |"
    )
    print(f"| sink (df.write) | {r['sink_rows_per_s']:,} rows/s | `{command}` |")
    print(
        f"| produce to visible in a micro-batch, p50 / p99 ({r['microbatch_latency_samples']} samples) | {r['microbatch_latency_ms_p50']} / {r['microbatch_latency_ms_p99']} ms | `{command}` |"
    )
    print(
        f"| first record visible after the query's start() | {r['microbatch_first_visible_s']} s | `{command}` |"
    )
    phases = ", ".join(f"{k} {v:g}" for k, v in r["microbatch_spark_ms_p50"].items())
    print(f"| Spark's own time per micro-batch, medians (ms) | {phases} | `{command}` |")
    for label, what in (
        ("first", "no maxOffsetsPerTrigger, the part's first query"),
        ("default", "no maxOffsetsPerTrigger"),
        ("capped", "maxOffsetsPerTrigger a tenth of the backlog"),
    ):
        print(
            f"| restart with a backlog of {r['restart_backlog_records']:,} records, {what}: "
            f"first micro-batch done after start() ({r[f'restart_{label}_first_microbatch_rows']:,} "
            f"rows) / backlog read | {r[f'restart_{label}_first_microbatch_s']} s / "
            f"{r[f'restart_{label}_caught_up_s']} s | `{command}` |"
        )


if __name__ == "__main__":
    main()
