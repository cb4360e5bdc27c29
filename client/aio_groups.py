"""Consumer groups for the AsyncConsumer: calls to the coordinator on grpc.aio, and the
heartbeat task (the asyncio engine's driver of ``Membership``; the threaded engine's is
``headwater.client.heartbeat``). Both run on the application's event loop, so the
membership needs no lock: the task records the coordinator's answers and the consumer's
``poll`` acts on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

import grpc

from headwater.client.groups import (
    BACKOFF_MAX_S,
    BACKOFF_MIN_S,
    REFIND_ERRORS,
    commit_request,
    committed_of,
    raise_failures,
)
from headwater.client.membership import (
    FENCING_ERRORS,
    SESSION_EXPIRED,
    Membership,
    topic_partitions,
)
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

_log = logging.getLogger(__name__)
IDLE_WAIT_S: Final = 0.5


class AsyncGroupCalls:
    """The coordinator of ``group_id``, found through ``bootstrap_address`` and called
    directly (found again after NOT_COORDINATOR or a transport error)."""

    def __init__(
        self,
        channel: Callable[[str], grpc.aio.Channel],
        bootstrap_address: str,
        group_id: str,
        timeout_s: float,
    ) -> None:
        self._channel = channel
        self.bootstrap_address = bootstrap_address
        self.group_id = group_id
        self.timeout_s = timeout_s
        self._coordinator = ""
        self._stubs: dict[str, pb_grpc.GroupsAsyncStub] = {}

    def _stub(self, address: str) -> pb_grpc.GroupsAsyncStub:
        stub = self._stubs.get(address)
        if stub is None:  # building one costs tens of microseconds: keep them
            stub = self._stubs[address] = pb_grpc.GroupsStub(self._channel(address))
        return stub

    async def call(self, method: str, request: Any, retry_s: float | None = None) -> Any:
        retry = self.timeout_s if retry_s is None else retry_s
        deadline = time.monotonic() + retry
        backoff = BACKOFF_MIN_S
        while True:
            address = self._coordinator or self.bootstrap_address
            try:
                if not self._coordinator:
                    found = await self._stub(self.bootstrap_address).FindCoordinator(
                        pb.FindCoordinatorRequest(group_id=self.group_id), timeout=self.timeout_s
                    )
                    self._coordinator = found.address or self.bootstrap_address
                    address = self._coordinator
                return await getattr(self._stub(address), method)(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, address)
            if error.code in REFIND_ERRORS:
                self._coordinator = ""
            if not error.retriable or time.monotonic() + backoff > deadline:
                raise error
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    async def commit(
        self, offsets: Mapping[TopicPartition, int], member_id: str, member_epoch: int
    ) -> None:
        if offsets:
            request = commit_request(self.group_id, offsets, member_id, member_epoch)
            raise_failures(await self.call("OffsetCommit", request))

    async def committed(
        self, partitions: Iterable[TopicPartition]
    ) -> dict[TopicPartition, pb.CommittedOffset]:
        request = pb.OffsetFetchRequest(
            group_id=self.group_id, partitions=topic_partitions(partitions)
        )
        return committed_of(await self.call("OffsetFetch", request))


class HeartbeatTask:
    """Heartbeats when due (or at once after ``wake``); leaves the group when the
    application has not polled for ``max_poll_interval_s`` (the next poll joins again)."""

    def __init__(
        self, calls: AsyncGroupCalls, membership: Membership, max_poll_interval_s: float
    ) -> None:
        self.calls = calls
        self.membership = membership
        self.max_poll_interval_s = max_poll_interval_s
        self.error: HeadwaterError | None = None
        self._last_poll_s = time.monotonic()
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def polled(self) -> None:
        self._last_poll_s = time.monotonic()

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        membership = self.membership
        while True:
            now = time.monotonic()
            if now - self._last_poll_s > self.max_poll_interval_s and not membership.lost():
                _log.warning(
                    "group %r: no poll for %.0f s (max_poll_interval_ms); leaving the group",
                    self.calls.group_id,
                    self.max_poll_interval_s,
                )
                leave = membership.leave_request()
                membership.failed(
                    HeadwaterError(ErrorCode.UNKNOWN_MEMBER_ID, "left: no poll in time"), now
                )
                if leave is not None:
                    await self._send_quietly(leave)
                continue
            if membership.session_expired(now):
                _log.warning(
                    "group %r: no heartbeat succeeded for the session timeout; giving the "
                    "partitions up",
                    self.calls.group_id,
                )
                membership.failed(SESSION_EXPIRED, now)
                continue
            if not membership.due(now):
                wait_s = (
                    IDLE_WAIT_S
                    if membership.lost()
                    else min(max(membership.next_heartbeat_s - now, 0.001), IDLE_WAIT_S)
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(wait_s):
                        await self._wake.wait()
                self._wake.clear()
                continue
            request = membership.request()
            sent_s = time.monotonic()
            try:
                response = await self.calls.call("ConsumerGroupHeartbeat", request, retry_s=0)
            except HeadwaterError as error:
                membership.failed(error, time.monotonic())
                if not error.retriable and error.code not in FENCING_ERRORS:
                    self.error = error
                continue
            if not membership.lost():
                membership.answered(response, time.monotonic(), sent_s)

    async def _send_quietly(self, request: pb.ConsumerGroupHeartbeatRequest) -> None:
        try:
            await self.calls.call("ConsumerGroupHeartbeat", request, retry_s=0)
        except HeadwaterError as error:
            _log.debug("leaving group %r: %s", self.calls.group_id, error)

    async def stop(self, leave: bool) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        request = self.membership.leave_request() if leave else None
        if request is not None:
            try:
                await self.calls.call("ConsumerGroupHeartbeat", request, retry_s=2.0)
            except HeadwaterError as error:
                _log.info("leaving group %r: %s", self.calls.group_id, error)
