"""A node whose peer dies logs no ERROR from its replication streams, nor does any node
during the Quickstart's commands and a consumer group after it.

Followers fetch from their leaders over one Replica.Fetch stream each. A stream-stream
call behind a grpc.aio client interceptor is fed by a request iterator in a task of its
own; a call that ended on a killed peer left that task pending, and asyncio logged
``ERROR asyncio: Task was destroyed but it is pending!`` and ``aclose(): asynchronous
generator is already running`` on the surviving nodes, lines operators page on."""

from __future__ import annotations

from pathlib import Path

from headwater.client import Admin, Producer
from tests.local_cluster import LocalCluster
from tests.node_process import run_cli, wait_until


def test_survivors_of_a_killed_leader_log_no_error(tmp_path: Path) -> None:
    cluster = LocalCluster(tmp_path, 3)
    cluster.start()
    try:
        with Admin(cluster.bootstrap()) as admin:
            admin.create_topic("streams", partitions=6, replication_factor=3)
        with Producer(cluster.bootstrap(), acks="all") as producer:
            for i in range(60):
                producer.send("streams", b"%d" % i, partition=i % 6)
            producer.flush()
        survivors = (1, 2)
        victim = cluster.nodes[3]
        victim.kill()

        def moved() -> bool:
            led = [p.leader for p in cluster.partitions(cluster.nodes[1], "streams")]
            return all(leader in survivors for leader in led)

        wait_until(moved, 30, "leadership off the killed node")
        victim.start()
        wait_until(victim.serving, 30, "the killed node back")
        with Producer(cluster.bootstrap(), acks="all") as producer:
            for i in range(60):
                producer.send("streams", b"%d" % i, partition=i % 6)
            producer.flush()
        # The Quickstart's commands and a group member that reads and leaves, after it.
        b = ["--bootstrap", cluster.bootstrap()]
        assert run_cli("topics", "create", "orders", "--partitions", "3", *b).returncode == 0
        lines = b"acme:order-1\nglobex:order-2\nacme:order-3\n"
        produced = run_cli("produce", "orders", "--key-separator", ":", *b, input_bytes=lines)
        assert produced.returncode == 0, produced.stderr
        read = ["--from-beginning", "--max-messages", "3", "--timeout-ms", "20000", *b]
        for group in ([], ["--group", "billing"]):
            consumed = run_cli("consume", "orders", *read, *group)
            assert sorted(consumed.stdout.splitlines()) == [b"order-1", b"order-2", b"order-3"]
        assert run_cli("topics", "describe", "orders", *b).returncode == 0
        assert run_cli("groups", "describe", "billing", *b).returncode == 0
        for node in cluster.nodes.values():
            log = node.log()
            assert " ERROR " not in log and "Traceback" not in log, log[-4000:]
    finally:
        cluster.close()
