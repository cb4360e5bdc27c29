"""``headwater bench groups``: consumer groups on a local 3-node cluster.

It starts its own nodes (as ``bench cluster`` does), a topic of ``--partitions``
partitions (RF 3, min_insync_replicas 2) fed at ``--rate`` records/s, and a group of
``--members`` member processes (``headwater.tools.benchmarks.group_member``), then measures:

- **a member joins**: from the moment the coordinator has the new member (its join is
  committed: ``describe`` shows it) until the group is stable again (every member at its
  target); the partitions that changed owner against those that had to (what the new
  member owns); and the partitions of which a record took more than ``STALL_MS`` from
  its send to its consumer during the change, against the moved ones and against as
  long a window just before the change (what the load of the machine alone causes);
- **a member dies** (SIGKILL): the same, from the moment the coordinator removes it
  (its session timeout, ``--session-timeout-ms``, after the kill);
- **offset commits per second through the AsyncConsumer**: one member owning every
  partition awaits ``commit`` of one partition's offset, one at a time (latency), then
  from 64 concurrent tasks (the consumer merges the commits asked for while one is in
  flight into its next request), then of every partition from 16 tasks;
- **consumer throughput**: a group of 3 against one consumer, each reading the same
  ``--read-records`` records (100 bytes, 12 partitions) from the start, timed from the
  moment the member processes (already started) are told to join.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import click

from headwater.client import Admin, GroupDescription, NewTopic, Producer
from headwater.client.aio import AsyncConsumer
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.tools.benchmarks.cluster import bench_cluster_of, wait_all_running
from headwater.tools.benchmarks.perf import percentile
from headwater.tools.devcluster import LocalCluster, WaitTimeoutError, wait_until

STALL_MS: Final = 500
STEADY_S: Final = 5.0
"""Steady consumption before each change (its end is the stall baseline's window)."""
DESCRIBE_EVERY_S: Final = 0.01
SETTLE_DEADLINE_S: Final = 120.0
GROUP: Final = "bench-group"
TOPIC: Final = "bench-group-topic"
READ_TOPIC: Final = "bench-group-read"


def _until(condition: Callable[[], Any], deadline_s: float, what: str) -> Any:
    try:
        return wait_until(condition, deadline_s, what, interval_s=DESCRIBE_EVERY_S)
    except WaitTimeoutError as error:
        raise click.ClickException(str(error)) from None


class MemberProcess:
    """A member process and the lines it printed (read by a thread)."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        session_ms: int,
        mode: str,
        wait: bool = False,
    ) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "headwater.tools.benchmarks.group_member",
                bootstrap,
                topic,
                group,
                str(session_ms),
                mode,
                *(["--wait"] if wait else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.started = threading.Event()
        self.ready = threading.Event()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith("started"):
                self.started.set()
            elif line.startswith("ready"):
                self.ready.set()
            else:
                self.lines.append(line)

    def go(self) -> None:
        """Join now (a member started with ``wait``)."""
        stdin = self.process.stdin
        assert stdin is not None
        stdin.write("go\n")
        stdin.flush()

    def last_count(self) -> int:
        return int(self.lines[-1]) if self.lines else 0

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def stalled(members: list[MemberProcess], start_ms: int, end_ms: int) -> set[int]:
    """Partitions of which a record consumed within [start, end] took more than
    STALL_MS from its send to its consumer."""
    found = set()
    for member in members:
        for line in list(member.lines):
            partition, stamp, _count, age = line.split()
            if start_ms <= int(stamp) <= end_ms and int(age) > STALL_MS:
                found.add(int(partition))
    return found


def owners(description: GroupDescription) -> dict[int, str]:
    return {p: m.member_id for m in description.members for t in m.assigned for p in t.partitions}


def settled(description: GroupDescription, members: int, partitions: int) -> bool:
    if description.state != "stable" or len(description.members) != members:
        return False
    return len(owners(description)) == partitions


class Feeder:
    """Produces to every partition in turn at ``rate`` records/s (acks=1)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, rate: int) -> None:
        self._stop = threading.Event()
        self._args = (bootstrap, topic, partitions, rate)
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        bootstrap, topic, partitions, rate = self._args
        tick_s = 0.01
        per_tick = max(1, rate // 100)
        with Producer(bootstrap, acks="1", linger_ms=0) as producer:
            partition = itertools.cycle(range(partitions))
            next_tick = time.monotonic()
            while not self._stop.is_set():
                for _ in range(per_tick):
                    producer.send(topic, b"x" * 100, partition=next(partition))
                next_tick += tick_s
                self._stop.wait(max(next_tick - time.monotonic(), 0))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def watch_change(
    admin: Admin,
    members: list[MemberProcess],
    expected_members: int,
    partitions: int,
    change: Callable[[], None],
) -> dict[str, Any]:
    """Run ``change`` and time the group from the coordinator's knowing of it to stable."""
    before = admin.describe_group(GROUP)
    previous_ids = {m.member_id for m in before.members}
    previous_owners = owners(before)
    began = time.monotonic()
    began_ms = time.time_ns() // 1_000_000
    change()

    def learned() -> GroupDescription | None:
        now = admin.describe_group(GROUP)
        ids = {m.member_id for m in now.members}
        return now if ids != previous_ids and len(ids) == expected_members else None

    _until(learned, SETTLE_DEADLINE_S, "the coordinator to learn of the change")
    learned_at = time.monotonic()

    def stable() -> GroupDescription | None:
        now = admin.describe_group(GROUP)
        return now if settled(now, expected_members, partitions) else None

    after = _until(stable, SETTLE_DEADLINE_S, "the group to be stable again")
    stable_at = time.monotonic()
    time.sleep(1.0)  # let consumption after the change show in the members' output
    end_ms = time.time_ns() // 1_000_000
    new_owners = owners(after)
    moved = {p for p in range(partitions) if previous_owners.get(p) != new_owners.get(p)}
    newcomers = {m.member_id for m in after.members} - previous_ids
    must_move = {p for p, owner in new_owners.items() if owner in newcomers}
    must_move |= {p for p, owner in previous_owners.items() if owner not in new_owners.values()}
    start_ms = began_ms + int((learned_at - began) * 1000) - 200
    paused = stalled(members, start_ms, end_ms)
    # The same measure over as long a window just before the change: what the machine's
    # load alone stalls (the producer and every member share its cores).
    baseline_start = max(began_ms - (end_ms - start_ms), began_ms - STEADY_S * 1000 + 500)
    baseline = stalled(members, int(baseline_start), began_ms)
    return {
        "coordinator_learned_after_ms": round((learned_at - began) * 1000, 1),
        "settle_after_coordinator_learned_ms": round((stable_at - learned_at) * 1000, 1),
        "partitions_moved": len(moved),
        "partitions_that_had_to_move": len(must_move),
        "partitions_with_a_record_later_than_500ms": len(paused),
        "late_partitions_not_moved": len(paused - moved),
        "partitions_with_a_record_later_than_500ms_just_before": len(baseline),
    }


async def _commit_rates(
    bootstrap: str, partitions: int, seconds: float, committers: int
) -> dict[str, Any]:
    async with AsyncConsumer(bootstrap, auto_offset_reset="earliest") as consumer:
        await consumer.subscribe(TOPIC, group_id="bench-commits")
        deadline = time.monotonic() + SETTLE_DEADLINE_S
        while len(consumer.assignment()) < partitions:
            await consumer.poll(timeout_ms=50)
            if time.monotonic() > deadline:
                raise click.ClickException("the commit benchmark's member got no assignment")
        tps = [TopicPartition(TOPIC, p) for p in range(partitions)]
        latencies = []
        offset = itertools.count(1)
        end = time.monotonic() + min(seconds, 2.0)
        while time.monotonic() < end:
            began = time.perf_counter()
            await consumer.commit({tps[0]: next(offset)})
            latencies.append((time.perf_counter() - began) * 1000)
        latencies.sort()

        async def committer(chosen: list[TopicPartition], stop_at: float) -> int:
            done = 0
            while time.monotonic() < stop_at:
                await consumer.commit(dict.fromkeys(chosen, next(offset)))
                done += 1
            return done

        stop_at = time.monotonic() + seconds
        began = time.monotonic()
        singles = await asyncio.gather(
            *(committer([tps[i % partitions]], stop_at) for i in range(committers))
        )
        single_rate = sum(singles) / (time.monotonic() - began)
        stop_at = time.monotonic() + seconds
        began = time.monotonic()
        wholes = await asyncio.gather(*(committer(tps, stop_at) for _ in range(16)))
        whole_rate = sum(wholes) / (time.monotonic() - began)
        return {
            "sequential_commit_ms": {
                "p50": round(percentile(latencies, 0.5), 2),
                "p99": round(percentile(latencies, 0.99), 2),
            },
            "concurrent_committers": committers,
            "commits_per_s_concurrent_committers": round(single_rate),
            "all_partition_commits_per_s_16_concurrent_committers": round(whole_rate, 1),
            "offsets_per_s_16_concurrent_all_partition_committers": round(whole_rate * partitions),
        }


def read_rate(bootstrap: str, group: str, size: int, records: int) -> float:
    """Records/s for a group of ``size`` member processes to read ``records`` from the
    start: from the moment all of them (started and imported) are told to join, to the
    last record."""
    members = [
        MemberProcess(bootstrap, READ_TOPIC, group, 10_000, "count", wait=True) for _ in range(size)
    ]
    try:
        _until(lambda: all(m.started.is_set() for m in members), 60, "the readers to start")
        began = time.monotonic()
        for member in members:
            member.go()
        _until(
            lambda: sum(m.last_count() for m in members) >= records,
            600,
            f"{size} reader(s) reading {records} records",
        )
        return records / (time.monotonic() - began)
    finally:
        for member in members:
            member.stop()


def run(
    members: int,
    partitions: int,
    rate: int,
    session_ms: int,
    seconds: float,
    committers: int,
    read_records: int,
) -> dict[str, Any]:
    results: dict[str, Any] = {
        "nodes": 3,
        "members": members,
        "partitions": partitions,
        "produce_rate_per_s": rate,
        "session_timeout_ms": session_ms,
    }
    with tempfile.TemporaryDirectory(prefix="headwater-bench-") as root:
        cluster: LocalCluster = bench_cluster_of(3, Path(root))
        processes: list[MemberProcess] = []
        feeder: Feeder | None = None
        try:
            cluster.start(wait=False)
            controller = wait_all_running(cluster)
            bootstrap = cluster.bootstrap()
            two = {"min_insync_replicas": "2"}
            cluster.admin(controller).create_topics(
                [NewTopic(TOPIC, partitions, 3, two), NewTopic(READ_TOPIC, 12, 3, two)]
            )
            with Admin(bootstrap, request_timeout_s=60) as admin:
                processes = [
                    MemberProcess(bootstrap, TOPIC, GROUP, session_ms, "track")
                    for _ in range(members)
                ]

                def all_in() -> bool:
                    try:
                        return settled(admin.describe_group(GROUP), members, partitions)
                    except HeadwaterError as error:
                        if error.code is ErrorCode.GROUP_ID_NOT_FOUND:
                            return False
                        raise

                _until(all_in, SETTLE_DEADLINE_S, f"{members} members to settle")
                feeder = Feeder(bootstrap, TOPIC, partitions, rate)

                newcomer = MemberProcess(bootstrap, TOPIC, GROUP, session_ms, "track", wait=True)
                _until(newcomer.started.is_set, 60, "the new member's process to start")
                time.sleep(STEADY_S)  # its start's load passes before the change

                def join() -> None:
                    processes.append(newcomer)
                    newcomer.go()

                results["member_joins"] = watch_change(
                    admin, processes, members + 1, partitions, join
                )
                time.sleep(STEADY_S)
                victim = processes[0]

                def die() -> None:
                    victim.process.kill()
                    victim.process.wait()

                results["member_dies"] = watch_change(
                    admin, processes[1:], members, partitions, die
                )
                feeder.stop()
                feeder = None
            for process in processes:
                process.stop()
            results["commits"] = asyncio.run(
                _commit_rates(bootstrap, partitions, seconds, committers)
            )
            with Producer(bootstrap, acks="1") as producer:
                values = [b"r" * 100] * 10_000
                for sent in range(0, read_records, len(values)):
                    producer.send_batch(
                        READ_TOPIC,
                        values[: min(len(values), read_records - sent)],
                        partition=(sent // len(values)) % 12,
                    )
                producer.flush()
            one = read_rate(bootstrap, "bench-read-one", 1, read_records)
            three = read_rate(bootstrap, "bench-read-three", 3, read_records)
            results["read_records"] = read_records
            results["one_consumer_records_per_s"] = round(one)
            results["group_of_3_records_per_s"] = round(three)
            results["ratio_group_of_3_to_one"] = round(three / one, 2)
        finally:
            if feeder is not None:
                feeder.stop()
            for process in processes:
                process.stop()
            cluster.close()
    return results


@click.command("groups")
@click.option("--members", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option("--partitions", type=click.IntRange(1, 1000), default=100, show_default=True)
@click.option(
    "--rate",
    type=click.IntRange(10),
    default=400,
    show_default=True,
    help="Records/s fed to the topic while members come and go.",
)
@click.option("--session-timeout-ms", type=click.IntRange(1000), default=6000, show_default=True)
@click.option("--commit-seconds", type=click.FloatRange(0.5), default=5.0, show_default=True)
@click.option(
    "--committers",
    type=click.IntRange(1, 10_000),
    default=256,
    show_default=True,
    help="Concurrent tasks committing one partition's offset each.",
)
@click.option("--read-records", type=click.IntRange(10_000), default=1_000_000, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def bench_groups(
    members: int,
    partitions: int,
    rate: int,
    session_timeout_ms: int,
    commit_seconds: float,
    committers: int,
    read_records: int,
    as_json: bool,
) -> None:
    """Consumer groups on a local 3-node cluster: time to settle after a member joins and
    after one dies, partitions moved and stalled, offset commits per second, and a group
    of 3 against one consumer."""
    results = run(
        members, partitions, rate, session_timeout_ms, commit_seconds, committers, read_records
    )
    if as_json:
        print(json.dumps(results))
        return
    print(json.dumps(results, indent=2))
