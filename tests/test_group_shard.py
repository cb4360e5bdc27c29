"""The coordinator's shard in one process, on a real partition log in a temporary
folder: the image is always the replay of the log; decisions made together are appended
together; an answer that writes nothing waits for the append it was decided after; a
failed append (a disk error injected into the real log) stops the shard, and loading
the log again gives exactly what was appended."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from headwater.log import batch as batch_format
from headwater.log.api import LogConfig
from headwater.log.file_log import FileLog
from headwater.node.config import NodeConfig
from headwater.node.groups import decisions as d
from headwater.node.groups.coordinator import GroupShard
from headwater.node.groups.records import OFFSETS_TOPIC
from headwater.node.replicas.partition import Partition
from headwater.raft.metadata.image import PartitionState
from headwater.shared.errors import ErrorCode, HeadwaterError

COUNTS = {"t": 8}
LIMITS = d.GroupLimits()


@pytest.fixture
def partition(tmp_path: Path) -> Iterator[Partition]:
    log = FileLog(tmp_path / "p", LogConfig(), now_ms=0)
    replica = Partition(OFFSETS_TOPIC, 0, log, LogConfig(), directory=tmp_path / "p")
    replica.become(PartitionState(0, (1,), (1,), 1, 1, 1), 1, 0)  # the only replica
    yield replica
    replica.close()
    log.close()


def commit(group: str, offset: int) -> Any:
    return lambda image: d.commit_offsets(
        image, group, "", -1, [d.CommitItem("t", offset % 8, offset)], COUNTS, 1000
    )


def join(group: str) -> Any:
    request = d.check_heartbeat(
        d.Heartbeat(group_id=group, member_id="", member_epoch=0, subscribed_topics=("t",)),
        LIMITS,
    )
    return lambda image: d.heartbeat(image, request, COUNTS, f"m-{group}", LIMITS)


async def loaded(partition: Partition) -> GroupShard:
    shard = GroupShard(partition, NodeConfig())
    await shard.load()
    return shard


def batches_in(partition: Partition) -> int:
    data = partition.read_for_replica(0, 64 << 20).data
    return len(list(batch_format.iter_headers(data)))


def test_decisions_made_together_are_appended_together_and_replay_to_the_same_image(
    partition: Partition,
) -> None:
    async def run() -> None:
        shard = await loaded(partition)
        await shard.write(join("joined"))
        answers = await asyncio.gather(*(shard.write(commit(f"g{i % 5}", i)) for i in range(60)))
        assert all(a == [None] for a in answers)
        assert batches_in(partition) < 20  # 61 decisions, a handful of appends
        again = await loaded(partition)
        assert again.image == shard.image == again.committed()

    asyncio.run(run())


def test_an_answer_that_writes_nothing_waits_for_the_append_before_it(
    partition: Partition,
) -> None:
    """With fsync before acknowledging, the append runs in a thread: a heartbeat that
    changes nothing, decided while the join before it is being appended, must not be
    answered before that join is in the log."""
    partition.fsync_on_append = True
    real_append = partition.log.append
    appended_at: list[float] = []

    def slow_append(batch: bytes, leader_epoch: int, now_ms: int) -> Any:
        time.sleep(0.3)
        info = real_append(batch, leader_epoch, now_ms)
        appended_at.append(time.monotonic())
        return info

    async def run() -> None:
        shard = await loaded(partition)
        partition.log.append = slow_append  # type: ignore[method-assign]
        joined = asyncio.ensure_future(shard.write(join("g")))
        await asyncio.sleep(0.05)  # the join is being appended now
        nothing = d.Decision((), "unchanged", shard.image)
        assert await shard.write(lambda image: nothing) == "unchanged"
        answered_at = time.monotonic()
        await joined
        assert appended_at and answered_at >= appended_at[0]

    asyncio.run(run())


def test_a_failed_append_stops_the_shard_and_a_reload_matches_the_log(
    partition: Partition,
) -> None:
    real_append = partition.log.append
    failures = iter([OSError(28, "No space left on device")])

    def failing_append(batch: bytes, leader_epoch: int, now_ms: int) -> Any:
        failure = next(failures, None)
        if failure is not None:
            real_append(batch, leader_epoch, now_ms)  # written, then the error: the worst case
            raise failure
        return real_append(batch, leader_epoch, now_ms)

    async def run() -> None:
        shard = await loaded(partition)
        await shard.write(commit("g", 1))
        partition.log.append = failing_append  # type: ignore[method-assign]
        with pytest.raises(HeadwaterError) as caught:
            await shard.write(commit("g", 2))
        assert caught.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert shard.failed
        with pytest.raises(HeadwaterError) as refused:
            await shard.write(commit("g", 3))
        assert refused.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        again = await loaded(partition)  # what the coordinator's timer does
        group = again.image.group("g")
        assert group is not None and group.offsets[("t", 2)].offset == 2  # it was in the log
        await again.write(commit("g", 4))
        assert (await loaded(partition)).image == again.image

    asyncio.run(run())


def test_a_refused_append_rolls_the_image_back(partition: Partition) -> None:
    async def run() -> None:
        shard = await loaded(partition)
        await shard.write(commit("g", 1))
        before = shard.image
        partition.min_insync_replicas = 2  # one replica in the ISR: appends are refused
        with pytest.raises(HeadwaterError) as caught:
            await shard.write(commit("g", 2))
        assert caught.value.code is ErrorCode.COORDINATOR_NOT_AVAILABLE
        assert shard.image == before and not shard.failed
        partition.min_insync_replicas = 1
        await shard.write(commit("g", 3))
        assert (await loaded(partition)).image == shard.image

    asyncio.run(run())


def test_a_commit_of_many_partitions_gives_the_loop_back_between_slices(
    partition: Partition,
) -> None:
    """1,200 offsets in one commit are decided 500 at a time, each slice in a turn of the
    event loop of its own (a commit of 10,000 decided at once would hold it 0.25 s), and
    every one is answered and stored. A classic member's commit is checked again before
    each slice: a member fenced after the first has the later slices refused."""
    import types

    from headwater.node.groups.classic import GroupProtocolError
    from headwater.node.groups.coordinator import COMMIT_SLICE, GroupCoordinator

    wide = types.SimpleNamespace(topics={"t": types.SimpleNamespace(partitions=[0] * 2000)})

    async def run() -> None:
        coordinator = GroupCoordinator(NodeConfig(), None, lambda: wide)  # type: ignore[arg-type]
        shard = coordinator.shards[0] = await loaded(partition)
        turns = 0

        async def count_turns() -> None:
            nonlocal turns
            while True:
                await asyncio.sleep(0)
                turns += 1

        decided_at: list[int] = []
        write_later = shard.write_later

        def counted(decide: Any) -> Any:
            decided_at.append(turns)
            return write_later(decide)

        shard.write_later = counted  # type: ignore[method-assign]
        counting = asyncio.ensure_future(count_turns())
        await asyncio.sleep(0)
        items = [d.CommitItem("t", p, 7) for p in range(1200)]
        answers = await coordinator.commit(0, "wide", "", -1, items)
        assert answers == [None] * 1200
        assert len(decided_at) == -(-1200 // COMMIT_SLICE)
        assert decided_at == sorted(set(decided_at))  # each slice in a turn of its own
        group = coordinator.shards[0].committed().group("wide")
        assert group is not None and len(group.offsets) == 1200

        checks = 0

        def fenced_after_the_first() -> None:
            nonlocal checks
            checks += 1
            raise GroupProtocolError(22, "generation 3 is not the group's")

        classic = [d.CommitItem("t", p, 9) for p in range(1200)]
        answers = await coordinator.commit_classic(0, "wide", classic, fenced_after_the_first)
        counting.cancel()
        assert checks == 2  # before the second and the third slice
        assert answers[:COMMIT_SLICE] == [None] * COMMIT_SLICE
        assert all(isinstance(a, GroupProtocolError) for a in answers[COMMIT_SLICE:])
        group = coordinator.shards[0].committed().group("wide")
        assert group is not None
        assert sorted({c.offset for c in group.offsets.values()}) == [7, 9]

    asyncio.run(run())
