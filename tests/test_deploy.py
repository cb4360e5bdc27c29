"""The docker-compose deployment, run for real (deploy/, README "Deploy with
docker-compose"): ``make up`` brings three healthy nodes and Prometheus; 100,000 acks=all
records survive ``docker kill`` of a partition leader's container; a node cut off from the
compose network for 20 s comes back into every ISR; Prometheus scrapes every node;
``make down VOLUMES=1`` removes it all.

Test traffic goes only to the ports the deployment publishes on 127.0.0.1; the containers
talk among themselves on the compose project's own network. Skipped, saying why, where
no Docker Engine runs. The first ``make up`` on a machine builds the images (minutes);
later ones reuse them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headwater.client import Admin, Consumer, Producer, RecordFuture
from tests.node_process import wait_until

ROOT = Path(__file__).resolve().parent.parent
BOOTSTRAP = "127.0.0.1:7700,127.0.0.1:7702,127.0.0.1:7704"
PROMETHEUS = "http://127.0.0.1:9090"
RECORDS = 100_000
TOPIC = "deployed"
CUT_OFF_S = 20


def _docker_runs() -> str | None:
    """Why the deployment cannot be tried here, or None."""
    if shutil.which("docker") is None:
        return "no docker command on this machine"
    if subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        return "no Docker Engine answers here (docker info failed)"
    if shutil.which("docker-compose") is None:
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
        if probe.returncode != 0:
            return "neither docker-compose nor docker compose is installed"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(2400),
    pytest.mark.skipif(_docker_runs() is not None, reason=f"docker-compose: {_docker_runs()}"),
]


def compose(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["docker-compose"] if shutil.which("docker-compose") else ["docker", "compose"]
    return subprocess.run(
        [*command, "-f", str(ROOT / "deploy/docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        check=check,
        cwd=ROOT,
    )


def container(service: str) -> str:
    found = compose("ps", "-q", service).stdout.strip()
    assert found, f"no container for {service}"
    return found


def docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True).stdout


def make(*args: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", *args], capture_output=True, text=True, cwd=ROOT, timeout=timeout_s, check=False
    )


def prometheus(query: str) -> list[dict[str, Any]]:
    url = f"{PROMETHEUS}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as answer:
        body = json.load(answer)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


@pytest.fixture(scope="module")
def deployment() -> Iterator[float]:
    """The deployment brought up by ``make up`` (its seconds to healthy), brought down
    with its data afterwards."""
    make("down", "VOLUMES=1", timeout_s=300)
    began = time.monotonic()
    up = make("up", timeout_s=1800)
    took = time.monotonic() - began
    try:
        assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        assert "3 nodes healthy" in up.stdout
        yield took
    finally:
        if up.returncode != 0 or os.environ.get("HEADWATER_KEEP_DEPLOYMENT") != "1":
            logs = compose("logs", "--tail", "50", check=False).stdout
            down = make("down", "VOLUMES=1", timeout_s=300)
            assert down.returncode == 0, f"make down failed: {down.stderr}\nlogs:\n{logs}"


def _isr_of(admin: Admin) -> dict[int, tuple[int, list[int]]]:
    (described,) = admin.describe_topics([TOPIC])
    return {p.partition: (p.leader, list(p.isr)) for p in described.partitions}


def _read_all(partitions: int) -> list[bytes]:
    consumer = Consumer(BOOTSTRAP, auto_offset_reset="earliest")
    values: list[bytes] = []
    try:
        consumer.assign([(TOPIC, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < 15:
            result = consumer.poll(timeout_ms=1000)
            got = [record.value for record in result]
            if got:
                values += got
                quiet_since = time.monotonic()
    finally:
        consumer.close()
    return values


def _kafka_round_trip(topic: str) -> None:
    """librdkafka through the published Kafka ports: every record acknowledged by the
    in-sync replicas and read back."""
    from confluent_kafka import Consumer as KafkaConsumer
    from confluent_kafka import Producer as KafkaProducer
    from confluent_kafka import TopicPartition as KafkaPartition

    servers = "127.0.0.1:9092,127.0.0.1:9093,127.0.0.1:9094"
    producer = KafkaProducer({"bootstrap.servers": servers, "acks": "all"})
    failed: list[object] = []
    for i in range(100):
        producer.produce(
            topic, value=b"kafka-%d" % i, on_delivery=lambda e, _m: failed.append(e) if e else None
        )
    assert producer.flush(60) == 0 and not failed, failed[:3]
    consumer = KafkaConsumer({"bootstrap.servers": servers, "group.id": "deploy-check"})
    consumer.assign([KafkaPartition(topic, 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + 60
    while len(values) < 100 and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(100, 1.0) if m.error() is None]
    consumer.close()
    assert sorted(values) == sorted(b"kafka-%d" % i for i in range(100))


def test_compose_cluster_survives_a_killed_leader_and_a_cut_off_node(deployment: float) -> None:
    print(f"make up: healthy after {deployment:.1f} s")
    with Admin(BOOTSTRAP) as admin:
        brokers = {b.node_id: b.state for b in admin.metadata().brokers}
        assert brokers == dict.fromkeys((1, 2, 3), "running"), brokers
        admin.create_topic(TOPIC, 3, 3, {"min_insync_replicas": "2"})
        leaders = _isr_of(admin)
    # Through each node in turn: the ones that are not the controller forward the
    # creation, over the other nodes' inter-broker addresses (the client addresses they
    # advertise are ports published on the host, which a container cannot dial).
    for port in (7700, 7702, 7704):
        with Admin(f"127.0.0.1:{port}") as admin:
            admin.create_topic(f"via-{port}", 1, 3)

            def leader_figures(admin: Admin = admin, port: int = port) -> bool:
                """The leader's log figures and follower progress, asked of the leader
                by this node (unknown, -1, until the new leader has taken its role)."""
                (described,) = admin.describe_topics([f"via-{port}"])
                (partition,) = described.partitions
                return partition.high_watermark >= 0 and len(partition.followers) == 2

            wait_until(leader_figures, 30, f"via-{port}'s leader figures through {port}")
            listed = admin.list_groups()
            assert not listed.unreachable_nodes and not listed.groups, listed
    _kafka_round_trip("via-7702")

    # 100,000 acks=all records while the container of partition 0's leader is killed.
    victim = f"node{leaders[0][0]}"
    futures: list[RecordFuture] = []
    sent = [0]
    raised: list[BaseException] = []
    producer = Producer(
        BOOTSTRAP,
        acks="all",
        request_timeout_ms=5000,
        retries=1000,
        delivery_timeout_ms=300_000,
    )

    def produce() -> None:
        try:
            for i in range(RECORDS):
                futures.append(producer.send(TOPIC, b"%08d" % i, key=b"k%d" % (i % 997)))
                sent[0] = i + 1
                if i % 1000 == 999:
                    time.sleep(0.02)  # spread the writes over the kill and the restart
        except BaseException as exc:
            raised.append(exc)

    sender = threading.Thread(target=produce, daemon=True)
    sender.start()
    try:
        wait_until(lambda: sent[0] >= RECORDS // 4 or raised, 300, "a quarter sent")
        docker("kill", container(victim))
        wait_until(lambda: sent[0] >= RECORDS // 2 or raised, 300, "half sent with a node down")
        docker("start", container(victim))
        sender.join(timeout=600)
        assert not raised, f"send raised {raised[0]!r}"
        producer.flush(timeout_s=300)
    finally:
        producer.close(timeout_s=60)
    failed = [f.exception(0) for f in futures if f.exception(0) is not None]
    assert not failed, f"{len(failed)} acknowledged-or-failed sends failed, e.g. {failed[:3]}"
    acknowledged = {b"%08d" % i for i in range(RECORDS)}
    read = _read_all(3)
    assert len(read) == len(set(read)), "a record was stored twice"
    assert acknowledged - set(read) == set(), "acknowledged records were lost"

    # Node 2 cut off from the compose network for 20 s: the others go on, then it rejoins
    # every ISR.
    network = "headwater_headwater"
    node2 = container("node2")
    docker("network", "disconnect", network, node2)
    cut_at = time.monotonic()
    try:
        with Admin("127.0.0.1:7700,127.0.0.1:7704") as admin:

            def shrunk() -> bool:
                return all(2 not in isr for _, isr in _isr_of(admin).values())

            wait_until(shrunk, 60, "node 2 to leave every ISR while cut off")
        with Producer("127.0.0.1:7700,127.0.0.1:7704", acks="all") as producer:
            for i in range(1000):
                producer.send(TOPIC, b"cut-%04d" % i)

        def alert_pending() -> bool:
            return bool(prometheus('ALERTS{alertname="HeadwaterUnderReplicatedPartitions"}'))

        wait_until(alert_pending, 60, "Prometheus's under-replication alert", interval_s=1)
        # The rest of the cut's length (a fault's duration, not a wait for a condition).
        time.sleep(max(0.0, CUT_OFF_S - (time.monotonic() - cut_at)))
    finally:
        docker("network", "connect", "--alias", "node2", network, node2)
    with Admin(BOOTSTRAP) as admin:
        wait_until(
            lambda: all(sorted(isr) == [1, 2, 3] for _, isr in _isr_of(admin).values()),
            180,
            "node 2 back in every ISR",
        )

    # Prometheus scrapes every node and has the topic's series.
    def targets_up() -> bool:
        up = prometheus('up{job="headwater"}')
        return len(up) == 3 and all(r["value"][1] == "1" for r in up)

    wait_until(targets_up, 120, "Prometheus to see 3 node targets up", interval_s=1)
    wait_until(
        lambda: len(prometheus(f'headwater_partition_high_watermark{{topic="{TOPIC}"}}')) >= 9,
        120,
        "Prometheus to hold the topic's high watermarks from every replica",
        interval_s=1,
    )
