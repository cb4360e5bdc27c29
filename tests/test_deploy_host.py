"""The host-network deployment (deploy/docker-compose.host.yml, ``make up NETWORK=host``)
run for real: three healthy nodes bound on the host's loopback, a replicated topic that
takes acks=all writes and gives them all back, Prometheus scraping every node, and
``make down NETWORK=host VOLUMES=1`` removing containers and data.

Runs after tests/test_deploy.py has taken the default deployment down (the two publish
the same ports). Skipped, saying why, where no Docker Engine runs.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from headwater.client import Admin, Consumer, Producer
from tests.node_process import wait_until
from tests.test_deploy import BOOTSTRAP, PROMETHEUS, _docker_runs, make

RECORDS = 20_000

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(_docker_runs() is not None, reason=f"docker-compose: {_docker_runs()}"),
]


def _targets() -> dict[str, str]:
    with urllib.request.urlopen(f"{PROMETHEUS}/api/v1/targets", timeout=10) as answer:
        body = json.load(answer)
    return {t["labels"]["instance"]: t["health"] for t in body["data"]["activeTargets"]}


def _volumes() -> set[str]:
    listed = subprocess.run(
        ["docker", "volume", "ls", "-q"], capture_output=True, text=True, check=True
    ).stdout
    return {name for name in listed.split() if name.startswith("headwater_host-")}


def test_host_network_deployment_serves_replicated_writes_and_metrics() -> None:
    make("down", "VOLUMES=1", timeout_s=300)
    up = make("up", "NETWORK=host", timeout_s=1800)
    try:
        assert up.returncode == 0, f"make up failed:\n{up.stdout[-3000:]}\n{up.stderr[-3000:]}"
        assert "3 nodes healthy" in up.stdout
        with Admin(BOOTSTRAP) as admin:
            admin.create_topic("hosted", 3, 3, {"min_insync_replicas": "2"})
            wait_until(
                lambda: all(
                    len(p.isr) == 3 for p in admin.describe_topics(["hosted"])[0].partitions
                ),
                60,
                "every partition's ISR holds 3 replicas",
            )
        with Producer(BOOTSTRAP, acks="all") as producer:
            for i in range(RECORDS):
                producer.send("hosted", f"v{i}".encode(), key=str(i).encode())
            producer.flush()
        consumer = Consumer(BOOTSTRAP, auto_offset_reset="earliest")
        seen: set[bytes] = set()
        try:
            consumer.assign([("hosted", p) for p in range(3)])
            consumer.seek_to_beginning()

            def all_read() -> bool:
                seen.update(record.value for record in consumer.poll(timeout_ms=500))
                return len(seen) == RECORDS

            wait_until(all_read, 60, f"all {RECORDS} records read back")
        finally:
            consumer.close()
        wait_until(
            lambda: _targets() == {f"node{i}": "up" for i in (1, 2, 3)},
            60,
            "Prometheus scrapes node1-3 on the host's loopback",
        )
    finally:
        down = make("down", "NETWORK=host", "VOLUMES=1", timeout_s=300)
    assert down.returncode == 0, down.stderr
    assert _volumes() == set(), "make down NETWORK=host VOLUMES=1 left volumes behind"
