"""Raw Kafka requests over a plain socket, for tests that need exact bytes: a frame built
from any request schema of Kafka's (kio), its answer decoded, and a SASL PLAIN login."""

from __future__ import annotations

import io
import socket
import struct
import time
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.serial import entity_reader, entity_writer

from headwater.node.kafka import protocol

DEADLINE_S = 30.0


def connect(address: str, source: str | None = None, timeout: float = DEADLINE_S) -> socket.socket:
    """A TCP connection to ``HOST:PORT``, from the local address ``source`` if given (any
    127.x.y.z is this machine's loopback too: a test's other "host")."""
    host, port = address.rsplit(":", 1)
    return socket.create_connection(
        (host, int(port)), timeout=timeout, source_address=(source, 0) if source else None
    )


def frame(api_key: int, version: int, correlation_id: int = 1, **fields: object) -> bytes:
    """A whole request frame (size, header, body built from ``fields``)."""
    schema = load_request_schema(api_key, version)
    header = protocol.build(
        schema.__header_schema__,
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=correlation_id,
        client_id="raw",
    )
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(schema)(out, protocol.build(schema, **fields))
    return struct.pack(">i", len(out.getvalue())) + out.getvalue()


def answer(sock: socket.socket, api_key: int, version: int) -> Any:
    """The next answer on ``sock``, decoded as ``api_key`` at ``version``."""
    (size,) = struct.unpack(">i", _exactly(sock, 4))
    body = _exactly(sock, size)
    response = load_response_schema(api_key, version)
    _, used = entity_reader(response.__header_schema__)(body, 0)
    decoded, _ = entity_reader(response)(body, used)
    return decoded


def _exactly(sock: socket.socket, size: int) -> bytes:
    """``size`` bytes from ``sock`` (a socket with a timeout may answer MSG_WAITALL with
    fewer); fewer only when the peer closes first."""
    parts = []
    while size:
        part = sock.recv(size)
        if not part:
            break
        parts.append(part)
        size -= len(part)
    return b"".join(parts)


def record_batch(
    records: list[tuple[bytes | None, bytes]], timestamp_ms: int | None = None
) -> bytes:
    """A Kafka record batch (v2, uncompressed, not idempotent) of ``records`` (key, value),
    every record at ``timestamp_ms`` (default: now)."""
    from aiokafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=1 << 31,
    )
    now = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    for delta, (key, value) in enumerate(records):
        builder.append(delta, now, key, value, [])
    return bytes(builder.build())


def exchange(sock: socket.socket, api_key: int, version: int, **fields: object) -> Any:
    """One raw request on ``sock`` (its body built from ``fields``): the decoded answer."""
    sock.sendall(frame(api_key, version, **fields))
    return answer(sock, api_key, version)


def plain_login(sock: socket.socket, user: str, password: str) -> int:
    """SaslHandshake (PLAIN) and SaslAuthenticate on ``sock``: the login's error code."""
    handshake = exchange(sock, protocol.SASL_HANDSHAKE, 1, mechanism="PLAIN")
    if handshake.error_code:
        return int(handshake.error_code)
    done = exchange(
        sock,
        protocol.SASL_AUTHENTICATE,
        1,
        auth_bytes=b"\0" + user.encode() + b"\0" + password.encode(),
    )
    return int(done.error_code)


def closed(sock: socket.socket, timeout: float = DEADLINE_S) -> bool:
    """Whether the peer closes ``sock`` within ``timeout`` (reading what it sends first)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True
