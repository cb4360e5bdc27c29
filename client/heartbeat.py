"""The threaded consumer's heartbeat thread: keeps the member in its group while the
application processes records (the threaded engine's driver of ``Membership``).

The thread sends each heartbeat when it is due (or at once when the poll thread releases
partitions), and records the coordinator's answers in the ``Membership`` under ``lock``;
the poll thread acts on them at its next poll (revoking, assigning). When the application
does not poll for ``max_poll_interval_ms``, the thread leaves the group (its partitions
go to other members) and the next poll joins again, as Kafka's consumer does.
"""

from __future__ import annotations

import logging
import threading
import time

from headwater.client.groups import GroupCalls
from headwater.client.membership import FENCING_ERRORS, SESSION_EXPIRED, Membership
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

_log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.5


class HeartbeatThread:
    def __init__(
        self, calls: GroupCalls, membership: Membership, max_poll_interval_s: float
    ) -> None:
        self.calls = calls
        self.membership = membership
        self.max_poll_interval_s = max_poll_interval_s
        self.lock = threading.Lock()
        self.error: HeadwaterError | None = None
        """A heartbeat error that retrying cannot fix; the next poll raises it."""
        self._last_poll_s = time.monotonic()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"heartbeat-{calls.group_id}", daemon=True
        )
        self._thread.start()

    def polled(self) -> None:
        with self.lock:
            self._last_poll_s = time.monotonic()

    def wake(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            leave: pb.ConsumerGroupHeartbeatRequest | None = None
            request: pb.ConsumerGroupHeartbeatRequest | None = None
            wait_s = 0.0
            with self.lock:
                now = time.monotonic()
                membership = self.membership
                if membership.lost():  # until the poll thread has given its partitions up
                    wait_s = IDLE_WAIT_S
                elif now - self._last_poll_s > self.max_poll_interval_s:
                    leave = self._leave_for_poll_timeout()
                elif membership.session_expired(now):
                    _log.warning(
                        "group %r: no heartbeat succeeded for the session timeout; giving the "
                        "partitions up",
                        self.calls.group_id,
                    )
                    membership.failed(SESSION_EXPIRED, now)
                elif membership.due(now):
                    request = membership.request()
                else:
                    wait_s = min(max(membership.next_heartbeat_s - now, 0.001), IDLE_WAIT_S)
            if leave is not None:
                self._send_quietly(leave)
            elif request is not None:
                self._heartbeat(request)
            elif wait_s:
                self._wake.wait(wait_s)
                self._wake.clear()

    def _heartbeat(self, request: pb.ConsumerGroupHeartbeatRequest) -> None:
        sent_s = time.monotonic()
        try:
            response = self.calls.heartbeat(request)
        except HeadwaterError as error:
            with self.lock:
                self.membership.failed(error, time.monotonic())
                if not error.retriable and error.code not in FENCING_ERRORS:
                    self.error = error
            if error.retriable:
                _log.debug("heartbeat of group %r: %s", self.calls.group_id, error)
            return
        with self.lock:
            if not self.membership.lost():
                self.membership.answered(response, time.monotonic(), sent_s)

    def _send_quietly(self, request: pb.ConsumerGroupHeartbeatRequest) -> None:
        try:
            self.calls.heartbeat(request)
        except HeadwaterError as error:
            _log.debug("leaving group %r: %s", self.calls.group_id, error)

    def _leave_for_poll_timeout(self) -> pb.ConsumerGroupHeartbeatRequest | None:
        """Under ``lock``: the application stopped polling; leave so that the group goes
        on without it (the partitions it holds count as lost at its next poll). Returns
        the leave heartbeat to send."""
        _log.warning(
            "group %r: no poll for %.0f s (max_poll_interval_ms); leaving the group",
            self.calls.group_id,
            self.max_poll_interval_s,
        )
        request = self.membership.leave_request()
        self.membership.failed(
            HeadwaterError(ErrorCode.UNKNOWN_MEMBER_ID, "left the group: no poll in time"),
            time.monotonic(),
        )
        return request

    def stop(self, leave: bool) -> None:
        """Stop heartbeating; with ``leave``, leave the group first."""
        self._stopped.set()
        self._wake.set()
        self._thread.join()
        if leave:
            with self.lock:
                request = self.membership.leave_request()
            if request is not None:
                try:
                    self.calls.call("ConsumerGroupHeartbeat", request, retry_s=2.0)
                except HeadwaterError as error:
                    _log.info("leaving group %r: %s", self.calls.group_id, error)
