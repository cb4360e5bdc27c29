"""Consumer groups across real processes: members share partitions and groups each see
everything; a SIGKILLed member's partitions move within its session with nothing skipped
and only records after its last commit delivered again; a member resumed from SIGSTOP
past its session cannot commit; the group survives a restart of its node and (slow) the
SIGKILL of its coordinator's node; bad requests get their error codes; the CLI."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest

from headwater.client import Admin, Consumer, GroupDescription, Producer
from headwater.client.aio import AsyncConsumer
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.local_cluster import LocalCluster
from tests.node_process import NodeProcess, run_cli, wait_until

ROOT = Path(__file__).resolve().parent.parent
DEADLINE_S = 60
GROUP_ENV = {"HEADWATER_OFFSETS_TOPIC_PARTITIONS": "4"}


@pytest.fixture
def group_node(tmp_path: Path) -> Iterator[NodeProcess]:
    process = NodeProcess(tmp_path / "data", env=GROUP_ENV)
    process.start()
    try:
        yield process
    finally:
        process.kill()


def groups_stub(address: str) -> tuple[grpc.Channel, pb_grpc.GroupsStub]:
    channel = grpc.insecure_channel(address)
    return channel, pb_grpc.GroupsStub(channel)


def call_error(call: object) -> ErrorCode:
    try:
        call()  # type: ignore[operator]
    except grpc.RpcError as exc:
        return from_rpc_error(exc, "node").code
    raise AssertionError("the call succeeded")


# ---------------------------------------------------------------------- member processes


@dataclass
class MemberLog:
    records: list[tuple[int, int, str]] = field(default_factory=list)
    commits: dict[int, int] = field(default_factory=dict)
    lines: list[str] = field(default_factory=list)


def read_member_log(path: Path) -> MemberLog:
    log = MemberLog()
    for line in path.read_text().splitlines():
        log.lines.append(line)
        parts = line.split()
        if parts[0] == "R" and len(parts) == 4:
            log.records.append((int(parts[1]), int(parts[2]), parts[3]))
        elif parts[0] == "C" and len(parts) == 3:
            log.commits[int(parts[1])] = int(parts[2])
    return log


def start_member(
    bootstrap: str, topic: str, group: str, out: Path, session_ms: int
) -> subprocess.Popen[bytes]:
    with open(out.with_suffix(".err"), "wb") as errors:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.group_member",
                bootstrap,
                topic,
                group,
                str(out),
                str(session_ms),
            ],
            cwd=ROOT,
            stderr=errors,
        )


def stop_members(members: list[subprocess.Popen[bytes]]) -> None:
    for member in members:
        if member.poll() is None:
            member.send_signal(signal.SIGCONT)
            member.terminate()
    for member in members:
        try:
            member.wait(15)
        except subprocess.TimeoutExpired:
            member.kill()
            member.wait()


def described(admin: Admin, group: str) -> GroupDescription | None:
    try:
        return admin.describe_group(group)
    except HeadwaterError as error:
        if error.code is ErrorCode.GROUP_ID_NOT_FOUND:
            return None
        raise


def assigned_counts(description: GroupDescription | None) -> list[int]:
    if description is None:
        return []
    return sorted(sum(len(t.partitions) for t in m.assigned) for m in description.members)


class AckedProducer:
    """Produces numbered records (acks=all) in a thread; remembers the acknowledged ones."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.acked: set[str] = set()
        self._stop = threading.Event()
        self._producer = Producer(bootstrap, acks="all", linger_ms=2)
        self._topic = topic
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            futures = []
            for _ in range(50):
                n += 1
                value = f"v{n}".encode()
                futures.append((value, self._producer.send(self._topic, value, key=value)))
            for value, future in futures:
                try:
                    future.result(timeout=30)
                    self.acked.add(value.decode())
                except HeadwaterError:
                    pass
            self._stop.wait(0.05)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(60)
        self._producer.close()


def check_delivery(acked: set[str], logs: dict[str, MemberLog], victim: str | None) -> None:
    """Every acknowledged record was consumed; a record consumed twice was first consumed
    by the victim at or after its last commit of that partition."""
    seen: dict[tuple[int, int], list[str]] = {}
    values: set[str] = set()
    for name, log in logs.items():
        for partition, offset, value in log.records:
            seen.setdefault((partition, offset), []).append(name)
            values.add(value)
    missing = acked - values
    assert not missing, (
        f"{len(missing)} acknowledged records never consumed, e.g. {sorted(missing)[:5]}"
    )
    for (partition, offset), readers in seen.items():
        if len(readers) == 1:
            continue
        assert victim is not None and victim in readers and len(readers) == 2, (
            f"{partition}:{offset} consumed by {readers}"
        )
        committed = logs[victim].commits.get(partition, 0)
        assert offset >= committed, (
            f"{partition}:{offset} delivered again though the victim committed {committed}"
        )


# ---------------------------------------------------------------------- in-process members


def test_two_groups_each_see_every_record_and_a_group_of_three_settles_two_each(
    group_node: NodeProcess,
) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("shared", partitions=6)
    members = [Consumer(bootstrap, auto_offset_reset="earliest") for _ in range(4)]
    got: dict[int, list[bytes]] = {i: [] for i in range(4)}
    stop = threading.Event()

    def run(index: int, group: str) -> None:
        consumer = members[index]
        consumer.subscribe("shared", group_id=group)
        while not stop.is_set():
            got[index] += [r.value for r in consumer.poll(timeout_ms=100) if r.value is not None]
        consumer.close()

    threads = [
        threading.Thread(target=run, args=(i, "wide" if i < 3 else "single"), daemon=True)
        for i in range(4)
    ]
    for thread in threads:
        thread.start()
    try:
        with Admin(bootstrap) as admin:
            wait_until(
                lambda: (
                    assigned_counts(described(admin, "wide")) == [2, 2, 2]
                    and described(admin, "wide").state == "stable"
                ),  # type: ignore[union-attr]
                DEADLINE_S,
                "group 'wide' settles 2-2-2",
            )
            with Producer(bootstrap, acks="all") as producer:
                for n in range(3000):
                    producer.send("shared", f"r{n}".encode(), key=str(n).encode())
                producer.flush()
            wait_until(
                lambda: sum(len(got[i]) for i in range(3)) >= 3000 and len(got[3]) >= 3000,
                DEADLINE_S,
                "both groups read everything",
            )
    finally:
        stop.set()
        for thread in threads:
            thread.join(30)
    wide = [v for i in range(3) for v in got[i]]
    assert sorted(wide) == sorted(got[3]) and len(set(wide)) == 3000
    assert all(got[i] for i in range(3))
    with Admin(bootstrap) as admin:
        # Each closed member committed what it was handed and left.
        lags = admin.group_lag(admin.describe_group("single"))
        assert [row.lag for row in lags] == [0] * 6
        assert admin.describe_group("wide").state == "empty"


def test_sigkilled_member_partitions_move_within_the_session(
    group_node: NodeProcess, tmp_path: Path
) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("moves", partitions=6)
    outs = {name: tmp_path / f"{name}.log" for name in ("a", "b", "c")}
    members = {
        name: start_member(bootstrap, "moves", "movers", out, session_ms=4000)
        for name, out in outs.items()
    }
    producer: AckedProducer | None = None
    try:
        with Admin(bootstrap) as admin:
            wait_until(
                lambda: assigned_counts(described(admin, "movers")) == [2, 2, 2],
                DEADLINE_S,
                "three members settle 2-2-2",
            )
            producer = AckedProducer(bootstrap, "moves")
            wait_until(
                lambda: all(read_member_log(o).commits for o in outs.values()),
                DEADLINE_S,
                "every member commits",
            )
            members["a"].kill()
            members["a"].wait()
            wait_until(
                lambda: assigned_counts(described(admin, "movers")) == [3, 3],
                4 + DEADLINE_S / 2,
                "a's partitions move to b and c",
            )
            producer.stop()
            acked = producer.acked
            wait_until(
                lambda: (
                    acked <= {v for o in outs.values() for _, _, v in read_member_log(o).records}
                ),
                DEADLINE_S,
                "everything acknowledged is consumed",
            )
    finally:
        if producer is not None:
            producer.stop()
        stop_members(list(members.values()))
    check_delivery(acked, {n: read_member_log(o) for n, o in outs.items()}, victim="a")


def test_member_resumed_past_its_session_cannot_commit(
    group_node: NodeProcess, tmp_path: Path
) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("paused", partitions=2)
    outs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    members = {n: start_member(bootstrap, "paused", "pausers", o, 2000) for n, o in outs.items()}
    try:
        with Admin(bootstrap) as admin:
            wait_until(
                lambda: assigned_counts(described(admin, "pausers")) == [1, 1],
                DEADLINE_S,
                "two members settle 1-1",
            )
            before = described(admin, "pausers")
            assert before is not None
            members["a"].send_signal(signal.SIGSTOP)
            stopped_size = outs["a"].stat().st_size
            wait_until(
                lambda: assigned_counts(described(admin, "pausers")) == [2],
                DEADLINE_S,
                "the paused member is removed and b takes both",
            )
            after = described(admin, "pausers")
            assert after is not None
            assert (
                len({m.member_id for m in before.members} - {m.member_id for m in after.members})
                == 1
            )
            with Producer(bootstrap, acks="all") as producer:
                for n in range(200):
                    producer.send("paused", f"p{n}".encode(), partition=n % 2)
            members["a"].send_signal(signal.SIGCONT)
            wait_until(
                lambda: any(
                    line.startswith(("L", "F commit"))
                    for line in outs["a"].read_bytes()[stopped_size:].decode().splitlines()
                ),
                DEADLINE_S,
                "the resumed member learns it is out of the group",
            )
    finally:
        stop_members(list(members.values()))
    # After it was resumed, the old member stored no offset: the coordinator refused its
    # commits, and it commits again only partitions a new membership assigned it.
    assigned_again: set[int] = set()
    for line in outs["a"].read_bytes()[stopped_size:].decode().splitlines():
        kind, _, rest = line.partition(" ")
        if kind == "F" and rest.startswith("commit"):
            assert rest.split()[1] in (
                "UNKNOWN_MEMBER_ID",
                "FENCED_MEMBER_EPOCH",
                "STALE_MEMBER_EPOCH",
            )
        elif kind == "A":
            assigned_again |= {int(p) for p in rest.split(",") if p}
        elif kind == "C":
            assert int(rest.split()[0]) in assigned_again, f"a committed {rest} after resuming"


def test_group_state_survives_a_restart_of_its_node(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "data", env=GROUP_ENV)
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.create_topic("kept", partitions=3)
            admin.alter_group_offsets(
                "keepers", {TopicPartition("kept", p): 7 + p for p in range(3)}
            )
        node.kill()
        node.start()
        with Admin(node.address) as admin:
            offsets = admin.group_offsets("keepers")
        assert offsets == {TopicPartition("kept", p): 7 + p for p in range(3)}
    finally:
        node.kill()


# ---------------------------------------------------------------------- bad input


def test_bad_group_requests_get_their_error_codes(group_node: NodeProcess) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("strict", partitions=2)
    channel, stub = groups_stub(bootstrap)
    with channel:
        joined = stub.ConsumerGroupHeartbeat(
            pb.ConsumerGroupHeartbeatRequest(group_id="strict", subscribed_topics=["strict"])
        )
        second = stub.ConsumerGroupHeartbeat(
            pb.ConsumerGroupHeartbeatRequest(group_id="strict", subscribed_topics=["strict"])
        )
        for _ in range(3):
            joined = stub.ConsumerGroupHeartbeat(
                pb.ConsumerGroupHeartbeatRequest(
                    group_id="strict",
                    member_id=joined.member_id,
                    member_epoch=joined.member_epoch,
                    subscribed_topics=["strict"],
                    owned=joined.assignment,
                )
            )
        (mine,) = [p for t in joined.assignment for p in t.partitions]
        before = stub.OffsetFetch(pb.OffsetFetchRequest(group_id="strict"))

        def commit(member_id: str, epoch: int, partition: int) -> pb.OffsetCommitResponse:
            response: pb.OffsetCommitResponse = stub.OffsetCommit(
                pb.OffsetCommitRequest(
                    group_id="strict",
                    member_id=member_id,
                    member_epoch=epoch,
                    offsets=[
                        pb.OffsetCommitPartition(topic="strict", partition=partition, offset=1)
                    ],
                )
            )
            return response

        not_mine = commit(joined.member_id, joined.member_epoch, 1 - mine)
        assert not_mine.results[0].error_code == pb.PARTITION_NOT_ASSIGNED
        cases = [
            (lambda: commit("ghost", 1, mine), ErrorCode.UNKNOWN_MEMBER_ID),
            (
                lambda: commit(joined.member_id, joined.member_epoch + 9, mine),
                ErrorCode.FENCED_MEMBER_EPOCH,
            ),
            (lambda: commit("", -1, mine), ErrorCode.NON_EMPTY_GROUP),
            (
                lambda: stub.DescribeGroup(pb.DescribeGroupRequest(group_id="never-made")),
                ErrorCode.GROUP_ID_NOT_FOUND,
            ),
            (
                lambda: stub.DescribeGroup(pb.DescribeGroupRequest(group_id="")),
                ErrorCode.INVALID_GROUP_ID,
            ),
            (
                lambda: stub.FindCoordinator(pb.FindCoordinatorRequest(group_id="g" * 256)),
                ErrorCode.INVALID_GROUP_ID,
            ),
            (
                lambda: stub.ConsumerGroupHeartbeat(
                    pb.ConsumerGroupHeartbeatRequest(group_id="strict")
                ),
                ErrorCode.INVALID_REQUEST,
            ),
            (
                lambda: stub.ConsumerGroupHeartbeat(
                    pb.ConsumerGroupHeartbeatRequest(
                        group_id="strict",
                        subscribed_topics=["strict"],
                        owned=[pb.TopicPartitions(topic="strict", partitions=[-1])],
                    )
                ),
                ErrorCode.INVALID_REQUEST,
            ),
            (
                lambda: stub.ConsumerGroupHeartbeat(
                    pb.ConsumerGroupHeartbeatRequest(
                        group_id="strict",
                        subscribed_topics=["strict"],
                        owned=[pb.TopicPartitions(topic="t", partitions=range(100_001))],
                    )
                ),
                ErrorCode.INVALID_REQUEST,
            ),
            (
                lambda: stub.DeleteGroup(pb.DeleteGroupRequest(group_id="strict")),
                ErrorCode.NON_EMPTY_GROUP,
            ),
            (
                lambda: stub.OffsetCommit(pb.OffsetCommitRequest(group_id="strict")),
                ErrorCode.INVALID_REQUEST,
            ),
        ]
        for call, code in cases:
            assert call_error(call) is code
        assert stub.OffsetFetch(pb.OffsetFetchRequest(group_id="strict")) == before
        described_now = stub.DescribeGroup(pb.DescribeGroupRequest(group_id="strict"))
        assert described_now.state in ("stable", "reconciling") and len(described_now.members) == 2
        del second
    with grpc.insecure_channel(bootstrap) as channel:
        broker = pb_grpc.BrokerStub(channel)
        refused = call_error(
            lambda: broker.Produce(
                pb.ProduceRequest(
                    topic="__consumer_offsets",
                    partition=0,
                    records=pb.RecordList(records=[pb.Record(value=b"{}")]),
                )
            )
        )
        assert refused is ErrorCode.INVALID_TOPIC_EXCEPTION
    result = run_cli("topics", "delete", "__consumer_offsets", "--bootstrap", bootstrap)
    assert result.returncode != 0 and b"internal topic" in result.stderr


def test_groups_cli_list_describe_reset_and_delete(group_node: NodeProcess) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("clitopic", partitions=2)
    with Producer(bootstrap, acks="all") as producer:
        for n in range(10):
            producer.send("clitopic", f"c{n}".encode(), partition=n % 2)
    consumed = run_cli(
        "consume",
        "clitopic",
        "--group",
        "cli",
        "--from-beginning",
        "--max-messages",
        "6",
        "--timeout-ms",
        "20000",
        "--bootstrap",
        bootstrap,
    )
    assert consumed.returncode == 0, consumed.stderr
    assert len(consumed.stdout.splitlines()) == 6
    listed = run_cli("groups", "list", "--json", "--bootstrap", bootstrap)
    assert [g["group_id"] for g in json.loads(listed.stdout)["groups"]] == ["cli"]
    described_cli = json.loads(
        run_cli("groups", "describe", "cli", "--json", "--bootstrap", bootstrap).stdout
    )
    assert described_cli["state"] == "empty"
    assert described_cli["total_lag"] == 4  # exactly what was printed was committed
    # The rest of the records, once more, from where the group stopped.
    rest = run_cli(
        "consume",
        "clitopic",
        "--group",
        "cli",
        "--max-messages",
        "4",
        "--timeout-ms",
        "20000",
        "--bootstrap",
        bootstrap,
    )
    assert sorted(consumed.stdout.splitlines() + rest.stdout.splitlines()) == sorted(
        f"c{n}".encode() for n in range(10)
    )
    dry = run_cli(
        "groups",
        "reset-offsets",
        "cli",
        "--topic",
        "clitopic",
        "--to-earliest",
        "--json",
        "--bootstrap",
        bootstrap,
    )
    plan = json.loads(dry.stdout)
    assert plan["executed"] is False and [p["new"] for p in plan["partitions"]] == [0, 0]
    assert [p["current"] for p in plan["partitions"]] == [5, 5]
    for args, expected in (
        (("--to-earliest",), [0, 0]),
        (("--shift-by", "3"), [3, 3]),
        (("--to-offset", "99"), [5, 5]),  # clamped to the log end
        (("--to-latest",), [5, 5]),
        (("--to-datetime", "2000-01-01T00:00:00Z"), [0, 0]),
    ):
        done = run_cli(
            "groups",
            "reset-offsets",
            "cli",
            "--topic",
            "clitopic",
            *args,
            "--execute",
            "--bootstrap",
            bootstrap,
        )
        assert done.returncode == 0, done.stderr
        if args[0] == "--to-offset":  # kafka-consumer-groups warns of the clamp too
            assert done.stderr.decode().splitlines()[0] == (
                "warning: clitopic-0: offset 99 is past the log end; it is set to 5"
            )
        with Admin(bootstrap) as admin:
            assert [
                admin.group_offsets("cli")[TopicPartition("clitopic", p)] for p in (0, 1)
            ] == expected
    assert run_cli("groups", "delete", "cli", "--bootstrap", bootstrap).returncode == 0
    gone = run_cli("groups", "describe", "cli", "--bootstrap", bootstrap)
    assert gone.returncode != 0 and b"does not exist" in gone.stderr


def test_reset_of_an_active_group_is_refused(group_node: NodeProcess) -> None:
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("busy", partitions=1)
    with Consumer(bootstrap) as consumer:
        consumer.subscribe("busy", group_id="busy")
        wait_until(
            lambda: consumer.poll(timeout_ms=50) is not None and consumer.assignment(),
            DEADLINE_S,
            "assigned",
        )
        result = run_cli(
            "groups",
            "reset-offsets",
            "busy",
            "--topic",
            "busy",
            "--to-earliest",
            "--execute",
            "--bootstrap",
            bootstrap,
        )
        assert result.returncode != 0 and b"member" in result.stderr
        deleted = run_cli("groups", "delete", "busy", "--bootstrap", bootstrap)
        assert deleted.returncode != 0 and b"member" in deleted.stderr


# ---------------------------------------------------------------------- coordinator failover


@pytest.mark.slow
def test_group_goes_on_when_the_coordinators_node_is_killed(tmp_path: Path) -> None:
    cluster = LocalCluster(
        tmp_path,
        3,
        env={
            **GROUP_ENV,
            "HEADWATER_DEFAULT_REPLICATION_FACTOR": "3",
            "HEADWATER_MIN_INSYNC_REPLICAS": "2",
        },
    )
    cluster.start()
    outs = {name: tmp_path / f"{name}.log" for name in ("a", "b")}
    members: dict[str, subprocess.Popen[bytes]] = {}
    producer: AckedProducer | None = None
    try:
        cluster.wait_settled()
        bootstrap = cluster.bootstrap()
        with Admin(bootstrap) as admin:
            admin.create_topic("failover", partitions=4, replication_factor=3)
        members = {
            n: start_member(bootstrap, "failover", "survivors", o, 6000) for n, o in outs.items()
        }
        with Admin(bootstrap) as admin:
            wait_until(
                lambda: assigned_counts(described(admin, "survivors")) == [2, 2],
                DEADLINE_S,
                "two members settle 2-2",
            )
        producer = AckedProducer(bootstrap, "failover")
        wait_until(
            lambda: all(read_member_log(o).commits for o in outs.values()), DEADLINE_S, "commits"
        )
        channel, stub = groups_stub(cluster.alive()[0].address)
        with channel:
            coordinator = stub.FindCoordinator(pb.FindCoordinatorRequest(group_id="survivors"))
        cluster.nodes[coordinator.node_id].kill()
        survivors = list(cluster.alive())
        commits_at_kill = {n: dict(read_member_log(o).commits) for n, o in outs.items()}
        wait_until(
            lambda: any(read_member_log(o).commits != commits_at_kill[n] for n, o in outs.items()),
            DEADLINE_S,
            "the members commit through the new coordinator",
        )
        producer.stop()
        acked = producer.acked
        wait_until(
            lambda: acked <= {v for o in outs.values() for _, _, v in read_member_log(o).records},
            DEADLINE_S,
            "everything acknowledged is consumed",
        )
        with Admin(cluster.bootstrap(survivors)) as admin:
            after = admin.describe_group("survivors")
            assert after.coordinator_id != coordinator.node_id
            assert len(after.members) == 2
    finally:
        if producer is not None:
            producer.stop()
        stop_members(list(members.values()))
        cluster.close()
    check_delivery(acked, {n: read_member_log(o) for n, o in outs.items()}, victim=None)


def test_async_commits_keep_their_order_and_share_requests(group_node: NodeProcess) -> None:
    """200 commits of one partition asked for at once, with rising offsets: each is
    stored when its await returns, and the group ends at the last one asked for (commits
    in flight never overtake each other)."""
    bootstrap = group_node.address
    with Admin(bootstrap) as admin:
        admin.create_topic("ordered", partitions=1)

    async def run() -> int | None:
        async with AsyncConsumer(bootstrap) as consumer:
            await consumer.subscribe("ordered", group_id="ordered")
            deadline = time.monotonic() + DEADLINE_S
            while not consumer.assignment() and time.monotonic() < deadline:
                await consumer.poll(timeout_ms=50)
            tp = TopicPartition("ordered", 0)
            await asyncio.gather(*(consumer.commit({tp: n}) for n in range(1, 201)))
            return (await consumer.committed([tp]))[tp]

    assert asyncio.run(run()) == 200
