"""Kafka's wire protocol and record batches, without a node: frames and headers, the
version table, building answers at every version served, and transcoding record batches
both ways with every codec; hostile frames and batches are refused with Kafka's codes,
never a crash or an unbounded decompression. The seeded fuzz cases run here; ``make
fuzz`` runs more (``tests/fuzz_kafka.py``)."""

from __future__ import annotations

import dataclasses
import io
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import cramjam
import crc32c
import lz4.frame
import pytest
import zstandard
from aiokafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v8.request import MetadataRequest, MetadataRequestTopic
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_writer

from headwater.log import batch as batch_format
from headwater.log import kafka_records as records
from headwater.node.kafka import protocol, request_shape
from headwater.node.kafka.request_shape import RequestLimits
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests import fuzz_kafka

NOW_MS = 1_767_225_600_000


def kafka_batch(
    count: int = 3,
    codec: int = 0,
    producer: tuple[int, int, int] = (-1, -1, -1),
    value_bytes: int = 10,
) -> bytes:
    producer_id, epoch, sequence = producer
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=sequence,
        batch_size=1 << 30,
    )
    for i in range(count):
        builder.append(
            i,
            NOW_MS + i,
            None if i == 0 else b"key-%d" % i,
            b"v" * value_bytes if i != 1 else None,
            [("trace", b"t%d" % i), ("empty", None)] if i == 2 else [],
        )
    return bytes(builder.build())


def frame_of(header: object, body: object) -> bytes:
    out = io.BytesIO()
    entity_writer(type(header))(out, header)
    entity_writer(type(body))(out, body)
    return out.getvalue()


# ----------------------------------------------------------------------------- records


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_kafka_batch_is_stored_and_read_back_with_the_same_records(codec: int) -> None:
    produced = records.to_stored(kafka_batch(codec=codec, producer=(7, 2, 40)), 1 << 20)
    header = batch_format.read_header(produced.stored)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (7, 2, 40)
    assert header.record_count == 3
    stored = batch_format.set_base_offset(produced.stored, 500, 4)
    back = DefaultRecordBatch(bytearray(records.to_kafka(stored, 1 << 20)))
    assert back.validate_crc()
    assert (back.base_offset, back.producer_id, back.producer_epoch, back.base_sequence) == (
        500,
        7,
        2,
        40,
    )
    got = [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in back]
    assert got == [
        (500, NOW_MS, None, b"v" * 10, []),
        (501, NOW_MS + 1, b"key-1", None, []),
        (502, NOW_MS + 2, b"key-2", b"v" * 10, [("trace", b"t2"), ("empty", None)]),
    ]


def test_a_batch_without_a_producer_id_ignores_its_epoch_and_sequence() -> None:
    """aiokafka writes base sequence 0 with producer id -1: Kafka ignores both fields
    then, and so does the broker (stored as -1, not refused as a half-idempotent batch)."""
    produced = records.to_stored(kafka_batch(producer=(-1, 3, 0)), 1 << 20)
    header = batch_format.verify_batch(produced.stored)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (-1, -1, -1)


@pytest.mark.parametrize("codec", [0, 1, 2, 3, 4], ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_a_kafka_batch_is_kept_as_it_came_and_read_as_columns_over_grpc(codec: int) -> None:
    """The log keeps the Kafka batch's bytes from its attributes on: a Kafka fetch gets
    them back byte for byte (base offset and leader epoch the broker's), a gRPC fetch and
    the broker's own readers the same records as columns, with the Kafka codec's
    counterpart (gzip and snappy: lz4)."""
    sent = kafka_batch(codec=codec, producer=(7, 2, 40))
    produced = records.to_stored(sent, 1 << 20)
    header = batch_format.verify_batch(produced.stored)
    assert header.is_kafka_records and header.total_size % 8 == 0
    assert (header.first_timestamp, header.max_timestamp) == (NOW_MS, NOW_MS + 2)
    stored = batch_format.set_base_offset(produced.stored, 500, 4)
    fetched = records.to_kafka(stored, 1 << 20)
    assert fetched[records.KAFKA_BODY_START :] == sent[records.KAFKA_BODY_START :]
    assert struct.unpack_from(">qiib", fetched) == (500, len(sent) - 12, 4, 2)
    assert fetched[17:21] == sent[17:21]  # the producer's CRC-32C
    with pytest.raises(batch_format.CorruptBatchError, match="Kafka records"):
        batch_format.decode_batch(stored)  # never for a client's decoder
    columnar, cut_at = records.to_columnar(stored + stored_columnar(503), 1 << 20)
    assert cut_at is None
    decoded = batch_format.decode_batches(columnar)
    assert decoded[0].header.compression == {0: 0, 1: 3, 2: 3, 3: 3, 4: 4}[codec]
    assert (decoded[0].header.base_offset, decoded[0].header.leader_epoch) == (500, 4)
    producer = decoded[0].header.producer_id, decoded[0].header.producer_epoch
    assert producer == (7, 2) and decoded[0].header.base_sequence == 40
    rows = [
        (r["offset"], r["key"], r["value"], r["headers"])
        for d in decoded
        for r in d.records.to_pylist()
    ]
    assert rows == [
        (500, None, b"v" * 10, []),
        (501, b"key-1", None, []),
        (
            502,
            b"key-2",
            b"v" * 10,
            [{"key": "trace", "value": b"t2"}, {"key": "empty", "value": None}],
        ),
        (503, None, b"c", None),
    ]
    assert records.decode_stored(stored).records.column("value").to_pylist()[1] is None


def stored_columnar(base_offset: int) -> bytes:
    """One record of the columnar format at ``base_offset``."""
    return batch_format.set_base_offset(
        batch_format.encode_batch([b"c"], timestamps_ms=NOW_MS), base_offset, 4
    )


def test_a_grpc_fetch_of_kafka_batches_stays_within_its_budget() -> None:
    """Transcoded batches are taken while the answer stays within the budget (always
    the first); the offset to go on from is the first batch left out."""
    one = batch_format.set_base_offset(records.to_stored(kafka_batch(), 1 << 20).stored, 0, 1)
    two = batch_format.set_base_offset(records.to_stored(kafka_batch(), 1 << 20).stored, 3, 1)
    data, cut_at = records.to_columnar(one + two, 1)
    assert cut_at == 3 and len(batch_format.decode_batches(data)) == 1
    assert records.to_columnar(stored_columnar(0), 1) == (stored_columnar(0), None)


def test_records_written_over_grpc_read_back_as_kafka_batches() -> None:
    stored = batch_format.encode_batch(
        [b"a", b"b"], keys=[b"k", None], headers=[[("h", b"1")], None], timestamps_ms=NOW_MS
    )
    stored = batch_format.set_base_offset(stored, 10, 1) + batch_format.set_base_offset(
        batch_format.encode_batch([b"c"], timestamps_ms=NOW_MS + 5), 12, 1
    )
    data = records.to_kafka(stored, 1 << 20)
    header = records.read_kafka_header(data)
    first = DefaultRecordBatch(bytearray(data[: header.total_size]))
    assert [(r.offset, r.key, r.value, r.headers) for r in first] == [
        (10, b"k", b"a", [("h", b"1")]),
        (11, None, b"b", []),
    ]
    rest = DefaultRecordBatch(bytearray(data[header.total_size :]))
    assert [(r.offset, r.value, r.timestamp) for r in rest] == [(12, b"c", NOW_MS + 5)]


def _tamper(batch: bytes, at: int, value: bytes) -> bytes:
    return batch[:at] + value + batch[at + len(value) :]


def _recrc(batch: bytes) -> bytes:
    return _tamper(batch, 17, struct.pack(">I", crc32c.crc32c(batch[records.CRC_START :])))


@pytest.mark.parametrize(
    ("damage", "code", "words"),
    [
        (lambda b: b[:40], ErrorCode.CORRUPT_MESSAGE, "61 bytes of header"),
        (lambda b: _tamper(b, 16, b"\x01"), ErrorCode.INVALID_RECORD, "magic 2 only"),
        (lambda b: _tamper(b, 8, struct.pack(">i", 10**6)), ErrorCode.CORRUPT_MESSAGE, "length"),
        (lambda b: _tamper(b, 30, b"\xff"), ErrorCode.CORRUPT_MESSAGE, "CRC-32C"),
        (lambda b: b + kafka_batch(), ErrorCode.INVALID_RECORD, "exactly one batch"),
        (
            lambda b: _recrc(_tamper(b, 57, struct.pack(">i", 0))),
            ErrorCode.INVALID_RECORD,
            "record count 0",
        ),
        (
            lambda b: _recrc(_tamper(b, 21, struct.pack(">h", 0x10))),
            ErrorCode.INVALID_RECORD,
            "transactional",
        ),
        (
            lambda b: _recrc(_tamper(b, 21, struct.pack(">h", 7))),
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
            "codec 7",
        ),
        (lambda b: _recrc(_shorten(b)), ErrorCode.CORRUPT_MESSAGE, "do not parse"),
    ],
    ids=[
        "short",
        "magic",
        "length",
        "crc",
        "two-batches",
        "count",
        "transactional",
        "codec",
        "cut",
    ],
)
def test_a_damaged_batch_is_refused_with_kafkas_code(
    damage: object, code: ErrorCode, words: str
) -> None:
    with pytest.raises(HeadwaterError) as refused:
        records.to_stored(damage(kafka_batch()), 1 << 20)  # type: ignore[operator]
    assert refused.value.code is code, refused.value.message
    assert words in refused.value.message


def _shorten(batch: bytes) -> bytes:
    """The batch less its last 3 bytes, with length and CRC fixed: the records are cut."""
    cut = batch[:-3]
    return _tamper(cut, 8, struct.pack(">i", len(cut) - records.LENGTH_PREFIX_BYTES))


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=["gzip", "snappy", "lz4", "zstd"])
def test_a_small_body_cannot_decompress_past_the_limit(codec: int) -> None:
    huge = b"\0" * (64 << 20)
    body = {
        1: lambda: zlib.compress(huge, wbits=31),
        2: lambda: bytes(cramjam.snappy.compress_raw(huge)),
        3: lambda: lz4.frame.compress(huge),
        4: lambda: zstandard.ZstdCompressor().compress(huge),
    }[codec]()
    assert len(body) < 4 << 20
    with pytest.raises(HeadwaterError) as refused:
        records.decompress_bounded(codec, body, 1 << 20)
    assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE


def test_a_fetch_answer_stays_within_its_budget_however_far_batches_decompress() -> None:
    """1 MiB of zeros stores in a few hundred bytes (zstd); 200 such batches read in one
    go would transcode to 200 MiB: only what the budget holds is transcoded."""
    zeros = batch_format.encode_batch(
        [b"\0" * (1 << 20)], timestamps_ms=NOW_MS, compression=batch_format.Compression.ZSTD
    )
    stored = b"".join(batch_format.set_base_offset(zeros, n, 0) for n in range(200))
    assert len(stored) < 200 << 10
    answer = records.to_kafka(stored, 3 << 20)
    assert (2 << 20) < len(answer) <= 3 << 20
    assert len(records.to_kafka(stored, 1)) > 1 << 20  # the first batch always


def test_a_batch_over_the_topics_limit_is_refused() -> None:
    with pytest.raises(HeadwaterError) as refused:
        records.to_stored(kafka_batch(count=100, codec=4, value_bytes=1000), 50_000)
    assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE


# ----------------------------------------------------------------------------- protocol


def test_apiversions_v3_decodes_with_its_flexible_header() -> None:
    frame = frame_of(
        RequestHeaderV2(
            request_api_key=18, request_api_version=3, correlation_id=9, client_id="rdkafka"
        ),
        ApiVersionsRequest(client_software_name="librdkafka", client_software_version="2.16"),
    )
    request = protocol.decode_request(frame)
    assert (request.api_key, request.api_version, request.correlation_id) == (18, 3, 9)
    assert request.client_id == "rdkafka"
    assert request.body.client_software_name == "librdkafka"


def test_bytes_after_a_body_are_ignored_as_kafka_ignores_them() -> None:
    frame = frame_of(
        RequestHeaderV1(request_api_key=3, request_api_version=8, correlation_id=1, client_id="c"),
        MetadataRequest(
            topics=(MetadataRequestTopic(name="t"),),
            allow_auto_topic_creation=False,
            include_cluster_authorized_operations=False,
            include_topic_authorized_operations=False,
        ),
    )
    assert protocol.decode_request(frame).body.topics[0].name == "t"
    assert protocol.decode_request(frame + b"\0").body.topics[0].name == "t"
    with pytest.raises(request_shape.MalformedRequestError, match="runs past the request"):
        protocol.decode_request(frame[:-3])


def test_librdkafkas_metadata_for_every_topic_decodes() -> None:
    """librdkafka's Metadata v12 for every topic, as it sends it (test 0017 of its own
    suite): the topic count is a one-byte null compact array followed by the three other
    bytes of the int32 it reserved, then its real flags; Kafka reads the null array and
    ignores what is left over."""
    frame = bytes.fromhex("0003000c000000020010303031375f636f6d7072657373696f6e0000000000010000")
    request = protocol.decode_request(frame)
    assert (request.api_key, request.api_version, request.client_id) == (
        3,
        12,
        "0017_compression",
    )
    assert request.body.topics is None


def test_tagged_fields_a_schema_does_not_know_are_skipped() -> None:
    """A newer client may add tagged fields anywhere a message is flexible; Kafka's
    protocol says a reader skips those it does not know. Here: two in the header, one in
    a topic of a Metadata v12 and one after its body, each with bytes of its own."""
    unknown = bytes([7, 3]) + b"new"  # tag 7, 3 bytes
    header = struct.pack(">hhih", 3, 12, 5, 1) + b"c" + bytes([2]) + unknown + bytes([9, 0])
    topic = bytes(16) + bytes([2]) + b"t" + bytes([1]) + unknown
    body = bytes([2]) + topic + b"\0\0" + bytes([1]) + bytes([30, 1, 0xFF])
    request = protocol.decode_request(header + body)
    assert (request.api_key, request.api_version, request.correlation_id) == (3, 12, 5)
    assert request.client_id == "c"
    assert [t.name for t in request.body.topics] == ["t"]
    with pytest.raises(request_shape.MalformedRequestError, match="tagged field"):
        protocol.decode_request(header + body[:-1])  # the last one's bytes cut short


def test_a_request_of_many_unknown_tagged_fields_is_refused_before_it_is_rebuilt() -> None:
    """Each unknown tagged field costs the broker a note and a copy: past
    UNKNOWN_TAGS_MAX the request is refused, however small its fields (a 4 MiB frame holds
    two million empty ones)."""
    limit = request_shape.UNKNOWN_TAGS_MAX

    def api_versions(tags: int) -> bytes:
        fields = b"".join(bytes([0x80 | (100 + i) & 0x7F, (100 + i) >> 7, 0]) for i in range(tags))
        count = bytes([tags]) if tags < 0x80 else bytes([tags & 0x7F | 0x80, tags >> 7])
        return struct.pack(">hhih", 18, 3, 1, 1) + b"c" + count + fields + b"\x02a\x02b\x00"

    assert protocol.decode_request(api_versions(limit - 1)).body.client_software_name == "a"
    with pytest.raises(request_shape.MalformedRequestError, match=f"more than {limit} tagged"):
        protocol.decode_request(api_versions(limit + 1))


def test_a_produce_of_many_tiny_entries_is_refused_before_it_is_decoded() -> None:
    """A million one-partition entries in 9 MB would take seconds to decode: the walk of
    its lengths refuses it at once."""
    header = struct.pack(">hhih", 0, 7, 1, -1) + struct.pack(">hhi", -1, 1, 1000)
    entries = struct.pack(">ii", 0, -1) * 1_000_000
    frame = header + struct.pack(">i", 1) + struct.pack(">h", 1) + b"t"
    frame += struct.pack(">i", 1_000_000) + entries
    with pytest.raises(
        request_shape.MalformedRequestError,
        match=r"partition_data holds 1000000 partitions in one request; at most 10000",
    ):
        protocol.decode_request(frame, RequestLimits())
    cut = header + struct.pack(">i", 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 2)
    with pytest.raises(request_shape.MalformedRequestError, match="runs past"):
        protocol.decode_request(cut + struct.pack(">ii", 0, 50), RequestLimits())


def test_every_array_of_every_served_request_has_a_bound() -> None:
    """A new API or version whose request has an array the walk does not know the kind
    of would be bounded by the frame alone."""
    unbounded = []

    def visit(schema: type[object]) -> None:
        for field, kind, nested in protocol._fields(schema):
            base = kind.removeprefix("nullable ")
            known = (schema.__name__, field.name) in request_shape.ARRAY_KINDS
            if base in ("entities", "array") and not known:
                unbounded.append(f"{schema.__name__}.{field.name}")
            if nested is not None and dataclasses.is_dataclass(nested):
                visit(nested)

    for api_key, (low, high) in protocol.SUPPORTED_VERSIONS.items():
        for version in range(low, high + 1):
            visit(load_request_schema(api_key, version))
    assert not unbounded, sorted(set(unbounded))


def test_the_entries_walked_one_by_one_are_bounded_over_the_whole_request() -> None:
    """A CreateTopics of 5 topics with 5 configs each: 30 entries walked, past a bound of
    20 though every array is within its own."""
    topics = [
        {"name": f"t{i}", "configs": [{"name": f"c{j}", "value": "v"} for j in range(5)]}
        for i in range(5)
    ]
    schema = load_request_schema(19, 4)
    out = io.BytesIO()
    header = protocol.build(
        schema.__header_schema__, request_api_key=19, request_api_version=4, client_id="c"
    )
    entity_writer(type(header))(out, header)
    entity_writer(schema)(out, protocol.build(schema, topics=topics, timeout=1000))
    limits = RequestLimits(entries_max=20)
    with pytest.raises(request_shape.MalformedRequestError, match="more than 20 entries"):
        protocol.decode_request(out.getvalue(), limits)
    assert len(protocol.decode_request(out.getvalue(), RequestLimits()).body.topics) == 5


def test_an_unsupported_apiversions_is_answered_in_v0_with_the_list() -> None:
    answer = protocol.unsupported_answer(protocol.FrameHeader(18, 9, 77))
    assert answer is not None
    size, correlation_id, error_code, count = struct.unpack_from(">iihi", answer)
    assert (size, correlation_id, error_code) == (len(answer) - 4, 77, 35)
    assert count == len(protocol.SUPPORTED_VERSIONS)


def test_an_api_not_served_gets_unsupported_version_and_an_unknown_key_none() -> None:
    answer = protocol.unsupported_answer(protocol.FrameHeader(32, 1, 5))  # DescribeConfigs
    assert answer is not None and struct.unpack_from(">i", answer, 4) == (5,)
    assert protocol.unsupported_answer(protocol.FrameHeader(999, 0, 5)) is None


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (k, v)
        for k, (low, high) in protocol.SUPPORTED_VERSIONS.items()
        for v in range(low, high + 1)
    ],
)
def test_every_served_version_has_a_request_and_a_response_message(
    api_key: int, version: int
) -> None:
    schema = protocol.response_schema(api_key, version)
    frame = protocol.encode_response(1, protocol.build(schema))
    assert struct.unpack_from(">ii", frame) == (len(frame) - 4, 1)


# ----------------------------------------------------------------------------- fuzz


def test_fuzzed_request_frames_never_escape_the_decoders() -> None:
    fuzz_kafka.fuzz_requests(seed=1, cases=3000)


def test_requests_near_and_over_their_limits_are_refused_exactly_when_over() -> None:
    fuzz_kafka.fuzz_request_limits(seed=4, cases=300)


def test_fuzzed_record_batches_never_escape_the_decoders() -> None:
    fuzz_kafka.fuzz_batches(seed=2, cases=1500)


def test_fuzzed_consumer_protocol_bytes_never_escape_the_decoders() -> None:
    fuzz_kafka.fuzz_consumer_protocol(seed=3, cases=3000)


STATED_COUNT_OF_2_31 = bytes.fromhex(
    "0008000900000007000466757a7a0001ffffffff0100fffffffe7069632d6102000000000000000000"
    "fffe00ffffffff00000000443963"
)
"""An OffsetCommit v9 frame (found by the fuzzer) whose compact array states about 2^31
entries: kio's native reader asked for 240 GB and aborted the whole process."""


def test_a_count_past_the_frame_is_refused_before_kio_reads_it() -> None:
    script = (
        "from headwater.node.kafka import protocol, request_shape\n"
        f"frame = bytes.fromhex({STATED_COUNT_OF_2_31.hex()!r})\n"
        "try:\n"
        "    protocol.decode_request(frame)\n"
        "except request_shape.MalformedRequestError as error:\n"
        "    print('refused:', error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused: "), done.stdout
    assert "runs past the request's 55 bytes" in done.stdout


def test_every_count_and_length_of_every_request_is_checked_before_kio() -> None:
    """Each byte of a valid request of every API and version served, replaced by a
    varint past any frame: each case decodes or is refused as malformed, and the process
    survives them all (a count kio trusted would abort it)."""
    script = (
        "from tests import fuzz_kafka\n"
        "from headwater.node.kafka import protocol, request_shape\n"
        "refused = 0\n"
        "for frame in fuzz_kafka._request_frames():\n"
        "    for varint in fuzz_kafka.LARGE_VARINTS:\n"
        "        for at in range(protocol.FRAME_HEADER.size, len(frame)):\n"
        "            try:\n"
        "                protocol.decode_request(frame[:at] + varint + frame[at + 1 :])\n"
        "            except request_shape.MalformedRequestError:\n"
        "                refused += 1\n"
        "print(refused)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stdout) > 1000


def test_a_kafka_batch_whose_timestamps_span_more_than_2_31_ms_is_kept_and_reads_back() -> None:
    """Kafka takes a batch whose record timestamps lie years apart (its deltas are
    varints); so does this broker, though the columnar form keeps int32 deltas. It is stored as it came, a Kafka fetch sends it back byte for
    byte, and a gRPC fetch, timestamp lookups and the cleaner read it as two columnar
    batches whose offsets and sequences follow on."""
    from headwater.log import cleaner

    day = 86_400_000
    stamps = [1_600_000_000_000, 1_600_000_000_000 + 30 * day, 1_600_000_000_000 + 31 * day]
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=0,
        producer_id=7,
        producer_epoch=1,
        base_sequence=10,
        batch_size=1 << 20,
    )
    for delta, stamp in enumerate(stamps):
        builder.append(delta, stamp, b"k%d" % delta, b"v%d" % delta, [])
    produced = bytes(builder.build())
    stored = batch_format.set_base_offset(records.to_stored(produced, 1 << 20).stored, 100, 3)
    assert (
        records.to_kafka(stored, 1 << 20)[records.KAFKA_BODY_START :]
        == (produced[records.KAFKA_BODY_START :])
    )
    columnar, cut_at = records.to_columnar(stored, 1 << 20)
    decoded = batch_format.decode_batches(columnar)
    assert cut_at is None and [d.header.base_offset for d in decoded] == [100, 101]
    assert [d.header.base_sequence for d in decoded] == [10, 11]
    assert [t for d in decoded for t in batch_format.timestamps_ms(d.records)] == stamps
    whole = records.decode_stored(stored)
    assert batch_format.timestamps_ms(whole.records) == stamps
    spanned = whole.header
    assert (spanned.base_offset, spanned.last_offset, spanned.record_count) == (100, 102, 3)
    assert spanned.max_timestamp == stamps[-1]
    rewritten = cleaner._rewrite(batch_format.read_header(stored), stored, [True, True, False])
    kept = [d for part in rewritten for d in batch_format.decode_batches(part)]
    assert [(d.header.base_offset, d.header.record_count) for d in kept] == [(100, 1), (101, 1)]
