"""gRPC channels with the settings of ``headwater.shared.tls``: threaded and asyncio,
TLS with the settings' credentials or plaintext, and fixed metadata (credentials, the
client id) added to every call by an interceptor. Kept apart from the settings so that
reading them loads no gRPC."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import grpc


def open_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    call_metadata: Sequence[tuple[str, str]] = (),
) -> grpc.Channel:
    """A channel to ``address``: TLS with ``credentials``, plaintext when None; every call
    carries ``call_metadata`` (``ClientSecurity.call_metadata``)."""
    if credentials is None:
        channel = grpc.insecure_channel(address, options=options)
    else:
        channel = grpc.secure_channel(address, credentials, options)
    if call_metadata:
        return grpc.intercept_channel(channel, _AddMetadata(tuple(call_metadata)))
    return channel


def open_aio_channel(
    address: str,
    credentials: grpc.ChannelCredentials | None,
    options: Sequence[tuple[str, Any]],
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
    call_metadata: Sequence[tuple[str, str]] = (),
) -> grpc.aio.Channel:
    """An asyncio channel to ``address``: TLS with ``credentials``, plaintext when None;
    every call carries ``call_metadata``."""
    if call_metadata:
        added = tuple(call_metadata)
        interceptors = [
            *(interceptors or ()),
            _AioAddMetadataUnary(added),  # type: ignore[list-item]
            _AioAddMetadataUnaryStream(added),  # type: ignore[list-item]
            _AioAddMetadataStream(added),  # type: ignore[list-item]
        ]
    if credentials is None:
        return grpc.aio.insecure_channel(address, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(address, credentials, options, interceptors=interceptors)


class CallDetails:
    """grpc.ClientCallDetails with other metadata (grpc's class is abstract)."""

    def __init__(self, details: Any, metadata: Sequence[tuple[str, str]]) -> None:
        self.method = details.method
        self.timeout = details.timeout
        self.metadata = [*(details.metadata or ()), *metadata]
        self.credentials = details.credentials
        self.wait_for_ready = details.wait_for_ready
        self.compression = getattr(details, "compression", None)


class _AddMetadata(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds fixed metadata to every call of a threaded channel."""

    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(CallDetails(details, self.metadata), request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return continuation(CallDetails(details, self.metadata), request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(CallDetails(details, self.metadata), requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return continuation(CallDetails(details, self.metadata), requests)


def _aio_details(details: Any, metadata: tuple[tuple[str, str], ...]) -> Any:
    merged = grpc.aio.Metadata(*(details.metadata or ()), *metadata)
    return grpc.aio.ClientCallDetails(
        details.method, details.timeout, merged, details.credentials, details.wait_for_ready
    )


# grpc's aio interceptor classes are generic in its type stubs only.
if TYPE_CHECKING:
    AioUnaryUnaryInterceptor = grpc.aio.UnaryUnaryClientInterceptor[Any, Any]
    AioUnaryStreamInterceptor = grpc.aio.UnaryStreamClientInterceptor[Any, Any]
    AioStreamStreamInterceptor = grpc.aio.StreamStreamClientInterceptor[Any, Any]
else:
    AioUnaryUnaryInterceptor = grpc.aio.UnaryUnaryClientInterceptor
    AioUnaryStreamInterceptor = grpc.aio.UnaryStreamClientInterceptor
    AioStreamStreamInterceptor = grpc.aio.StreamStreamClientInterceptor


class _AioAddMetadataUnary(AioUnaryUnaryInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self.metadata), request)


class _AioAddMetadataUnaryStream(AioUnaryStreamInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_aio_details(details, self.metadata), request)


class _AioAddMetadataStream(AioStreamStreamInterceptor):
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self.metadata = metadata

    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(_aio_details(details, self.metadata), requests)
