"""Proof of the cluster secret on the inter-broker listener.

The internal listener (``internal_listen``) serves the Controller and Replica services,
which only nodes of the cluster may call: a client that could call them could register
as an existing broker, heartbeat for it and join an ISR without holding its records.
Every call a node makes there carries the metadata key ``headwater-cluster-auth``::

    v1:<node id>:<unix ms>:<hex HMAC-SHA256(secret, "v1:<node id>:<unix ms>:<method>")>

and the listener refuses (UNAUTHENTICATED) a call whose token is missing, malformed,
more than ``TOKEN_SKEW_MS`` from its own clock, or not signed with the cluster secret
for that method, and logs the refusal with the caller's address (one WARNING per
``REFUSAL_LOG_INTERVAL_S``, counting the rest). The secret itself never travels. The
token proves membership, not confidentiality: a listener on the path could replay a
token for the same method within the skew window; mutual TLS closes that.

``token`` and ``verify`` are pure; the interceptors apply them to gRPC calls.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import grpc

from headwater.node import clock
from headwater.node.rpc.call_hooks import WrappedHandlers, around, service_and_method
from headwater.shared.errors import ErrorCode, GrpcCode, HeadwaterError
from headwater.shared.grpc_errors import to_status
from headwater.shared.log_limits import LogEvery

AUTH_KEY: Final = "headwater-cluster-auth"
TOKEN_SKEW_MS: Final = 5 * 60 * 1000
_VERSION: Final = "v1"
_TOKEN_BYTES_MAX: Final = 200
REFUSAL_LOG_INTERVAL_S: Final = 10.0
"""At most one WARNING per interval names a refused caller (with a count of the rest)."""
_log = logging.getLogger(__name__)

# grpc's interceptor classes are generic in its type stubs only.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor
    _UnaryUnary = grpc.aio.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.aio.UnaryStreamClientInterceptor


def _signature(secret: bytes, node_id: int, unix_ms: int, method: str) -> str:
    message = f"{_VERSION}:{node_id}:{unix_ms}:{method}".encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def token(secret: bytes, node_id: int, method: str, unix_ms: int) -> str:
    """The metadata value that proves ``secret`` for one call of ``method``."""
    return f"{_VERSION}:{node_id}:{unix_ms}:{_signature(secret, node_id, unix_ms, method)}"


def verify(secret: bytes, value: str, method: str, now_ms: int) -> str | None:
    """None when ``value`` proves ``secret`` for ``method`` at ``now_ms``; otherwise why
    not (for the refusal's message)."""
    if len(value) > _TOKEN_BYTES_MAX:
        return f"{AUTH_KEY} is longer than {_TOKEN_BYTES_MAX} characters"
    parts = value.split(":")
    if len(parts) != 4 or parts[0] != _VERSION:
        return f"{AUTH_KEY} is not {_VERSION}:<node id>:<unix ms>:<hmac>"
    try:
        node_id, unix_ms = int(parts[1]), int(parts[2])
    except ValueError:
        return f"{AUTH_KEY} has a node id or time that is not an integer"
    if abs(now_ms - unix_ms) > TOKEN_SKEW_MS:
        return (
            f"{AUTH_KEY} was made at {unix_ms}, more than {TOKEN_SKEW_MS} ms from this node's "
            f"clock ({now_ms}): check the clocks"
        )
    expected = _signature(secret, node_id, unix_ms, method)
    if not hmac.compare_digest(expected, parts[3]):
        return f"{AUTH_KEY} is not signed with this cluster's secret (cluster_secret)"
    return None


def _method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


# ----------------------------------------------------------------------------- server


def _refusal(
    handler: grpc.RpcMethodHandler[Any, Any],
    message: str,
    status: grpc.Status | None = None,
    log: LogEvery | None = None,
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same kind as ``handler`` that refuses with ``status``, by default
    UNAUTHENTICATED with ``message`` as CLUSTER_AUTHORIZATION_FAILED (the caller did not
    prove it is a node of the cluster: a client on the wrong port reads that, not an
    unknown server error); ``log`` (rate-limited) names the peer and why."""
    if status is None:
        refused = HeadwaterError(ErrorCode.CLUSTER_AUTHORIZATION_FAILED, message)
        status = to_status(refused, GrpcCode.UNAUTHENTICATED)
    answer = status

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if log is not None:
            log.log("refused an inter-broker call from %s: %s", context.peer(), message[:300])
        await context.abort(answer.code, answer.details, answer.trailing_metadata)

    kinds = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }
    make = kinds[(handler.request_streaming, handler.response_streaming)]
    return make(
        refuse,
        request_deserializer=handler.request_deserializer,
        response_serializer=handler.response_serializer,
    )


class RequireClusterSecret(_ServerInterceptor):
    """Refuses every call that does not prove the cluster secret (see the module
    docstring)."""

    def __init__(self, secret: bytes, now_ms: Callable[[], int] = clock.now_ms) -> None:
        self.secret = secret
        self.now_ms = now_ms
        self.refusals = LogEvery(_log, REFUSAL_LOG_INTERVAL_S)

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler: grpc.RpcMethodHandler[Any, Any] | None = await continuation(handler_call_details)
        if handler is None:
            return handler  # type: ignore[return-value]  # unknown method: UNIMPLEMENTED
        details: Any = handler_call_details
        method = _method_name(details.method)
        values = [v for k, v in (details.invocation_metadata or ()) if k == AUTH_KEY]
        problem: str | None
        if not values:
            problem = (
                f"{method} on the inter-broker listener is for the nodes of the cluster "
                f"only: the call lacks {AUTH_KEY}; clients connect to a node's client "
                "listener (its --listen address)"
            )
        else:
            value = values[0]
            problem = verify(
                self.secret,
                value.decode() if isinstance(value, bytes) else str(value),
                method,
                self.now_ms(),
            )
        if problem is None:
            return handler
        return _refusal(handler, problem, log=self.refusals)


FORWARDED_SERVICES: Final = ("headwater.v1.Broker", "headwater.v1.Admin", "headwater.v1.Groups")


class ForwardedCallLimit(_ServerInterceptor):
    """Bounds the calls other nodes forward to this one (the client services on the
    inter-broker listener) to ``calls_max`` at once, so that forwarded client load (long
    polls, acks=all produces, streams) can never take the calls that heartbeats,
    replication and ISR changes need on the same listener. A call beyond it is refused
    with THROTTLING_QUOTA_EXCEEDED (retriable), which the forwarding node passes on."""

    def __init__(self, calls_max: int) -> None:
        self.calls_max = calls_max
        self.open = 0
        self._wrapped = WrappedHandlers(lambda _method, handler: around(handler, self))

    def started(self, _context: Any) -> None:
        self.open += 1

    def ended(self, _state: None, _error: BaseException | None, _context: Any) -> None:
        self.open -= 1

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler: grpc.RpcMethodHandler[Any, Any] | None = await continuation(handler_call_details)
        method = _method_name(handler_call_details.method)
        if handler is None or service_and_method(method)[0] not in FORWARDED_SERVICES:
            return handler  # type: ignore[return-value]
        if self.open >= self.calls_max:
            error = HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"this node is serving {self.open} calls forwarded by other nodes, its limit "
                f"(concurrent_calls_max / 2 = {self.calls_max}); retry, or send requests to "
                "the partition's leader",
            )
            return _refusal(handler, str(error), to_status(error))
        return self._wrapped.of(method, handler)


# ----------------------------------------------------------------------------- client


class _Sign:
    def __init__(self, secret: bytes, node_id: int) -> None:
        self.secret = secret
        self.node_id = node_id

    def details(self, details: grpc.aio.ClientCallDetails) -> grpc.aio.ClientCallDetails:
        method = _method_name(details.method)
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add(AUTH_KEY, token(self.secret, self.node_id, method, clock.now_ms()))
        return grpc.aio.ClientCallDetails(
            details.method,
            details.timeout,
            metadata,
            details.credentials,
            details.wait_for_ready,
        )


class _SignUnaryUnary(_Sign, _UnaryUnary):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self.details(details), request)


class _SignUnaryStream(_Sign, _UnaryStream):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self.details(details), request)


def signing_interceptors(secret: bytes, node_id: int) -> list[Any]:
    """Interceptors for an aio channel to the internal listener of another node: its
    unary-unary and unary-stream calls signed. A stream-stream call is signed by its
    caller (``signed_metadata``): grpc.aio turns a call behind a stream-stream
    interceptor into one fed by a request iterator in a task of its own, which a call
    ending on a dead peer left pending ("Task was destroyed but it is pending!",
    "aclose(): asynchronous generator is already running", logged as ERROR by asyncio)."""
    return [_SignUnaryUnary(secret, node_id), _SignUnaryStream(secret, node_id)]


def signed_metadata(secret: bytes, node_id: int, method: str) -> tuple[tuple[str, str], ...]:
    """The metadata that signs one call of ``method`` (its full path,
    ``/headwater.v1.Replica/Fetch``) to another node's internal listener."""
    return ((AUTH_KEY, token(secret, node_id, method, clock.now_ms())),)
