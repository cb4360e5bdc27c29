"""A follower that caught up rejoins the ISR, whatever held it out ("stuck ISR").

What was seen after the stream and Raft floods: a partition's ISR stayed at the leader
alone for minutes although both followers had lag 0, refusing acks=all until a later
leader change. Two causes, each reproduced here on real processes in network namespaces
the test makes and removes (``headwater.tools.chaos.netns``), 3 nodes, a topic with replication
factor 3 and ``min_insync_replicas`` 3 (so one follower out of the ISR refuses acks=all):

- **A follower fenced for longer than ``replica_lag_ms_max`` while it kept replicating**
  (the floods starved heartbeats, not replication). A follower reports a partition in its
  fetch session only when its position moves, so once it had caught up and the partition
  was idle, the leader saw no fetch from it; when the follower was unfenced, its "last
  fetch" was older than ``replica_lag_ms_max`` and the leader never proposed it. With
  acks=all refused, nothing was written, nothing was fetched, and nothing changed.
  Scenario: follower F's calls to the controller's inter-broker listener are cut off (not
  its replication from the leader, nor Raft) until it is fenced and dropped from the ISR;
  it catches up, stays idle past ``replica_lag_ms_max``, and is then reconnected.
- **A leader whose metadata image stands still** (its Raft transport cut off, or stalled
  by a flood) while it serves clients, heartbeats and replicates. It applied an ISR
  change only when its own image showed it, and filtered followers by its image's view of
  them (fenced): it never even asked. Scenario: F is paused until the leader X has shrunk
  the ISR without it, X's Raft port is cut off, and F resumes and catches up.

Each ends with acks=all writes to the leader, which must succeed again within a deadline.
The scenarios run in a child process inside the hub namespace (the only one that reaches
the nodes' addresses): ``python -m tests.test_isr_stale_metadata SCENARIO PREFIX ROOT``
prints one JSON document.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from headwater.client import Producer
from headwater.shared.errors import HeadwaterError
from headwater.tools.chaos import netns
from headwater.tools.chaos.cluster import (
    NETNS_INTERNAL_PORT,
    NETNS_RAFT_PORT,
    ChaosCluster,
    wait_for,
)

TOPIC = "isr"
PARTITIONS = 3
SERVING_DEADLINE_S = 60.0
SHRINK_DEADLINE_S = 60.0
RECOVERY_DEADLINE_S = 30.0
REPLICA_LAG_MS_MAX = 10_000  # the default
SCENARIO_TIMEOUT_S = 300.0


def _write(producer: Producer, partition: int, value: bytes) -> str | None:
    """None when the record was acknowledged, else the error's name."""
    try:
        producer.send(TOPIC, value, partition=partition).result(timeout=10)
    except HeadwaterError as exc:
        return exc.code.name
    return None


def _isr(cluster: ChaosCluster, partition: int, via: int) -> set[int] | None:
    metadata = cluster.metadata(TOPIC, via=[via])
    if metadata is None:
        return None
    for topic in metadata.topics:
        for p in topic.partitions:
            if topic.name == TOPIC and p.partition == partition:
                return set(p.isr)
    return None


class Run:
    """The cluster, the roles picked for the scenario, two producers, and what was seen."""

    def __init__(self, cluster: ChaosCluster, topology: netns.Topology) -> None:
        self.cluster = cluster
        self.topology = topology
        self.seen: dict[str, Any] = {"ok": False}
        controller = cluster.controller()
        assert controller is not None
        self.partition, self.leader = next(
            (p, leader)
            for p in range(PARTITIONS)
            if (leader := cluster.leader(TOPIC, p)) not in (None, controller)
        )
        self.controller = controller
        self.follower = next(n for n in cluster.nodes if n not in (self.leader, controller))
        self.seen.update(
            controller=controller,
            leader=self.leader,
            follower=self.follower,
            partition=self.partition,
        )
        self.strict = Producer(
            cluster.bootstrap, acks="all", retries=0, linger_ms=0, delivery_timeout_ms=8_000
        )
        self.loose = Producer(cluster.bootstrap, acks=1, retries=3, linger_ms=0)

    def close(self) -> None:
        self.strict.close()
        self.loose.close()

    def wait_shrunk(self) -> None:
        """Until the leader and the controller both show the ISR without the follower."""
        shrunk = wait_for(
            lambda: all(
                (_isr(self.cluster, self.partition, via) or {self.follower})
                == {self.leader, self.controller}
                for via in (self.leader, self.controller)
            ),
            SHRINK_DEADLINE_S,
            0.25,
        )
        assert shrunk, "the follower never left the ISR"
        self.seen["refused_while_shrunk"] = _write(self.strict, self.partition, b"refused")

    def follower_caught_up(self) -> bool:
        admin = self.cluster.admin(self.follower)
        theirs = admin.describe_replica_log(
            self.cluster.nodes[self.follower].address, TOPIC, self.partition
        )
        ours = admin.describe_replica_log(
            self.cluster.nodes[self.leader].address, TOPIC, self.partition
        )
        return bool(theirs.log_end_offset == ours.log_end_offset > 0)

    def expect_recovery(self) -> None:
        errors: list[str] = []

        def acknowledged() -> bool:
            error = _write(self.strict, self.partition, b"after")
            if error is not None:
                errors.append(error)
            return error is None

        recovered = wait_for(acknowledged, RECOVERY_DEADLINE_S, 0.25)
        self.seen["errors_after"] = sorted(set(errors))
        self.seen["attempts_refused"] = len(errors)
        self.seen["leader_view_of_isr"] = sorted(
            _isr(self.cluster, self.partition, self.leader) or ()
        )
        self.seen["controller_view_of_isr"] = sorted(
            _isr(self.cluster, self.partition, self.controller) or ()
        )
        self.seen["ok"] = bool(recovered)


def follower_fenced_while_fetching(run: Run) -> None:
    assert _write(run.strict, run.partition, b"before") is None, "acks=all failed at the start"
    # Heartbeats to the controller fail; replication from the leader and Raft go on.
    netns.cut_port(run.topology, run.follower, NETNS_INTERNAL_PORT, peer=run.controller)
    run.wait_shrunk()
    assert _write(run.loose, run.partition, b"while fenced") is None
    assert wait_for(run.follower_caught_up, SHRINK_DEADLINE_S), "the follower never caught up"
    # What the scenario needs is time itself: the follower idle past replica_lag_ms_max.
    time.sleep(REPLICA_LAG_MS_MAX / 1000 + 2)
    netns.heal(run.topology)
    run.expect_recovery()


def frozen_leader_image(run: Run) -> None:
    assert _write(run.strict, run.partition, b"before") is None, "acks=all failed at the start"
    run.cluster.pause(run.follower)
    assert _write(run.loose, run.partition, b"while paused") is None
    run.wait_shrunk()
    netns.cut_port(run.topology, run.leader, NETNS_RAFT_PORT)
    run.cluster.resume(run.follower)
    run.expect_recovery()


SCENARIOS: dict[str, Callable[[Run], None]] = {
    "fenced-follower": follower_fenced_while_fetching,
    "frozen-leader-image": frozen_leader_image,
}


def scenario(name: str, topology: netns.Topology, root: Path) -> dict[str, Any]:
    """Run scenario ``name``; the JSON-ready outcome (``ok`` and what was seen)."""
    cluster = ChaosCluster(root, 3, topology)
    seen: dict[str, Any] = {"ok": False}
    try:
        for node_id in cluster.nodes:
            cluster.start(node_id)
        late = cluster.wait_serving(cluster.nodes, SERVING_DEADLINE_S)
        assert not late, f"nodes {late} did not serve within {SERVING_DEADLINE_S} s"
        cluster.admin(1).create_topic(TOPIC, PARTITIONS, 3, {"min_insync_replicas": "3"})
        assert wait_for(lambda: cluster.in_sync(TOPIC), SERVING_DEADLINE_S), "ISR never full"
        run = Run(cluster, topology)
        seen = run.seen
        try:
            SCENARIOS[name](run)
        finally:
            run.close()
    except AssertionError as exc:
        seen["failure"] = str(exc)
    finally:
        seen["stopped"] = cluster.close()
    return seen


def run_scenario(name: str, tmp_path: Path) -> dict[str, Any]:
    reason = netns.unavailable_reason()
    if reason is not None:
        pytest.skip(f"network namespaces unavailable: {reason}")
    topology = netns.Topology(f"hwisr-{os.getpid()}", (1, 2, 3))
    netns.create(topology)
    try:
        done = subprocess.run(
            [
                *topology.exec_prefix(topology.hub),
                sys.executable,
                "-m",
                "tests.test_isr_stale_metadata",
                name,
                topology.prefix,
                str(tmp_path),
            ],
            capture_output=True,
            text=True,
            timeout=SCENARIO_TIMEOUT_S,
            check=False,
            cwd=Path(__file__).resolve().parent.parent,
        )
    finally:
        netns.destroy(topology)
    assert done.stdout.strip(), f"no outcome; stderr:\n{done.stderr[-4000:]}"
    seen: dict[str, Any] = json.loads(done.stdout)
    logs = {p.name: p.read_text(errors="replace")[-3000:] for p in sorted(tmp_path.glob("n*.log"))}
    where = json.dumps(seen, indent=1) + "".join(f"\n--- {n}\n{t}" for n, t in logs.items())
    assert "failure" not in seen, where
    assert seen["refused_while_shrunk"] == "NOT_ENOUGH_REPLICAS", where
    assert seen["ok"], where
    assert seen["controller_view_of_isr"] == [1, 2, 3], where
    return seen


@pytest.mark.slow
@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 60)
def test_a_follower_fenced_while_it_kept_up_rejoins_once_unfenced(tmp_path: Path) -> None:
    run_scenario("fenced-follower", tmp_path)


@pytest.mark.slow
@pytest.mark.timeout(SCENARIO_TIMEOUT_S + 60)
def test_a_leader_with_a_frozen_image_takes_back_a_caught_up_follower(tmp_path: Path) -> None:
    seen = run_scenario("frozen-leader-image", tmp_path)
    # The leader's own image never moved: it took the controller's answer.
    assert seen["leader_view_of_isr"] != [1, 2, 3]


def main() -> int:
    name, prefix, root = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    started = time.monotonic()
    seen = scenario(name, netns.Topology(prefix, (1, 2, 3)), root)
    seen["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(seen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
