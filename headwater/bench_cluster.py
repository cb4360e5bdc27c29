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
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, TypeVar

import click
import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from headwater.bench import percentile
from headwater.cli_cluster import DevNode, spawn
from headwater.ports import free_port
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

T = TypeVar("T")
POLL_S: Final = 0.005
READY_DEADLINE_S: Final = 120.0


def _until(condition: Callable[[], T | None], deadline_s: float, what: str) -> T:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            value = condition()
        except grpc.RpcError:
            value = None
        if value:
            return value
        time.sleep(POLL_S)
    raise click.ClickException(f"timed out after {deadline_s:g} s waiting for {what}")


class BenchCluster:
    def __init__(self, size: int, root: Path) -> None:
        self.nodes = {
            i: DevNode(
                node_id=i,
                address=f"127.0.0.1:{free_port()}",
                raft_address=f"127.0.0.1:{free_port()}",
                data_dir=root / f"node-{i}",
                log_path=root / f"node-{i}.log",
            )
            for i in range(1, size + 1)
        }
        self.quorum = ",".join(f"{n.node_id}@{n.raft_address}" for n in self.nodes.values())
        self.env = {**os.environ, "HEADWATER_CLUSTER_SECRET": "bench"}
        self._channels: dict[str, grpc.Channel] = {}

    def start(self, node_id: int | None = None) -> None:
        for node in self.nodes.values():
            if node_id is None or node.node_id == node_id:
                node.process = spawn(node, self.quorum, self.env)

    def kill(self, node_id: int) -> None:
        process = self.nodes[node_id].process
        assert process is not None
        process.send_signal(signal.SIGKILL)
        process.wait()

    def close(self) -> None:
        for node in self.nodes.values():
            if node.process is not None and node.process.poll() is None:
                node.process.kill()
                node.process.wait()
        for channel in self._channels.values():
            channel.close()

    def stub(self, node_id: int) -> pb_grpc.BrokerStub:
        address = self.nodes[node_id].address
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = grpc.insecure_channel(
                address, options=[("grpc.max_receive_message_length", 256 << 20)]
            )
        return pb_grpc.BrokerStub(channel)

    def admin(self, node_id: int) -> pb_grpc.AdminStub:
        self.stub(node_id)
        return pb_grpc.AdminStub(self._channels[self.nodes[node_id].address])

    def metadata(self, node_id: int, timeout_s: float = 2.0) -> pb.MetadataResponse:
        response: pb.MetadataResponse = self.stub(node_id).Metadata(
            pb.MetadataRequest(), timeout=timeout_s
        )
        return response

    def serving(self, node_id: int) -> bool:
        self.stub(node_id)
        channel = self._channels[self.nodes[node_id].address]
        reply = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=2
        )
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)

    def live(self) -> list[int]:
        return [
            i for i, n in self.nodes.items() if n.process is not None and n.process.poll() is None
        ]

    def wait_all_running(self) -> int:
        """Wait until every node sees the same controller and every broker running;
        return the controller's id."""

        def settled() -> int | None:
            if not all(self.serving(i) for i in self.nodes):
                return None
            views = [self.metadata(i) for i in self.nodes]
            controllers = {v.controller_id for v in views}
            states = {b.state for v in views for b in v.brokers}
            brokers = {len(v.brokers) for v in views}
            settled = len(controllers) == 1 and -1 not in controllers and states == {"running"}
            if settled and brokers == {len(self.nodes)}:
                return views[0].controller_id
            return None

        return _until(settled, READY_DEADLINE_S, "every node running under one controller")


def controller_failover(cluster: BenchCluster, trials: int) -> list[float]:
    times_ms = []
    for _ in range(trials):
        old = cluster.wait_all_running()
        survivors = [i for i in cluster.nodes if i != old]
        began = time.perf_counter()
        cluster.kill(old)

        def moved(survivors: list[int] = survivors, old: int = old) -> bool:
            return any(cluster.metadata(i, 0.5).controller_id not in (-1, old) for i in survivors)

        _until(moved, 30, "a new controller")
        times_ms.append((time.perf_counter() - began) * 1000)
        cluster.start(old)
    return times_ms


def leader_failover(cluster: BenchCluster, trials: int) -> list[float]:
    controller = cluster.wait_all_running()
    cluster.admin(controller).CreateTopics(
        pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="bench-failover", partitions=1, replication_factor=3)]
        ),
        timeout=30,
    )
    request = pb.ProduceRequest(
        topic="bench-failover",
        partition=0,
        records=pb.RecordList(records=[pb.Record(value=b"x" * 100)]),
        acks=pb.ACKS_LEADER,
    )
    times_ms = []
    for _ in range(trials):
        controller = cluster.wait_all_running()
        (partition,) = [
            p
            for t in cluster.metadata(controller).topics
            if t.name == "bench-failover"
            for p in t.partitions
        ]
        leader = partition.leader
        via = next(i for i in cluster.nodes if i != leader)
        cluster.stub(via).Produce(request, timeout=10)  # the path works before the kill
        began = time.perf_counter()
        cluster.kill(leader)

        def produced(via: int = via) -> bool:
            return bool(cluster.stub(via).Produce(request, timeout=1).results)

        _until(produced, 60, "a produce to the new leader")
        times_ms.append((time.perf_counter() - began) * 1000)
        cluster.start(leader)
    return times_ms


def topic_creations(cluster: BenchCluster, count: int) -> dict[str, float]:
    controller = cluster.wait_all_running()
    admin = cluster.admin(controller)
    began = time.perf_counter()
    for i in range(count):
        admin.CreateTopics(
            pb.CreateTopicsRequest(
                topics=[pb.NewTopic(name=f"rate-{i}", partitions=1, replication_factor=3)]
            ),
            timeout=30,
        )
    one_per_request = count / (time.perf_counter() - began)
    began = time.perf_counter()
    admin.CreateTopics(
        pb.CreateTopicsRequest(
            topics=[
                pb.NewTopic(name=f"batch-{i}", partitions=1, replication_factor=3)
                for i in range(count)
            ]
        ),
        timeout=120,
    )
    many_per_request = count / (time.perf_counter() - began)
    return {
        "one_per_request_per_s": round(one_per_request, 1),
        "many_per_request_per_s": round(many_per_request, 1),
    }


def metadata_latency(cluster: BenchCluster, node_id: int, calls: int = 100) -> dict[str, float]:
    samples = []
    for _ in range(calls):
        began = time.perf_counter()
        cluster.metadata(node_id, 10)
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return {
        "p50_ms": round(percentile(samples, 0.5), 2),
        "p99_ms": round(percentile(samples, 0.99), 2),
    }


def big_cluster(cluster: BenchCluster, partitions: int) -> dict[str, Any]:
    controller = cluster.wait_all_running()
    began = time.perf_counter()
    cluster.admin(controller).CreateTopics(
        pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="bench-big", partitions=partitions, replication_factor=3)]
        ),
        timeout=300,
    )
    created_s = time.perf_counter() - began
    other = next(i for i in cluster.nodes if i != controller)
    before = metadata_latency(cluster, other)
    for node_id in list(cluster.live()):
        cluster.kill(node_id)
    began = time.perf_counter()
    cluster.start()
    cluster.wait_all_running()
    restart_s = time.perf_counter() - began
    after = metadata_latency(cluster, other)
    total = sum(len(t.partitions) for t in cluster.metadata(other).topics)
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
        cluster = BenchCluster(3, Path(root))
        try:
            cluster.start()
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


def run_bench(bootstrap: str, *args: str) -> dict[str, Any]:
    """One ``headwater bench`` run in its own process (as a user would run it)."""
    done = subprocess.run(
        [sys.executable, "-m", "headwater.cli", "bench", *args, "--json", "--bootstrap", bootstrap],
        capture_output=True,
        check=False,
        text=True,
    )
    if done.returncode != 0:
        raise click.ClickException(
            f"headwater bench {' '.join(args)} failed: {done.stderr.strip()[-500:]}"
        )
    result: dict[str, Any] = json.loads(done.stdout)
    result["command"] = "headwater bench " + " ".join(args)
    return result


class LagSampler:
    """Samples, every 100 ms, the records each follower of ``topic`` lacks (as its
    leaders report them in DescribeTopics)."""

    def __init__(self, cluster: BenchCluster, via: int, topic: str) -> None:
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
        admin = self.cluster.admin(self.via)
        while not self._stop.wait(0.1):
            try:
                described = admin.DescribeTopics(
                    pb.DescribeTopicsRequest(names=[self.topic]), timeout=2
                )
            except grpc.RpcError:
                continue
            for partition in described.topics[0].partitions:
                for follower in partition.followers:
                    if follower.lag_records >= 0:
                        self.lags.append(follower.lag_records)
                        self.caught_up_ms.append(follower.caught_up_ms_ago)


def node_cpu_s(cluster: BenchCluster) -> float:
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
    cluster: BenchCluster, bootstrap: str, records: int, *args: str
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
        cluster = BenchCluster(3, Path(root))
        try:
            cluster.start()
            controller = cluster.wait_all_running()
            bootstrap = ",".join(n.address for n in cluster.nodes.values())
            topics = [
                pb.NewTopic(name="rf1", partitions=partitions, replication_factor=1),
                pb.NewTopic(
                    name="rf3",
                    partitions=partitions,
                    replication_factor=3,
                    configs={"min_insync_replicas": "2"},
                ),
                pb.NewTopic(
                    name="rf3-latency",
                    partitions=1,
                    replication_factor=3,
                    configs={"min_insync_replicas": "2"},
                ),
            ]
            cluster.admin(controller).CreateTopics(
                pb.CreateTopicsRequest(topics=topics), timeout=60
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
