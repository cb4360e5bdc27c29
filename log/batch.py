"""Record batch format v1: encode, verify and decode (pure; no I/O).

The byte-by-byte specification, with test vectors, is docs/record-batch-format.md; this
docstring is a summary and the two must agree. All integers are little-endian.

Header (80 bytes)::

    off size type    field
      0   8  int64   base_offset        offset of the first record (assigned by the broker)
      8   4  int32   batch_length       bytes after this field: total size = 12 + batch_length
     12   4  int32   leader_epoch       epoch of the leader that appended (set by the broker)
     16   1  uint8   magic              format version, 1
     17   3          reserved           zero
     20   4  uint32  crc                CRC32C of bytes [24, 12 + batch_length)
     24   2  uint16  attributes         bits 0-2 codec (0 none, 3 lz4 frame, 4 zstd frame),
                                        bit 3 timestamp type (0 create, 1 log append),
                                        bit 4 transactional, bit 5 control,
                                        bit 6 has keys, bit 7 has headers, others zero
     26   2          reserved           zero
     28   4  int32   record_count       n, in [1, RECORD_COUNT_MAX]
     32   4  int32   last_offset_delta  n - 1
     36   4  int32   body_length        bytes of the stored (possibly compressed) body
     40   8  int64   first_timestamp    ms since the epoch, timestamp of record 0
     48   8  int64   max_timestamp      largest record timestamp
     56   8  int64   producer_id        -1 when not idempotent
     64   4  int32   base_sequence      -1 when not idempotent
     68   2  int16   producer_epoch     -1 when not idempotent
     70   2          reserved           zero
     72   4  int32   uncompressed_body_length
     76   4          reserved           zero
     80      body    body_length bytes, then zero padding to a multiple of 8

Body (after decompression), Arrow's binary layout; every section is padded with zeros
to a multiple of 8 bytes, so every section starts 8-byte aligned::

    [has keys]    key validity bitmap  ceil(n/8) bytes, bit i (LSB first) = key i present
                  key offsets          int32[n+1], offsets[0] = 0, non-decreasing
                  key data             offsets[n] bytes
                  value validity       ceil(n/8) bytes (a null value is a tombstone)
                  value offsets        int32[n+1]
                  value data           bytes
                  timestamp deltas     int32[n]: timestamp_i = first_timestamp + delta_i
    [has headers] header list offsets  int32[n+1]: record i has headers [o_i, o_{i+1})
                  header key offsets   int32[h+1], h = header list offsets[n]
                  header key data      UTF-8
                  header value validity ceil(h/8) bytes
                  header value offsets int32[h+1]
                  header value data    bytes

Invariants: ``total_size % 8 == 0``; the broker may rewrite base_offset and
leader_epoch (bytes [0, 8) and [12, 16)) without touching the CRC; everything else the
broker stores and returns byte for byte.

Hostile input: every length, count and offset is checked against its buffer before any
Arrow call reads through it, and decompression never produces more than the header's
uncompressed_body_length, itself capped by the reader's limit. ``validate_batch`` (what
the broker runs on a produced batch) adds the producer's rules: bits 3-5 of the
attributes are the broker's, and every record timestamp lies in [TIMESTAMP_MIN_MS,
TIMESTAMP_MAX_MS] and the topic's window. tests/fuzz_batch.py fuzzes all of it.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import crc32c as _crc32c
import lz4.frame
import pyarrow as pa
import pyarrow.compute as pc
import zstandard

from headwater.shared.errors import ErrorCode, HeadwaterError

MAGIC: Final = 1
HEADER_STRUCT: Final = struct.Struct("<qiiB3xIH2xiiiqqqih2xi4x")
HEADER_BYTES: Final = HEADER_STRUCT.size
assert HEADER_BYTES == 80
RESERVED_CRC_COVERED_BYTES: Final = ((26, 28), (70, 72), (76, 80))
"""Reserved header byte ranges [start, end) covered by the CRC. The broker refuses a
produced batch where any is not zero, so that a later format may give them a meaning;
decoders ignore them. (Bytes 17-19, outside the CRC, are checked by every reader.)"""
LENGTH_PREFIX_BYTES: Final = 12
"""base_offset + batch_length: what a reader needs to find the next batch."""
_BATCH_LENGTH: Final = struct.Struct("<i")
_BATCH_COUNT: Final = struct.Struct("<i")
_BATCH_ATTRIBUTES: Final = struct.Struct("<H")
"""record_count, at byte 28 of a stored batch."""
_BATCH_COUNT_END: Final = 32
CRC_START: Final = 24
ALIGNMENT: Final = 8
RECORD_COUNT_MAX: Final = 1 << 24
BATCH_BYTES_MAX: Final = (1 << 31) - 8
"""Hard ceiling of the format (int32 lengths); topics set far lower max_message_bytes."""

_CODEC_MASK: Final = 0x07
_TIMESTAMP_TYPE_BIT: Final = 0x08
_TRANSACTIONAL_BIT: Final = 0x10
_CONTROL_BIT: Final = 0x20
_HAS_KEYS_BIT: Final = 0x40
_HAS_HEADERS_BIT: Final = 0x80
KAFKA_RECORDS_ATTRIBUTE: Final = 0x100
_KAFKA_RECORDS_BIT: Final = KAFKA_RECORDS_ATTRIBUTE
_KNOWN_ATTRIBUTE_BITS: Final = 0x1FF
KAFKA_RECORDS_HEADER_BYTES: Final = 40
"""A Kafka-records body starts with Kafka's batch fields from its attributes to its record
count (docs/record-batch-format.md, "Batches produced over Kafka's protocol")."""
PRODUCER_ATTRIBUTE_BITS: Final = _CODEC_MASK | _HAS_KEYS_BIT | _HAS_HEADERS_BIT
"""Attribute bits a producer may set: codec, has keys, has headers. The timestamp type,
transactional and control bits are the broker's (log-append time, transaction markers)."""
TIMESTAMP_MIN_MS: Final = 0
"""1970-01-01T00:00:00.000Z: Kafka's rule (no negative timestamps)."""
TIMESTAMP_MAX_MS: Final = 253_402_300_799_999
"""9999-12-31T23:59:59.999Z: the last instant every language's date type can hold."""
TIMESTAMP_DELTA_MIN: Final = -(1 << 31)
TIMESTAMP_DELTA_MAX: Final = (1 << 31) - 1
"""Record timestamps relative to their batch's first_timestamp: int32 deltas."""
MESSAGE_BYTES_DEFAULT: Final = (4 << 20) - 1024
"""The default max_message_bytes (4 MiB - 1 KiB): a batch no larger fits, with the
answer's framing, in one Fetch answer under a stock gRPC client's 4 MiB receive limit, so
that a client in any language reads every batch of a topic at its default settings."""
UNCOMPRESSED_BYTES_MAX: Final = 1 << 30
"""Largest body a reader decompresses when it knows no topic limit (the largest
max_message_bytes a topic may set); the broker checks produced batches against the
topic's own max_message_bytes."""
_BASE_OFFSET_LEADER_EPOCH: Final = struct.Struct("<qii")
_LZ4_FRAME_MAGIC: Final = b"\x04\x22\x4d\x18"  # 0x184D2204, little-endian
_LZ4_FLAG_DICTIONARY_ID: Final = 0x01  # FLG bits of the LZ4 frame descriptor
_LZ4_FLAG_CONTENT_SIZE: Final = 0x08
_PRODUCER_FIELDS: Final = struct.Struct("<qih")


class Compression(enum.IntEnum):
    """Body codec ids (Kafka's numbers; gzip and snappy are not supported)."""

    NONE = 0
    LZ4 = 3
    ZSTD = 4

    @classmethod
    def parse(cls, name: str) -> Compression:
        """Parse a codec name (``none``, ``lz4``, ``zstd``), case-insensitively."""
        try:
            return cls[name.strip().upper()]
        except KeyError:
            valid = ", ".join(c.name.lower() for c in cls)
            raise HeadwaterError(
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                f"unknown compression {name!r}; valid: {valid}",
            ) from None


class TimestampType(enum.IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class CorruptBatchError(HeadwaterError):
    """The bytes are not a valid v1 record batch; ``message`` says which check failed."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


class UnsupportedCompressionError(HeadwaterError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, message)


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded 80-byte header of one batch (see the module docstring for the layout)."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    record_count: int
    last_offset_delta: int
    body_length: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    base_sequence: int
    producer_epoch: int
    uncompressed_body_length: int

    @property
    def total_size(self) -> int:
        return LENGTH_PREFIX_BYTES + self.batch_length

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        """One past the last offset of the batch."""
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> Compression:
        return Compression(self.attributes & _CODEC_MASK)

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType(1 if self.attributes & _TIMESTAMP_TYPE_BIT else 0)

    @property
    def has_keys(self) -> bool:
        return bool(self.attributes & _HAS_KEYS_BIT)

    @property
    def has_headers(self) -> bool:
        return bool(self.attributes & _HAS_HEADERS_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)

    @property
    def is_kafka_records(self) -> bool:
        """The body is a Kafka RecordBatch v2 from its attributes on, as a Kafka client
        produced it: the broker's own form, transcoded before any fetch answers."""
        return bool(self.attributes & _KAFKA_RECORDS_BIT)


# ----------------------------------------------------------------------------- helpers


def _pad(size: int) -> int:
    return -size % ALIGNMENT


def _padding(size: int) -> bytes:
    return b"\x00" * (-size % ALIGNMENT)


def _bitmap_bytes(count: int) -> int:
    return (count + 7) // 8


HeaderPairs = Sequence[tuple[str, bytes | None]]

_HEADERS_TYPE: Final = pa.list_(
    pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())])
)

RECORD_SCHEMA: Final = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.timestamp("ms", tz="UTC"), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", _HEADERS_TYPE),
    ]
)
"""Schema of the columnar view of decoded records (``decode_batch().records``)."""


def _canonical_bitmap(validity: pa.Buffer | None, count: int) -> bytes | memoryview:
    """A validity bitmap of ``count`` items in its canonical form: the bits at or past
    ``count`` (the unused bits of the last byte) are 0. None: every item is present."""
    size = _bitmap_bytes(count)
    spare_bits = 8 * size - count
    if size == 0:
        return b""
    if validity is None:
        return b"\xff" * (size - 1) + bytes([0xFF >> spare_bits])
    bitmap = memoryview(validity)[:size]
    if spare_bits and bitmap[size - 1] >> (8 - spare_bits):
        return bytes(bitmap[: size - 1]) + bytes([bitmap[size - 1] & (0xFF >> spare_bits)])
    return bitmap


def _binary_sections(
    values: Sequence[bytes | None] | pa.Array, count: int
) -> list[bytes | memoryview]:
    """Validity bitmap, int32 offsets and data of a binary column, each padded to 8."""
    array = values if isinstance(values, pa.Array) else pa.array(values, type=pa.binary())
    if array.type != pa.binary():
        array = array.cast(pa.binary())
    if len(array) != count:
        raise ValueError(f"column has {len(array)} entries, expected {count}")
    if array.offset != 0:
        array = pa.concat_arrays([array])  # re-base offsets at zero
    validity, offsets, data = array.buffers()
    bitmap = _canonical_bitmap(validity, count)
    bitmap_size = len(bitmap)
    offsets_size = 4 * (count + 1)
    offsets_bytes = memoryview(offsets)[:offsets_size]
    (data_size,) = struct.unpack_from("<i", offsets_bytes, offsets_size - 4)
    data_bytes = memoryview(data)[:data_size] if data is not None and data_size else b""
    return [
        bitmap,
        _padding(bitmap_size),
        offsets_bytes,
        _padding(offsets_size),
        data_bytes,
        _padding(data_size),
    ]


def _has_non_null(items: Sequence[object]) -> bool:
    if isinstance(items, list):
        return items.count(None) != len(items)  # C-level scan, no per-item Python frame
    return any(item is not None for item in items)


def _header_sections(headers: Sequence[HeaderPairs | None], count: int) -> list[bytes | memoryview]:
    if len(headers) != count:
        raise ValueError(f"headers has {len(headers)} entries, expected {count}")
    lists = pa.array([list(h) if h else [] for h in headers], type=_HEADERS_TYPE)
    list_offsets = lists.offsets
    entries = lists.values
    header_count = len(entries)
    offsets_bytes = memoryview(list_offsets.buffers()[1])[: 4 * (count + 1)]
    key_sections = _binary_sections(entries.field("key").cast(pa.binary()), header_count)
    # key validity is implied (keys are never null): drop the bitmap and its padding.
    value_sections = _binary_sections(entries.field("value"), header_count)
    return [offsets_bytes, _padding(len(offsets_bytes)), *key_sections[2:], *value_sections]


_UNJOINED_BODY_RECORDS_FROM: Final = 256
"""From this many records on, an uncompressed body's sections go into the batch without
being joined first (one copy of the body, not two); for fewer, one join of a small body
is cheaper than a CRC call per section."""
_ARROW_MIN_MAX_FROM: Final = 1024
"""From this many timestamps on, their bounds are taken in Arrow (a fixed ~8 us a call)
rather than by Python's min and max (~10 ns an item each)."""


def _timestamp_section(timestamps_ms: int | Sequence[int], count: int) -> tuple[int, int, bytes]:
    """(first_timestamp, max_timestamp, padded int32 deltas)."""
    if isinstance(timestamps_ms, int):
        return timestamps_ms, timestamps_ms, bytes(4 * count + _pad(4 * count))
    if len(timestamps_ms) != count:
        raise ValueError(f"timestamps has {len(timestamps_ms)} entries, expected {count}")
    first = timestamps_ms[0]
    stamps = None
    if count < _ARROW_MIN_MAX_FROM:
        low, high = min(timestamps_ms), max(timestamps_ms)
    else:  # one C pass to convert, one for both bounds
        stamps = pa.array(timestamps_ms, type=pa.int64())
        if stamps.null_count:  # as min() and max() refuse None below the threshold
            raise TypeError("a record timestamp is None")
        bounds = pc.min_max(stamps)
        low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low == high:
        return first, high, bytes(4 * count + _pad(4 * count))
    if low - first < TIMESTAMP_DELTA_MIN or high - first > TIMESTAMP_DELTA_MAX:
        raise ValueError("record timestamps in one batch must lie within 2**31 ms of the first")
    # Typed scalars: converting a Python int per call costs ~100 us (see _arange).
    if stamps is None:
        stamps = pa.array(timestamps_ms, type=pa.int64())
    deltas = pc.subtract(stamps, pa.scalar(first, pa.int64()))
    delta_bytes = memoryview(deltas.cast(pa.int32()).buffers()[1])[: 4 * count]
    return first, high, bytes(delta_bytes) + _padding(4 * count)


def compress(body: bytes, compression: Compression) -> bytes:
    if compression is Compression.NONE:
        return body
    if compression is Compression.ZSTD:
        return zstandard.ZstdCompressor(level=3).compress(body)
    return bytes(lz4.frame.compress(body))


def _zstd_decompress(stored: bytes | memoryview, size: int, whole: bool) -> bytes:
    """The first Zstandard frame of ``stored``, into a buffer of ``size`` bytes: output
    past it fails. With ``whole``, so does any byte after the frame (a second frame, a
    skippable frame)."""
    try:
        parameters = zstandard.get_frame_parameters(stored)
        if parameters.dict_id:
            raise CorruptBatchError(
                f"zstd frame names dictionary {parameters.dict_id}: batches use none"
            )
        declared = parameters.content_size
        if declared not in (zstandard.CONTENTSIZE_UNKNOWN, size):
            raise CorruptBatchError(
                f"zstd frame declares {declared} bytes, header says uncompressed_body_length={size}"
            )
        return bytes(
            zstandard.ZstdDecompressor().decompress(  # one per call: not thread-safe
                stored,
                max_output_size=max(size, 1),  # 0 would mean unbounded
                allow_extra_data=not whole,
            )
        )
    except zstandard.ZstdError as exc:
        if "unused data" in str(exc):
            raise CorruptBatchError(
                f"zstd body has bytes after its frame ({exc}): a produced body is exactly "
                "one Zstandard frame"
            ) from exc
        if "did not decompress full frame" in str(exc):
            raise CorruptBatchError(
                f"zstd body is truncated or decompresses to more than {size} bytes"
            ) from exc
        raise CorruptBatchError(f"zstd body does not decompress: {exc}") from exc


def _lz4_decompress(stored: bytes | memoryview, size: int, whole: bool) -> bytes:
    """The first LZ4 frame of ``stored`` (the LZ4 Frame Format), at most ``size`` bytes of
    it. Its descriptor is read here: no dictionary id, and a content size, when the frame
    has one, equal to ``size``. With ``whole``, any byte after the frame fails."""
    if bytes(stored[:4]) != _LZ4_FRAME_MAGIC or len(stored) < 7:
        raise CorruptBatchError(
            f"lz4 body starts with {bytes(stored[:4]).hex()}, not an LZ4 frame's magic "
            "04224d18: the body is one frame of the LZ4 Frame Format (not a raw block, "
            "not the legacy frame)"
        )
    flags = stored[4]
    if flags & _LZ4_FLAG_DICTIONARY_ID:
        raise CorruptBatchError("lz4 frame names a dictionary: batches use none")
    if flags & _LZ4_FLAG_CONTENT_SIZE:
        declared = int.from_bytes(bytes(stored[6:14]), "little")
        if declared != size:
            raise CorruptBatchError(
                f"lz4 frame declares {declared} bytes, header says uncompressed_body_length={size}"
            )
    try:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        raw = bytes(decompressor.decompress(stored, max_length=size))
    except (RuntimeError, ValueError) as exc:
        raise CorruptBatchError(f"lz4 body does not decompress: {exc}") from exc
    if len(raw) == size and not decompressor.eof:
        raise CorruptBatchError(f"lz4 body decompresses to more than {size} bytes")
    if whole and decompressor.unused_data:
        raise CorruptBatchError(
            f"lz4 body has {len(decompressor.unused_data)} bytes after its frame: a produced "
            "body is exactly one LZ4 frame"
        )
    return raw


def decompress(
    stored: bytes | memoryview,
    compression: Compression,
    size: int,
    max_size: int = UNCOMPRESSED_BYTES_MAX,
    whole: bool = False,
) -> bytes | memoryview:
    """Decompress a body, checking it yields exactly ``size`` bytes (an uncompressed body
    is returned as a view of ``stored``, not copied).

    ``size`` (the header's uncompressed_body_length) must not exceed ``max_size``, and no
    codec is allowed to produce more than ``size`` bytes: decompression stops there, so
    a body that claims or expands to more costs at most ``size`` bytes of memory.

    A reader decodes the body's first frame and ignores bytes after it (brokers before
    2026-11 stored such bodies); ``whole`` (the broker's check of a produced batch)
    refuses them: a produced body is exactly one frame.
    """
    if size > max_size:
        raise CorruptBatchError(
            f"uncompressed_body_length {size} exceeds the limit of {max_size} bytes "
            "(max_message_bytes)"
        )
    if compression is Compression.ZSTD:
        raw: bytes | memoryview = _zstd_decompress(stored, size, whole)
    elif compression is Compression.LZ4:
        raw = _lz4_decompress(stored, size, whole)
    else:
        raw = memoryview(stored)
    if len(raw) != size:
        raise CorruptBatchError(
            f"body decompresses to {len(raw)} bytes, header says uncompressed_body_length={size}"
        )
    return raw


# ----------------------------------------------------------------------------- encode


def encode_batch(
    values: Sequence[bytes | None] | pa.Array,
    *,
    keys: Sequence[bytes | None] | pa.Array | None = None,
    headers: Sequence[HeaderPairs | None] | None = None,
    timestamps_ms: int | Sequence[int] = 0,
    compression: Compression = Compression.NONE,
    base_offset: int = 0,
    leader_epoch: int = -1,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> bytes:
    """Encode records into one v1 batch.

    ``timestamps_ms`` is one create time for all records or one per record. ``keys`` None
    (or all None) omits the key section; ``headers`` None (or all empty) omits the header
    section. Raises ValueError for inputs no batch can hold (programmer errors of the
    caller: empty, mismatched lengths, too many records).
    """
    count = len(values)
    if not 1 <= count <= RECORD_COUNT_MAX:
        raise ValueError(f"a batch holds 1 to {RECORD_COUNT_MAX} records, got {count}")
    attributes = int(compression)
    sections: list[bytes | memoryview] = []
    if keys is not None and (
        keys.null_count < len(keys) if isinstance(keys, pa.Array) else _has_non_null(keys)
    ):
        attributes |= _HAS_KEYS_BIT
        sections += _binary_sections(keys, count)
    sections += _binary_sections(values, count)
    first_ts, max_ts, ts_section = _timestamp_section(timestamps_ms, count)
    sections.append(ts_section)
    if headers is not None and any(headers):
        attributes |= _HAS_HEADERS_BIT
        sections += _header_sections(headers, count)
    if count >= _UNJOINED_BODY_RECORDS_FROM and compression is Compression.NONE:
        # The body is copied once, into the batch; it is never joined on its own.
        stored: Sequence[bytes | memoryview] = sections
        body_length = stored_length = sum(map(len, sections))
    else:
        body = b"".join(sections)
        compressed = compress(body, compression)
        stored, body_length, stored_length = (compressed,), len(body), len(compressed)
    padding = _padding(stored_length)
    total = HEADER_BYTES + stored_length + len(padding)
    if total > BATCH_BYTES_MAX:
        raise ValueError(f"batch of {total} bytes exceeds the format's {BATCH_BYTES_MAX}")
    header = bytearray(
        HEADER_STRUCT.pack(
            base_offset,
            total - LENGTH_PREFIX_BYTES,
            leader_epoch,
            MAGIC,
            0,
            attributes,
            count,
            count - 1,
            stored_length,
            first_ts,
            max_ts,
            producer_id,
            base_sequence,
            producer_epoch,
            body_length,
        )
    )
    # CRC over [24, end): the header's tail, then the stored body, then the padding.
    crc = _crc32c.crc32c(bytes(header[CRC_START:]))
    for section in stored:
        crc = _crc32c.crc32c(section, crc)
    struct.pack_into("<I", header, 20, _crc32c.crc32c(padding, crc))
    return b"".join((header, *stored, padding))


def stamp_prefix(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """The batch's first 16 bytes with base_offset and leader_epoch rewritten; write it
    followed by ``batch[16:]`` to store the stamped batch without copying it (the CRC is
    unaffected)."""
    batch_length = struct.unpack_from("<i", batch, 8)[0]
    return _BASE_OFFSET_LEADER_EPOCH.pack(base_offset, batch_length, leader_epoch)


def encode_kafka_records(
    body: bytes | memoryview,
    record_count: int,
    first_timestamp: int,
    max_timestamp: int,
    producer_id: int,
    producer_epoch: int,
    base_sequence: int,
) -> bytes:
    """A stored batch whose body is ``body``, a Kafka RecordBatch v2 from its attributes
    field to its end, checked by its caller (``headwater.log.kafka_records.to_stored``):
    attribute 0x0100, codec none (the body keeps Kafka's own codec), base offset 0 and
    leader epoch -1 for the broker to write, the given record count, timestamps and
    producer fields, and the CRC of the whole."""
    size = len(body)
    header = bytearray(
        HEADER_STRUCT.pack(
            0,
            HEADER_BYTES + size + _pad(size) - LENGTH_PREFIX_BYTES,
            -1,
            MAGIC,
            0,
            _KAFKA_RECORDS_BIT,
            record_count,
            record_count - 1,
            size,
            first_timestamp,
            max_timestamp,
            producer_id,
            base_sequence,
            producer_epoch,
            size,
        )
    )
    padding = _padding(size)
    crc = _crc32c.crc32c(memoryview(header)[CRC_START:])
    crc = _crc32c.crc32c(body, crc)
    struct.pack_into("<I", header, 20, _crc32c.crc32c(padding, crc))
    return b"".join((header, body, padding))


def set_base_offset(batch: bytes, base_offset: int, leader_epoch: int) -> bytes:
    """Return ``batch`` with base_offset and leader_epoch rewritten (CRC unaffected)."""
    return stamp_prefix(batch, base_offset, leader_epoch) + batch[16:]


# ----------------------------------------------------------------------------- verify


def _checked_total(batch_length: int, available: int, position: int) -> int:
    """The total size ``batch_length`` gives a batch at ``position`` with ``available``
    bytes from there; raises CorruptBatchError when out of range or past the bytes."""
    total = LENGTH_PREFIX_BYTES + batch_length
    if total < HEADER_BYTES or total % ALIGNMENT or total > BATCH_BYTES_MAX:
        raise CorruptBatchError(
            f"batch_length {batch_length} gives total size {total}: must be a multiple "
            f"of {ALIGNMENT} in [{HEADER_BYTES}, {BATCH_BYTES_MAX}]"
        )
    if total > available:
        raise CorruptBatchError(
            f"truncated batch: header says {total} bytes, {available} available at {position}"
        )
    return total


_SPAN_STRUCT: Final = struct.Struct("<qi4xB11xii")
"""base_offset, batch_length, magic, record_count, last_offset_delta: a span's fields."""
assert _SPAN_STRUCT.size == 36


def read_span(buffer: bytes | memoryview, position: int = 0) -> tuple[int, int, int]:
    """(base offset, total size, next offset) of the batch at ``position``: what a reader
    needs to walk whole batches, each field checked as ``read_header`` checks it, at a
    fraction of its cost (one unpack, no header object). The rest of the header is
    checked where the batch is decoded: by the fronts that cut or transcode it, by a
    follower (``read_header``, the CRC) and by a client, which checks each batch's CRC.

    Raises CorruptBatchError naming the failed check."""
    available = len(buffer) - position
    if available < HEADER_BYTES:
        raise CorruptBatchError(
            f"truncated batch: {available} bytes at position {position}, a header is {HEADER_BYTES}"
        )
    base_offset, batch_length, magic, record_count, last_offset_delta = _SPAN_STRUCT.unpack_from(
        buffer, position
    )
    if magic != MAGIC:
        raise CorruptBatchError(f"magic {magic} at position {position}, expected {MAGIC}")
    total = _checked_total(batch_length, available, position)
    if not 1 <= record_count <= RECORD_COUNT_MAX or last_offset_delta != record_count - 1:
        raise CorruptBatchError(
            f"record_count {record_count} outside [1, {RECORD_COUNT_MAX}] or "
            f"last_offset_delta {last_offset_delta} != record_count - 1"
        )
    return base_offset, total, base_offset + last_offset_delta + 1


def read_header(buffer: bytes | memoryview, position: int = 0) -> BatchHeader:
    """Parse and sanity-check the header at ``position`` (no CRC check).

    Raises CorruptBatchError naming the failed check, or UnsupportedCompressionError.
    """
    available = len(buffer) - position
    if available < HEADER_BYTES:
        raise CorruptBatchError(
            f"truncated batch: {available} bytes at position {position}, a header is {HEADER_BYTES}"
        )
    header = BatchHeader(*HEADER_STRUCT.unpack_from(buffer, position))
    total = header.total_size
    if header.magic != MAGIC:
        raise CorruptBatchError(f"magic {header.magic} at position {position}, expected {MAGIC}")
    if bytes(buffer[position + 17 : position + 20]) != b"\x00\x00\x00":
        # Outside the CRC (like base_offset and leader_epoch), so checked here.
        raise CorruptBatchError(f"reserved header bytes 17-19 at position {position} are not zero")
    _checked_total(header.batch_length, available, position)
    if header.attributes & ~_KNOWN_ATTRIBUTE_BITS:
        raise CorruptBatchError(f"unknown attribute bits in {header.attributes:#06x}")
    codec = header.attributes & _CODEC_MASK
    if codec not in Compression._value2member_map_:
        valid = ", ".join(f"{c.value} ({c.name.lower()})" for c in Compression)
        raise UnsupportedCompressionError(f"codec id {codec} is not supported; valid: {valid}")
    if not 1 <= header.record_count <= RECORD_COUNT_MAX:
        raise CorruptBatchError(
            f"record_count {header.record_count} outside [1, {RECORD_COUNT_MAX}]"
        )
    if header.last_offset_delta != header.record_count - 1:
        raise CorruptBatchError(
            f"last_offset_delta {header.last_offset_delta} != record_count - 1 "
            f"({header.record_count - 1})"
        )
    stored_room = total - HEADER_BYTES
    if not 0 <= stored_room - header.body_length < ALIGNMENT:
        raise CorruptBatchError(
            f"body_length {header.body_length} does not fill the batch: expected "
            f"{stored_room - ALIGNMENT + 1}..{stored_room}"
        )
    if header.uncompressed_body_length < 0 or (
        header.compression is Compression.NONE
        and header.uncompressed_body_length != header.body_length
    ):
        raise CorruptBatchError(
            f"uncompressed_body_length {header.uncompressed_body_length} inconsistent with "
            f"body_length {header.body_length} and codec {header.compression.name.lower()}"
        )
    if header.max_timestamp < header.first_timestamp:
        raise CorruptBatchError(
            f"max_timestamp {header.max_timestamp} < first_timestamp {header.first_timestamp}"
        )
    if header.attributes & _KAFKA_RECORDS_BIT and (
        header.attributes != _KAFKA_RECORDS_BIT or header.body_length < KAFKA_RECORDS_HEADER_BYTES
    ):
        raise CorruptBatchError(
            f"a Kafka-records batch (attributes {header.attributes:#06x}, body_length "
            f"{header.body_length}) sets no other attribute bit and "
            f"holds at least {KAFKA_RECORDS_HEADER_BYTES} bytes of body"
        )
    return header


def compute_crc(buffer: bytes | memoryview, position: int, total_size: int) -> int:
    view = memoryview(buffer)[position + CRC_START : position + total_size]
    return int(_crc32c.crc32c(view))


def verify_batch(buffer: bytes | memoryview, position: int = 0) -> BatchHeader:
    """Check the header and the CRC of the batch at ``position``; return its header."""
    header = read_header(buffer, position)
    actual = compute_crc(buffer, position, header.total_size)
    if actual != header.crc:
        raise CorruptBatchError(
            f"CRC32C mismatch at position {position}: stored {header.crc:#010x}, "
            f"computed {actual:#010x}"
        )
    return header


def iter_headers(
    buffer: bytes | memoryview, verify_crc: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each whole batch in a concatenation of batches.

    Raises CorruptBatchError at the first invalid or truncated batch.
    """
    position = 0
    end = len(buffer)
    check = verify_batch if verify_crc else read_header
    while position < end:
        header = check(buffer, position)
        yield position, header
        position += header.total_size


def batches_end(
    buffer: bytes | memoryview,
    start: int,
    count: int,
    records_max: int | None = None,
    records_of_kafka: bool = False,
) -> tuple[int, int]:
    """Where whole batches from ``start`` of a concatenation of batches end, and the
    records counted in them: at most ``count`` batches and, past the first, none that
    would take the records counted over ``records_max``; fewer when the buffer ends
    first. Only the records of batches holding Kafka records are counted when
    ``records_of_kafka``, only those of the others otherwise (a caller counts the
    records whose handling costs it work). A walk of their length, attribute and count
    fields, nothing else read. A length out of range ends the walk at the buffer's end,
    leaving the rest to a decoder, which refuses it."""
    position, end, batches, records = start, len(buffer), 0, 0
    while batches < count and position < end:
        if end - position < _BATCH_COUNT_END:
            return end, records
        (length,) = _BATCH_LENGTH.unpack_from(buffer, position + 8)
        if length <= 0:
            return end, records
        (attributes,) = _BATCH_ATTRIBUTES.unpack_from(buffer, position + CRC_START)
        in_batch = 0
        if bool(attributes & KAFKA_RECORDS_ATTRIBUTE) == records_of_kafka:
            (in_batch,) = _BATCH_COUNT.unpack_from(buffer, position + 28)
        if batches and records_max is not None and records + in_batch > records_max:
            break
        batches += 1
        records += in_batch
        position += LENGTH_PREFIX_BYTES + length
    return min(position, end), records


# ----------------------------------------------------------------------------- decode


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """One decoded batch: its header and its records as an Arrow RecordBatch (RECORD_SCHEMA)."""

    header: BatchHeader
    records: pa.RecordBatch


class _BodyReader:
    """Cuts the body into 8-aligned sections, checking every length against what is left."""

    def __init__(self, body: bytes | memoryview) -> None:
        self.body = body
        self.view = memoryview(body)
        self.position = 0

    def take(self, size: int, what: str) -> pa.Buffer:
        if size < 0 or self.position + size > len(self.body):
            raise CorruptBatchError(
                f"{what}: needs {size} bytes at body position {self.position}, body has "
                f"{len(self.body)}"
            )
        start = self.position
        self.position += size + _pad(size)
        return pa.py_buffer(self.view[start : start + size])

    def offsets(self, count: int, what: str) -> tuple[pa.Buffer, int]:
        buffer = self.take(4 * (count + 1), f"{what} offsets")
        first, last = (
            struct.unpack_from("<i", buffer, 0)[0],
            struct.unpack_from("<i", buffer, 4 * count)[0],
        )
        if first != 0 or last < 0:
            raise CorruptBatchError(
                f"{what} offsets must start at 0 and end >= 0, got {first}..{last}"
            )
        return buffer, last

    def binary(
        self, count: int, what: str, with_validity: bool = True, validate: bool = True
    ) -> pa.Array:
        """A binary column, fully validated (every offset non-decreasing and within its
        data) before anything reads through its offsets: a cast or a slice of an array
        with a bad middle offset reads outside its buffers. With ``validate`` False the
        caller validates it (as part of a parent array) before any such use."""
        validity = self.take(_bitmap_bytes(count), f"{what} validity") if with_validity else None
        offsets, data_size = self.offsets(count, what)
        data = self.take(data_size, f"{what} data")
        array = pa.Array.from_buffers(pa.binary(), count, [validity, offsets, data])
        if validate:
            _validate(array, what)
        return array


def _validate(array: pa.Array, what: str) -> None:
    try:
        array.validate(full=True)
    except pa.ArrowInvalid as exc:
        raise CorruptBatchError(
            f"{what} offsets must start at 0, never decrease and end at the data's length: {exc}"
        ) from exc


def _arange(count: int, start: int) -> pa.Array:
    """int64 [start, start + count). A typed scalar matters: converting a Python int to an
    Arrow scalar costs ~100 us per call, the add itself ~10 us for 10k rows."""
    if count <= len(_ARANGE):
        return pc.add(_ARANGE.slice(0, count), pa.scalar(start, pa.int64()))
    return pa.array(range(start, start + count), type=pa.int64())


_ARANGE: Final = pa.array(range(1 << 16), type=pa.int64())


@dataclass(frozen=True, slots=True)
class _Columns:
    """The body's columns, each validated: keys, values (binary), timestamp deltas
    (int32) and headers (_HEADERS_TYPE)."""

    keys: pa.Array
    values: pa.Array
    deltas: pa.Array
    headers: pa.Array


def _decode_columns(header: BatchHeader, body: bytes | memoryview) -> _Columns:
    """Cut an uncompressed body into validated columns (zero-copy views into ``body``).

    Order matters: every length is checked against the body before a buffer is taken,
    and every array is fully validated by Arrow before it is cast, wrapped in a parent
    array or read; any failure is a CorruptBatchError naming the section."""
    count = header.record_count
    reader = _BodyReader(body)
    try:
        keys = reader.binary(count, "key") if header.has_keys else pa.nulls(count, type=pa.binary())
        values = reader.binary(count, "value")
        deltas = pa.Array.from_buffers(
            pa.int32(), count, [None, reader.take(4 * count, "timestamp deltas")]
        )
        if header.has_headers:
            list_offsets, header_count = reader.offsets(count, "header list")
            header_keys = reader.binary(header_count, "header key", with_validity=False)
            # Validated with the list below: nothing reads through its offsets before.
            header_values = reader.binary(header_count, "header value", validate=False)
            try:
                header_key_text = header_keys.cast(pa.string())
            except pa.ArrowInvalid as exc:
                raise CorruptBatchError(f"header keys must be valid UTF-8: {exc}") from exc
            entries = pa.StructArray.from_arrays(
                [header_key_text, header_values],
                fields=list(_HEADERS_TYPE.value_type),
            )
            headers = pa.Array.from_buffers(
                _HEADERS_TYPE, count, [None, list_offsets], children=[entries]
            )
            _validate(headers, "header list")
        else:
            headers = pa.nulls(count, type=_HEADERS_TYPE)
    except pa.ArrowInvalid as exc:
        raise CorruptBatchError(f"malformed body: {exc}") from exc
    if reader.position != len(body):
        raise CorruptBatchError(
            f"body has {len(body) - reader.position} unexplained trailing bytes"
        )
    return _Columns(keys, values, deltas, headers)


def decode_body(header: BatchHeader, body: bytes | memoryview) -> pa.RecordBatch:
    """Decode an uncompressed body into an Arrow RecordBatch of RECORD_SCHEMA.

    Every section is checked against the body and every offsets array validated
    (monotonic, within its data) before use; any failure is a CorruptBatchError. Buffers
    are zero-copy views into ``body``.
    """
    columns = _decode_columns(header, body)
    count = header.record_count
    if header.timestamp_type is TimestampType.LOG_APPEND_TIME:
        timestamps = pa.array([header.max_timestamp] * count, type=pa.int64())
    else:
        timestamps = pc.add(
            columns.deltas.cast(pa.int64()), pa.scalar(header.first_timestamp, pa.int64())
        )
    offsets = _arange(count, header.base_offset)
    return pa.RecordBatch.from_arrays(
        [
            offsets,
            timestamps.cast(pa.timestamp("ms", tz="UTC")),
            columns.keys,
            columns.values,
            columns.headers,
        ],
        schema=RECORD_SCHEMA,
    )


def split_by_timestamp_span(stamps: Sequence[int], start: int, end: int) -> list[tuple[int, int]]:
    """[start, end) of ``stamps`` split into consecutive pieces [a, b), each whose
    timestamps lie within the int32 delta (TIMESTAMP_DELTA_MIN, TIMESTAMP_DELTA_MAX) of its
    first: the records one batch can hold."""
    if end - start <= 1:
        return [(start, end)]
    window = stamps[start:end]
    if max(window) - min(window) <= TIMESTAMP_DELTA_MAX:
        return [(start, end)]
    pieces: list[tuple[int, int]] = []
    first = start
    for index in range(start + 1, end):
        delta = stamps[index] - stamps[first]
        if not TIMESTAMP_DELTA_MIN <= delta <= TIMESTAMP_DELTA_MAX:
            pieces.append((first, index))
            first = index
    pieces.append((first, end))
    return pieces


def timestamps_ms(records: pa.RecordBatch) -> list[int]:
    """Record timestamps as integer ms. Going through datetime (``.timestamp() * 1000``)
    is wrong: float seconds lose a millisecond for large timestamps, and a timestamp
    outside datetime's years 1-9999 (which a batch stored before the broker checked
    timestamps may hold) does not convert at all."""
    return list(records.column("timestamp").cast(pa.int64()).to_pylist())


def columns_without_timestamps(records: pa.RecordBatch) -> dict[str, list[Any]]:
    """Every column but ``timestamp`` as Python lists (see ``timestamps_ms`` for that)."""
    columns: dict[str, list[Any]] = records.drop_columns(["timestamp"]).to_pydict()
    return columns


def rows_without_timestamps(records: pa.RecordBatch) -> list[dict[str, Any]]:
    """Every row as a dict of every column but ``timestamp``."""
    rows: list[dict[str, Any]] = records.drop_columns(["timestamp"]).to_pylist()
    return rows


def decode_batch(
    buffer: bytes | memoryview, position: int = 0, verify_crc: bool = True
) -> DecodedBatch:
    """Verify and decode the batch at ``position``."""
    header = verify_batch(buffer, position) if verify_crc else read_header(buffer, position)
    if header.is_kafka_records:
        raise CorruptBatchError(
            f"the batch at position {position} holds Kafka records (attribute 0x0100), which "
            "a broker transcodes before a fetch answers; it is not for readers of this format"
        )
    start = position + HEADER_BYTES
    stored = memoryview(buffer)[start : start + header.body_length]
    body = decompress(stored, header.compression, header.uncompressed_body_length)
    return DecodedBatch(header, decode_body(header, body))


def decode_batches(buffer: bytes | memoryview, verify_crc: bool = True) -> list[DecodedBatch]:
    """Decode every batch of a concatenation (as returned by Fetch). For bytes from
    elsewhere (a fetch, a peer), ``decode_batches_within`` bounds what they decode to."""
    result = []
    for position, _header in iter_headers(buffer, verify_crc=verify_crc):
        result.append(decode_batch(buffer, position, verify_crc=False))
    return result


DECODED_RECORDS_MIN: Final = 1 << 16
FETCHED_BYTES_PER_RECORD: Final = 2


def decoded_records_max(fetched_bytes: int) -> int:
    """The most records a reader decodes from ``fetched_bytes`` of batches at once: one
    per FETCHED_BYTES_PER_RECORD bytes, and at least DECODED_RECORDS_MIN.

    An uncompressed record takes at least 8 bytes of body (two int32 lengths), so only a
    compressed batch holding more than one record for every 2 of its bytes reaches the
    bound: a compression bomb (400,000 null records compress with zstd into a 200-byte
    batch, and 4 MiB of such batches decode into 8 billion records), or records so alike
    that a reader takes them in more than one step (8-byte values that are all the same
    take 2.7 bytes a record with zstd, and are not cut). Arrow holds a decoded record in
    about 30 bytes, so a reader's memory stays within about 15 times what it fetched,
    plus the one batch it always decodes (bounded by the topic's max_message_bytes)."""
    return max(fetched_bytes // FETCHED_BYTES_PER_RECORD, DECODED_RECORDS_MIN)


def decode_batches_within(
    buffer: bytes | memoryview, records_max: int | None = None, verify_crc: bool = True
) -> tuple[list[DecodedBatch], int | None]:
    """Decode the batches of a concatenation in order, stopping before the first whose
    ``record_count`` would take the records decoded past ``records_max`` (by default
    ``decoded_records_max(len(buffer))``; the first batch is always decoded, so that a
    reader moves on). Returns the decoded batches and, when that left batches undecoded,
    the offset the reader goes on from (the last decoded batch's ``next_offset``), else
    None. Each batch is checked (``verify_crc``) before it is decompressed. Past the
    stop, only the next batch's header is read: a malformed header there (a length or
    count out of range) fails the whole call, while damage its CRC covers is left for
    the read that gets there."""
    if records_max is None:
        records_max = decoded_records_max(len(buffer))
    result: list[DecodedBatch] = []
    records = 0
    for position, header in iter_headers(buffer, verify_crc=False):
        records += header.record_count
        if result and records > records_max:
            return result, result[-1].header.next_offset
        result.append(decode_batch(buffer, position, verify_crc=verify_crc))
    return result, None


class InvalidTimestampError(HeadwaterError):
    """A record timestamp outside the range the broker accepts (INVALID_TIMESTAMP)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_TIMESTAMP, message)


FORMAT_TIMESTAMP_RANGE: Final = (TIMESTAMP_MIN_MS, TIMESTAMP_MAX_MS)


def _check_timestamp(timestamp: int, what: str, valid: tuple[int, int]) -> None:
    low, high = valid
    if not low <= timestamp <= high:
        raise InvalidTimestampError(
            f"{what} {timestamp} outside the accepted range [{low}, {high}] (ms since the epoch)"
        )


PRODUCER_EPOCH_MAX: Final = (1 << 15) - 1
SELF_NAMED_PRODUCER_ID_MIN: Final = 1 << 62
"""Producer ids from here up are named by their writers (deterministic ids, as the Spark
sink's); the cluster allocates ids below it (InitProducerId)."""
SEQUENCE_MAX: Final = (1 << 31) - 1


def sequence_after(base_sequence: int, records: int) -> int:
    """The sequence of the record ``records`` after the one at ``base_sequence`` (they
    wrap past SEQUENCE_MAX to 0, as Kafka's); -1 for a batch without sequences."""
    if base_sequence < 0:
        return -1
    return (base_sequence + records) % (SEQUENCE_MAX + 1)


def check_producer_fields(producer_id: int, epoch: int, sequence: int) -> None:
    """A batch is either not idempotent (producer_id, producer_epoch and base_sequence
    all -1) or idempotent (producer_id >= 0, producer_epoch in [0, 32767], base_sequence
    in [0, 2^31 - 1]); CorruptBatchError otherwise."""
    if producer_id == -1 and epoch == -1 and sequence == -1:
        return
    if producer_id >= 0 and 0 <= epoch <= PRODUCER_EPOCH_MAX and 0 <= sequence <= SEQUENCE_MAX:
        return
    raise CorruptBatchError(
        f"producer_id {producer_id}, producer_epoch {epoch}, base_sequence {sequence}: "
        "either all three are -1 (not idempotent), or producer_id >= 0, producer_epoch in "
        f"[0, {PRODUCER_EPOCH_MAX}] and base_sequence in [0, {SEQUENCE_MAX}]"
    )


def stamp_producer(
    batch: bytes, producer_id: int, producer_epoch: int, base_sequence: int
) -> bytes:
    """``batch`` with its producer fields (bytes 56-69) rewritten and its CRC computed
    again (the fields are covered by it)."""
    stamped = bytearray(batch)
    _PRODUCER_FIELDS.pack_into(stamped, 56, producer_id, base_sequence, producer_epoch)
    struct.pack_into("<I", stamped, 20, _crc32c.crc32c(memoryview(stamped)[CRC_START:]))
    return bytes(stamped)


def validate_batch(
    buffer: bytes | memoryview,
    max_uncompressed_bytes: int = UNCOMPRESSED_BYTES_MAX,
    timestamp_range: tuple[int, int] = FORMAT_TIMESTAMP_RANGE,
    require_keys: bool = False,
) -> BatchHeader:
    """Full check of one batch a producer sent: header, CRC, codec, body structure, the
    attribute bits a producer may set, and every record timestamp.

    The broker runs this on every produced batch, so that nothing it stores can fail a
    consumer's decoder. The uncompressed body may not exceed ``max_uncompressed_bytes``
    (decompression stops there); every record timestamp must lie in ``timestamp_range``
    (inclusive, within [TIMESTAMP_MIN_MS, TIMESTAMP_MAX_MS]) and ``max_timestamp`` must be
    the largest of them; with ``require_keys`` (a compacted topic) every record has a
    key (INVALID_RECORD). Raises CorruptBatchError, UnsupportedCompressionError,
    InvalidTimestampError, MESSAGE_TOO_LARGE (a body over ``max_uncompressed_bytes``, found
    from the header before decompressing) or that INVALID_RECORD naming the failed check;
    never anything else, whatever the bytes.
    """
    header = verify_batch(buffer, 0)
    if header.total_size != len(buffer):
        raise CorruptBatchError(
            f"payload is {len(buffer)} bytes but the batch header says {header.total_size}"
        )
    for start, end in RESERVED_CRC_COVERED_BYTES:
        if any(buffer[start:end]):
            raise CorruptBatchError(
                f"reserved header bytes {start}-{end - 1} are not zero: a producer writes "
                "every reserved byte (17-19, 26-27, 70-71, 76-79) as zero"
            )
    broker_bits = header.attributes & ~PRODUCER_ATTRIBUTE_BITS
    if broker_bits:
        raise CorruptBatchError(
            f"attribute bits {broker_bits:#06x} are the broker's (timestamp type 0x0008, "
            f"transactional 0x0010, control 0x0020, Kafka records 0x0100); a producer may set only "
            f"{PRODUCER_ATTRIBUTE_BITS:#06x} (codec, has keys, has headers)"
        )
    check_producer_fields(header.producer_id, header.producer_epoch, header.base_sequence)
    low = max(timestamp_range[0], TIMESTAMP_MIN_MS)
    high = min(timestamp_range[1], TIMESTAMP_MAX_MS)
    _check_timestamp(header.first_timestamp, "first_timestamp", (low, high))
    _check_timestamp(header.max_timestamp, "max_timestamp", (low, high))
    if header.uncompressed_body_length > max_uncompressed_bytes:
        raise HeadwaterError(
            ErrorCode.MESSAGE_TOO_LARGE,
            f"uncompressed_body_length {header.uncompressed_body_length} exceeds the limit of "
            f"{max_uncompressed_bytes} bytes (max_message_bytes, which bounds a body after "
            "decompression too): send fewer records per batch",
        )
    stored = memoryview(buffer)[HEADER_BYTES : HEADER_BYTES + header.body_length]
    body = decompress(
        stored,
        header.compression,
        header.uncompressed_body_length,
        max_uncompressed_bytes,
        whole=True,
    )
    columns = _decode_columns(header, body)
    if require_keys and (not header.has_keys or columns.keys.null_count):
        raise HeadwaterError(
            ErrorCode.INVALID_RECORD,
            f"{columns.keys.null_count if header.has_keys else header.record_count} record(s) "
            "without a key: a compacted topic (cleanup_policy compact) keeps the newest "
            "record per key, so every record needs one",
        )
    extremes = pc.min_max(columns.deltas).as_py()
    smallest = header.first_timestamp + extremes["min"]
    largest = header.first_timestamp + extremes["max"]
    _check_timestamp(smallest, "a record timestamp", (low, high))
    if largest != header.max_timestamp:
        raise CorruptBatchError(
            f"max_timestamp {header.max_timestamp} is not the largest record timestamp ({largest})"
        )
    return header
