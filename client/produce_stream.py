"""One ProduceStream call to a node: requests go out in order, answers come back in order.

The node answers every request of the stream, in arrival order, with one ProduceResponse
(errors included), so answers are matched to requests first-in first-out. When the stream
breaks (the node died, the connection dropped), every request still waiting is answered
with the transport error, which is retriable: the producer resends on a new stream.

Thread-safety: ``send`` may be called from any thread; ``on_answer`` runs on this
stream's reader thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Final, Generic, TypeVar

import grpc

from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

Token = TypeVar("Token")
CLOSE_JOIN_S: Final = 5.0


class ProduceStream(Generic[Token]):
    def __init__(
        self,
        stub: pb_grpc.BrokerStub,
        address: str,
        on_answer: Callable[[Token, pb.ProduceResponse | None, HeadwaterError | None], None],
    ) -> None:
        self.address = address
        self._on_answer = on_answer
        self._requests: queue.SimpleQueue[pb.ProduceRequest | None] = queue.SimpleQueue()
        self._pending: deque[tuple[Token, float]] = deque()  # (token, monotonic send time)
        self._lock = threading.Lock()
        self._broken: HeadwaterError | None = None
        self._call = stub.ProduceStream(self._outgoing())
        self._reader = threading.Thread(
            target=self._read, name=f"produce-stream-{address}", daemon=True
        )
        self._reader.start()

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def _outgoing(self) -> Iterator[pb.ProduceRequest]:
        while True:
            request = self._requests.get()
            if request is None:
                return
            yield request

    def send(self, request: pb.ProduceRequest, token: Token) -> bool:
        """Queue ``request``; False (and nothing queued) when the stream is broken."""
        with self._lock:
            if self._broken is not None:
                return False
            self._pending.append((token, time.monotonic()))
            self._requests.put(request)
            return True

    def oldest_wait_s(self, now: float) -> float:
        """Seconds the oldest unanswered request has waited (0 when none waits)."""
        with self._lock:
            return now - self._pending[0][1] if self._pending else 0.0

    def cancel(self) -> None:
        """Abandon the stream: everything unanswered fails with a retriable error."""
        self._call.cancel()  # type: ignore[no-untyped-call]

    def _read(self) -> None:
        error: HeadwaterError
        try:
            for response in self._call:
                with self._lock:
                    token, _sent = self._pending.popleft()
                self._on_answer(token, response, None)
        except grpc.RpcError as exc:
            error = from_rpc_error(exc, self.address)
        else:
            error = HeadwaterError(
                ErrorCode.NETWORK_EXCEPTION, f"{self.address}: produce stream closed"
            )
        with self._lock:
            self._broken = error
            waiting = [token for token, _sent in self._pending]
            self._pending.clear()
        for token in waiting:
            self._on_answer(token, None, error)

    def close(self) -> None:
        """End the stream after what was sent is answered; wait briefly for the reader."""
        self._requests.put(None)
        self._reader.join(CLOSE_JOIN_S)
        if self._reader.is_alive():
            self._call.cancel()  # type: ignore[no-untyped-call]
