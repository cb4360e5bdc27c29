"""Kafka's record batches (magic 2) in the log (pure: no I/O, no clock).

A batch produced over Kafka's protocol is checked whole (its header, CRC-32C, codec, every
record's structure, offset delta and timestamp, and keys in a compacted topic) and then
kept as it came, wrapped in a stored batch with attribute 0x0100 ("Kafka records";
docs/record-batch-format.md, "Batches produced over Kafka's protocol"): the stored
header carries the record count, the first and largest record timestamps and the
producer id, epoch and base sequence, so the log, its indexes, retention, replication and
idempotence treat it as any other batch; its body is the Kafka batch from its attributes
field to its end, with Kafka's own codec.

Reading turns batches into the form the reader speaks:
- a Kafka fetch sends a Kafka-records batch as it was produced, with the base offset and
  leader epoch the broker gave it (``to_kafka``), and transcodes a batch of the columnar
  format into one uncompressed Kafka batch with the same offsets, timestamps (and type)
  and producer fields;
- a gRPC fetch, the cleaner and timestamp lookups take columnar batches: a Kafka-records
  batch is transcoded into one (``to_columnar``, ``decode_stored``) with the same
  offsets, leader epoch, keys, values, headers, timestamps and producer fields, its codec
  none, lz4 or zstd as it was (gzip and snappy become lz4, which the columnar format has).
Control batches are never returned to a Kafka client.

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

import contextlib
import dataclasses
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

import cramjam
import crc32c
import lz4.frame
import pyarrow as pa
import zstandard
from aiokafka.errors import CorruptRecordException
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headwater.log import batch as batch_format
from headwater.shared.errors import ErrorCode, HeadwaterError

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
TIMESTAMP_DELTA_RANGE: Final = (batch_format.TIMESTAMP_DELTA_MIN, batch_format.TIMESTAMP_DELTA_MAX)
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
    """A produced Kafka batch, checked whole and wrapped for the log (``to_stored``): the
    only way a Kafka-records batch enters the log, so every one there was checked."""

    stored: bytes
    header: KafkaBatchHeader


@dataclass(frozen=True, slots=True)
class _Parsed:
    """What parsing a Kafka batch's records found."""

    keys: list[bytes | None]
    values: list[bytes | None]
    timestamps: list[int]
    headers: list[list[tuple[str, bytes | None]] | None]


def _plain_batch(
    header: KafkaBatchHeader, data: bytes | memoryview, uncompressed_max: int
) -> bytes | bytearray:
    """The Kafka batch ``data`` with its records decompressed (codec bits cleared), for
    the record parser; the records may not pass ``uncompressed_max`` bytes. An
    uncompressed batch is returned as it is (as bytes)."""
    if header.codec == 0:
        if len(data) - HEADER_BYTES > uncompressed_max:
            raise _invalid(
                f"the records take {len(data) - HEADER_BYTES} bytes, more than "
                f"{uncompressed_max} (the topic's max_message_bytes)",
                ErrorCode.MESSAGE_TOO_LARGE,
            )
        return data if isinstance(data, bytes) else bytes(data)
    records = decompress_bounded(header.codec, memoryview(data)[HEADER_BYTES:], uncompressed_max)
    plain = bytearray(memoryview(data)[:HEADER_BYTES])
    struct.pack_into(">h", plain, CRC_START, header.attributes & ~CODEC_MASK)
    plain += records
    struct.pack_into(">i", plain, 8, len(plain) - LENGTH_PREFIX_BYTES)
    return plain


@contextlib.contextmanager
def _parsing() -> Iterator[None]:
    """aiokafka's errors while it parses records, as CORRUPT_MESSAGE naming the cause."""
    try:
        yield
    except CorruptRecordException as exc:
        raise _invalid(f"the records do not parse: {exc}") from None
    except (UnicodeDecodeError, IndexError, ValueError, struct.error) as exc:
        raise _invalid(f"the records do not parse: {type(exc).__name__}: {exc}") from None


RECORD_ERRORS_MAX: Final = 1000
"""Records a refusal names one by one at most (Produce v8's ``record_errors``)."""


class BadRecordsError(HeadwaterError):
    """A batch refused for some of its records: ``records`` holds (index in the batch,
    what is wrong) of each, at most RECORD_ERRORS_MAX, for Produce v8's per-record errors
    (KIP-467), so a client knows which records failed."""

    def __init__(self, code: ErrorCode, message: str, records: list[tuple[int, str]]) -> None:
        super().__init__(code, message)
        self.records = tuple(records[:RECORD_ERRORS_MAX])


def _check_records(
    header: KafkaBatchHeader,
    plain: bytes | bytearray,
    timestamp_range: tuple[int, int],
    require_keys: bool,
) -> tuple[int, int]:
    """Parse every record of ``plain`` and check them: offset deltas 0, 1, 2, ..., as many
    records as the header says, every timestamp in ``timestamp_range`` and within
    TIMESTAMP_DELTA_RANGE of record 0's, a key on each with ``require_keys``. Returns
    record 0's timestamp and the largest. The checks run over whole columns (builtins
    in C); the record at fault is looked for only once one fails."""
    offsets: list[int] = []
    stamps: list[int] = []
    keyless: list[int] = []
    # One pass, each record dropped at once: records held in a list until the end would
    # wake the cyclic garbage collector over the whole process many times a batch.
    with _parsing():
        for record in DefaultRecordBatch(plain):
            offsets.append(record.offset)
            stamps.append(record.timestamp)
            if require_keys and record.key is None:
                keyless.append(len(offsets) - 1)
    if len(offsets) != header.record_count:
        raise _invalid(
            f"the batch header says {header.record_count} records, the body holds {len(offsets)}",
            ErrorCode.INVALID_RECORD,
        )
    if offsets != list(range(len(offsets))):
        delta = next(i for i, offset in enumerate(offsets) if offset != i)
        raise _invalid(
            f"record {delta} has offset delta {offsets[delta]}; a produced batch's offset "
            "deltas are 0, 1, 2, ...",
            ErrorCode.INVALID_RECORD,
        )
    first, smallest, largest = stamps[0], min(stamps), max(stamps)
    low, high = timestamp_range
    if smallest < low or largest > high:
        outside = [i for i, stamp in enumerate(stamps) if not low <= stamp <= high]
        raise BadRecordsError(
            ErrorCode.INVALID_TIMESTAMP,
            f"record {outside[0]} has timestamp {stamps[outside[0]]}; valid range is "
            f"[{low}, {high}] (the topic's message.timestamp.before.max.ms and after.max.ms)",
            [(i, f"timestamp {stamps[i]} outside [{low}, {high}]") for i in outside],
        )
    if keyless:
        raise BadRecordsError(
            ErrorCode.INVALID_RECORD,
            f"record {keyless[0]} has no key: a compacted topic (cleanup.policy compact) keeps "
            "the newest record per key, so every record needs one",
            [(i, "no key in a compacted topic") for i in keyless],
        )
    return first, largest


def to_stored(
    data: bytes | memoryview,
    uncompressed_max: int,
    timestamp_range: tuple[int, int] = batch_format.FORMAT_TIMESTAMP_RANGE,
    require_keys: bool = False,
) -> ProducedBatch:
    """The one Kafka batch of a produce request's partition, checked whole and wrapped
    for the log (see the module doc). ``uncompressed_max`` bounds its records after
    decompression, ``timestamp_range`` every record's timestamp; ``require_keys`` (a
    compacted topic) refuses a record without a key. Raises HeadwaterError with Kafka's
    code for what is wrong, whatever the bytes."""
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
    if header.attributes & TIMESTAMP_TYPE_BIT:
        raise _invalid(
            "the batch sets the log-append-time attribute (0x08), which is the broker's to "
            "set; a producer sends create time",
            ErrorCode.INVALID_RECORD,
        )
    if header.attributes & ~(CODEC_MASK | TIMESTAMP_TYPE_BIT | TRANSACTIONAL_BIT | CONTROL_BIT):
        raise _invalid(
            f"record batch attributes {header.attributes:#06x} set unknown bits (valid: "
            "0x07 codec, 0x08 timestamp type, 0x10 transactional, 0x20 control)",
            ErrorCode.INVALID_RECORD,
        )
    plain = _plain_batch(header, data, uncompressed_max)
    low = max(timestamp_range[0], batch_format.TIMESTAMP_MIN_MS)
    high = min(timestamp_range[1], batch_format.TIMESTAMP_MAX_MS)
    first, largest = _check_records(header, plain, (low, high), require_keys)
    # Kafka's rule: without a producer id the epoch and sequence mean nothing (aiokafka
    # writes sequence 0 there); the stored header wants them -1.
    idempotent = header.producer_id >= 0
    producer = (
        (header.producer_id, header.producer_epoch, header.base_sequence)
        if idempotent
        else (-1, -1, -1)
    )
    batch_format.check_producer_fields(*producer)
    stored = batch_format.encode_kafka_records(
        view[KAFKA_BODY_START:], header.record_count, first, largest, *producer
    )
    return ProducedBatch(stored, header)


KAFKA_BODY_START: Final = CRC_START
"""Where the part of a Kafka batch the log keeps starts: its attributes (byte 21), the
first byte its CRC-32C covers."""

_KAFKA_PREFIX: Final = struct.Struct(">qiibI")  # base offset, length, epoch, magic, CRC


def kafka_batch(data: bytes | memoryview, position: int, header: batch_format.BatchHeader) -> bytes:
    """The Kafka batch a Kafka-records stored batch at ``position`` holds, with the base
    offset and leader epoch the broker gave it (its CRC-32C computed again: Kafka's covers
    only what follows it, so it is the one the producer sent)."""
    return b"".join(_kafka_parts(data, position, header))


def _kafka_parts(
    data: bytes | memoryview, position: int, header: batch_format.BatchHeader
) -> tuple[bytes, memoryview]:
    """``kafka_batch`` in two parts, its first 21 bytes and a view of the rest."""
    start = position + batch_format.HEADER_BYTES
    body = memoryview(data)[start : start + header.body_length]
    prefix = _KAFKA_PREFIX.pack(
        header.base_offset,
        len(body) + _KAFKA_PREFIX.size - LENGTH_PREFIX_BYTES,
        header.leader_epoch,
        MAGIC,
        crc32c.crc32c(body),
    )
    return prefix, body


def kafka_columnar(
    data: bytes | memoryview, position: int, header: batch_format.BatchHeader
) -> bytes:
    """The Kafka-records stored batch at ``position`` as batches of the columnar format
    with the same base offset, leader epoch, offsets, records, timestamps and producer
    fields; its codec as the Kafka batch's (gzip and snappy: lz4). One batch, unless its
    timestamps span more than a columnar batch's int32 deltas hold (2^31 ms: a Kafka batch
    may, with its varint deltas): then one per stretch that fits, their offsets and
    sequences following on. The batch was checked whole when produced; a failure here is a
    damaged log (CORRUPT_MESSAGE)."""
    kafka = kafka_batch(data, position, header)
    kafka_header = read_kafka_header(kafka)
    plain = _plain_batch(kafka_header, kafka, batch_format.UNCOMPRESSED_BYTES_MAX)
    parsed = _parse_records(kafka_header, plain)
    stamps = parsed.timestamps
    parts = []
    try:
        for start, end in batch_format.split_by_timestamp_span(stamps, 0, len(stamps)):
            parts.append(
                batch_format.encode_batch(
                    parsed.values[start:end],
                    keys=parsed.keys[start:end],
                    headers=parsed.headers[start:end],
                    timestamps_ms=stamps[start:end],
                    compression=_STORED_CODEC[kafka_header.codec],
                    base_offset=header.base_offset + start,
                    leader_epoch=header.leader_epoch,
                    producer_id=header.producer_id,
                    producer_epoch=header.producer_epoch,
                    base_sequence=batch_format.sequence_after(header.base_sequence, start),
                )
            )
    except (ValueError, OverflowError) as exc:
        raise _invalid(f"stored Kafka records do not transcode: {exc}") from None
    return b"".join(parts)


def _parse_records(header: KafkaBatchHeader, plain: bytes | bytearray) -> _Parsed:
    """Every record of ``plain`` as columns."""
    parsed = _Parsed([], [], [], [])
    with _parsing():
        for record in DefaultRecordBatch(plain):
            parsed.keys.append(None if record.key is None else bytes(record.key))
            parsed.values.append(None if record.value is None else bytes(record.value))
            parsed.timestamps.append(record.timestamp)
            pairs = record.headers  # None when empty: a list a record would wake the GC
            parsed.headers.append(
                [(k, None if v is None else bytes(v)) for k, v in pairs] if pairs else None
            )
    if len(parsed.values) != header.record_count:
        raise _invalid(
            f"the batch header says {header.record_count} records, the body holds "
            f"{len(parsed.values)}"
        )
    return parsed


def decode_stored(
    data: bytes | memoryview, position: int = 0, verify_crc: bool = True
) -> batch_format.DecodedBatch:
    """The stored batch at ``position`` decoded into columns, whichever its form: the
    broker's own readers (the cleaner, timestamp lookups) take this, not
    ``batch.decode_batch``, which refuses Kafka records. The header returned is the
    columnar one (a Kafka-records batch's codec is the one it transcodes to); for a Kafka
    batch whose timestamps need several columnar batches, the first one's, with the
    record count, last offset and largest timestamp of them all (its lengths and CRC are
    the first one's)."""
    check = batch_format.verify_batch if verify_crc else batch_format.read_header
    header = check(data, position)
    if not header.is_kafka_records:
        return batch_format.decode_batch(data, position, verify_crc=False)
    decoded = batch_format.decode_batches(kafka_columnar(data, position, header), False)
    if len(decoded) == 1:
        return decoded[0]
    # Timestamps too far apart for one columnar batch: the records of all of them, under
    # the first one's header (its codec is the one they share) made to span them all.
    records = pa.Table.from_batches([d.records for d in decoded]).combine_chunks()
    first, last = decoded[0].header, decoded[-1].header
    spanning = dataclasses.replace(
        first,
        record_count=sum(d.header.record_count for d in decoded),
        last_offset_delta=last.last_offset - first.base_offset,
        max_timestamp=max(d.header.max_timestamp for d in decoded),
    )
    return batch_format.DecodedBatch(spanning, records.to_batches()[0])


_LENGTH: Final = struct.Struct("<i")
_ATTRIBUTES: Final = struct.Struct("<H")


def holds_kafka_records(data: bytes | memoryview) -> bool:
    """Whether any batch of a read's bytes (whole stored batches) holds Kafka records:
    two fields read per batch. A length out of range answers True, so that the caller
    takes the path that checks every header."""
    position, end = 0, len(data)
    while position < end:
        if end - position < batch_format.HEADER_BYTES:
            return True
        (length,) = _LENGTH.unpack_from(data, position + 8)
        (attributes,) = _ATTRIBUTES.unpack_from(data, position + batch_format.CRC_START)
        if attributes & batch_format.KAFKA_RECORDS_ATTRIBUTE or length <= 0:
            return True
        position += batch_format.LENGTH_PREFIX_BYTES + length
    return False


def to_columnar(
    data: bytes | memoryview, budget: int, whole_first: bool = True
) -> tuple[bytes | memoryview, int | None]:
    """A read's stored batches as columnar ones, for a gRPC fetch: returned as they are
    when they fit ``budget`` and none holds Kafka records (two fields read per batch,
    ``holds_kafka_records``), else each Kafka-records batch transcoded
    (``kafka_columnar``), in order while the answer stays within ``budget`` bytes, and
    the first whatever its size when ``whole_first``.
    Returns the bytes and, when batches were left out, the base offset of the first
    one left out (else None)."""
    if len(data) <= budget and not holds_kafka_records(data):
        return data, None
    headers = list(batch_format.iter_headers(data, verify_crc=False))
    parts: list[bytes | memoryview] = []
    size = 0
    view = memoryview(data)
    for position, header in headers:
        if header.is_kafka_records:
            part: bytes | memoryview = kafka_columnar(data, position, header)
        else:
            part = view[position : position + header.total_size]
        if (parts or not whole_first) and size + len(part) > budget:
            return b"".join(parts), header.base_offset
        parts.append(part)
        size += len(part)
    return b"".join(parts), None


KAFKA_RECORD_OVERHEAD_BYTES: Final = 24
"""More than a Kafka record adds to its key, value and headers (length, attributes,
deltas, counts as varints): the bound on a transcoded batch's size."""


def kafka_size_bound(header: batch_format.BatchHeader) -> int:
    """At most how many bytes the Kafka batch of this stored batch takes: a Kafka-records
    batch its body and Kafka's 21 bytes before it, a columnar one its records
    uncompressed with their framing."""
    if header.is_kafka_records:
        return header.body_length + KAFKA_BODY_START
    return (
        HEADER_BYTES
        + header.uncompressed_body_length
        + KAFKA_RECORD_OVERHEAD_BYTES * header.record_count
    )


@dataclass(frozen=True, slots=True)
class KafkaBatches:
    """Stored batches as Kafka batches (``to_kafka_within``): ``data``; the offset after
    the last stored batch taken or passed over (``None`` when none was), and whether
    every batch of the stored bytes was (``complete``; False when one past the budget
    ended the walk)."""

    data: bytes
    next_offset: int | None
    complete: bool


def to_kafka(data: bytes | memoryview, budget: int, whole_first: bool = True) -> bytes:
    """Stored batches (a read's bytes, whole batches, CRC checked when written) as
    Kafka batches, control batches left out (see the module doc). Batches are taken in
    order while the output stays within ``budget`` bytes (measured before any is
    decompressed, ``kafka_size_bound``), and the first whatever its size when
    ``whole_first`` (KIP-74: the first batch of the first partition of a fetch that has
    any is sent whole, so that a consumer always makes progress; in the partitions after
    it, a batch past what is left of the fetch's bytes is not): a small stored batch
    that decompresses to much more never makes an answer larger than asked."""
    return to_kafka_within(data, budget, whole_first).data


def to_kafka_within(data: bytes | memoryview, budget: int, whole_first: bool) -> KafkaBatches:
    """``to_kafka``, telling also where the batches taken end and whether they are all
    of ``data``'s."""
    parts: list[bytes | memoryview] = []
    first = whole_first
    next_offset: int | None = None
    for position, header in batch_format.iter_headers(data, verify_crc=False):
        if not header.is_control:
            size = kafka_size_bound(header)
            if not first and size > budget:
                return KafkaBatches(b"".join(parts), next_offset, complete=False)
            first = False
            budget -= size
            if header.is_kafka_records:
                parts.extend(_kafka_parts(data, position, header))
            else:
                parts.append(_kafka_batch_of_columns(data, position, header))
        next_offset = header.next_offset
    return KafkaBatches(b"".join(parts), next_offset, complete=True)


def _kafka_batch_of_columns(
    data: bytes | memoryview, position: int, header: batch_format.BatchHeader
) -> bytes:
    """The Kafka batch of the columnar stored batch at ``position``: its records
    uncompressed, with the stored batch's offsets, epoch, producer and timestamps."""
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
    return bytes(built)
