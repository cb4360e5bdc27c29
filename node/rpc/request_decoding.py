"""Requests that do not decode are refused with INVALID_REQUEST, never a traceback; a
client that went away before its answer is a WARNING line, never a traceback.

grpc.aio decodes a request with the handler's ``request_deserializer`` before the
servicer runs; a DecodeError there (garbage bytes, invalid UTF-8 in a string field) ends
the call with UNKNOWN "Unexpected <class 'DecodeError'>" and logs an ERROR with a
traceback for every such call, which any client can use to flood the log.
``DecodeRequests`` (a server interceptor, on both listeners, every service: Health and
reflection too) gives every handler a deserializer that returns an ``Undecodable``
marker instead of raising, and a behaviour that ends a call given one with
INVALID_REQUEST naming the message type and the parse error. For client streams each
message is checked as the servicer takes it. One WARNING line per
``WARNING_INTERVAL_S`` says how many were refused and the last one's method and peer.

grpc's own log has two more ERROR records with a traceback that any client can cause
and that say nothing about the node: "ExecuteBatchError raised in core by servicer
method" when an answer cannot be sent because the client is gone (its deadline passed,
it closed the connection), and "Invalid encoding on b'...'" when a call's metadata value
is not UTF-8 (logged twice per call, quoting the value: an ``authorization`` header's
bytes would land in the log). ``quiet_grpc_log`` turns each kind into one WARNING per
``WARNING_INTERVAL_S`` that counts the rest, without the traceback or the value.

Runs on the node's event loop; the warning's counters are that loop's.
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from headwater.node.rpc.call_hooks import WrappingInterceptor
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import abort, bounded_message

WARNING_INTERVAL_S: Final = 10.0
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Undecodable:
    """What a request's bytes gave instead of a message."""

    problem: str


def safe_deserializer(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
    def decode(data: bytes) -> Any:
        if deserializer is None:
            return data
        try:
            return deserializer(data)
        except Exception as exc:  # a decoder's every failure means the bytes are bad
            return Undecodable(bounded_message(f"{type(exc).__name__}: {exc}"))

    return decode


class _Warnings:
    """At most one WARNING per WARNING_INTERVAL_S, counting what it left out."""

    def __init__(self) -> None:
        self.next_at = 0.0
        self.left_out = 0

    def refused(self, method: str, context: Any, problem: str) -> None:
        now = time.monotonic()
        if now < self.next_at:
            self.left_out += 1
            return
        self.next_at = now + WARNING_INTERVAL_S
        more = f" (and {self.left_out} more since the last warning)" if self.left_out else ""
        self.left_out = 0
        _log.warning(
            "refused an undecodable request to %s from %s: %s%s",
            method,
            context.peer(),
            problem,
            more,
        )


GRPC_LOGGER: Final = "grpc._cython.cygrpc"
CLIENT_GONE_PREFIX: Final = "ExecuteBatchError raised in core by servicer method"
INVALID_ENCODING_PREFIX: Final = "Invalid encoding on"


class _Quieted:
    """One kind of grpc record: its replacement text, and when the next may pass."""

    def __init__(self, prefix: str, rewrite: Callable[[str], str]) -> None:
        self.prefix = prefix
        self.rewrite = rewrite
        self.next_at = 0.0
        self.left_out = 0


class GrpcLogFilter(logging.Filter):
    """See the module docstring (a filter on grpc's logger: of each kind it keeps one
    record per interval, rewritten as a WARNING, and drops the rest)."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds = (
            _Quieted(
                CLIENT_GONE_PREFIX,
                lambda message: (
                    "a client went away before its answer to "
                    f"{message[len(CLIENT_GONE_PREFIX) :].strip()[:200]} was sent"
                ),
            ),
            _Quieted(
                INVALID_ENCODING_PREFIX,
                lambda _message: "refused a call whose metadata value is not UTF-8",
            ),
        )

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        kind = next((k for k in self.kinds if message.startswith(k.prefix)), None)
        if kind is None:
            return True
        now = time.monotonic()
        if now < kind.next_at:
            kind.left_out += 1
            return False
        kind.next_at = now + WARNING_INTERVAL_S
        more = f" (and {kind.left_out} more since the last warning)" if kind.left_out else ""
        kind.left_out = 0
        record.msg = "%s%s"
        record.args = (kind.rewrite(message), more)
        record.levelno, record.levelname = logging.WARNING, "WARNING"
        record.exc_info = record.exc_text = None
        return True


def quiet_grpc_log() -> None:
    """Install ``GrpcLogFilter`` on grpc's logger (once)."""
    logger = logging.getLogger(GRPC_LOGGER)
    if not any(isinstance(f, GrpcLogFilter) for f in logger.filters):
        logger.addFilter(GrpcLogFilter())


class DecodeRequests(WrappingInterceptor):
    """See the module docstring."""

    def __init__(self) -> None:
        self.warnings = _Warnings()
        super().__init__(self._wrap)

    def _refusal(self, method: str, context: Any, request: Undecodable) -> HeadwaterError:
        self.warnings.refused(method, context, request.problem)
        return HeadwaterError(
            ErrorCode.INVALID_REQUEST,
            f"the request to {method} does not decode as its message type: {request.problem}",
        )

    def _wrap(self, method: str, handler: Any) -> grpc.RpcMethodHandler[Any, Any]:
        serializers = {
            "request_deserializer": safe_deserializer(handler.request_deserializer),
            "response_serializer": handler.response_serializer,
        }
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._unary(method, handler.unary_unary), **serializers
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._unary(method, handler.unary_stream), **serializers
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._streamed(method, handler.stream_unary), **serializers
            )
        return grpc.stream_stream_rpc_method_handler(
            self._streamed(method, handler.stream_stream), **serializers
        )

    def _unary(self, method: str, behaviour: Any) -> Any:
        """The behaviour, refusing an Undecodable request before it runs; of the same
        kind (an async generator function stays one, anything else becomes a coroutine
        function), as grpc.aio tells them apart."""
        if inspect.isasyncgenfunction(behaviour):

            async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
                if isinstance(request, Undecodable):
                    await abort(context, self._refusal(method, context, request))
                async for response in behaviour(request, context):
                    yield response

            return stream

        async def call(request: Any, context: Any) -> Any:
            if isinstance(request, Undecodable):
                await abort(context, self._refusal(method, context, request))
            result = behaviour(request, context)
            return await result if inspect.isawaitable(result) else result

        return call

    def _streamed(self, method: str, behaviour: Any) -> Any:
        """The behaviour, given the client's messages through a check that ends the call
        at the first Undecodable one (of the same kind, as ``_unary``)."""
        if inspect.isasyncgenfunction(behaviour):

            async def stream(requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
                async for response in behaviour(self._checked(method, requests, context), context):
                    yield response

            return stream

        async def call(requests: AsyncIterator[Any], context: Any) -> Any:
            result = behaviour(self._checked(method, requests, context), context)
            return await result if inspect.isawaitable(result) else result

        return call

    async def _checked(
        self, method: str, requests: AsyncIterator[Any], context: Any
    ) -> AsyncIterator[Any]:
        async for request in requests:
            if isinstance(request, Undecodable):
                await abort(context, self._refusal(method, context, request))
            yield request
