"""The followers' side of replication: ``LeaderFetcher``, one per leader node, copies the
partitions that leader leads into this node's replicas over one fetch session
(``headwater.node.replicas.replica_service``).

When a replica becomes a follower, or its leader epoch changes, it asks the leader where
its own latest epoch ends and truncates its log there (a leader's unreplicated tail never
survives a leader change), moves to the leader's log start if it is behind it, and then
joins the session. ``ReplicaManager.reconcile`` (``headwater.node.replicas.replica_manager``)
starts and stops the fetchers and tells each which partitions to follow.

Everything here runs on the node's event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

import grpc

from headwater.node.clock import now_ms
from headwater.node.cluster.peers import peer_error
from headwater.node.replicas.following import Following
from headwater.node.replicas.partition import Partition
from headwater.node.tasks import cancel_and_wait
from headwater.shared.cancellation import task_is_stopping
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

if TYPE_CHECKING:
    from headwater.node.replicas.replica_manager import Key, ReplicaManager

T = TypeVar("T")
RETRY_S: Final = 0.2
# A follower gives up on a silent leader after this much more than the fetch wait, and on
# an OffsetForLeaderEpoch after CALL_TIMEOUT_S: a leader that died mid-call must not hold
# its partitions' replication for the 30 s of a general request timeout.
SILENCE_EXTRA_S: Final = 3.0
CALL_TIMEOUT_S: Final = 2.0
STREAM_END: Final[object] = grpc.aio.EOF  # type: ignore[attr-defined]
_log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Following:
    """A followed partition's steps (``Following``) and when to try it again."""

    steps: Following
    retry_at: float = 0.0

    @property
    def partition(self) -> Partition:
        return self.steps.partition

    @property
    def leader_epoch(self) -> int:
        return self.steps.leader_epoch


@dataclass(slots=True)
class LeaderFetcher:
    """Copies the partitions that ``leader_id`` leads into this node's replicas."""

    manager: ReplicaManager
    leader_id: int
    address: str
    following: dict[Key, _Following] = field(default_factory=dict)
    removed: set[Key] = field(default_factory=set)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            _log.error("replica fetcher for node %d stopped: %r", self.leader_id, task.exception())
        elif task.cancelled():
            _log.debug("replica fetcher for node %d was cancelled", self.leader_id)

    async def stop(self) -> None:
        await cancel_and_wait(self.task)

    def follow(self, partition: Partition, leader_epoch: int) -> None:
        key = (partition.topic, partition.index)
        current = self.following.get(key)
        if current is not None and current.steps.is_for(partition, self.leader_id, leader_epoch):
            return
        self.following[key] = _Following(Following(partition, self.leader_id, leader_epoch))
        self.removed.discard(key)
        self.changed.set()

    def unfollow(self, key: Key) -> None:
        if self.following.pop(key, None) is not None:
            self.removed.add(key)
            self.changed.set()

    async def _run(self) -> None:
        while True:
            if not self.following:
                self.changed.clear()
                await self.changed.wait()
                continue
            try:
                await self._session()
            except grpc.RpcError as error:
                _log.debug(
                    "replica fetch from node %d: %s",
                    self.leader_id,
                    peer_error(error, self.address),
                )
            except HeadwaterError as error:
                _log.debug("replica fetch from node %d: %s", self.leader_id, error)
            except asyncio.InvalidStateError as error:  # the call ended while writing to it
                _log.debug("replica fetch from node %d: %s", self.leader_id, error)
            except asyncio.CancelledError:
                if task_is_stopping():
                    raise  # this fetcher is being stopped
                # grpc.aio raises CancelledError for a call that was cancelled under it.
                _log.debug("replica fetch from node %d: the call was cancelled", self.leader_id)
            except Exception:
                # A fetcher must outlive any one failure, or its partitions stop replicating.
                _log.exception("replica fetch from node %d failed", self.leader_id)
            for entry in self.following.values():
                entry.steps.truncate_again()
            await asyncio.sleep(RETRY_S)

    async def _session(self) -> None:
        call = self.manager.peers.replica_fetch(self.address)
        silence_s = self.manager.config.replica_fetch_wait_ms_max / 1000 + SILENCE_EXTRA_S
        try:
            positions = await self._prepare_new()
            await self._within(call, silence_s, call.write(self._request(positions, True)))
            while True:
                response = await self._within(call, silence_s, call.read())
                if response is STREAM_END:
                    return
                assert isinstance(response, pb.ReplicaFetchResponse)
                positions = await self._apply(response)
                positions += await self._prepare_new()
                await self._within(call, silence_s, call.write(self._request(positions, True)))
        finally:
            call.cancel()

    async def _within(self, call: Any, seconds: float, step: Awaitable[T]) -> T:
        """Await one read or write of ``call``, cancelling the call if the leader stays
        silent for ``seconds``. (Cancelling the awaiting task is not enough: a grpc.aio
        read can outlive it.)"""
        fired = False

        def expire() -> None:
            nonlocal fired
            fired = True
            call.cancel()

        watchdog = asyncio.get_running_loop().call_later(seconds, expire)
        try:
            return await step
        except asyncio.CancelledError:
            if task_is_stopping():
                raise  # this fetcher is being stopped
            # grpc.aio raises CancelledError for a call that was cancelled under it.
            reason = "went silent" if fired else "cancelled the fetch"
            raise HeadwaterError(
                ErrorCode.REQUEST_TIMED_OUT, f"node {self.leader_id} {reason}"
            ) from None
        finally:
            watchdog.cancel()

    def _request(
        self, positions: list[pb.ReplicaFetchPosition], clear_removed: bool
    ) -> pb.ReplicaFetchRequest:
        removed = [pb.ReplicaPartition(topic=t, partition=p) for t, p in sorted(self.removed)]
        if clear_removed:
            self.removed.clear()
        config = self.manager.config
        return pb.ReplicaFetchRequest(
            replica_id=config.node_id,
            broker_epoch=self.manager.broker_epoch(),
            positions=positions,
            removed=removed,
            max_wait_ms=config.replica_fetch_wait_ms_max,
            max_bytes=config.replica_fetch_bytes_max,
        )

    async def _prepare_new(self) -> list[pb.ReplicaFetchPosition]:
        """Truncate every partition not yet in the session, all at once (a leader that
        went silent costs one CALL_TIMEOUT_S, not one per partition), and return the
        positions of those that are ready."""
        loop = asyncio.get_running_loop()
        waiting = [
            (key, entry)
            for key, entry in self.following.items()
            if not entry.steps.ready and loop.time() >= entry.retry_at
        ]
        if not waiting:
            return []
        outcomes = await asyncio.gather(
            *(self._truncate(entry) for _key, entry in waiting), return_exceptions=True
        )
        positions = []
        for (key, entry), outcome in zip(waiting, outcomes, strict=True):
            if isinstance(outcome, grpc.RpcError | HeadwaterError):
                error = (
                    peer_error(outcome, self.address)
                    if isinstance(outcome, grpc.RpcError)
                    else outcome
                )
                _log.debug("cannot start following %s-%d: %s", key[0], key[1], error)
                entry.retry_at = loop.time() + RETRY_S
                continue
            if isinstance(outcome, BaseException):
                raise outcome
            if self.following.get(key) is not entry:
                continue  # unfollowed or re-followed meanwhile
            positions.append(self._position(entry))
        return positions

    def _position(self, entry: _Following) -> pb.ReplicaFetchPosition:
        return pb.ReplicaFetchPosition(
            topic=entry.partition.topic,
            partition=entry.partition.index,
            leader_epoch=entry.leader_epoch,
            fetch_offset=entry.steps.fetch_offset,
        )

    async def _truncate(self, entry: _Following) -> None:
        """Cut the replica's log to where it agrees with the leader's: the rounds of
        ``Following`` (``headwater.node.replicas.following`` and ``follower_truncation``, which
        state the rules and invariants), each question sent as an OffsetForLeaderEpoch.
        Each answer is acted on only after ``_check_current`` confirms, on the loop and
        after the await that brought it, that this fetcher still follows the partition
        with this entry."""
        partition = entry.partition
        key = (partition.topic, partition.index)
        steps = entry.steps
        steps.begin_truncation()
        while True:
            asked = steps.question()
            response = await self.manager.peers.replica(self.address).OffsetForLeaderEpoch(
                pb.OffsetForLeaderEpochRequest(
                    topic=partition.topic,
                    partition=partition.index,
                    replica_id=self.manager.config.node_id,
                    current_leader_epoch=entry.leader_epoch,
                    leader_epoch=asked,
                ),
                timeout=CALL_TIMEOUT_S,
            )
            self._check_current(key, entry)
            cut = steps.answer(
                response.leader_epoch, response.end_offset, response.log_start_offset, now_ms()
            )
            if cut.after < cut.before:
                self.manager.counters.truncations += 1
                _log.info(
                    "%s-%d: truncated from %d to %d (leader epoch %d ends at %d on node %d, "
                    "leader epoch %d)",
                    key[0],
                    key[1],
                    cut.before,
                    cut.after,
                    response.leader_epoch,
                    response.end_offset,
                    self.leader_id,
                    entry.leader_epoch,
                )
            if cut.done:
                return

    def _check_current(self, key: Key, entry: _Following) -> None:
        """Raise FENCED_LEADER_EPOCH unless ``entry`` is still how this replica follows
        this leader (see ``Partition.check_following``)."""
        if self.following.get(key) is not entry:
            raise HeadwaterError(
                ErrorCode.FENCED_LEADER_EPOCH,
                f"{key[0]}-{key[1]}: no longer follows node {self.leader_id} at epoch "
                f"{entry.leader_epoch}",
            )
        entry.partition.check_following(self.leader_id, entry.leader_epoch)

    async def _apply(self, response: pb.ReplicaFetchResponse) -> list[pb.ReplicaFetchPosition]:
        """Append what arrived; return the positions that moved."""
        moved = []
        loop = asyncio.get_running_loop()
        for data in response.partitions:
            key = (data.topic, data.partition)
            entry = self.following.get(key)
            if entry is None:
                continue
            partition = entry.partition
            failed = data.error_code != pb.NONE
            was_ready = entry.steps.ready
            if not entry.steps.fetch_answered(failed):
                if was_ready and not entry.steps.ready:  # failed: back to truncation
                    _log.debug(
                        "%s-%d from node %d: %s", key[0], key[1], self.leader_id, data.error_message
                    )
                    entry.retry_at = loop.time() + RETRY_S
                continue  # or sent for an earlier leadership, or no longer followed
            records = data.records  # each read of a bytes field copies it
            if records:
                try:
                    if partition.fsync_on_append:
                        await asyncio.to_thread(partition.append_replicated, records, now_ms())
                    else:
                        partition.append_replicated(records, now_ms())
                except HeadwaterError as error:
                    _log.warning(
                        "%s-%d: cannot append from node %d: %s",
                        key[0],
                        key[1],
                        self.leader_id,
                        error,
                    )
                    entry.steps.truncate_again()
                    entry.retry_at = loop.time() + RETRY_S
                    self.removed.add(key)
                    continue
                moved.append(self._position(entry))
            entry.steps.appended(data.high_watermark)
        return moved
