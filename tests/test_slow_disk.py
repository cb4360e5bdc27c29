"""One voter with a slow disk (an LD_PRELOAD library that delays its writes and fsyncs,
built by the test): the cluster always has an active controller, the slow voter does not
keep the role, acknowledged writes go on, and nothing acknowledged is lost.

Needs a C compiler (cc) to build the library; skipped otherwise.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.client import Admin, Producer
from headwater.tools.chaos.slow_disk import SlowDisk, SlowDiskUnavailableError, build
from tests.local_cluster import ControllerWatch, LocalCluster
from tests.node_process import wait_until
from tests.test_disk_full import check_read_back, read_batches, send_batch

pytestmark = pytest.mark.slow

PHASE_S = 15.0
NO_CONTROLLER_S_MAX = 3.0
"""Longest the healthy voters may see no active controller (elections take ~0.3-1 s)."""
HANDOVER_S_MAX = 5.0
"""Longest a slow voter that is the controller keeps the role (its next slow write, 0.5 s
here, marks it slow; it hands over at once)."""


def test_a_voter_with_a_slow_disk_never_leaves_the_cluster_without_a_controller(
    tmp_path: Path,
) -> None:
    try:
        library = build(tmp_path / "slow-disk")
    except SlowDiskUnavailableError as exc:
        pytest.skip(str(exc))
    cluster = LocalCluster(tmp_path, 3)
    slow = SlowDisk(library, cluster.nodes[3].data_dir, tmp_path / "slow-disk" / "control")
    cluster.nodes[3].env.update(slow.env())
    cluster.start()
    watch = ControllerWatch(cluster, (1, 2))
    try:
        bootstrap = cluster.bootstrap()
        with Admin(bootstrap) as admin:
            admin.create_topic(
                "s", partitions=3, replication_factor=3, configs={"min_insync_replicas": "2"}
            )
        cluster.wait_controller()
        watch.start()
        acknowledged: list[int] = []
        with Producer(bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=20_000) as producer:
            numbers = itertools.count()  # every batch sent gets its own number
            healthy = phase(producer, acknowledged, numbers, 5.0)
            slow.set(500, 2000)
            slow_since = time.monotonic()
            first = phase(producer, acknowledged, numbers, PHASE_S)
            slow.set(3000, 5000)
            second = phase(producer, acknowledged, numbers, PHASE_S)
            slow.set(0, 0)
            # The slow node's replicas held acks=all back while they were in the ISR (a
            # slow follower that keeps up stays in it, as in Kafka): once its disk is
            # fast again, the rate comes back.
            recovered = wait_until(
                lambda: phase(producer, acknowledged, numbers, 2.0) >= 0.5 * healthy,
                60,
                "the write rate to recover",
            )
        watch.stop.set()
        watch.join()
        assert watch.longest_gap_s < NO_CONTROLLER_S_MAX, (
            f"no controller for {watch.longest_gap_s:.1f} s"
        )
        # Whoever led at the start, the slow voter hands the role over within seconds.
        late = [c for t, c in watch.named if t > slow_since + HANDOVER_S_MAX]
        assert 3 not in late, "the slow voter was the controller"
        # Writes went on through both phases (no phase without a controller, whose lease
        # answers every leader's writes depend on).
        assert first > 0 and second > 0 and recovered, (healthy, first, second)
        wait_until(lambda: cluster.controller_id(cluster.nodes[3]) >= 0, 60, "node 3 caught up")
        check_read_back(read_batches(bootstrap, "s"), acknowledged)
    finally:
        watch.stop.set()
        slow.set(0, 0)
        cluster.close()


def phase(
    producer: Producer, acknowledged: list[int], numbers: Iterator[int], seconds: float
) -> float:
    """Send batches one at a time for ``seconds``; batches a second acknowledged."""
    began = time.monotonic()
    done = 0
    while time.monotonic() - began < seconds:
        n = next(numbers)
        if send_batch(producer, "s", n):
            acknowledged.append(n)
            done += 1
    return done / (time.monotonic() - began)
