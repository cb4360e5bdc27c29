"""Attacks on a 3-node cluster, each measured by what legitimate users see meanwhile.

- A login flood on a follower: 4 connections from another host (127.0.0.2) try wrong
  passwords for a 65,536-iteration user, each call given up after 10 ms. A user's
  first login on that node succeeds, and acks=all writes whose follower is that node
  keep their quiet p50 latency (within 1.5x).

The earlier attacks (impostor brokers, pickles on the Raft port, replica fetches from
another registration) are in ``test_hardening``; ACLs on every RPC, forwarded calls and
streams after an ACL is removed in ``test_authorization`` and ``test_acls``; single-node
attacks in ``test_security_attacks``. ``make test-security`` runs them all.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from headwater.benchmarks import login_flood
from headwater.client import Admin
from tests.local_cluster import LocalCluster

pytestmark = pytest.mark.slow

DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    cluster = LocalCluster(
        tmp_path_factory.mktemp("security-cluster"),
        3,
        env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"},
    )
    cluster.start()
    try:
        with Admin(cluster.bootstrap()) as admin:
            admin.upsert_user("victim", "victim-secret", iterations=login_flood.VICTIM_ITERATIONS)
        yield cluster
    finally:
        cluster.close()


def test_a_login_flood_on_a_follower_locks_no_one_out_and_leaves_replication_alone(
    cluster: LocalCluster,
) -> None:
    """``headwater bench login-flood``'s round, asserted: see the module docstring."""
    with Admin(cluster.bootstrap()) as admin:
        admin.create_topic("r", partitions=1, replication_factor=3)
    [partition] = cluster.partitions(cluster.nodes[1], "r")
    follower = cluster.nodes[next(r for r in partition.replicas if r != partition.leader)]
    leader = cluster.nodes[partition.leader]
    rounds = []
    # A round's ratio moves by +-40% on a loaded 2-core machine (BENCHMARKS.md): another
    # round only when one is over the bound; the hashing in the default executor this
    # guards against gave 5x.
    for _ in range(3):
        rounds.append(
            login_flood.flood_round(
                leader.address, follower.address, "r", sends=300, connections=4, give_up_ms=10
            )
        )
        if rounds[-1]["ratio"] <= 1.5:
            break
    print(rounds)
    result = min(rounds, key=lambda r: r["ratio"])
    assert f"refused a login from {login_flood.ATTACKER_HOST}" in follower.log()
    assert result["flood_calls"] > 100, result
    assert result["ratio"] <= 1.5, result
    assert result["first_login_ms"] < 5000, result
