"""The group coordinator of one node: a shard per ``__consumer_offsets`` partition this
node leads, each the owner of the groups that live there.

A shard's state is its partition's log and nothing else. On taking the leadership it
replays the log from its start (``load``) into the groups image; every change is decided
on that image (``headwater.node.groups.decisions``), appended to the log as one batch of
group records, applied to the image, and answered once the high watermark passes it
(acks=all). Invariants:

- **the image is the replay of the local log plus what is buffered for it**: each
  decision is made on the image the decision before it left, and its records are
  appended in order (decisions made during one append go together as one batch); a
  failed append fails its decisions and every later one, and the image goes back to
  the log's (``_appended``);
- **answers and reads show only replicated state**: a heartbeat or commit is answered
  after its records are below the high watermark; OffsetFetch, DescribeGroup and
  ListGroups read ``committed()``, the image at the high watermark, never records a new
  leader could drop;
- **a shard serves only while its replica leads at the epoch it loaded at**
  (``check_serving``): a node that lost the leadership, was paused past its lease or is
  fenced answers NOT_COORDINATOR, and the new leader loads the groups from its own log.

Soft state (not in the log, rebuilt on load): when each member was last heard from and
since when it has held partitions to give up. A new leader starts every member's session
afresh, as Kafka's coordinator does.

Everything runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Final, TypeVar, cast

from headwater.log import batch as batch_format
from headwater.node.clock import now_ms
from headwater.node.config import NodeConfig
from headwater.node.groups import decisions
from headwater.node.groups.classic import GroupProtocolError
from headwater.node.groups.image import GroupsImage, replay
from headwater.node.groups.records import (
    OFFSETS_TOPIC,
    ClassicGeneration,
    GroupRecord,
    log_entries,
)
from headwater.node.replicas.log_manager import LogManager
from headwater.node.replicas.partition import Partition
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.errors import ErrorCode, HeadwaterError

T = TypeVar("T")
_log = logging.getLogger(__name__)
LOAD_READ_BYTES: Final = 1 << 20
TICK_S: Final = 0.2
OFFSETS_EXPIRY_CHECK_S: Final = 60.0
FLUSH_BYTES_MAX: Final = 4 << 20
"""Most bytes of group records appended as one batch (a decision's records always go in
one batch, whatever their size: requests are bounded so that it stays a few MiB)."""
COMMIT_SLICE: Final = 500
"""Offsets one commit's decision takes before the next slice is decided (``commit``)."""
_CommitWrite = Awaitable[list[HeadwaterError | None]] | HeadwaterError | GroupProtocolError
RECONCILING_HEARTBEAT_MS: Final = 100
"""Heartbeat interval given to a member with partitions to take or give up."""


class GroupShard:
    """The groups of one ``__consumer_offsets`` partition led here (see the module)."""

    def __init__(self, partition: Partition, config: NodeConfig) -> None:
        self.partition = partition
        self.index = partition.index
        self.leader_epoch = partition.leader_epoch
        self.config = config
        self.image = GroupsImage()
        self.loaded = False
        self.loaded_end = 0
        """The log end offset when the shard was loaded (``caught_up``)."""
        self.skipped_records = 0
        self._committed = GroupsImage()
        self._pending: deque[tuple[int, GroupsImage]] = deque()
        self._appended = GroupsImage()
        """The image of the log as appended (``image`` less what is buffered)."""
        self._buffer: list[_Buffered] = []
        self._flushing: asyncio.Task[None] | None = None
        self._latest: asyncio.Future[int] | None = None
        """The last decision's append: what a decision that writes nothing waits for."""
        self.failed = False
        """An append failed in a way that may have left its batch in the log: the shard
        serves nothing more, and the coordinator loads the partition again."""
        self.last_seen: dict[tuple[str, str], float] = {}
        self.revoking_since: dict[tuple[str, str], float] = {}
        self.counts_seen: Mapping[str, int] = {}
        """The topics' partition counts the timers last checked the targets against."""
        self.next_offsets_expiry_s = 0.0

    # ------------------------------------------------------------------ state

    def check_serving(self) -> None:
        partition = self.partition
        if self.failed:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_NOT_AVAILABLE,
                f"{OFFSETS_TOPIC}-{self.index} is being loaded again after a failed append; retry",
            )
        if not self.loaded:
            raise HeadwaterError(
                ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
                f"{OFFSETS_TOPIC}-{self.index} is being loaded on this node; retry",
            )
        if not partition.is_leader or partition.leader_epoch != self.leader_epoch:
            raise HeadwaterError(
                ErrorCode.NOT_COORDINATOR,
                f"this node no longer leads {OFFSETS_TOPIC}-{self.index}; find the coordinator "
                "again",
            )

    def caught_up(self) -> bool:
        """Has the high watermark reached what the log held when the shard was loaded? A
        leader that took over may hold records its ISR has not all confirmed yet: until
        then ``committed`` is older than what the last coordinator acknowledged."""
        return self.partition.high_watermark >= self.loaded_end

    def committed(self) -> GroupsImage:
        """The image as of the high watermark (what every replica has)."""
        high_watermark = self.partition.high_watermark
        while self._pending and self._pending[0][0] <= high_watermark:
            self._committed = self._pending.popleft()[1]
        return self._committed

    async def load(self) -> None:
        """Replay the partition's log into the image (a record that cannot be read or
        applied is skipped and counted: only this coordinator writes the partition)."""
        partition = self.partition
        offset = partition.log.log_start_offset
        end = partition.log.log_end_offset
        high_watermark = partition.high_watermark
        image = committed = GroupsImage()
        while offset < end:
            result = partition.read_for_replica(offset, LOAD_READ_BYTES)
            if not result.data:
                break
            for decoded in batch_format.decode_batches(result.data):
                records = decoded.records
                image = self._replay(
                    image,
                    records.column("key").to_pylist(),
                    records.column("value").to_pylist(),
                )
                if decoded.header.next_offset <= high_watermark:
                    committed = image
                await asyncio.sleep(0)  # let the loop serve other calls between batches
            offset = result.next_offset
        self.image = self._appended = image
        self._committed = committed
        self.loaded_end = end
        if end > high_watermark:
            self._pending.append((end, image))
        now = time.monotonic()
        for group_id, group in image.groups.items():
            for member_id in group.members:
                self.last_seen[(group_id, member_id)] = now
            for member_id, assignment in group.current.items():
                if assignment.revoking:
                    self.revoking_since[(group_id, member_id)] = now
        self.loaded = True
        _log.info(
            "coordinating %d group(s) of %s-%d (epoch %d, offsets [%d, %d))%s",
            len(image.groups),
            OFFSETS_TOPIC,
            self.index,
            self.leader_epoch,
            partition.log.log_start_offset,
            end,
            f", {self.skipped_records} unreadable record(s) skipped"
            if self.skipped_records
            else "",
        )

    def _replay(
        self, image: GroupsImage, keys: list[bytes | None], values: list[bytes | None]
    ) -> GroupsImage:
        """``image`` after one batch's records (``replay``); a record that cannot be read
        or applied is skipped, counted and logged."""
        image, problems = replay(image, keys, values)
        for problem in problems:
            self.skipped_records += 1
            _log.warning("%s-%d: skipping a group record: %s", OFFSETS_TOPIC, self.index, problem)
        return image

    # ------------------------------------------------------------------ writes

    async def write(self, decide: Callable[[GroupsImage], decisions.Decision[T]]) -> T:
        """Decide on the image, have the records appended, and return the answer once
        they are replicated. A decision that writes nothing is still answered only once
        every record it was decided on is replicated: an answer never rests on records a
        new leader could drop. Refusals raise before anything is written.

        Decisions are made one after another on the loop, each on the image the one
        before it left (``image`` runs ahead of the log by what is buffered); the records
        of every decision made while an append is under way go to the log together, as
        one batch (a group commit), and wait for replication together."""
        return await self.write_later(decide)

    def write_later(self, decide: Callable[[GroupsImage], decisions.Decision[T]]) -> Awaitable[T]:
        """``write``'s decision made now (a refusal raised now), and the rest (the append
        and the replication) in a task of its own: its answer."""
        self.check_serving()
        decision = decide(self.image)
        written: asyncio.Future[int] | None = None
        if decision.records:
            written = asyncio.get_running_loop().create_future()
            self._buffer.append(_Buffered.of(decision.records, decision.image, written))
            self.image = decision.image
            if self._flushing is None:
                self._flushing = asyncio.get_running_loop().create_task(self._flush())
            self._latest = written
        elif self._latest is not None and not self._latest.done():
            written = self._latest  # buffered, or being appended now
        end = self._pending[-1][0] if self._pending else 0
        return asyncio.ensure_future(self._answer_once_replicated(decision.answer, written, end))

    async def _answer_once_replicated(
        self, answer: T, written: asyncio.Future[int] | None, end: int
    ) -> T:
        if written is not None:
            end = await asyncio.shield(written)
        if end > self.partition.high_watermark:
            await self._replicated(end)
        return answer

    async def _flush(self) -> None:
        """Append what the decisions buffered, one batch per turn, until nothing is left.

        An append refused before anything was written (leadership gone, too few in-sync
        replicas) fails its decisions and every one buffered since (they were made on its
        image), and the image goes back to the log's. Any other failure of the append
        (a disk error) may have left the batch in the log or not: the shard stops
        (``failed``) and the coordinator loads it again from the log, so the image is
        again exactly the log's."""
        try:
            while self._buffer:
                taken, self._buffer = _take(self._buffer, FLUSH_BYTES_MAX)
                try:
                    end = await self._append(taken)
                except _RefusedError as refused:
                    self._fail(taken, refused.error)
                    self.image = self._appended
                    return
                except BaseException as exc:
                    self.failed = True
                    self._fail(
                        taken,
                        HeadwaterError(
                            ErrorCode.COORDINATOR_NOT_AVAILABLE,
                            f"{OFFSETS_TOPIC}-{self.index}: appending group records failed "
                            f"({type(exc).__name__}: {exc}); the coordinator reloads the "
                            "groups from the log; retry",
                        ),
                    )
                    if not isinstance(exc, Exception):
                        raise
                    _log.exception(
                        "%s-%d: appending group records failed", OFFSETS_TOPIC, self.index
                    )
                    return
                self._appended = taken[-1].image
                self._pending.append((end, self._appended))
                for entry in taken:
                    if not entry.appended.done():
                        entry.appended.set_result(end)
        finally:
            self._flushing = None

    def _fail(self, taken: list[_Buffered], error: HeadwaterError) -> None:
        """Fail ``taken`` and everything buffered after it."""
        failed, self._buffer = taken + self._buffer, []
        for entry in failed:
            if not entry.appended.done():
                entry.appended.set_exception(error)

    async def _append(self, entries: list[_Buffered]) -> int:
        """Append ``entries`` as one batch; _RefusedError when refused before writing."""
        batch = batch_format.encode_batch(
            [v for entry in entries for v in entry.values],
            keys=[k for entry in entries for k in entry.keys],
            timestamps_ms=now_ms(),
        )
        partition = self.partition
        try:
            self.check_serving()
            partition.check_open()
            partition.check_leader()
            partition.check_min_insync()
        except HeadwaterError as error:
            raise _RefusedError(_coordinator_error(error, self.index)) from None
        info = await partition.append(batch, now_ms())
        return info.last_offset + 1

    async def _replicated(self, end_offset: int) -> None:
        try:
            await self.partition.wait_for_replication(
                end_offset, self.config.offsets_commit_timeout_ms / 1000
            )
        except HeadwaterError as error:
            raise _coordinator_error(error, self.index) from None

    # ------------------------------------------------------------------ soft state

    def seen(self, group_id: str, member_id: str) -> None:
        self.last_seen[(group_id, member_id)] = time.monotonic()

    def track_revoking(self, group_id: str, member_id: str, revoking: bool) -> None:
        key = (group_id, member_id)
        if revoking:
            self.revoking_since.setdefault(key, time.monotonic())
        else:
            self.revoking_since.pop(key, None)

    def expired_members(self, now: float) -> dict[str, list[str]]:
        """Members past their session timeout, or holding partitions to give up for
        longer than their rebalance timeout, by group."""
        expired: dict[str, list[str]] = {}
        for group_id, group in self.image.groups.items():
            for member_id, member in group.members.items():
                key = (group_id, member_id)
                seen = self.last_seen.setdefault(key, now)
                revoking_since = self.revoking_since.get(key)
                if now - seen > member.session_timeout_ms / 1000 or (
                    revoking_since is not None
                    and now - revoking_since > member.rebalance_timeout_ms / 1000
                ):
                    expired.setdefault(group_id, []).append(member_id)
        return expired

    def forget(self, group_id: str, member_ids: list[str]) -> None:
        for member_id in member_ids:
            self.last_seen.pop((group_id, member_id), None)
            self.revoking_since.pop((group_id, member_id), None)


@dataclass(frozen=True, slots=True)
class _Buffered:
    """A decision's records, encoded, waiting for ``_flush``; ``image`` is the image after
    them, ``appended`` gets the log end offset once they are in the log."""

    values: list[bytes | None]
    keys: list[bytes]
    image: GroupsImage
    appended: asyncio.Future[int]

    @classmethod
    def of(
        cls, records: tuple[GroupRecord, ...], image: GroupsImage, appended: asyncio.Future[int]
    ) -> _Buffered:
        entries = [entry for record in records for entry in log_entries(record)]
        return cls([v for _, v in entries], [k for k, _ in entries], image, appended)

    @property
    def size(self) -> int:
        return sum(len(v) for v in self.values if v is not None) + sum(map(len, self.keys))


class _RefusedError(Exception):
    """An append refused before anything was written."""

    def __init__(self, error: HeadwaterError) -> None:
        super().__init__(error.message)
        self.error = error


def _take(buffer: list[_Buffered], limit: int) -> tuple[list[_Buffered], list[_Buffered]]:
    """The first decisions of ``buffer`` with at most ``limit`` bytes in all (at least
    one decision), and the rest."""
    size = 0
    for index, entry in enumerate(buffer):
        size += entry.size
        if size > limit and index > 0:
            return buffer[:index], buffer[index:]
    return buffer, []


def _remove(
    group_id: str, members: list[str], counts: Mapping[str, int], image: GroupsImage
) -> decisions.Decision[None]:
    return decisions.remove_members(image, group_id, members, counts)


def _refresh(
    group_id: str, counts: Mapping[str, int], image: GroupsImage
) -> decisions.Decision[None]:
    return decisions.refresh_target(image, group_id, counts)


def _coordinator_error(error: HeadwaterError, index: int) -> HeadwaterError:
    """A log or replication failure of the coordinator's partition, as group clients know
    it: leadership gone -> NOT_COORDINATOR; too few replicas -> COORDINATOR_NOT_AVAILABLE."""
    if error.code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH):
        return HeadwaterError(
            ErrorCode.NOT_COORDINATOR,
            f"this node no longer leads {OFFSETS_TOPIC}-{index} ({error.message}); find the "
            "coordinator again",
        )
    if error.code in (
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.KAFKA_STORAGE_ERROR,
    ):
        return HeadwaterError(
            ErrorCode.COORDINATOR_NOT_AVAILABLE,
            f"{OFFSETS_TOPIC}-{index} cannot store group records now: {error.message}",
        )
    return error


class GroupCoordinator:
    """The shards of this node, kept in step with the partitions it leads, and the timers
    that remove silent members and expire old offsets."""

    def __init__(
        self, config: NodeConfig, logs: LogManager, metadata: Callable[[], MetadataImage]
    ) -> None:
        self.config = config
        self.logs = logs
        self.metadata = metadata
        self.limits = decisions.GroupLimits(
            members_max=config.group_members_max,
            session_timeout_ms=config.group_session_timeout_ms,
        )
        self.shards: dict[int, GroupShard] = {}
        self._loading: dict[int, asyncio.Task[None]] = {}
        self._ticker: asyncio.Task[None] | None = None
        self._ticking: dict[int, asyncio.Task[None]] = {}
        self._counts_image: MetadataImage | None = None
        self._counts: Mapping[str, int] = {}

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick_forever())

    async def stop(self) -> None:
        tasks = [t for t in [self._ticker, *self._loading.values(), *self._ticking.values()] if t]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def reconcile(self) -> None:
        """Open a shard for each offsets partition this node now leads (loading it), and
        drop the shards of partitions it no longer leads at the loaded epoch."""
        led: dict[int, Partition] = {}
        for partition in self.logs.hosted():
            if partition.topic == OFFSETS_TOPIC and partition.is_leader:
                led[partition.index] = partition
        for index, shard in list(self.shards.items()):
            leading = led.get(index)
            if leading is not shard.partition or shard.partition.leader_epoch != shard.leader_epoch:
                del self.shards[index]
                task = self._loading.pop(index, None)
                if task is not None:
                    task.cancel()
        for index, partition in led.items():
            if index not in self.shards:
                shard = self.shards[index] = GroupShard(partition, self.config)
                self._loading[index] = asyncio.get_running_loop().create_task(
                    self._load(index, shard)
                )

    async def _load(self, index: int, shard: GroupShard) -> None:
        try:
            await shard.load()
        except Exception:
            _log.exception("loading the groups of %s-%d failed", OFFSETS_TOPIC, index)
            if self.shards.get(index) is shard:
                del self.shards[index]  # the next reconcile tries again
        finally:
            if self._loading.get(index) is asyncio.current_task():
                del self._loading[index]

    def partition_counts(self) -> Mapping[str, int]:
        """Every topic's partition count in the current metadata image, computed once
        per image (not per heartbeat and commit: a cluster may hold thousands of
        topics)."""
        image = self.metadata()
        if image is not self._counts_image:
            self._counts = {name: len(t.partitions) for name, t in image.topics.items()}
            self._counts_image = image
        return self._counts

    def shard(self, index: int) -> GroupShard:
        shard = self.shards.get(index)
        if shard is None:
            raise HeadwaterError(
                ErrorCode.NOT_COORDINATOR,
                f"this node does not lead {OFFSETS_TOPIC}-{index}; find the coordinator again",
            )
        return shard

    # ------------------------------------------------------------------ requests

    async def heartbeat(
        self, index: int, request: decisions.Heartbeat
    ) -> tuple[decisions.HeartbeatAnswer, int]:
        """The member's answer and the heartbeat interval to give it."""
        request = decisions.check_heartbeat(request, self.limits)
        shard = self.shard(index)
        counts = self.partition_counts()
        new_member_id = uuid.uuid4().hex
        answer = await shard.write(
            lambda image: decisions.heartbeat(image, request, counts, new_member_id, self.limits)
        )
        if answer.member_epoch >= 0:
            shard.seen(request.group_id, answer.member_id)
            group = shard.image.group(request.group_id)
            current = group.current.get(answer.member_id) if group else None
            shard.track_revoking(
                request.group_id, answer.member_id, bool(current and current.revoking)
            )
        elif answer.member_epoch == decisions.LEAVE_EPOCH:
            shard.forget(request.group_id, [answer.member_id])
        interval = (
            min(RECONCILING_HEARTBEAT_MS, self.config.group_heartbeat_interval_ms)
            if answer.reconciling
            else self.config.group_heartbeat_interval_ms
        )
        return answer, interval

    async def commit(
        self,
        index: int,
        group_id: str,
        member_id: str,
        member_epoch: int,
        items: list[decisions.CommitItem],
    ) -> list[HeadwaterError | None]:
        """A commit at the member's epoch (``decisions.commit_offsets``). A commit of many
        partitions is decided ``COMMIT_SLICE`` items at a time, giving the event loop back
        in between; the slices are appended and replicated together. A refusal of the
        first slice, or a failure of every slice's write, is the request's; a later
        slice's refusal (the member fenced meanwhile) or failed write answers its items."""
        answers = await self._commit(index, group_id, member_id, member_epoch, items, None)
        # Without a recheck every refusal is the decision's or the write's: a HeadwaterError.
        return cast(list[HeadwaterError | None], answers)

    async def commit_classic(
        self,
        index: int,
        group_id: str,
        items: list[decisions.CommitItem],
        recheck: Callable[[], None],
    ) -> list[HeadwaterError | GroupProtocolError | None]:
        """A commit of a classic group's member (``classic_member`` in
        ``decisions.commit_offsets``), whose generation the caller checked:
        ``recheck`` checks it again before each slice after the first (the member may
        have been fenced while the loop was given back), and what it raises answers that
        slice's items."""
        return await self._commit(index, group_id, "", decisions.ADMIN_MEMBER_EPOCH, items, recheck)

    async def _commit(
        self,
        index: int,
        group_id: str,
        member_id: str,
        member_epoch: int,
        items: list[decisions.CommitItem],
        recheck: Callable[[], None] | None,
    ) -> list[HeadwaterError | GroupProtocolError | None]:
        shard = self.shard(index)
        counts = self.partition_counts()
        classic_member = recheck is not None

        def decide(
            part: list[decisions.CommitItem],
        ) -> Callable[[GroupsImage], decisions.Decision[list[HeadwaterError | None]]]:
            return lambda image: decisions.commit_offsets(
                image, group_id, member_id, member_epoch, part, counts, now_ms(), classic_member
            )

        slices = [items[n : n + COMMIT_SLICE] for n in range(0, len(items), COMMIT_SLICE)]
        writes: list[tuple[list[decisions.CommitItem], _CommitWrite]] = []
        for n, part in enumerate(slices or [[]]):
            if n:
                await asyncio.sleep(0)
            try:
                if n and recheck is not None:
                    recheck()
                writes.append((part, shard.write_later(decide(part))))
            except (HeadwaterError, GroupProtocolError) as refused:
                if not n:
                    raise
                writes.append((part, refused))
        answers: list[HeadwaterError | GroupProtocolError | None] = []
        failures: list[HeadwaterError | GroupProtocolError] = []
        for part, write in writes:
            try:
                if isinstance(write, (HeadwaterError, GroupProtocolError)):
                    raise write
                answers += await write
            except (HeadwaterError, GroupProtocolError) as failed:
                failures.append(failed)
                answers += [failed] * len(part)
        if len(failures) == len(writes):
            raise failures[0]
        if member_id:
            shard.seen(group_id, member_id)  # a commit shows the member is alive
        return answers

    async def save_classic(self, index: int, record: ClassicGeneration) -> None:
        """Append a classic group's generation (``headwater.node.groups.classic_groups``) and
        return once it is replicated."""
        await self.shard(index).write(lambda image: decisions.save_classic(image, record))

    async def delete(self, index: int, group_id: str) -> None:
        shard = self.shard(index)
        await shard.write(lambda image: decisions.delete_group(image, group_id))
        shard.forget(group_id, [])

    def committed(self, index: int) -> GroupsImage:
        shard = self.shard(index)
        shard.check_serving()
        return shard.committed()

    # ------------------------------------------------------------------ timers

    async def _tick_forever(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            try:
                await self.tick()
            except HeadwaterError as error:
                _log.debug("group coordinator tick: %s", error)
            except Exception:
                _log.exception("group coordinator tick failed")

    async def tick(self) -> None:
        """Reload failed shards, and start each loaded shard's timers (``_tick_shard``)
        unless its last round is still running: one shard waiting on its replicas never
        holds up another's."""
        now = time.monotonic()
        counts = self.partition_counts()
        failed = [index for index, shard in self.shards.items() if shard.failed]
        for index in failed:
            del self.shards[index]
        if failed:
            self.reconcile()  # opens and loads them again, from the log
        loop = asyncio.get_running_loop()
        for index, shard in list(self.shards.items()):
            running = self._ticking.get(index)
            if shard.loaded and (running is None or running.done()):
                self._ticking[index] = loop.create_task(self._tick_shard(shard, now, counts))

    async def _tick_shard(self, shard: GroupShard, now: float, counts: Mapping[str, int]) -> None:
        """Remove the shard's expired members, give its groups new targets when their
        topics changed, and (every minute) expire old offsets of its empty groups."""
        try:
            for group_id, members in shard.expired_members(now).items():
                _log.info(
                    "group %r: member(s) %s timed out; they leave the group", group_id, members
                )
                await shard.write(functools.partial(_remove, group_id, members, counts))
                shard.forget(group_id, members)
            if counts is not shard.counts_seen and counts != shard.counts_seen:
                for group_id in decisions.stale_targets(shard.image, counts):
                    await shard.write(functools.partial(_refresh, group_id, counts))
                shard.counts_seen = counts
            if now >= shard.next_offsets_expiry_s:
                await shard.write(
                    lambda image: decisions.expire_offsets(
                        image, now_ms(), self.config.offsets_retention_ms
                    )
                )
                shard.next_offsets_expiry_s = now + OFFSETS_EXPIRY_CHECK_S
        except HeadwaterError as error:
            _log.debug("%s-%d timers: %s", OFFSETS_TOPIC, shard.index, error)
        except Exception:
            _log.exception("%s-%d timers failed", OFFSETS_TOPIC, shard.index)
