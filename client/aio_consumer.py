"""The asyncio consumer (``AsyncConsumer``): one FetchStream per assigned partition, each
read by a task into one bounded asyncio queue; ``poll`` waits on that queue. A stream that
ends or fails with a retriable error is reopened where it stopped; other errors are raised
by ``poll``. Assignment, positions, reset policy and group membership come from the same
sans-I/O cores as the threaded Consumer's; it reads from each partition's leader directly
(``LeaderRouter``).

Not thread-safe: use from one event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

import grpc

from headwater.client.admin_messages import OFFSET_SPECS
from headwater.client.admin_types import OffsetSpec
from headwater.client.aio_groups import AsyncGroupCalls, HeartbeatTask
from headwater.client.aio_router import LeaderRouter
from headwater.client.connection import (
    MESSAGE_BYTES_MAX,
    RETRY_BACKOFF_MAX_S,
    RETRY_BACKOFF_MIN_S,
    resolve_bootstrap,
)
from headwater.client.consumer import (
    ARRIVALS_MAX,
    GROUP_POLL_STEP_S,
    FetchedBatch,
    PollResult,
    fetched_from,
)
from headwater.client.membership import (
    Membership,
    RebalanceListener,
    subscription_of,
    uncommitted,
)
from headwater.client.offsets import offset_requests, offsets_answered, one_timestamp
from headwater.client.positions import FetchPositions, TopicPartition
from headwater.shared.cancellation import task_is_stopping
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import ClientSecurity
from headwater.v1 import headwater_pb2 as pb

_log = logging.getLogger(__name__)
# How long a partition's reader retries a stream that keeps failing without progress.
READ_RETRY_S: Final = 30.0
CONSUMER_CALL_TIMEOUT_S: Final = 30.0


_SPEC_OF_RESET: Final = {"earliest": pb.OFFSET_SPEC_EARLIEST, "latest": pb.OFFSET_SPEC_LATEST}


class AsyncConsumer:
    """The threaded Consumer's assignment, positions and reset policy (one sans-I/O core,
    headwater.client.positions), with one FetchStream per partition read by a task."""

    def __init__(
        self,
        bootstrap: str | Sequence[str] | None = None,
        *,
        fetch_max_bytes: int = 4 << 20,
        fetch_max_wait_ms: int = 500,
        auto_offset_reset: str = "latest",
        check_crcs: bool = True,
        security: ClientSecurity | None = None,
        group_id: str | None = None,
    ) -> None:
        self._positions = FetchPositions(auto_offset_reset)
        if fetch_max_bytes < 1 or fetch_max_wait_ms < 0:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                "fetch_max_bytes must be >= 1 and fetch_max_wait_ms >= 0",
            )
        self.address = resolve_bootstrap(bootstrap)[0]
        self.fetch_max_bytes = fetch_max_bytes
        self.fetch_max_wait_ms = fetch_max_wait_ms
        self.auto_offset_reset = auto_offset_reset
        self.check_crcs = check_crcs
        self._router = LeaderRouter(self.address, CONSUMER_CALL_TIMEOUT_S, security)
        self._readers: dict[TopicPartition, asyncio.Task[None]] = {}
        # (partition, generation, (record batches, next offset) or None, error or None)
        self._arrivals: asyncio.Queue[
            tuple[TopicPartition, int, tuple[bytes, int] | None, HeadwaterError | None]
        ] = asyncio.Queue(maxsize=ARRIVALS_MAX)
        self._group: _AsyncGroup | None = None
        self.group_id = group_id
        """The group ``subscribe`` joins when it names none (Kafka's ``group.id``)."""

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ assignment

    async def assign(self, partitions: str | Iterable[TopicPartition | tuple[str, int]]) -> None:
        """Consume a whole topic (a name) or the given partitions; positions start unset
        (``auto_offset_reset`` places them at the first poll)."""
        if self._group is not None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                "this consumer is subscribed to a group; assign() and subscribe() do not mix",
            )
        if isinstance(partitions, str):
            count = len(await self._router.leaders(partitions))
            wanted = [TopicPartition(partitions, p) for p in range(count)]
        else:
            wanted = [
                p if isinstance(p, TopicPartition) else TopicPartition(*p) for p in partitions
            ]
            for tp in wanted:  # raises for unknown topics and partitions
                await self._router.checked_leaders(tp.topic, tp.partition)
        await self._stop_readers()
        self._positions.assign(wanted)

    async def assign_at(self, topic: str, spec: OffsetSpec = OffsetSpec.LATEST) -> None:
        """Consume every partition of ``topic`` from its earliest or latest offset
        (``OffsetSpec.EARLIEST`` or ``OffsetSpec.LATEST``)."""
        if spec is OffsetSpec.TIMESTAMP:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST,
                "assign_at starts at OffsetSpec.EARLIEST or OffsetSpec.LATEST; to start at "
                "a time, assign and seek to Admin.offsets_for_times",
            )
        await self.assign(topic)
        await self._seek_spec(None, OFFSET_SPECS[spec])

    def assignment(self) -> list[TopicPartition]:
        return self._positions.assignment()

    def seek(self, partition: TopicPartition, offset: int) -> None:
        """The next poll reads ``partition`` from ``offset`` (checked by the broker)."""
        self._positions.seek(partition, offset)
        reader = self._readers.pop(partition, None)
        if reader is not None:
            reader.cancel()  # what it queued already is of an old generation: dropped

    async def seek_to_beginning(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_spec(partitions, pb.OFFSET_SPEC_EARLIEST)

    async def seek_to_end(self, partitions: Iterable[TopicPartition] | None = None) -> None:
        await self._seek_spec(partitions, pb.OFFSET_SPEC_LATEST)

    async def seek_to_timestamp(
        self, timestamp_ms: int, partitions: Iterable[TopicPartition] | None = None
    ) -> None:
        """Position at the first record with timestamp >= timestamp_ms (else the end)."""
        await self._seek_spec(partitions, pb.OFFSET_SPEC_TIMESTAMP, timestamp_ms)

    async def position(self, partition: TopicPartition) -> int:
        if self._positions.offset(partition) is None:
            await self._reset(partition)
        position = self._positions.offset(partition)
        assert position is not None
        return position

    async def _seek_spec(
        self,
        partitions: Iterable[TopicPartition] | None,
        spec: pb.OffsetSpec.ValueType,
        timestamp_ms: int = 0,
    ) -> None:
        keys = [(tp.topic, tp.partition) for tp in self._positions.check_assigned(partitions)]
        stamps = one_timestamp(keys, spec, timestamp_ms)
        for request in offset_requests(keys, spec, stamps):
            try:
                response = await self._router.stub(self.address).ListOffsets(
                    request, timeout=CONSUMER_CALL_TIMEOUT_S
                )
            except grpc.RpcError as exc:
                raise from_rpc_error(exc, request.topic) from None
            for (topic, partition), offset in offsets_answered(request, response).items():
                self.seek(TopicPartition(topic, partition), offset)

    async def _reset(self, partition: TopicPartition, cause: HeadwaterError | None = None) -> None:
        await self._seek_spec(
            [partition], _SPEC_OF_RESET[self._positions.reset_to(partition, cause)]
        )

    # ------------------------------------------------------------------ fetching

    async def _read(self, tp: TopicPartition, offset: int, generation: int) -> None:
        """Feed ``tp``'s arrivals into the queue until stopped. A stream that ends or fails
        with a retriable error (a leader moving, a node restarting) is reopened from the
        next offset after what was queued, with backoff, for up to ``READ_RETRY_S`` without
        progress; any other error, or running out of that time, is queued for ``poll``."""
        backoff_s = RETRY_BACKOFF_MIN_S
        give_up_at = time.monotonic() + READ_RETRY_S
        while True:
            request = pb.FetchRequest(
                topic=tp.topic,
                partition=tp.partition,
                offset=offset,
                max_bytes=self.fetch_max_bytes,
                max_wait_ms=self.fetch_max_wait_ms,
                min_bytes=1,
                replica_id=-1,
                max_response_bytes=MESSAGE_BYTES_MAX,
            )
            try:
                address = (await self._router.leaders(tp.topic))[tp.partition]
            except (HeadwaterError, IndexError):
                address = self.address  # the bootstrap node forwards, or names the problem
            call = self._router.stub(address).FetchStream(request)
            try:
                async for response in call:
                    records = response.records  # each read of a bytes field copies it
                    if records:
                        arrival = (records, response.next_offset)
                        await self._arrivals.put((tp, generation, arrival, None))
                    offset = max(offset, response.next_offset)
                    backoff_s = RETRY_BACKOFF_MIN_S
                    give_up_at = time.monotonic() + READ_RETRY_S
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: fetch stream of {tp} ended"
                )
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, address)
            except asyncio.CancelledError:
                if task_is_stopping():
                    raise  # stopped by a seek, a reassignment or close
                # grpc.aio raises CancelledError for a call cancelled under it.
                error = HeadwaterError(
                    ErrorCode.NETWORK_EXCEPTION, f"{address}: fetch stream was cancelled"
                )
            finally:
                call.cancel()
            self._router.invalidate(tp.topic)  # the leader may have moved
            if not error.retriable or time.monotonic() + backoff_s > give_up_at:
                await self._arrivals.put((tp, generation, None, error))
                return
            await asyncio.sleep(backoff_s)
            backoff_s = min(backoff_s * 2, RETRY_BACKOFF_MAX_S)

    async def _start_readers(self) -> None:
        """A reader for every assigned partition without one, from its position."""
        for tp in self._positions:
            if tp not in self._readers:
                offset = await self.position(tp)
                generation = self._positions.generation(tp)
                task = asyncio.get_running_loop().create_task(self._read(tp, offset, generation))
                self._readers[tp] = task

    async def poll(self, timeout_ms: float = 1000) -> PollResult:
        """Batches that arrive within ``timeout_ms`` (possibly none). In a group, also
        where partitions are revoked and assigned (see ``subscribe``)."""
        deadline = time.monotonic() + max(timeout_ms, 0) / 1000
        if self._group is not None:
            return await self._poll_in_group(deadline)
        if not self._positions:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "no partitions assigned; call assign() first"
            )
        return await self._poll_until(deadline)

    async def _poll_in_group(self, deadline: float) -> PollResult:
        while True:
            await self._group_step()
            now = time.monotonic()
            if self._positions:
                result = await self._poll_until(min(deadline, now + GROUP_POLL_STEP_S))
                if result.batches or time.monotonic() >= deadline:
                    return result
            elif now >= deadline:
                return PollResult([])
            else:
                await asyncio.sleep(min(GROUP_POLL_STEP_S, deadline - now))

    async def _poll_until(self, deadline: float) -> PollResult:
        await self._start_readers()
        batches: list[FetchedBatch] = []
        try:
            if self._arrivals.empty():
                async with asyncio.timeout(max(deadline - time.monotonic(), 0)):
                    first = await self._arrivals.get()
            else:
                first = self._arrivals.get_nowait()
        except TimeoutError:
            return PollResult(batches)
        items = [first]
        while not self._arrivals.empty():
            items.append(self._arrivals.get_nowait())
        for tp, generation, arrival, error in items:
            position = self._positions.accept(tp, generation)
            if position is None:
                continue  # from before a seek or reassignment
            if error is not None:
                self._readers.pop(tp, None)
                if error.code != ErrorCode.OFFSET_OUT_OF_RANGE:
                    raise error
                await self._reset(tp, error)  # the next poll reads from the new position
                continue
            assert arrival is not None
            records, next_offset = arrival
            fetched, resume = fetched_from(tp, records, position, self.check_crcs)
            batches += fetched
            if resume is None:
                self._positions.advance(tp, next_offset)
            else:  # the rest of the answer is fetched again, by a new reader from ``resume``
                self.seek(tp, resume)
        return PollResult(batches)

    async def _stop_readers(self) -> None:
        for task in self._readers.values():
            task.cancel()
        for task in self._readers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._readers.clear()

    # ------------------------------------------------------------------ groups

    async def subscribe(
        self,
        topics: str | Sequence[str] | None = None,
        *,
        group_id: str | None = None,
        pattern: str | None = None,
        listener: RebalanceListener | None = None,
        enable_auto_commit: bool = True,
        auto_commit_interval_ms: int = 5000,
        instance_id: str = "",
        client_id: str = "",
        assignor: str = "",
        session_timeout_ms: int = 0,
        max_poll_interval_ms: int = 300_000,
    ) -> None:
        """Join consumer group ``group_id`` (default: the consumer's): the same options
        and semantics as the threaded ``Consumer.subscribe`` (docs/groups.md); the
        heartbeats run as a task on this event loop, and the listener is called from
        ``poll``."""
        subscription = subscription_of(
            self.group_id if group_id is None else group_id,
            topics,
            pattern,
            subscribed=self._group is not None,
            assigned=bool(self._positions),
            instance_id=instance_id,
            client_id=client_id,
            assignor=assignor,
            session_timeout_ms=session_timeout_ms,
            max_poll_interval_ms=max_poll_interval_ms,
        )
        calls = AsyncGroupCalls(
            self._router.channel, self.address, subscription.group_id, CONSUMER_CALL_TIMEOUT_S
        )
        membership = Membership(subscription)
        self._group = _AsyncGroup(
            calls,
            membership,
            HeartbeatTask(calls, membership, max_poll_interval_ms / 1000),
            listener,
            enable_auto_commit,
            auto_commit_interval_ms / 1000,
        )

    def _require_group(self) -> _AsyncGroup:
        if self._group is None:
            raise HeadwaterError(
                ErrorCode.INVALID_REQUEST, "this consumer is not in a group; call subscribe()"
            )
        return self._group

    async def _group_step(self) -> None:
        """Act on what the coordinator said since the last poll (see Membership)."""
        group = self._require_group()
        membership = group.membership
        group.heartbeats.polled()
        if group.heartbeats.error is not None:
            error, group.heartbeats.error = group.heartbeats.error, None
            raise error
        if group.auto_commit and time.monotonic() >= group.next_auto_commit_s:
            group.next_auto_commit_s = time.monotonic() + group.auto_commit_interval_s
            await self._commit_quietly(None)
        if membership.lost():
            gone = sorted(membership.owned)
            await self._drop(gone)
            if group.listener is not None:
                group.listener.on_lost(gone)
            membership.forget_owned(time.monotonic())
            group.last_committed.clear()
            group.heartbeats.wake()
        revoke = membership.to_revoke()
        if revoke:
            if group.listener is not None:
                group.listener.on_revoked(revoke)
            if group.auto_commit:
                await self._commit_quietly(revoke)
            await self._drop(revoke)
            membership.released(revoke, time.monotonic())
            group.heartbeats.wake()
        assign = membership.to_assign()
        if assign:
            # Owned from now on, before the call (see the threaded Consumer).
            membership.taken(assign)
            try:
                committed = await group.calls.committed(assign)
            except HeadwaterError:
                membership.released(assign, time.monotonic())
                raise
            self._positions.add(assign)
            for tp in assign:
                if tp in committed:
                    self.seek(tp, committed[tp].offset)
            if group.listener is not None:
                group.listener.on_assigned(assign)

    async def _drop(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            reader = self._readers.pop(tp, None)
            if reader is not None:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
        self._positions.remove(partitions)

    def _uncommitted(
        self, group: _AsyncGroup, partitions: Iterable[TopicPartition] | None
    ) -> dict[TopicPartition, int]:
        return uncommitted(self._positions.known(), group.last_committed, partitions)

    async def _commit_quietly(self, partitions: list[TopicPartition] | None) -> None:
        group = self._require_group()
        try:
            await self._commit_offsets(group, self._uncommitted(group, partitions))
        except HeadwaterError as error:
            _log.warning("auto-commit of group offsets failed: %s", error)

    async def _commit_offsets(self, group: _AsyncGroup, offsets: dict[TopicPartition, int]) -> None:
        """Commit ``offsets`` through the one commit in flight: offsets asked for while a
        commit is out are merged (the latest per partition) and sent together when it
        is back, so commits reach the coordinator in the order they were asked for (a
        partition's committed offset never goes back to an older request's) and many
        small commits cost one request per round trip."""
        if not offsets:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        group.commit_pending.update(offsets)
        group.commit_waiters.append(done)
        if group.committing is None:
            group.committing = asyncio.get_running_loop().create_task(self._send_commits(group))
        await asyncio.shield(done)

    async def _send_commits(self, group: _AsyncGroup) -> None:
        try:
            while group.commit_pending:
                offsets, group.commit_pending = group.commit_pending, {}
                waiters, group.commit_waiters = group.commit_waiters, []
                membership = group.membership
                try:
                    await group.calls.commit(offsets, membership.member_id, membership.member_epoch)
                except HeadwaterError as error:
                    for waiter in waiters:
                        if not waiter.done():
                            waiter.set_exception(error)
                    continue
                group.last_committed.update(offsets)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
        finally:
            group.committing = None

    async def commit(self, offsets: dict[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (the next offset to read per partition), or the positions of
        everything ``poll`` handed out, and wait until they are stored (replicated);
        CommitFailedError names partitions that were not."""
        group = self._require_group()
        await self._commit_offsets(
            group, self._uncommitted(group, None) if offsets is None else dict(offsets)
        )

    def commit_async(self, offsets: dict[TopicPartition, int] | None = None) -> asyncio.Task[None]:
        """``commit`` as a task: the positions are taken now; await the task (or not)."""
        group = self._require_group()
        snapshot = self._uncommitted(group, None) if offsets is None else dict(offsets)
        return asyncio.get_running_loop().create_task(self._commit_offsets(group, snapshot))

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, int | None]:
        """The group's committed offset of each partition (None where it has none)."""
        wanted = list(partitions)
        found = await self._require_group().calls.committed(wanted)
        return {tp: (found[tp].offset if tp in found else None) for tp in wanted}

    async def close(self) -> None:
        """In a group: commit (under auto-commit) and leave."""
        group = self._group
        if group is not None:
            if group.auto_commit:
                await self._commit_quietly(None)
            self._group = None
            await group.heartbeats.stop(leave=True)
        await self._stop_readers()
        await self._router.close()


@dataclass(slots=True)
class _AsyncGroup:
    calls: AsyncGroupCalls
    membership: Membership
    heartbeats: HeartbeatTask
    listener: RebalanceListener | None
    auto_commit: bool
    auto_commit_interval_s: float
    next_auto_commit_s: float = 0.0
    last_committed: dict[TopicPartition, int] = field(default_factory=dict)
    commit_pending: dict[TopicPartition, int] = field(default_factory=dict)
    commit_waiters: list[asyncio.Future[None]] = field(default_factory=list)
    committing: asyncio.Task[None] | None = None
