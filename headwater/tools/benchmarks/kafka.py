"""``headwater bench kafka``: Kafka clients against the Kafka listener, beside the gRPC
client on the same records in the same run.

It starts its own node(s) (``headwater.tools.devcluster``): one node for the single-node
figures; with ``--cluster``, three nodes and a replication factor 3 topic for acks=all.
Each round, in this order, on a fresh topic of ``--partitions`` partitions:

- **librdkafka produce** (confluent-kafka, its default batching, ``--acks``): RECORDS
  values of ``--record-size`` bytes, from the first ``produce`` to the end of ``flush``,
  failed deliveries reported (``delivery.report.only.error``: a Python callback for
  every record acknowledged would cost the client a third of its time), through the
  producer's ``on_delivery`` setting rather than one per ``produce`` call, with ``poll``
  every ``POLL_EVERY`` records (a callback object per record and a ``poll`` per record
  cost the client 0.6 µs of CPU a record, 1.7 µs against 1.1);
- **gRPC produce**: the same records with the project's client, per-record ``send``
  (its default batching, the same acks);
- **librdkafka consume**: every record from the earliest offset, by assignment, with
  ``fetch.queue.backoff.ms`` at 10 (librdkafka 2.1 and later stop fetching for 1 s,
  its default, whenever their prefetch queue fills, which a broker that answers fast
  makes them do over and over: 0.2M records/s with it against 1.3M without, the node
  idle meanwhile);
- **kcat consume** (librdkafka in C, with Debian's kcat when installed): the same
  records, from the first to the last, its output one offset a line;
- **gRPC consume**: the same, iterating records;
- with ``--kafka-python``: kafka-python's producer and consumer on a tenth of the records
  (they are bound by the client's own speed).

Beside each path's records per second, ``*_node_us`` is the microseconds of CPU the
node processes spent per record meanwhile (from /proc): the clients and the nodes share
the machine, so this says what the node costs whichever side is the bound. The ratios
are Kafka / gRPC of records per second, median of the rounds. confluent-kafka
and kafka-python are the project's dev dependencies.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click

from headwater.client import Admin, Consumer, Producer
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.devcluster import LocalCluster, LocalNode
from headwater.tools.ports import free_port

DEADLINE_S: Final = 300.0
FETCH_QUEUE_BACKOFF_MS: Final = 10
POLL_EVERY: Final = 1000


def kcat_consume(servers: str, topic: str, count: int) -> float | None:
    """Seconds kcat (librdkafka in C) takes to read ``count`` records of ``topic`` from
    the earliest offsets to the end, start-up included; None without kcat."""
    kcat = shutil.which("kcat")
    if kcat is None:
        return None
    began = time.perf_counter()
    broker = servers.split(",", maxsplit=1)[0]
    done = subprocess.run(
        [kcat, "-C", "-b", broker, "-t", topic, "-o", "beginning", "-e", "-q", "-f", "%o\n"],
        capture_output=True,
        timeout=DEADLINE_S,
        check=False,
    )
    took = time.perf_counter() - began
    read = done.stdout.count(b"\n")
    if done.returncode != 0 or read != count:
        raise HeadwaterError(
            ErrorCode.REQUEST_TIMED_OUT,
            f"kcat read {read} of {count} records: {done.stderr.decode(errors='replace')[-300:]}",
        )
    return took


def _require_kafka_clients() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise click.ClickException(
            "bench kafka needs confluent-kafka (pip install confluent-kafka; make installs it)"
        ) from None
    return confluent_kafka


def _rate(records: int, seconds: float) -> float:
    return round(records / seconds, 1) if seconds > 0 else 0.0


def kafka_produce(servers: str, topic: str, values: list[bytes], acks: str) -> float:
    """Seconds librdkafka takes to produce and flush ``values``."""
    ck = _require_kafka_clients()
    failed: list[object] = []

    def report(error: object, _message: object) -> None:
        if error is not None:
            failed.append(error)

    producer = ck.Producer(
        {
            "bootstrap.servers": servers,
            "acks": acks,
            "delivery.report.only.error": True,
            "on_delivery": report,
        }
    )
    produce, poll = producer.produce, producer.poll
    began = time.perf_counter()
    for n, value in enumerate(values, 1):
        while True:
            try:
                produce(topic, value)
                break
            except BufferError:  # its queue is full: let deliveries drain it
                poll(0.001)
        if not n % POLL_EVERY:
            poll(0)
    if producer.flush(DEADLINE_S) != 0 or failed:
        raise HeadwaterError(
            ErrorCode.REQUEST_TIMED_OUT, f"librdkafka did not deliver every record: {failed[:3]}"
        )
    return time.perf_counter() - began


def kafka_consume(servers: str, topic: str, partitions: int, count: int) -> float:
    """Seconds librdkafka takes to read ``count`` records from the earliest offsets."""
    ck = _require_kafka_clients()
    consumer = ck.Consumer(
        {
            "bootstrap.servers": servers,
            "group.id": "bench",
            "enable.auto.commit": False,
            "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        }
    )
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got = 0
    began = time.perf_counter()
    deadline = time.monotonic() + DEADLINE_S
    try:
        while got < count:
            if time.monotonic() > deadline:
                raise HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, f"read {got} of {count}")
            for message in consumer.consume(10_000, 1.0):
                if message.error() is None:
                    got += 1
        return time.perf_counter() - began
    finally:
        consumer.close()


def grpc_produce(bootstrap: str, topic: str, values: list[bytes], acks: str) -> float:
    with Producer(bootstrap, acks=acks) as producer:
        began = time.perf_counter()
        for value in values:
            producer.send(topic, value)
        producer.flush()
        return time.perf_counter() - began


def grpc_consume(bootstrap: str, topic: str, partitions: int, count: int) -> float:
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign([(topic, p) for p in range(partitions)])
        got = 0
        began = time.perf_counter()
        deadline = time.monotonic() + DEADLINE_S
        while got < count:
            if time.monotonic() > deadline:
                raise HeadwaterError(ErrorCode.REQUEST_TIMED_OUT, f"read {got} of {count}")
            for record in consumer.poll(1000):
                got += 1
                _ = record.value
        return time.perf_counter() - began


def kafka_python_round(
    servers: str, topic: str, values: list[bytes], partitions: int
) -> dict[str, float]:
    import warnings

    with warnings.catch_warnings():  # kafka-python reads its schemas the deprecated way
        warnings.simplefilter("ignore", DeprecationWarning)
        from kafka import KafkaConsumer, KafkaProducer, TopicPartition

        producer = KafkaProducer(bootstrap_servers=servers, acks=1, linger_ms=5)
        began = time.perf_counter()
        for value in values:
            producer.send(topic, value)
        producer.flush()
        produce_s = time.perf_counter() - began
        producer.close()
        consumer = KafkaConsumer(bootstrap_servers=servers, enable_auto_commit=False)
        consumer.assign([TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        got = 0
        began = time.perf_counter()
        while got < len(values):
            for batch in consumer.poll(1000, max_records=100_000).values():
                got += len(batch)
        consume_s = time.perf_counter() - began
        consumer.close()
    return {
        "kafka_python_produce_rps": _rate(len(values), produce_s),
        "kafka_python_consume_rps": _rate(len(values), consume_s),
    }


def _nodes_cpu_s(pids: list[int]) -> float:
    """CPU seconds (user and system) the node processes have used so far."""
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def run_round(
    servers: str,
    bootstrap: str,
    topic_prefix: str,
    partitions: int,
    replication: int,
    values: list[bytes],
    acks: str,
    with_kafka_python: bool,
    node_pids: list[int],
) -> dict[str, float]:
    """One round's records per second, and the nodes' microseconds of CPU per record of
    each librdkafka and gRPC path (``*_node_us``): what the node spends, whichever client
    is the bound."""
    with Admin(bootstrap) as admin:
        for side in ("kafka", "grpc", "kp"):
            admin.create_topic(f"{topic_prefix}-{side}", partitions, replication)
    kafka_topic, grpc_topic = f"{topic_prefix}-kafka", f"{topic_prefix}-grpc"
    count = len(values)
    steps: dict[str, Callable[[], float | None]] = {
        "kafka_produce": lambda: kafka_produce(servers, kafka_topic, values, acks),
        "grpc_produce": lambda: grpc_produce(bootstrap, grpc_topic, values, acks),
        "kafka_consume": lambda: kafka_consume(servers, kafka_topic, partitions, count),
        "grpc_consume": lambda: grpc_consume(bootstrap, grpc_topic, partitions, count),
        "kcat_consume": lambda: kcat_consume(servers, kafka_topic, count),
    }
    figures: dict[str, float] = {}
    for name, step in steps.items():
        cpu_before = _nodes_cpu_s(node_pids)
        seconds = step()
        if seconds is None:
            continue
        figures[f"{name}_rps"] = _rate(count, seconds)
        figures[f"{name}_node_us"] = round((_nodes_cpu_s(node_pids) - cpu_before) / count * 1e6, 3)
    if with_kafka_python:
        figures.update(
            kafka_python_round(servers, f"{topic_prefix}-kp", values[: count // 10], partitions)
        )
    return figures


def _median_ratio(rounds: list[dict[str, float]], top: str, bottom: str) -> float:
    return round(statistics.median(r[top] / r[bottom] for r in rounds if r[bottom]), 3)


@click.command("kafka")
@click.option("--records", type=click.IntRange(min=1000), default=1_000_000, show_default=True)
@click.option("--record-size", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--partitions", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True)
@click.option("--acks", type=click.Choice(["0", "1", "all"]), default="1", show_default=True)
@click.option("--cluster", is_flag=True, help="Three nodes, replication factor 3.")
@click.option("--kafka-python", "with_kafka_python", is_flag=True, help="Also kafka-python.")
@click.option("--json", "as_json", is_flag=True)
def bench_kafka(
    records: int,
    record_size: int,
    partitions: int,
    rounds: int,
    acks: str,
    cluster: bool,
    with_kafka_python: bool,
    as_json: bool,
) -> None:
    """librdkafka (and kafka-python) on the Kafka listener against the gRPC client, on the
    same records in one run (see the module doc)."""
    _require_kafka_clients()
    values = [(b"%010d" % i).ljust(record_size, b"x")[:record_size] for i in range(records)]
    with tempfile.TemporaryDirectory(prefix="headwater-bench-kafka-") as root:
        start: Callable[[], tuple[str, str, Callable[[], None], list[LocalNode]]]
        if cluster:

            def start() -> tuple[str, str, Callable[[], None], list[LocalNode]]:
                group = LocalCluster(Path(root), 3, kafka_ports={i: free_port() for i in (1, 2, 3)})
                group.start()
                kafka = ",".join(n.kafka_address or "" for n in group.nodes.values())
                return kafka, group.bootstrap(), group.close, list(group.nodes.values())

        else:

            def start() -> tuple[str, str, Callable[[], None], list[LocalNode]]:
                node = LocalNode(Path(root) / "data", kafka_port=free_port())
                node.start()

                def stop_node() -> None:
                    node.stop()

                return node.kafka_address or "", node.address, stop_node, [node]

        servers, bootstrap, stop, nodes = start()
        pids = [n.process.pid for n in nodes if n.process is not None]
        try:
            results = [
                run_round(
                    servers,
                    bootstrap,
                    f"bench-{n}",
                    partitions,
                    3 if cluster else 1,
                    values,
                    acks,
                    with_kafka_python,
                    pids,
                )
                for n in range(rounds)
            ]
        finally:
            stop()
    summary = {
        "records": records,
        "record_size": record_size,
        "partitions": partitions,
        "acks": acks,
        "nodes": 3 if cluster else 1,
        "rounds": results,
        "produce_kafka_over_grpc": _median_ratio(results, "kafka_produce_rps", "grpc_produce_rps"),
        "consume_kafka_over_grpc": _median_ratio(results, "kafka_consume_rps", "grpc_consume_rps"),
        **(
            {
                "consume_kcat_over_grpc": _median_ratio(
                    results, "kcat_consume_rps", "grpc_consume_rps"
                )
            }
            if all("kcat_consume_rps" in r for r in results)
            else {}
        ),
    }
    if as_json:
        click.echo(json.dumps(summary))
        return
    for n, figures in enumerate(results, 1):
        click.echo(f"round {n}: " + ", ".join(f"{k} {v}" for k, v in figures.items()))
    click.echo(
        f"Kafka / gRPC, median: produce {summary['produce_kafka_over_grpc']}, "
        f"consume {summary['consume_kafka_over_grpc']}"
    )
