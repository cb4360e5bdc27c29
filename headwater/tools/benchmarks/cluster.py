"""``headwater bench cluster``: the control plane's figures on a local 3-node cluster.

It starts its own combined nodes (``headwater serve`` child processes on free loopback
ports, data in a temporary folder) and measures, over ``--trials`` trials each:

- controller failover: SIGKILL of the active controller until a surviving node reports
  another active controller (its activation record is applied there);
- partition leader failover: SIGKILL of a partition's leader until the first successful
  produce (acks=1) to that partition, sent to a surviving node;

then topic creations per second (one topic per request, then many per request), and a
topic with ``--partitions`` partitions (RF 3): the time to create it, to restart the
whole cluster with it, and the Metadata RPC's latency (p50, p99) before and after.
The killed node is restarted after each trial and the next trial waits until every
broker is running again.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeVar

import click

from headwater.client import Admin, ClusterMetadata, NewTopic, Producer, TopicDescription
from headwater.shared.errors import HeadwaterError
from headwater.tools.benchmarks.perf import percentile
from headwater.tools.devcluster import LocalCluster, WaitTimeoutError, wait_until

T = TypeVar("T")
POLL_S: Final = 0.005
READY_DEADLINE_S: Final = 120.0


def _until(condition: Callable[[], T | None], deadline_s: float, what: str) -> T:
    try:
        return wait_until(condition, deadline_s, what, interval_s=POLL_S)
    except WaitTimeoutError as error:
        raise click.ClickException(str(error)) from None


def bench_cluster_of(size: int, root: Path) -> LocalCluster:
    """The benchmarks' cluster: ``size`` nodes with data under ``root`` (not started)."""
    return LocalCluster(root, size)


def metadata(cluster: LocalCluster, node_id: int) -> ClusterMetadata:
    """Node ``node_id``'s own view of the cluster (its Metadata answer)."""
    return cluster.admin(node_id).node_metadata(
        cluster.nodes[node_id].address, include_digest=False
    )


def wait_all_running(cluster: LocalCluster) -> int:
    try:
        return cluster.wait_settled(READY_DEADLINE_S)
    except WaitTimeoutError as error:
        raise click.ClickException(str(error)) from None


def controller_failover(cluster: LocalCluster, trials: int) -> list[float]:
    times_ms = []
    for _ in range(trials):
        old = wait_all_running(cluster)
        survivors = [i for i in cluster.nodes if i != old]
        began = time.perf_counter()
        cluster.nodes[old].kill()

        def moved(survivors: list[int] = survivors, old: int = old) -> bool:
            return any(metadata(cluster, i).controller_id not in (-1, old) for i in survivors)

        _until(moved, 30, "a new controller")
        times_ms.append((time.perf_counter() - began) * 1000)
        cluster.start([old], wait=False)
    return times_ms


def leader_failover(cluster: LocalCluster, trials: int) -> list[float]:
    controller = wait_all_running(cluster)
    cluster.admin(controller).create_topic("bench-failover", 1, 3)
    times_ms = []
    for _ in range(trials):
        controller = wait_all_running(cluster)
        (partition,) = [
            p
            for t in metadata(cluster, controller).topics
            if t.name == "bench-failover"
            for p in t.partitions
        ]
        leader = partition.leader
        via = next(i for i in cluster.nodes if i != leader)
        # No retries: each attempt is one produce, and the clock runs until one succeeds.
        with Producer(
            cluster.nodes[via].address,
            acks="1",
            linger_ms=0,
            retries=0,
            request_timeout_ms=1000,
            delivery_timeout_ms=1000,
        ) as producer:

            def produced(producer: Producer = producer) -> bool:
                try:
                    producer.send("bench-failover", b"x" * 100, partition=0).result(2)
                except HeadwaterError:
                    producer.cluster.invalidate("bench-failover")
                    return False
                return True

            _until(produced, 10, "a produce before the kill")
            began = time.perf_counter()
            cluster.nodes[leader].kill()
            _until(produced, 60, "a produce to the new leader")
            times_ms.append((time.perf_counter() - began) * 1000)
        cluster.start([leader], wait=False)
    return times_ms


def topic_creations(cluster: LocalCluster, count: int) -> dict[str, float]:
    controller = wait_all_running(cluster)
    admin = cluster.admin(controller)
    began = time.perf_counter()
    for i in range(count):
        admin.create_topic(f"rate-{i}", 1, 3)
    one_per_request = count / (time.perf_counter() - began)
    began = time.perf_counter()
    with Admin(cluster.nodes[controller].address, request_timeout_s=120) as slow_admin:
        slow_admin.create_topics([NewTopic(f"batch-{i}", 1, 3) for i in range(count)])
    many_per_request = count / (time.perf_counter() - began)
    return {
        "one_per_request_per_s": round(one_per_request, 1),
        "many_per_request_per_s": round(many_per_request, 1),
    }


def metadata_latency(cluster: LocalCluster, node_id: int, calls: int = 100) -> dict[str, float]:
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        metadata(cluster, node_id)
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return {
        "p50_ms": round(percentile(samples, 0.5), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
    }


def big_cluster(cluster: LocalCluster, partitions: int) -> dict[str, Any]:
    controller = wait_all_running(cluster)
    began = time.perf_counter()
    with Admin(cluster.nodes[controller].address, request_timeout_s=300) as slow_admin:
        slow_admin.create_topic("bench-big", partitions, 3)
    created_s = time.perf_counter() - began
    other = next(i for i in cluster.nodes if i != controller)
    before = metadata_latency(cluster, other)
    for node in cluster.alive():
        node.kill()
    began = time.perf_counter()
    cluster.start(wait=False)
    wait_all_running(cluster)
    restart_s = time.perf_counter() - began
    after = metadata_latency(cluster, other)
    total = sum(len(t.partitions) for t in metadata(cluster, other).topics)
    return {
        "partitions": partitions,
        "partitions_in_cluster": total,
        "create_s": round(created_s, 2),
        "restart_to_ready_s": round(restart_s, 2),
        "metadata_rpc": before,
        "metadata_rpc_after_restart": after,
    }


def summary(samples_ms: list[float]) -> dict[str, float]:
    ordered = sorted(samples_ms)
    return {
        "trials": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5), 1),
        "p99_ms": round(percentile(ordered, 0.99), 1),
        "max_ms": round(ordered[-1], 1),
    }


def run(trials: int, topics: int, partitions: int) -> dict[str, Any]:
    results: dict[str, Any] = {"nodes": 3, "broker_session_timeout_ms": 3000}
    with tempfile.TemporaryDirectory(prefix="headwater-bench-") as root:
        cluster = bench_cluster_of(3, Path(root))
        try:
            cluster.start(wait=False)
            results["controller_failover"] = summary(controller_failover(cluster, trials))
            results["leader_failover"] = summary(leader_failover(cluster, trials))
            results["topic_creations"] = topic_creations(cluster, topics)
            results["big_topic"] = big_cluster(cluster, partitions)
        finally:
            cluster.close()
    return results


@click.command("cluster")
@click.option("--trials", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.option("--topics", type=click.IntRange(1, 10_000), default=200, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 10_000), default=3000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_cluster(trials: int, topics: int, partitions: int, as_json: bool) -> None:
    """Failover times, topic creation rate and a large cluster's metadata latency on a
    local 3-node cluster."""
    results = run(trials, topics, partitions)
    if as_json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        click.echo(f"{key}: {value}")


# --------------------------------------------------------------------------- replication


def run_bench(bootstrap: str, *args: str, env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """One ``headwater bench`` run in its own process (as a user would run it), with
    ``env`` added to this process's environment (a client's TLS settings)."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "headwater.cli.main",
            "bench",
            *args,
            "--json",
            "--bootstrap",
            bootstrap,
        ],
        capture_output=True,
        check=False,
        text=True,
        env={**os.environ, **env} if env else None,
    )
    if done.returncode != 0:
        raise click.ClickException(
            f"headwater bench {' '.join(args)} failed: {done.stderr.strip()[-500:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout)
    result["command"] = "headwater bench " + " ".join(args)
    return result


def produce_batch(
    bootstrap: str, topic: str, records: int, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """``bench produce --mode batch --partitions 4 --acks all`` (send_batch), the batch
    workload of the same-run comparisons (``bench metrics``, ``bench tls``)."""
    return run_bench(
        bootstrap,
        "produce",
        "--topic",
        topic,
        "--mode",
        "batch",
        "--partitions",
        "4",
        "--acks",
        "all",
        "--records",
        str(records),
        env=env,
    )


def produce_per_record(
    bootstrap: str,
    topic: str,
    records: int,
    *options: str,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """``bench produce --mode record --acks 1`` (per-record send) with more ``options``."""
    return run_bench(
        bootstrap,
        "produce",
        "--topic",
        topic,
        "--mode",
        "record",
        "--acks",
        "1",
        *options,
        "--records",
        str(records),
        env=env,
    )


CONSUME_RUNS: Final = 3


def throughput_workloads(
    bootstrap: str,
    batch_topic: str,
    record_topic: str,
    records: int,
    record_records: int,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The throughput workloads of the same-run comparisons (``bench tls``, ``bench
    acls``): ``batch`` (``produce_batch`` into ``batch_topic``), ``record``
    (``produce_per_record``) and ``consume``, a columnar read of ``batch_topic`` from the
    start, run ``CONSUME_RUNS`` times in a row and counted by the median run (the first
    read right after a produce varies by 2x from run to run on a 2-core machine)."""
    batch = produce_batch(bootstrap, batch_topic, records, env)
    record = produce_per_record(bootstrap, record_topic, record_records, env=env)
    consumes = [
        run_bench(bootstrap, "consume", "--topic", batch_topic, "--records", str(records), env=env)
        for _ in range(CONSUME_RUNS)
    ]
    consume = sorted(consumes, key=lambda r: float(r["records_per_s"]))[CONSUME_RUNS // 2]
    return {"batch": batch, "record": record, "consume": consume}


def paired_ratios(numerators: Sequence[float], denominators: Sequence[float]) -> list[float]:
    """Each figure over the one measured beside it in the same round, to 3 places."""
    return [round(a / b, 3) for a, b in zip(numerators, denominators, strict=True)]


def median_ratio(ratios: Sequence[float]) -> float:
    return round(statistics.median(ratios), 3)


class LagSampler:
    """Samples, every 100 ms, the records each follower of ``topic`` lacks (as its
    leaders report them in DescribeTopics)."""

    def __init__(self, cluster: LocalCluster, via: int, topic: str) -> None:
        self.cluster = cluster
        self.via = via
        self.topic = topic
        self.lags: list[int] = []
        self.caught_up_ms: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> LagSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        with Admin(self.cluster.nodes[self.via].address, request_timeout_s=2) as admin:
            while not self._stop.wait(0.1):
                try:
                    (described,) = admin.describe_topics([self.topic])
                except HeadwaterError:
                    continue
                self._note(described)

    def _note(self, described: TopicDescription) -> None:
        for partition in described.partitions:
            for follower in partition.followers:
                if follower.lag_records >= 0:
                    self.lags.append(follower.lag_records)
                    self.caught_up_ms.append(follower.caught_up_ms_ago)


def node_cpu_s(cluster: LocalCluster) -> float:
    """CPU seconds (user + system) the cluster's node processes have used so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for node in cluster.nodes.values():
        if node.process is None:
            continue
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{node.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / ticks
    return total


def _measured_produce(
    cluster: LocalCluster, bootstrap: str, records: int, *args: str
) -> dict[str, Any]:
    """One produce run, with the node CPU seconds it cost per million records. Runs start
    with no dirty pages: the writeback of the previous run's data (gigabytes, three times
    as much after an RF 3 run) must not land in this one."""
    os.sync()
    before = node_cpu_s(cluster)
    result = run_bench(bootstrap, "produce", *args)
    result["node_cpu_s_per_million_records"] = round(
        (node_cpu_s(cluster) - before) / records * 1e6, 3
    )
    return result


def run_replication(
    records: int, partitions: int, rate: int, e2e_records: int, rounds: int
) -> dict[str, Any]:
    """RF 1 acks=1 and RF 3 acks=all alternate for ``rounds`` rounds on one cluster (so
    that both see the same machine); the ratio is that of their median throughputs."""
    results: dict[str, Any] = {"nodes": 3, "partitions": partitions, "record_bytes": 100}
    rf1_runs: list[dict[str, Any]] = []
    rf3_runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="headwater-bench-") as root:
        cluster = bench_cluster_of(3, Path(root))
        try:
            cluster.start(wait=False)
            controller = wait_all_running(cluster)
            bootstrap = cluster.bootstrap()
            two = {"min_insync_replicas": "2"}
            cluster.admin(controller).create_topics(
                [
                    NewTopic("rf1", partitions, 1),
                    NewTopic("rf3", partitions, 3, two),
                    NewTopic("rf3-latency", 1, 3, two),
                ]
            )
            common = ["--records", str(records), "--partitions", str(partitions)]
            with LagSampler(cluster, controller, "rf3") as under_load:
                for _ in range(rounds):
                    rf1_runs.append(
                        _measured_produce(
                            cluster, bootstrap, records, "--topic", "rf1", "--acks", "1", *common
                        )
                    )
                    rf3_runs.append(
                        _measured_produce(
                            cluster, bootstrap, records, "--topic", "rf3", "--acks", "all", *common
                        )
                    )
            os.sync()  # the latency phase, a steady state, starts with no writeback due
            with LagSampler(cluster, controller, "rf3-latency") as steady:
                e2e = run_bench(
                    bootstrap,
                    "e2e",
                    "--topic",
                    "rf3-latency",
                    "--acks",
                    "all",
                    "--rate",
                    str(rate),
                    "--records",
                    str(e2e_records),
                )
        finally:
            cluster.close()
    rf1 = _median_run(rf1_runs)
    rf3 = _median_run(rf3_runs)
    results["rounds"] = rounds
    results["rf1_acks_1"] = rf1
    results["rf3_acks_all"] = rf3
    results["rf1_records_per_s_by_round"] = [r["records_per_s"] for r in rf1_runs]
    results["rf3_records_per_s_by_round"] = [r["records_per_s"] for r in rf3_runs]
    results["ratio_rf3_all_to_rf1_1"] = round(rf3["records_per_s"] / rf1["records_per_s"], 3)
    results["ratio_by_round"] = [
        round(b["records_per_s"] / a["records_per_s"], 3)
        for a, b in zip(rf1_runs, rf3_runs, strict=True)
    ]
    results["e2e_rf3_acks_all"] = e2e
    results["follower_lag_records_under_full_load"] = _spread(under_load.lags)
    results["follower_lag_records_at_steady_rate"] = _spread(steady.lags)
    results["follower_caught_up_ms_ago_at_steady_rate"] = _spread(steady.caught_up_ms)
    return results


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput (the lower middle one of an even count)."""
    ordered = sorted(runs, key=lambda r: float(r["records_per_s"]))
    return ordered[(len(ordered) - 1) // 2]


def _spread(samples: list[int]) -> dict[str, float]:
    if not samples:
        return {"samples": 0}
    ordered = sorted(samples)
    return {
        "samples": len(ordered),
        "p50": percentile(ordered, 0.5),
        "p99": percentile(ordered, 0.99),
        "max": ordered[-1],
    }


@click.command("replication")
@click.option("--records", type=click.IntRange(1), default=2_000_000, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 64), default=4, show_default=True)
@click.option("--rate", type=click.IntRange(1), default=10_000, show_default=True)
@click.option("--e2e-records", type=click.IntRange(1), default=100_000, show_default=True)
@click.option(
    "--rounds",
    type=click.IntRange(1, 20),
    default=3,
    show_default=True,
    help="Alternating RF 1 / RF 3 runs; the medians are compared.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_replication(
    records: int, partitions: int, rate: int, e2e_records: int, rounds: int, as_json: bool
) -> None:
    """RF 3 acks=all against RF 1 acks=1 in one run (alternating rounds, medians compared,
    with the node CPU each costs), acks=all latency at a fixed rate, and follower lag, on a
    local 3-node cluster."""
    results = run_replication(records, partitions, rate, e2e_records, rounds)
    if as_json:
        print(json.dumps(results))
        return
    for key, value in results.items():
        click.echo(f"{key}: {value}")
