"""Run code around every call of a gRPC method handler, whatever its kind: the one place
that knows how grpc.aio handlers look, for the server interceptors that count calls
(``headwater.node.ops.metrics``) and bound them (``ForwardedCallLimit``).

A handler's behaviour is one of: a coroutine function (unary answers, and streaming ones
that write with ``context.write``, as grpc's own Health.Watch and the refusals of
``headwater.node.security.cluster_auth`` do), a plain function, or an async generator function
(streaming answers that ``yield``). ``around(handler, hooks)`` returns a handler of the
same kind that calls ``hooks.started()`` before the behaviour and
``hooks.ended(state, error, context)`` once after it, with the exception it ended with
(None when it ended normally; GeneratorExit or CancelledError when the client went away).
``hooks.started(context)`` may refuse the call by raising HeadwaterError: the call then
ends with that error's status, the behaviour never runs, and ``ended`` is not called. It
may return an awaitable of its state, to hold the call back (a request quota).
Client-streaming handlers (no method of Headwater's has one) are returned unwrapped.
"""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import grpc

from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import abort

State = TypeVar("State")

# grpc's interceptor class is generic in its type stubs only.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.aio.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.aio.ServerInterceptor


class CallHooks(Protocol, Generic[State]):
    def started(self, context: Any) -> State: ...

    def ended(self, state: State, error: BaseException | None, context: Any) -> None: ...


def around(handler: Any, hooks: CallHooks[Any]) -> grpc.RpcMethodHandler[Any, Any]:
    """``handler`` with ``hooks`` run around each call (see the module docstring)."""
    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.unary_unary is not None:
        return grpc.unary_unary_rpc_method_handler(
            _around_unary(handler.unary_unary, hooks), **serializers
        )
    for streaming, make in (
        (handler.unary_stream, grpc.unary_stream_rpc_method_handler),
        (handler.stream_stream, grpc.stream_stream_rpc_method_handler),
    ):
        if streaming is not None:
            behaviour = (
                _around_generator(streaming, hooks)
                if inspect.isasyncgenfunction(streaming)
                else _around_unary(streaming, hooks)
            )
            return make(behaviour, **serializers)
    return handler  # type: ignore[no-any-return]


def _around_unary(inner: Any, hooks: CallHooks[Any]) -> Any:
    async def call(request: Any, context: Any) -> Any:
        try:
            state = hooks.started(context)
            if inspect.isawaitable(state):
                state = await state
        except HeadwaterError as refusal:
            return await abort(context, refusal)
        try:
            result = inner(request, context)
            if inspect.isawaitable(result):
                result = await result
        except BaseException as exc:
            hooks.ended(state, exc, context)
            raise
        hooks.ended(state, None, context)
        return result

    return call


def _around_generator(inner: Any, hooks: CallHooks[Any]) -> Any:
    async def call(request: Any, context: Any) -> AsyncIterator[Any]:
        try:
            state = hooks.started(context)
            if inspect.isawaitable(state):
                state = await state
        except HeadwaterError as refusal:
            await abort(context, refusal)
        try:
            async for response in inner(request, context):
                yield response
        except BaseException as exc:
            hooks.ended(state, exc, context)
            raise
        hooks.ended(state, None, context)

    return call


def service_and_method(method: str) -> tuple[str, str]:
    """("headwater.v1.Broker", "Produce") of the gRPC path "/headwater.v1.Broker/Produce"."""
    service, _, name = method.lstrip("/").partition("/")
    return service, name


class WrappedHandlers:
    """Each method's handler wrapped once by ``wrap(method, handler)`` and kept, so that
    an interceptor does not wrap again on every call (a handler object the server hands
    out anew is wrapped anew)."""

    def __init__(self, wrap: Callable[[str, Any], grpc.RpcMethodHandler[Any, Any]]) -> None:
        self.wrap = wrap
        self._wrapped: dict[str, tuple[Any, grpc.RpcMethodHandler[Any, Any]]] = {}

    def of(self, method: str, handler: Any) -> grpc.RpcMethodHandler[Any, Any]:
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self.wrap(method, handler))
        return cached[1]


def method_name(method: str | bytes) -> str:
    return method.decode() if isinstance(method, bytes) else method


class WrappingInterceptor(_ServerInterceptor):
    """A server interceptor that gives each method's handler, wrapped once by ``wrap``
    (``WrappedHandlers``), for every method ``skip`` does not name."""

    def __init__(self, wrap: Callable[[str, Any], grpc.RpcMethodHandler[Any, Any]]) -> None:
        self._wrapped = WrappedHandlers(wrap)

    def skip(self, method: str) -> bool:  # noqa: ARG002 (subclasses look at it)
        """Should calls of ``method`` run unwrapped?"""
        return False

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler: grpc.RpcMethodHandler[Any, Any] | None = await continuation(handler_call_details)
        method = method_name(handler_call_details.method)
        if handler is None or self.skip(method):
            return handler  # type: ignore[return-value]  # unknown method: UNIMPLEMENTED
        return self._wrapped.of(method, handler)


class HooksInterceptor(WrappingInterceptor):
    """A server interceptor that is its own ``CallHooks``: subclasses define ``started``
    and ``ended``, which run around every call of every method ``skip`` does not name."""

    def __init__(self) -> None:
        hooks: Any = self  # a CallHooks once a subclass defines started and ended
        super().__init__(lambda _method, handler: around(handler, hooks))


_log = logging.getLogger(__name__)
Handler = TypeVar("Handler", bound=Callable[..., Any])


def rpc_handler(method: Handler) -> Handler:
    """Make a unary handler (plain or coroutine) an asyncio one that turns HeadwaterError
    into a gRPC status, and logs and masks anything unexpected."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            result = method(self, request, context)
            return await result if inspect.isawaitable(result) else result
        except HeadwaterError as error:
            failure = error
        except Exception as exc:
            _log.exception("%s failed", method.__name__)
            failure = HeadwaterError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"internal error in {method.__name__}: {type(exc).__name__}: {exc}",
            )
        return await abort(context, failure)

    return wrapper  # type: ignore[return-value]
