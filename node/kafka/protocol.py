"""Kafka's wire protocol: frames, request headers, the API versions this broker serves,
and version-independent building of response messages (pure: no I/O).

A request frame is a big-endian int32 size, then the request header (api key i16, api
version i16, correlation id i32, client id as a nullable int16-length string, and for
flexible versions a tagged-field section) and the request body. The response is a size,
the response header (the correlation id; for flexible versions a tagged-field section,
except ApiVersions, whose response header is always version 0) and the body. Messages are
the ones generated from Kafka's own JSON schemas by ``kio``; this module picks the right
one for each API key and version, and checks that a body decodes within its frame
(bytes after it are ignored, as Kafka ignores them). Before kio's reader sees a message,
``request_shape`` walks it by its lengths and counts, each checked against the bytes left
and against what one request may name; a tagged field this schema does not know (a newer
client's) is skipped, as Kafka's protocol requires.

``SUPPORTED_VERSIONS`` is exactly what the broker answers (ApiVersions lists it). A
request for another version of a listed API, or for an API Kafka defines and this broker
does not serve, is answered with UNSUPPORTED_VERSION in that API's response at that
version (every other field at its zero value); ApiVersions itself answers an unsupported
version in version 0, with the list, as Kafka does, so clients fall back.
"""

from __future__ import annotations

import dataclasses
import datetime
import io
import struct
import typing
from typing import Any, Final

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode as KafkaErrorCode
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError

from headwater.node.kafka.request_shape import (
    MalformedRequestError,
    RequestLimits,
    Walked,
    walk_request,
)

API_VERSIONS: Final = 18
PRODUCE: Final = 0
FETCH: Final = 1
LIST_OFFSETS: Final = 2
METADATA: Final = 3
CREATE_TOPICS: Final = 19
DELETE_TOPICS: Final = 20
INIT_PRODUCER_ID: Final = 22
OFFSET_COMMIT: Final = 8
OFFSET_FETCH: Final = 9
FIND_COORDINATOR: Final = 10
JOIN_GROUP: Final = 11
HEARTBEAT: Final = 12
LEAVE_GROUP: Final = 13
SYNC_GROUP: Final = 14
DESCRIBE_GROUPS: Final = 15
LIST_GROUPS: Final = 16
DELETE_GROUPS: Final = 42
DESCRIBE_CONFIGS: Final = 32
ALTER_CONFIGS: Final = 33
INCREMENTAL_ALTER_CONFIGS: Final = 44
CREATE_PARTITIONS: Final = 37
DESCRIBE_CLUSTER: Final = 60
CONSUMER_GROUP_HEARTBEAT: Final = 68
SASL_HANDSHAKE: Final = 17
SASL_AUTHENTICATE: Final = 36
SASL_APIS: Final = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})

SUPPORTED_VERSIONS: Final[dict[int, tuple[int, int]]] = {
    PRODUCE: (3, 8),
    FETCH: (4, 11),
    LIST_OFFSETS: (1, 5),
    METADATA: (1, 12),
    API_VERSIONS: (0, 3),
    CREATE_TOPICS: (2, 4),
    DELETE_TOPICS: (1, 3),
    INIT_PRODUCER_ID: (0, 1),
    OFFSET_COMMIT: (2, 9),
    OFFSET_FETCH: (1, 7),
    FIND_COORDINATOR: (0, 2),
    JOIN_GROUP: (0, 5),
    HEARTBEAT: (0, 3),
    LEAVE_GROUP: (0, 3),
    SYNC_GROUP: (0, 3),
    DESCRIBE_GROUPS: (0, 4),
    LIST_GROUPS: (0, 2),
    DELETE_GROUPS: (0, 1),
    DESCRIBE_CONFIGS: (1, 3),
    ALTER_CONFIGS: (0, 1),
    INCREMENTAL_ALTER_CONFIGS: (0, 0),
    CREATE_PARTITIONS: (0, 1),
    DESCRIBE_CLUSTER: (0, 0),
    CONSUMER_GROUP_HEARTBEAT: (0, 1),
    SASL_HANDSHAKE: (1, 1),
    SASL_AUTHENTICATE: (0, 1),
}
"""API key -> (lowest, highest) version served. Most stay below the API's first
flexible version; those that go past it serve what a listed client needs there:
ApiVersions v3 (librdkafka asks it first), Metadata v9-12 (topic ids, which the consumer
protocol names topics by), OffsetCommit v8-9 and OffsetFetch v6-7 (the consumer
protocol's member epochs), DescribeCluster and ConsumerGroupHeartbeat (flexible from their
first versions). The SASL
APIs (``SASL_APIS``) are served, and listed, only by a listener that asks for logins."""

API_NAMES: Final = {
    PRODUCE: "Produce",
    FETCH: "Fetch",
    LIST_OFFSETS: "ListOffsets",
    METADATA: "Metadata",
    OFFSET_COMMIT: "OffsetCommit",
    OFFSET_FETCH: "OffsetFetch",
    FIND_COORDINATOR: "FindCoordinator",
    JOIN_GROUP: "JoinGroup",
    HEARTBEAT: "Heartbeat",
    LEAVE_GROUP: "LeaveGroup",
    SYNC_GROUP: "SyncGroup",
    DESCRIBE_GROUPS: "DescribeGroups",
    LIST_GROUPS: "ListGroups",
    SASL_HANDSHAKE: "SaslHandshake",
    API_VERSIONS: "ApiVersions",
    CREATE_TOPICS: "CreateTopics",
    DELETE_TOPICS: "DeleteTopics",
    INIT_PRODUCER_ID: "InitProducerId",
    DESCRIBE_CONFIGS: "DescribeConfigs",
    ALTER_CONFIGS: "AlterConfigs",
    SASL_AUTHENTICATE: "SaslAuthenticate",
    CREATE_PARTITIONS: "CreatePartitions",
    DELETE_GROUPS: "DeleteGroups",
    INCREMENTAL_ALTER_CONFIGS: "IncrementalAlterConfigs",
    DESCRIBE_CLUSTER: "DescribeCluster",
    CONSUMER_GROUP_HEARTBEAT: "ConsumerGroupHeartbeat",
}


def api_name(api_key: int) -> str:
    """Kafka's name of an API this broker serves (``api key N`` for another)."""
    return API_NAMES.get(api_key, f"api key {api_key}")


UNSUPPORTED_VERSION: Final = 35
FRAME_HEADER: Final = struct.Struct(">hhi")  # api key, api version, correlation id
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True, slots=True)
class FrameHeader:
    api_key: int
    api_version: int
    correlation_id: int


def read_frame_header(frame: bytes | memoryview) -> FrameHeader:
    """The fixed first 8 bytes of a request: enough to answer it, even with an error."""
    if len(frame) < FRAME_HEADER.size:
        raise MalformedRequestError(
            f"a request of {len(frame)} bytes; a request header needs at least {FRAME_HEADER.size}"
        )
    return FrameHeader(*FRAME_HEADER.unpack_from(frame))


def is_supported(api_key: int, api_version: int, sasl: bool = True) -> bool:
    """Is this version of this API served (the SASL APIs only when ``sasl``)?"""
    if api_key in SASL_APIS and not sasl:
        return False
    versions = SUPPORTED_VERSIONS.get(api_key)
    return versions is not None and versions[0] <= api_version <= versions[1]


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header fields and the body message."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: Any


def decode_request(frame: bytes | memoryview, limits: RequestLimits | None = None) -> Request:
    """A supported request, walked (``request_shape.walk_request``: every length and
    count checked, against ``limits`` too) and decoded. Bytes after the body are ignored,
    as Kafka's broker ignores them: librdkafka's Metadata request for every topic (v9 and
    later) ends with three (the rest of the int32 it reserves for the topic count and
    leaves as a one-byte null compact array)."""
    return decode_walked(walk(frame, limits))


def walk(frame: bytes | memoryview, limits: RequestLimits | None) -> Walked:
    """The walk of a supported request (``request_shape.walk_request``), the first half
    of ``decode_request``: cheap, bounded by ``limits``, and telling how many entries
    decoding the request will build."""
    fixed = read_frame_header(frame)
    if not is_supported(fixed.api_key, fixed.api_version):
        raise MalformedRequestError(
            f"api key {fixed.api_key} version {fixed.api_version} is not served"
        )
    schema = load_request_schema(fixed.api_key, fixed.api_version)
    return walk_request(schema.__header_schema__, schema, frame, limits)


def decode_walked(walked: Walked) -> Request:
    """The request ``walk`` has checked, decoded (the second half of ``decode_request``,
    which a large request may run in a worker thread: nothing here is shared)."""
    frame = walked.frame
    fixed = read_frame_header(frame)
    schema = load_request_schema(fixed.api_key, fixed.api_version)
    try:
        header, used = reader_of(schema.__header_schema__)(frame, 0)
        body, _ = reader_of(schema)(frame, used)
    except (SerialError, KeyError, ValueError, TypeError, OverflowError, IndexError) as exc:
        raise MalformedRequestError(
            f"api key {fixed.api_key} version {fixed.api_version} does not decode: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    return Request(
        fixed.api_key, fixed.api_version, fixed.correlation_id, header.client_id or "", body
    )


_readers: dict[type[Any], Any] = {}
_writers: dict[type[Any], Any] = {}


def reader_of(schema: type[Any]) -> Any:
    """kio's reader of ``schema`` (made once per schema)."""
    reader = _readers.get(schema)
    if reader is None:
        reader = _readers[schema] = entity_reader(schema)
    return reader


def _writer(schema: type[Any]) -> Any:
    writer = _writers.get(schema)
    if writer is None:
        writer = _writers[schema] = entity_writer(schema)
    return writer


def response_schema(api_key: int, api_version: int) -> type[Any]:
    return load_response_schema(api_key, api_version)


@dataclasses.dataclass(frozen=True, slots=True)
class Unbuilt:
    """An answer not built yet: the response message ``schema`` and the plain values
    ``build`` takes. Building and encoding cost 10-30 µs an entry (a 10,000-partition
    answer 0.3 s), so the listener does them in a worker thread for an answer of many
    ``entries`` (as its handler counts them: topics, partitions, groups, members...) and
    on the event loop for a small one. Building reads only ``values``."""

    schema: type[Any]
    values: dict[str, Any]
    entries: int = 0


def answer(schema: type[Any], entries: int = 0, **values: Any) -> Unbuilt:
    """An answer of ``schema`` from plain values, built when it is encoded (``build``);
    ``entries``: how many entries its lists hold, about (see ``Unbuilt``)."""
    return Unbuilt(schema, values, entries)


def encode_response(correlation_id: int, body: Any) -> bytes:
    """A whole response frame: size, header, ``body`` (a response message of the
    request's API and version, which choose the header; or an ``Unbuilt`` one)."""
    if isinstance(body, Unbuilt):
        body = build(body.schema, **body.values)
    out = io.BytesIO()
    out.write(b"\0\0\0\0")
    header_schema = type(body).__header_schema__
    _writer(header_schema)(out, build(header_schema, correlation_id=correlation_id))
    _writer(type(body))(out, body)
    frame = out.getbuffer()
    struct.pack_into(">i", frame, 0, len(frame) - 4)
    return bytes(frame)


def unsupported_answer(fixed: FrameHeader, sasl: bool = True) -> bytes | None:
    """The answer to a request for a version or an API this broker does not serve (see
    the module doc), or None when Kafka defines no such API and version (the caller
    closes the connection)."""
    if fixed.api_key == API_VERSIONS:
        body = build(
            response_schema(API_VERSIONS, 0),
            error_code=UNSUPPORTED_VERSION,
            api_keys=supported_api_keys(sasl),
        )
        return encode_response(fixed.correlation_id, body)
    try:
        schema = response_schema(fixed.api_key, fixed.api_version)
    except (UnknownAPIKey, UnknownEntity):
        return None
    body = build(schema, error_code=UNSUPPORTED_VERSION)
    return encode_response(fixed.correlation_id, body)


def supported_api_keys(sasl: bool = True) -> list[dict[str, int]]:
    """ApiVersions' list: every API served (the SASL APIs only when ``sasl``)."""
    return [
        {"api_key": key, "min_version": low, "max_version": high}
        for key, (low, high) in sorted(SUPPORTED_VERSIONS.items())
        if sasl or key not in SASL_APIS
    ]


# ----------------------------------------------------------------------------- building


def build(schema: type[Any], **values: Any) -> Any:
    """A message of ``schema`` from plain values: fields the schema lacks are ignored
    (so one call serves every version), missing fields take their default or their
    type's zero value, nested messages may be given as dicts, milliseconds become the
    timedeltas and datetimes the schema wants, error codes become Kafka's enum."""
    kwargs: dict[str, Any] = {}
    for field, kind, nested in _fields(schema):
        if field.name in values:
            kwargs[field.name] = _convert(values[field.name], kind, nested)
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            kwargs[field.name] = _zero(kind, nested)
    return schema(**kwargs)


_described: dict[type[Any], tuple[tuple[dataclasses.Field[Any], str, Any], ...]] = {}


def _fields(schema: type[Any]) -> tuple[tuple[dataclasses.Field[Any], str, Any], ...]:
    known = _described.get(schema)
    if known is None:
        known = _described[schema] = _describe(schema)
    return known


def _describe(schema: type[Any]) -> tuple[tuple[dataclasses.Field[Any], str, Any], ...]:
    hints = typing.get_type_hints(schema)
    described = []
    for field in dataclasses.fields(schema):
        hint = hints[field.name]
        kind = field.metadata.get("kafka_type", "")
        nested: Any = None
        nullable = type(None) in typing.get_args(hint)
        if nullable:  # X | None: describe X
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        args = typing.get_args(hint)
        if typing.get_origin(hint) is tuple and args and dataclasses.is_dataclass(args[0]):
            kind, nested = "entities", args[0]
        elif typing.get_origin(hint) is tuple:
            kind = "array"
        elif dataclasses.is_dataclass(hint):
            kind, nested = "entity", hint
        if nullable:
            kind = f"nullable {kind}"
        described.append((field, kind, nested))
    return tuple(described)


def _convert(value: Any, kind: str, nested: Any) -> Any:
    base = kind.removeprefix("nullable ")
    if value is None:
        return None
    if base == "entities":
        return tuple(build(nested, **v) if isinstance(v, dict) else v for v in value)
    if base == "entity":
        return build(nested, **value) if isinstance(value, dict) else value
    if base == "array":
        return tuple(value)
    if base == "error_code":
        return KafkaErrorCode(int(value))
    if base.startswith("timedelta") and isinstance(value, int):
        return datetime.timedelta(milliseconds=value)
    if base.startswith("datetime") and isinstance(value, int):
        return None if value < 0 and kind.startswith("nullable") else _datetime(value)
    return value


def _datetime(ms: int) -> datetime.datetime:
    return _EPOCH + datetime.timedelta(milliseconds=ms)


def _zero(kind: str, nested: Any) -> Any:
    if kind.startswith("nullable"):
        return None
    if kind in {"entities", "array"}:
        return ()
    if kind == "entity":
        return build(nested)
    if kind == "error_code":
        return KafkaErrorCode(0)
    if kind.startswith("timedelta"):
        return datetime.timedelta(0)
    if kind.startswith("datetime"):
        return _EPOCH
    if kind in ("string",):
        return ""
    if kind in ("bytes", "records"):
        return b""
    if kind == "bool":
        return False
    if kind == "uuid":
        return None
    return 0


def milliseconds(value: datetime.timedelta | int) -> int:
    """A duration field of a request as whole milliseconds."""
    if isinstance(value, datetime.timedelta):
        return value // datetime.timedelta(milliseconds=1)
    return int(value)
