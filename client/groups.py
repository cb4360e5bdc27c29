"""Calls to a consumer group's coordinator (the threaded client's I/O edge for groups).

``GroupCalls`` finds the coordinator once (FindCoordinator on any node), calls it
directly, and finds it again after NOT_COORDINATOR or a transport error; any node would
forward the call, so a stale coordinator costs a hop at worst. Retriable errors are
retried with backoff up to the request timeout.

Thread-safety: every method may be called from any thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Final, TypeVar

import grpc

from headwater.client.connection import Cluster
from headwater.client.membership import topic_partitions
from headwater.client.positions import TopicPartition
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb

T = TypeVar("T")
REFIND_ERRORS: Final = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
    }
)
BACKOFF_MIN_S: Final = 0.05
BACKOFF_MAX_S: Final = 1.0


class CommitFailedError(HeadwaterError):
    """Some partitions' offsets were not stored; ``failures`` names each one's error."""

    def __init__(self, failures: Mapping[TopicPartition, HeadwaterError]) -> None:
        first = next(iter(failures.values()))
        super().__init__(
            first.code,
            f"{len(failures)} offset(s) not committed; first: {first.message}",
        )
        self.failures = dict(failures)


def commit_request(
    group_id: str, offsets: Mapping[TopicPartition, int], member_id: str, member_epoch: int
) -> pb.OffsetCommitRequest:
    return pb.OffsetCommitRequest(
        group_id=group_id,
        member_id=member_id,
        member_epoch=member_epoch,
        offsets=[
            pb.OffsetCommitPartition(topic=tp.topic, partition=tp.partition, offset=o)
            for tp, o in sorted(offsets.items())
        ],
    )


def raise_failures(response: pb.OffsetCommitResponse) -> None:
    """CommitFailedError for the partitions an OffsetCommit did not store."""
    failures = {
        TopicPartition(r.topic, r.partition): HeadwaterError(
            ErrorCode(r.error_code), r.error_message
        )
        for r in response.results
        if r.error_code
    }
    if failures:
        raise CommitFailedError(failures)


def committed_of(response: pb.OffsetFetchResponse) -> dict[TopicPartition, pb.CommittedOffset]:
    return {TopicPartition(o.topic, o.partition): o for o in response.offsets if o.offset >= 0}


class GroupCalls:
    def __init__(self, cluster: Cluster, group_id: str) -> None:
        self.cluster = cluster
        self.group_id = group_id
        self._lock = threading.Lock()
        self._coordinator = ""

    def _address(self) -> str:
        with self._lock:
            if self._coordinator:
                return self._coordinator
        found: pb.FindCoordinatorResponse = self.cluster.call_any(
            lambda a: self.cluster.groups(a).FindCoordinator(
                pb.FindCoordinatorRequest(group_id=self.group_id),
                timeout=self.cluster.request_timeout_s,
            ),
            retry_s=self.cluster.request_timeout_s,
        )
        with self._lock:
            self._coordinator = found.address or self.cluster.bootstrap[0]
            return self._coordinator

    def call(self, method: str, request: object, retry_s: float | None = None) -> T:  # type: ignore[type-var]
        """``method`` on the coordinator; retriable errors retried for up to ``retry_s``
        (the request timeout when None; 0: no retry)."""
        retry = self.cluster.request_timeout_s if retry_s is None else retry_s
        deadline = time.monotonic() + retry
        backoff = BACKOFF_MIN_S
        while True:
            address = ""
            try:
                address = self._address()
                stub: Callable[..., T] = getattr(self.cluster.groups(address), method)
                return stub(request, timeout=self.cluster.request_timeout_s)
            except grpc.RpcError as exc:
                error = from_rpc_error(exc, address or "the cluster")
            except HeadwaterError as exc:
                error = exc
            if error.code in REFIND_ERRORS:
                with self._lock:
                    self._coordinator = ""
            if not error.retriable or time.monotonic() + backoff > deadline:
                raise error
            time.sleep(backoff)
            backoff = min(backoff * 2, BACKOFF_MAX_S)

    # ------------------------------------------------------------------ offsets

    def commit(
        self,
        offsets: Mapping[TopicPartition, int],
        member_id: str = "",
        member_epoch: int = -1,
        retry_s: float | None = None,
    ) -> None:
        """Store ``offsets``; CommitFailedError names the partitions that were not stored."""
        if not offsets:
            return
        request = commit_request(self.group_id, offsets, member_id, member_epoch)
        raise_failures(self.call("OffsetCommit", request, retry_s))

    def committed(
        self, partitions: Iterable[TopicPartition] = ()
    ) -> dict[TopicPartition, pb.CommittedOffset]:
        """Committed offsets (of ``partitions``, or every one the group has); partitions
        without one are left out."""
        request = pb.OffsetFetchRequest(
            group_id=self.group_id, partitions=topic_partitions(partitions)
        )
        return committed_of(self.call("OffsetFetch", request))

    def heartbeat(
        self, request: pb.ConsumerGroupHeartbeatRequest
    ) -> pb.ConsumerGroupHeartbeatResponse:
        """One heartbeat, not retried (the member's loop retries on its own schedule)."""
        response: pb.ConsumerGroupHeartbeatResponse = self.call(
            "ConsumerGroupHeartbeat", request, retry_s=0
        )
        return response
