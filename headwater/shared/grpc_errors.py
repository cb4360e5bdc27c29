"""HeadwaterError <-> gRPC status, in both directions (the one place that does it).

On the wire an error is a gRPC status with code ``GRPC_STATUS_OF[error_code]``, the
message ``"<CODE_NAME>: <message>"``, and one ``google.rpc.ErrorInfo`` detail: reason =
the ErrorCode name, domain = "headwater.v1", metadata ``code`` (the number) and
``retriable`` ("true"/"false").
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any, Final, NoReturn

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from headwater.shared.errors import (
    ERROR_DOMAIN,
    GRPC_STATUS_OF,
    ErrorCode,
    GrpcCode,
    HeadwaterError,
)
from headwater.shared.tls import handshake_failure

_TRANSPORT_CODES = {
    grpc.StatusCode.UNAVAILABLE: ErrorCode.NETWORK_EXCEPTION,
    grpc.StatusCode.DEADLINE_EXCEEDED: ErrorCode.REQUEST_TIMED_OUT,
    grpc.StatusCode.CANCELLED: ErrorCode.NETWORK_EXCEPTION,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ErrorCode.INVALID_REQUEST,
}


ABORTED_WITH: Final[ContextVar[ErrorCode | None]] = ContextVar(
    "headwater_aborted_with", default=None
)
"""The ErrorCode the current call was ended with by ``abort`` (in the call's own context:
the server's metrics interceptor reads it to label the error)."""


STATUS_MESSAGE_BYTES_MAX: Final = 1024
"""The longest status message sent (UTF-8 bytes): with its copy in the details trailer,
percent- and base64-encoded, it stays far below gRPC's 16 KiB metadata limit."""


def bounded_message(message: str) -> str:
    """``message`` cut to STATUS_MESSAGE_BYTES_MAX bytes of UTF-8 (at a character
    boundary), "..." marking the cut."""
    data = message.encode()
    if len(data) <= STATUS_MESSAGE_BYTES_MAX:
        return message
    return data[: STATUS_MESSAGE_BYTES_MAX - 3].decode(errors="ignore") + "..."


def to_status(error: HeadwaterError, grpc_code: GrpcCode | None = None) -> grpc.Status:
    """``error`` as a gRPC status: its code's gRPC status (``grpc_code`` instead, where
    the call's own status must say more than the error code's), the message, and the
    error code in an ErrorInfo detail that ``from_rpc_error`` reads back."""
    info = error_details_pb2.ErrorInfo(
        reason=error.code.name,
        domain=ERROR_DOMAIN,
        metadata={"code": str(int(error.code)), "retriable": str(error.retriable).lower()},
    )
    detail = any_pb2.Any()
    detail.Pack(info)
    status = status_pb2.Status(
        code=int(GRPC_STATUS_OF[error.code] if grpc_code is None else grpc_code),
        message=bounded_message(str(error)),
        details=[detail],
    )
    return rpc_status.to_status(status)


async def abort(context: grpc.aio.ServicerContext[Any, Any], error: HeadwaterError) -> NoReturn:
    """End the call with ``error`` as its status (grpc.aio servicers)."""
    status = to_status(error)
    ABORTED_WITH.set(error.code)
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("abort returned")  # pragma: no cover


ASYNC_WRITE_FAILED: Final = "Internal error from Core"
"""The details grpc.aio gives a stream whose write failed as the call ended."""


def from_rpc_error(exc: grpc.RpcError, target: str) -> HeadwaterError:
    """Translate a failed call into a HeadwaterError (transport failures included)."""
    # Failed sync calls are both grpc.RpcError and grpc.Call at run time (the stubs cannot
    # say so); grpc.aio's AioRpcError is not a grpc.Call but has the same three methods.
    call: grpc.Call | None = (
        exc  # type: ignore[assignment]
        if isinstance(exc, grpc.Call | grpc.aio.AioRpcError)
        else None
    )
    if call is not None:
        status = rpc_status.from_call(call)
        if status is not None:
            for detail in status.details:
                if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                    info = error_details_pb2.ErrorInfo()
                    detail.Unpack(info)
                    if info.domain == ERROR_DOMAIN and info.reason in ErrorCode.__members__:
                        code = ErrorCode[info.reason]
                        prefix = f"{code.name}: "
                        message = status.message.removeprefix(prefix)
                        return HeadwaterError(code, message)
    code_of_call = call.code() if call is not None else grpc.StatusCode.UNKNOWN
    details = (call.details() if call is not None else None) or str(exc)
    error_code = _TRANSPORT_CODES.get(code_of_call, ErrorCode.UNKNOWN_SERVER_ERROR)
    if code_of_call == grpc.StatusCode.UNAVAILABLE:
        refused = handshake_failure(details)
        if refused is not None:
            return HeadwaterError(
                ErrorCode.TLS_HANDSHAKE_FAILED, f"{target}: {refused} ({details})"
            )
    if code_of_call == grpc.StatusCode.INTERNAL and details == ASYNC_WRITE_FAILED:
        # grpc.aio reports a stream write that fails as the call ends (a node killed
        # under it) with this status instead of the call's own (grpc/grpc#36066): the
        # connection broke, and whether the node acted on the request is unknown.
        error_code = ErrorCode.NETWORK_EXCEPTION
    return HeadwaterError(error_code, f"{target}: {details} (gRPC {code_of_call.name})")
