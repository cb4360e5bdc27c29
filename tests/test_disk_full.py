"""Real nodes whose data folder fills up (a tmpfs the test mounts): nothing acknowledged is
lost or stored twice, the node neither crashes nor stops the cluster, its folder goes
offline as Kafka's log directories do, and it comes back by itself once there is room.

Root only (the tests mount a file system); skipped elsewhere with the reason.
"""

from __future__ import annotations

import collections
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.client import Admin, Consumer, Producer
from headwater.shared.errors import HeadwaterError
from tests.disk_faults import fill, small_filesystem
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, run_cli, wait_until

pytestmark = pytest.mark.slow

RECORDS_PER_BATCH = 38
DEADLINE_S = 60.0
NODE_ENV = {
    # Back online once 2 MiB are free (the default of 16 MiB is more than these disks).
    "HEADWATER_LOG_DIR_FREE_BYTES_MIN": str(2 << 20),
    "HEADWATER_SEGMENT_BYTES": str(1 << 20),
}


def batch_values(n: int) -> list[bytes]:
    return [f"v{n}-{i}".encode().ljust(100, b".") for i in range(RECORDS_PER_BATCH)]


def send_batch(producer: Producer, topic: str, n: int) -> bool:
    """Send one batch and wait for it: True when every record was acknowledged."""
    futures = [producer.send(topic, value=v) for v in batch_values(n)]
    with contextlib.suppress(HeadwaterError):
        producer.flush(timeout_s=10)
    try:
        for future in futures:
            future.result(1)
    except Exception:
        return False
    return True


class Stored(collections.Counter[str]):
    """How many records of each batch (by its number) a topic holds, and where the
    first record of each copy is (partition, offset)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)


def read_batches(bootstrap: str, topic: str) -> Stored:
    seen = Stored()
    with Consumer(bootstrap, auto_offset_reset="earliest") as consumer:
        consumer.assign(topic)
        idle = 0
        while idle < 3:
            records = consumer.poll(timeout_ms=1000)
            idle = idle + 1 if not records else 0
            for record in records:
                batch, _, index = bytes(record.value).partition(b"-")
                seen[batch.decode()] += 1
                if index.startswith(b"0."):
                    seen.where[batch.decode()].append((record.partition, record.offset))
    return seen


def check_read_back(seen: Stored, acknowledged: list[int]) -> None:
    lost = [n for n in acknowledged if seen[f"v{n}"] == 0]
    twice = [
        (batch, seen.where[batch]) for batch, count in seen.items() if count > RECORDS_PER_BATCH
    ]
    torn = [batch for batch, count in seen.items() if count % RECORDS_PER_BATCH]
    assert not lost, f"{len(lost)} acknowledged batches lost: {lost[:10]}"
    assert not twice, f"batches stored twice (partition, offset): {twice[:10]}"
    assert not torn, f"batches stored in part: {torn[:10]}"


@contextlib.contextmanager
def cluster_with_node3_on(tmp_path: Path, size_bytes: int) -> Iterator[tuple[LocalCluster, Path]]:
    """A started 3-node cluster whose node 3 keeps its data on a tmpfs of ``size_bytes``
    (yielded with the cluster); the caller closes the cluster."""
    with small_filesystem(tmp_path / "fs3", size_bytes) as fs3:

        def layout(root: Path, node_id: int) -> tuple[Path, Path]:
            data = fs3 / "data" if node_id == 3 else root / f"n{node_id}" / "data"
            return data, root / f"n{node_id}.log"

        cluster = LocalCluster(tmp_path, 3, env=NODE_ENV, layout=layout)
        cluster.start()
        yield cluster, fs3


@pytest.fixture
def full_disk_node(tmp_path: Path) -> Iterator[tuple[NodeProcess, Path]]:
    with small_filesystem(tmp_path / "fs", 48 << 20) as fs:
        node = NodeProcess(fs / "data", env=NODE_ENV, log_path=tmp_path / "node.log")
        node.start()
        try:
            yield node, fs
        finally:
            node.kill()


def test_a_full_disk_loses_nothing_and_the_node_comes_back_by_itself(
    full_disk_node: tuple[NodeProcess, Path],
) -> None:
    node, fs = full_disk_node
    with Admin(node.address) as admin:
        admin.create_topic("d", partitions=1)
    acknowledged: list[int] = []
    failures = 0
    with Producer(node.address, acks="all", linger_ms=0, delivery_timeout_ms=4000) as producer:
        acknowledged += [n for n in range(300) if send_batch(producer, "d", n)]
        fill(fs / "ballast")
        for n in range(300, 2000):
            if send_batch(producer, "d", n):
                acknowledged.append(n)
                failures = 0
            else:
                failures += 1
                if failures >= 5:
                    break
    assert failures >= 5, "the disk never filled"
    # The folder is offline, and the node says so; a metadata write on the full disk
    # (its Raft journal is in the same folder) is refused, not a crash.
    wait_until(lambda: not node.serving(), DEADLINE_S, "health NOT_SERVING")
    with Admin(node.address, request_timeout_s=5) as admin, pytest.raises(HeadwaterError):
        admin.create_topic("while-full", partitions=1)
    assert node.running
    errors = [line for line in node.log().splitlines() if " ERROR " in line and "offline" in line]
    assert len(errors) == 1, errors
    assert str(fs / "data") in errors[0] and "No space left on device" in errors[0]
    assert "Traceback" not in node.log()
    (fs / "ballast").unlink()
    wait_until(node.serving, DEADLINE_S, "the node to come back online by itself")
    with Producer(node.address, acks="all", linger_ms=0) as producer:
        after = list(range(5000, 5010))
        assert all(send_batch(producer, "d", n) for n in after)
        acknowledged += after
    check_read_back(read_batches(node.address, "d"), acknowledged)
    # Full again, then a clean shutdown on the full disk: every log closed, exit 0.
    fill(fs / "ballast")
    with Producer(node.address, acks="all", linger_ms=0, delivery_timeout_ms=4000) as producer:
        for n in range(6000, 6100):
            if not send_batch(producer, "d", n):
                break
            acknowledged.append(n)
    assert node.stop() == 0, node.log()[-4000:]
    (fs / "ballast").unlink()
    node.start()
    check_read_back(read_batches(node.address, "d"), acknowledged)
    assert "set aside" not in node.log()


def test_blocks_the_logs_gave_back_do_not_bring_a_full_folder_back(
    full_disk_node: tuple[NodeProcess, Path],
) -> None:
    """Each active segment holds blocks reserved past its end, given back when its log
    closes: a folder that went offline must not count them as room (coming back on them
    would fill the disk again at once, so the folder would flap)."""
    node, fs = full_disk_node
    with Admin(node.address) as admin:
        admin.create_topic("d", partitions=4)
    with Producer(node.address, acks="all", linger_ms=0, delivery_timeout_ms=4000) as producer:
        for partition in range(4):  # each partition's segment takes its reserve
            producer.send("d", value=b"v" * 100, partition=partition).result(10)
        fill(fs / "ballast")
        failures = 0
        for n in range(5000):
            futures = [producer.send("d", value=v, partition=0) for v in batch_values(n)]
            with contextlib.suppress(HeadwaterError):
                producer.flush(timeout_s=10)
            if not all(f.done() and f.exception(0) is None for f in futures):
                failures += 1
                if failures >= 3:
                    break
    assert failures >= 3, "the disk never filled"
    wait_until(lambda: not node.serving(), DEADLINE_S, "health NOT_SERVING")
    # Several probes of the offline folder go by: it stays offline.
    quiet_until = time.monotonic() + 5.0
    while time.monotonic() < quiet_until:
        assert not node.serving(), node.log()[-3000:]
        time.sleep(0.25)
    assert "online again" not in node.log()
    (fs / "ballast").unlink()
    wait_until(node.serving, DEADLINE_S, "the node to come back online by itself")


def test_one_full_disk_of_three_moves_leadership_and_writes_go_on(tmp_path: Path) -> None:
    """Node 3's folder fills: its leaderships move to in-sync replicas within the session
    timeout, it leaves the ISRs and takes no new replica, the producer's keyless records
    go on at the healthy rate; freed, node 3 catches up and rejoins the ISRs."""
    with cluster_with_node3_on(tmp_path, 40 << 20) as (cluster, fs3):
        try:
            run_three_node_scenario(cluster, fs3)
        finally:
            cluster.close()


def run_three_node_scenario(cluster: LocalCluster, fs3: Path) -> None:
    bootstrap = cluster.bootstrap()
    with Admin(bootstrap) as admin:
        admin.create_topic(
            "r", partitions=3, replication_factor=3, configs={"min_insync_replicas": "2"}
        )
    led_by_3 = [p.partition for p in cluster.partitions(cluster.nodes[1], "r") if p.leader == 3]
    acknowledged: list[int] = []
    with Producer(bootstrap, acks="all", linger_ms=0, delivery_timeout_ms=10_000) as producer:
        acknowledged += [n for n in range(100) if send_batch(producer, "r", n)]
        # Each phase numbers its batches from its own range: a phase sends ~1,000.
        healthy = rate(producer, acknowledged, 100_000, 3.0)
        fill(fs3 / "ballast")
        began = time.monotonic()

        def moved() -> bool:
            brokers = cluster.broker_states(cluster.nodes[1])
            parts = cluster.partitions(cluster.nodes[1], "r")
            return brokers[3] == "log_dir_offline" and all(
                p.leader != 3 and 3 not in p.isr for p in parts
            )

        n = 200_000
        while not moved():
            assert time.monotonic() - began < DEADLINE_S, "leadership never left node 3"
            if send_batch(producer, "r", n):
                acknowledged.append(n)
            n += 1
        moved_s = time.monotonic() - began
        session_s = 6.0  # broker_session_timeout_ms's default, with room for a loaded machine
        assert moved_s < session_s + 3, f"leadership moved after {moved_s:.1f} s"
        after = rate(producer, acknowledged, 300_000, 3.0)
        # Two nodes now lead what three led, on two cores shared with the client: 0.90-0.92
        # of the healthy rate on an idle machine, 0.75 seen under CI. A producer waiting on
        # the offline node in any way (a timeout, a retry, a refused ISR) falls far below.
        assert after >= 0.6 * healthy, f"{after:.0f} batches/s against {healthy:.0f} healthy"
        status = run_cli("cluster", "status", "--json", "--bootstrap", bootstrap)
        brokers = {b["id"]: b for b in json.loads(status.stdout)["brokers"]}
        assert brokers[3]["state"] == "log_dir_offline"
        assert "No space left on device" in brokers[3]["log_dir_problem"]
        with Admin(bootstrap) as admin:
            admin.create_topic("placed", partitions=4, replication_factor=2)
        placed = cluster.partitions(cluster.nodes[1], "placed")
        assert all(3 not in p.replicas for p in placed), "a replica was placed on node 3"
        assert cluster.nodes[3].running
        (fs3 / "ballast").unlink()
        wait_until(
            lambda: all(set(p.isr) == {1, 2, 3} for p in cluster.partitions(cluster.nodes[1], "r")),
            DEADLINE_S,
            "node 3 back in every ISR",
        )
        assert cluster.broker_states(cluster.nodes[1])[3] == "running"
        after = list(range(400_000, 400_010))
        assert all(send_batch(producer, "r", m) for m in after)
        acknowledged += after
    assert led_by_3 is not None
    check_read_back(read_batches(bootstrap, "r"), acknowledged)


def rate(producer: Producer, acknowledged: list[int], first: int, seconds: float) -> float:
    """Batches a second sent one at a time (acknowledged ones counted): the best of three
    windows of ``seconds / 3``, so that one pause of a loaded machine (a garbage
    collection, a metadata refresh) does not decide the figure."""
    n = first
    best = 0.0
    for _ in range(3):
        began = time.monotonic()
        done = 0
        while time.monotonic() - began < seconds / 3:
            if send_batch(producer, "r", n):
                acknowledged.append(n)
                done += 1
            n += 1
        best = max(best, done / (time.monotonic() - began))
    return best


def test_a_full_metadata_disk_takes_a_voter_out_of_elections_not_down(tmp_path: Path) -> None:
    """Node 3's folder (its Raft journal included) fills while metadata keeps changing:
    no SIGBUS; once its journal cannot be written it leaves the controller role (if it
    had it) and votes no more, while the two others go on; freed, its journal is written
    whole again and its image catches up."""
    with cluster_with_node3_on(tmp_path, 24 << 20) as (cluster, fs3):
        try:
            cluster.wait_controller()
            fill(fs3 / "ballast")
            node3 = cluster.nodes[3]
            journal_failed = "the metadata journal"
            n = 0
            # Big metadata batches (a topic of 1,000 partitions each) use up the journal's
            # reserved blocks within a few topics.
            while journal_failed not in node3.log():
                assert n < 60, "node 3's journal never failed"
                with Admin(cluster.nodes[1].address) as admin:
                    admin.create_topic(f"m{n}", partitions=1000, replication_factor=1)
                n += 1
            assert node3.running
            controller = cluster.wait_controller(excluding=(3,))
            with Admin(cluster.nodes[1].address) as admin:
                admin.create_topic("after", partitions=1)
            assert controller in (1, 2)
            (fs3 / "ballast").unlink()
            wait_until(
                lambda: "is writable again" in node3.log(), DEADLINE_S, "node 3's journal back"
            )

            def caught_up() -> bool:
                mine = cluster.metadata(node3).metadata_offset
                return bool(mine >= cluster.metadata(cluster.nodes[1]).metadata_offset)

            wait_until(caught_up, DEADLINE_S, "node 3's image to catch up")
            assert "after" in {t.name for t in cluster.metadata(node3).topics}
            assert "Traceback" not in node3.log()
            # Its journal, written whole again, replays cleanly after a SIGKILL.
            node3.kill()
            node3.start()
            wait_until(caught_up, DEADLINE_S, "node 3's image after its restart")
            assert "is damaged" not in node3.log()
        finally:
            cluster.close()
