"""Kafka's record batches (magic 2) to the stored format and back (pure: no I/O, no clock).

The log stores one format (docs/record-batch-format.md). A batch produced over Kafka's
protocol is checked and transcoded at the edge into one stored batch holding the same
records: keys, values, headers, per-record timestamps, and the producer id, epoch and
base sequence (so idempotence deduplicates Kafka producers' retries with the same rules
as gRPC ones). Codecs map to the stored format's: none, lz4 and zstd stay; gzip and
snappy bodies are stored lz4 (the stored format has no gzip or snappy).
A fetch over Kafka's protocol transcodes stored batches back, one Kafka batch per stored
batch with the same base offset, offsets, leader epoch, timestamps (and timestamp type)
and producer fields, uncompressed. Control batches are not returned.

Kafka batch layout (big-endian), 61 bytes of header then the records:
base offset i64, batch length i32 (bytes after this field), partition leader epoch i32,
magic i8 (2), CRC-32C u32 of everything after it, attributes i16 (bits 0-2 codec:
0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd; bit 3 log-append time; bit 4 transactional;
bit 5 control), last offset delta i32, base timestamp i64, max timestamp i64, producer
id i64, producer epoch i16, base sequence i32, record count i32.

Everything a client sends is checked before a library sees it: the header's lengths,
magic, CRC and counts, and a compressed body is decompressed into at most
``uncompressed_max`` bytes (a small body cannot expand without bound). Records are then
parsed by aiokafka's compiled codec, which checks each record against the body.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import cramjam
import crc32c
import lz4.frame
import zstandard
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headwater.errors import ErrorCode, HeadwaterError
from headwater.log import batch as batch_format

HEADER: Final = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES: Final = HEADER.size  # 61
LENGTH_PREFIX_BYTES: Final = 12  # base offset and batch length: not counted in the length
CRC_START: Final = 21
MAGIC: Final = 2
CODEC_MASK: Final = 0x07
TIMESTAMP_TYPE_BIT: Final = 0x08
TRANSACTIONAL_BIT: Final = 0x10
CONTROL_BIT: Final = 0x20
GZIP: Final = 1
SNAPPY: Final = 2
LZ4: Final = 3
ZSTD: Final = 4
_STORED_CODEC: Final = {
    0: batch_format.Compression.NONE,
    GZIP: batch_format.Compression.LZ4,
    SNAPPY: batch_format.Compression.LZ4,
    LZ4: batch_format.Compression.LZ4,
    ZSTD: batch_format.Compression.ZSTD,
}
_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_READ_CHUNK: Final = 1 << 16


@dataclass(frozen=True, slots=True)
class KafkaBatchHeader:
    """The fields of a Kafka batch header this module uses."""

    base_offset: int
    batch_length: int
    leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def total_size(self) -> int:
        return LENGTH_PREFIX_BYTES + self.batch_length

    @property
    def codec(self) -> int:
        return self.attributes & CODEC_MASK


def _invalid(message: str, code: ErrorCode = ErrorCode.CORRUPT_MESSAGE) -> HeadwaterError:
    return HeadwaterError(code, message)


def read_kafka_header(data: bytes | memoryview, position: int = 0) -> KafkaBatchHeader:
    """The header of the Kafka batch at ``position``, its lengths and magic checked."""
    if len(data) - position < HEADER_BYTES:
        raise _invalid(
            f"a record batch needs at least {HEADER_BYTES} bytes of header, got "
            f"{len(data) - position}"
        )
    header = KafkaBatchHeader(*HEADER.unpack_from(data, position))
    if header.magic != MAGIC:
        raise _invalid(
            f"record batch magic is {header.magic}; this broker takes magic 2 only (Kafka "
            "0.11 and later clients): set the client's api.version / message format to 2",
            ErrorCode.INVALID_RECORD,
        )
    if not HEADER_BYTES <= header.total_size <= len(data) - position:
        raise _invalid(
            f"record batch length {header.batch_length} does not fit the {len(data) - position} "
            f"bytes sent (valid: {HEADER_BYTES - LENGTH_PREFIX_BYTES} to "
            f"{len(data) - position - LENGTH_PREFIX_BYTES})"
        )
    if not 1 <= header.record_count <= batch_format.RECORD_COUNT_MAX:
        raise _invalid(
            f"record count {header.record_count}; valid range is "
            f"[1, {batch_format.RECORD_COUNT_MAX}]",
            ErrorCode.INVALID_RECORD,
        )
    if header.last_offset_delta != header.record_count - 1:
        raise _invalid(
            f"last offset delta {header.last_offset_delta} with {header.record_count} "
            "records; a produced batch's offsets are consecutive (delta = count - 1)",
            ErrorCode.INVALID_RECORD,
        )
    return header


def decompress_bounded(codec: int, body: bytes | memoryview, limit: int) -> bytes:
    """``body`` decompressed with Kafka's codec ``codec``, refused (MESSAGE_TOO_LARGE) as
    soon as it would pass ``limit`` bytes."""
    try:
        if codec == 0:
            out = bytes(body)
        elif codec == GZIP:
            inflater = zlib.decompressobj(wbits=47)  # gzip or zlib header
            out = inflater.decompress(bytes(body), limit + 1)
        elif codec == SNAPPY:
            out = _snappy_decompress(bytes(body), limit)
        elif codec == LZ4:
            out = lz4.frame.LZ4FrameDecompressor().decompress(bytes(body), max_length=limit + 1)
        elif codec == ZSTD:
            reader = zstandard.ZstdDecompressor().stream_reader(bytes(body))
            out = reader.read(limit + 1)
        else:
            raise HeadwaterError(
                ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
                f"compression codec {codec}; valid: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd",
            )
    except HeadwaterError:
        raise
    except Exception as exc:  # each codec's own error type: the body is damaged
        raise _invalid(f"the records do not decompress: {type(exc).__name__}: {exc}") from None
    if len(out) > limit:
        raise _invalid(
            f"the records decompress to more than {limit} bytes (the topic's max_message_bytes)",
            ErrorCode.MESSAGE_TOO_LARGE,
        )
    return out


def _snappy_decompress(data: bytes, limit: int) -> bytes:
    """Raw snappy, or the xerial framing Kafka's Java client writes (a magic, two
    versions, then blocks each with a big-endian length). Every block's stated
    uncompressed length is checked against what is left of ``limit`` first."""
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, limit)
    position, parts, total = 16, [], 0
    while position < len(data):
        if len(data) - position < 4:
            raise ValueError("a snappy block length is cut short")
        (size,) = struct.unpack_from(">i", data, position)
        position += 4
        if not 0 <= size <= len(data) - position:
            raise ValueError(f"snappy block of {size} bytes with {len(data) - position} left")
        part = _snappy_block(data[position : position + size], limit - total)
        position += size
        total += len(part)
        parts.append(part)
    return b"".join(parts)


def _snappy_block(block: bytes, limit: int) -> bytes:
    stated, shift, position = 0, 0, 0
    while True:  # the block's preamble: its uncompressed length as a varint
        if position >= len(block) or position > 4:
            raise ValueError("a snappy block has no valid length")
        byte = block[position]
        stated |= (byte & 0x7F) << shift
        position += 1
        shift += 7
        if not byte & 0x80:
            break
    if stated > limit:
        return b"\0" * (limit + 1)  # refused by the caller, nothing decompressed
    return bytes(cramjam.snappy.decompress_raw(block))


@dataclass(frozen=True, slots=True)
class ProducedBatch:
    """A produced Kafka batch transcoded: the stored batch and the Kafka header."""

    stored: bytes
    header: KafkaBatchHeader


def to_stored(data: bytes | memoryview, uncompressed_max: int) -> ProducedBatch:
    """The one Kafka batch of a produce request's partition, checked and transcoded
    (see the module doc). Raises HeadwaterError with Kafka's code for what is wrong."""
    header = read_kafka_header(data)
    if header.total_size != len(data):
        raise _invalid(
            f"{len(data)} bytes of records hold more than one record batch; a produce "
            "request carries exactly one batch per partition",
            ErrorCode.INVALID_RECORD,
        )
    view = memoryview(data)
    if crc32c.crc32c(view[CRC_START:]) != header.crc:
        raise _invalid("record batch CRC-32C does not match its bytes")
    if header.attributes & (TRANSACTIONAL_BIT | CONTROL_BIT):
        raise _invalid(
            "transactional and control batches are not supported (transactions are not "
            "implemented); use an idempotent producer without transactional.id",
            ErrorCode.INVALID_RECORD,
        )
    records = decompress_bounded(header.codec, view[HEADER_BYTES:], uncompressed_max)
    plain = bytearray(view[:HEADER_BYTES])
    struct.pack_into(">h", plain, CRC_START, header.attributes & ~CODEC_MASK)
    plain += records
    struct.pack_into(">i", plain, 8, len(plain) - LENGTH_PREFIX_BYTES)
    keys: list[bytes | None] = []
    values: list[bytes | None] = []
    timestamps: list[int] = []
    headers: list[list[tuple[str, bytes | None]]] = []
    try:
        for delta, record in enumerate(DefaultRecordBatch(plain)):
            if record.offset != delta:
                raise _invalid(
                    f"record {delta} has offset delta {record.offset}; a produced batch's "
                    "offset deltas are 0, 1, 2, ...",
                    ErrorCode.INVALID_RECORD,
                )
            keys.append(None if record.key is None else bytes(record.key))
            values.append(None if record.value is None else bytes(record.value))
            timestamps.append(record.timestamp)
            headers.append([(k, None if v is None else bytes(v)) for k, v in record.headers])
    except CorruptRecordException as exc:
        raise _invalid(f"the records do not parse: {exc}") from None
    except (UnicodeDecodeError, IndexError, ValueError, struct.error) as exc:
        raise _invalid(f"the records do not parse: {type(exc).__name__}: {exc}") from None
    if len(values) != header.record_count:
        raise _invalid(
            f"the batch header says {header.record_count} records, the body holds {len(values)}",
            ErrorCode.INVALID_RECORD,
        )
    # Kafka's rule: without a producer id the epoch and sequence mean nothing (aiokafka
    # writes sequence 0 there); the stored format wants them -1.
    idempotent = header.producer_id >= 0
    try:
        stored = batch_format.encode_batch(
            values,
            keys=keys,
            headers=headers,
            timestamps_ms=timestamps,
            compression=_STORED_CODEC[header.codec],
            producer_id=header.producer_id if idempotent else -1,
            producer_epoch=header.producer_epoch if idempotent else -1,
            base_sequence=header.base_sequence if idempotent else -1,
        )
    except (ValueError, OverflowError) as exc:
        raise _invalid(f"the records cannot be stored: {exc}", ErrorCode.INVALID_RECORD) from None
    return ProducedBatch(stored, header)


KAFKA_RECORD_OVERHEAD_BYTES: Final = 24
"""More than a Kafka record adds to its key, value and headers (length, attributes,
deltas, counts as varints): the bound on a transcoded batch's size."""


def kafka_size_bound(header: batch_format.BatchHeader) -> int:
    """At most how many bytes the Kafka batch of this stored batch takes (its records
    uncompressed, with their framing)."""
    return (
        HEADER_BYTES
        + header.uncompressed_body_length
        + KAFKA_RECORD_OVERHEAD_BYTES * header.record_count
    )


def to_kafka(data: bytes | memoryview, budget: int) -> bytes:
    """Stored batches (a read's bytes, whole batches, CRC checked when written) as
    Kafka batches, control batches left out (see the module doc). Batches are transcoded
    in order while the output stays within ``budget`` bytes (measured before any is
    decompressed, ``kafka_size_bound``), and always the first: a small stored batch
    that decompresses to much more never makes an answer larger than asked."""
    return b"".join(_kafka_batches(data, budget))


def _kafka_batches(data: bytes | memoryview, budget: int) -> Iterator[bytes]:
    first = True
    for position, header in batch_format.iter_headers(data, verify_crc=False):
        if header.is_control:
            continue
        size = kafka_size_bound(header)
        if not first and size > budget:
            return
        first = False
        budget -= size
        decoded = batch_format.decode_batch(data, position, verify_crc=False)
        columns = batch_format.columns_without_timestamps(decoded.records)
        stamps = batch_format.timestamps_ms(decoded.records)
        builder = DefaultRecordBatchBuilder(
            magic=MAGIC,
            compression_type=0,
            is_transactional=0,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            batch_size=1 << 31,
        )
        for delta, (key, value, pairs, stamp) in enumerate(
            zip(columns["key"], columns["value"], columns["headers"], stamps, strict=True)
        ):
            builder.append(
                delta,
                stamp,
                key,
                value,
                [(pair["key"], pair["value"]) for pair in pairs or ()],
            )
        built = builder.build()
        struct.pack_into(">q", built, 0, header.base_offset)
        struct.pack_into(">i", built, 12, header.leader_epoch)
        if header.timestamp_type is batch_format.TimestampType.LOG_APPEND_TIME:
            (attributes,) = struct.unpack_from(">h", built, CRC_START)
            struct.pack_into(">h", built, CRC_START, attributes | TIMESTAMP_TYPE_BIT)
            struct.pack_into(">I", built, 17, crc32c.crc32c(memoryview(built)[CRC_START:]))
        yield bytes(built)
