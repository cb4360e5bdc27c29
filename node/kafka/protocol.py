"""Kafka's wire protocol: frames, request headers, the API versions this broker serves,
and version-independent building of response messages (pure: no I/O).

A request frame is a big-endian int32 size, then the request header (api key i16, api
version i16, correlation id i32, client id as a nullable int16-length string, and for
flexible versions a tagged-field section) and the request body. The response is a size,
the response header (the correlation id; for flexible versions a tagged-field section,
except ApiVersions, whose response header is always version 0) and the body. Messages are
the ones generated from Kafka's own JSON schemas by ``kio``; this module picks the right
one for each API key and version, and checks that a body decodes within its frame
(bytes after it are ignored, as Kafka ignores them). Before kio's reader (native code,
which sizes its buffers from the counts a message states) sees a message, ``check_shape``
walks it by its lengths and counts, each checked against the bytes left. A tagged field
this schema does not know (a newer client's) is skipped, as Kafka's protocol requires:
the walk notes it, and the frame kio reads is the request without it.

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
from kio.serial._introspect import (
    EntityField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial.errors import SerialError

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

UNSUPPORTED_VERSION: Final = 35
FRAME_HEADER: Final = struct.Struct(">hhi")  # api key, api version, correlation id
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


class MalformedRequestError(Exception):
    """The frame cannot be read as a request: the connection is closed (the message says
    why, for the one log line)."""


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


_I8: Final = struct.Struct(">b")
_I16: Final = struct.Struct(">h")
_I32: Final = struct.Struct(">i")


def check_produce_shape(frame: bytes | memoryview, topics_max: int, partitions_max: int) -> None:
    """Walk a Produce frame (versions 3-8, not flexible) by its lengths before it is
    decoded: at most ``topics_max`` topics and ``partitions_max`` partitions in all, every
    length inside the frame; MalformedRequestError otherwise. The walk touches only the
    lengths, so a frame of many tiny entries is refused before any is built."""
    position = FRAME_HEADER.size

    def take(size: int) -> int:
        nonlocal position
        if size < 0 or position + size > len(frame):
            raise MalformedRequestError(
                f"a Produce request's lengths run past its {len(frame)} bytes"
            )
        start = position
        position += size
        return start

    def string() -> None:
        (length,) = _I16.unpack_from(frame, take(2))
        if length >= 0:
            take(length)

    def count(what: str, limit: int) -> int:
        found = int(_I32.unpack_from(frame, take(4))[0])
        if not 0 <= found <= limit:
            raise MalformedRequestError(f"a Produce request names {found} {what}; at most {limit}")
        return found

    string()  # client id
    string()  # transactional id
    take(2 + 4)  # acks, timeout
    partitions = 0
    for _ in range(count("topics", topics_max)):
        string()
        entries = count("partitions", partitions_max)
        partitions += entries
        if partitions > partitions_max:
            raise MalformedRequestError(
                f"a Produce request names more than {partitions_max} partitions"
            )
        for _ in range(entries):
            take(4)  # the partition index
            (length,) = _I32.unpack_from(frame, take(4))
            if length >= 0:
                take(length)


@dataclasses.dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header fields and the body message."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str
    body: Any


_FIXED_SIZES: Final = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_VARINT_BYTES_MAX: Final = 5
UNKNOWN_TAGS_MAX: Final = 64
"""Most tagged fields a request may carry that its schema does not know (Kafka's own
requests carry none that a broker of their version does not know)."""


class _Shape:
    """Walks a request by its schema, reading only lengths and counts, each checked
    against the bytes left: ``check_shape``. ``unknown_tags``: (start, end, replacement)
    of each byte range to change so that the tagged fields the schema does not know are
    gone (a section's count rewritten, each unknown field removed)."""

    def __init__(self, frame: bytes | memoryview) -> None:
        self.frame = memoryview(frame)
        self.position = 0
        self.unknown_tags: list[tuple[int, int, bytes]] = []

    def without_unknown_tags(self) -> bytes:
        """The frame with every unknown tagged field taken out (``unknown_tags``, at most
        UNKNOWN_TAGS_MAX and the count rewrites that go with them)."""
        out = bytearray()
        copied = 0
        for start, end, replacement in sorted(self.unknown_tags):
            out += self.frame[copied:start]
            out += replacement
            copied = end
        out += self.frame[copied:]
        return bytes(out)

    def fail(self, what: str) -> MalformedRequestError:
        return MalformedRequestError(
            f"{what} at byte {self.position} runs past the request's {len(self.frame)} bytes"
        )

    def take(self, size: int, what: str) -> int:
        if size < 0 or self.position + size > len(self.frame):
            raise self.fail(f"{what} of {size} bytes")
        start = self.position
        self.position += size
        return start

    def uvarint(self, what: str) -> int:
        value = shift = 0
        for _ in range(_VARINT_BYTES_MAX):
            byte = self.frame[self.take(1, what)]
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7
        raise self.fail(f"{what}: a varint longer than {_VARINT_BYTES_MAX} bytes")

    def length(self, flexible: bool, legacy: struct.Struct, what: str) -> int:
        """A length or count (-1: null), checked to fit what is left of the frame."""
        if flexible:
            found = self.uvarint(what) - 1
        else:
            (found,) = legacy.unpack_from(self.frame, self.take(legacy.size, what))
        if found < -1 or found > len(self.frame) - self.position:
            raise self.fail(f"{what} {found}")
        return int(found)

    def primitive(self, kafka_type: str, flexible: bool, what: str, legacy_string: bool) -> None:
        size = _FIXED_SIZES.get(kafka_type)
        if size is not None:
            self.take(size, what)
        elif kafka_type == "string":
            flexible_string = flexible and not legacy_string
            self.take(max(self.length(flexible_string, _I16, what), 0), what)
        elif kafka_type in ("bytes", "records"):
            self.take(max(self.length(flexible, _I32, what), 0), what)
        else:
            raise MalformedRequestError(f"{what}: type {kafka_type!r} is not known here")

    def entity(self, schema: type[Any], nullable: bool = False) -> None:
        flexible = bool(schema.__flexible__)
        if nullable:
            (marker,) = _I8.unpack_from(self.frame, self.take(1, schema.__name__))
            if marker < 0:
                return
        tagged: dict[int, dataclasses.Field[Any]] = {}
        header = schema.__name__ == "RequestHeader"
        for field in dataclasses.fields(schema):
            tag = get_field_tag(field)
            if tag is not None:
                tagged[int(tag)] = field
            else:
                self.field(field, flexible, header and field.name == "client_id")
        if not flexible:
            return
        count_start = self.position
        number = self.uvarint(f"{schema.__name__}'s tagged fields")
        count_end = self.position
        if number > len(self.frame) - self.position:
            raise self.fail(f"{number} tagged fields")
        unknown = 0
        for _ in range(number):
            field_start = self.position
            tag_number = self.uvarint("a tag")
            size = self.uvarint("a tagged field's size")
            end = self.take(size, "a tagged field") + size
            known = tagged.get(tag_number)
            if known is not None:  # walked within its own bytes
                inner = _Shape(self.frame[:end])
                inner.position = end - size
                inner.field(known, True, False)
                if inner.unknown_tags:  # its size would have to be rewritten too
                    raise MalformedRequestError(
                        f"{schema.__name__}'s tagged field {tag_number} holds tagged fields "
                        "this broker does not know"
                    )
            else:
                unknown += 1
                if len(self.unknown_tags) >= UNKNOWN_TAGS_MAX:
                    raise MalformedRequestError(
                        f"more than {UNKNOWN_TAGS_MAX} tagged fields this broker does not know"
                    )
                self.unknown_tags.append((field_start, end, b""))
        if unknown:
            self.unknown_tags.append((count_start, count_end, _uvarint(number - unknown)))

    def field(self, field: dataclasses.Field[Any], flexible: bool, legacy_string: bool) -> None:
        kind = classify_field(field)
        what = field.name
        if isinstance(kind, PrimitiveField):
            self.primitive(get_schema_field_type(field), flexible, what, legacy_string)
        elif isinstance(kind, EntityField):
            self.entity(kind.type_, nullable=is_optional(field))
        else:
            count = self.length(flexible, _I32, f"{what} count")
            for _ in range(max(count, 0)):
                if isinstance(kind, PrimitiveTupleField):
                    self.primitive(get_schema_field_type(field), flexible, what, False)
                else:
                    self.entity(kind.type_)


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def check_shape(schema: type[Any], frame: bytes | memoryview, position: int) -> int:
    """Walk the message of ``schema`` at ``position`` by its lengths and counts only, each
    checked against the bytes left in ``frame``; the position after it, or
    MalformedRequestError. kio's reader (native code) sizes its buffers from the counts a
    request states: a count of 2^31 aborted the whole process with an allocation of
    240 GB. Nothing is built here, and nothing is read beyond the frame."""
    shape = _Shape(frame)
    shape.position = position
    shape.entity(schema)
    return shape.position


def decode_request(frame: bytes | memoryview) -> Request:
    """A supported request, decoded. Bytes after the body are ignored, as Kafka's broker
    ignores them: librdkafka's Metadata request for every topic (v9 and later) ends with
    three (the rest of the int32 it reserves for the topic count and leaves as a one-byte
    null compact array)."""
    fixed = read_frame_header(frame)
    if not is_supported(fixed.api_key, fixed.api_version):
        raise MalformedRequestError(
            f"api key {fixed.api_key} version {fixed.api_version} is not served"
        )
    schema = load_request_schema(fixed.api_key, fixed.api_version)
    shape = _Shape(frame)
    shape.entity(schema.__header_schema__)
    shape.entity(schema)
    if shape.unknown_tags:
        frame = shape.without_unknown_tags()
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


def encode_response(correlation_id: int, body: Any) -> bytes:
    """A whole response frame: size, header, ``body`` (a response message of the
    request's API and version, which choose the header)."""
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
