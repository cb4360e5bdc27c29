"""gRPC calls over a bare HTTP/2 connection with any header bytes, as an attacker makes
them (grpc's own clients refuse to send what is not ASCII)."""

from __future__ import annotations

import socket

import h2.events

from headwater.tools.benchmarks.login_flood import (
    EMPTY_MESSAGE,
    grpc_request_headers,
    h2_client_connection,
)


def raw_call(
    address: str, path: str, headers: list[tuple[bytes, bytes]], timeout_s: float = 30.0
) -> dict[bytes, bytes]:
    """One call with an empty request; its response headers and trailers."""
    host, port = address.rsplit(":", 1)
    connection = h2_client_connection()
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        connection.initiate_connection()
        stream = connection.get_next_available_stream_id()
        connection.send_headers(stream, grpc_request_headers(address, path, headers))
        connection.send_data(stream, EMPTY_MESSAGE, end_stream=True)
        sock.sendall(connection.data_to_send())
        answer: dict[bytes, bytes] = {}
        ended = False
        while not ended:
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the node closed the connection without an answer")
            for event in connection.receive_data(data):
                if isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
                    answer.update(dict(event.headers))
                ended = ended or isinstance(event, (h2.events.StreamEnded, h2.events.StreamReset))
            sock.sendall(connection.data_to_send())
    return answer
