"""Record batch format v1: round trips (Hypothesis), test vectors, and malformed input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.client.consumer import fetched_from
from headwater.client.positions import TopicPartition
from headwater.log import batch as bf
from headwater.shared.errors import ErrorCode, HeadwaterError
from tests.fuzz_batch import compressed_batch
from tests.fuzz_batch import rechecksummed as _rechecksummed

VECTORS = json.loads(
    (Path(__file__).parent.parent / "docs/testvectors/record-batches.json").read_text()
)["vectors"]

optional_bytes = st.one_of(st.none(), st.binary(max_size=64))
header_lists = st.one_of(
    st.none(), st.lists(st.tuples(st.text(max_size=8), optional_bytes), max_size=3)
)


@st.composite
def record_sets(draw: st.DrawFn) -> dict:
    count = draw(st.integers(min_value=1, max_value=40))
    values = draw(st.lists(optional_bytes, min_size=count, max_size=count))
    keys = draw(st.one_of(st.none(), st.lists(optional_bytes, min_size=count, max_size=count)))
    headers = draw(st.one_of(st.none(), st.lists(header_lists, min_size=count, max_size=count)))
    base = draw(st.integers(min_value=0, max_value=2**40))
    stamps = draw(
        st.one_of(
            st.integers(min_value=0, max_value=2**41),
            st.lists(
                st.integers(min_value=2**40, max_value=2**40 + 2**30),
                min_size=count,
                max_size=count,
            ),
        )
    )
    codec = draw(st.sampled_from(list(bf.Compression)))
    return {
        "values": values,
        "keys": keys,
        "headers": headers,
        "timestamps_ms": stamps,
        "compression": codec,
        "base_offset": base,
    }


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(record_sets())
def test_round_trip(case: dict) -> None:
    data = bf.encode_batch(**case)
    assert len(data) % 8 == 0
    assert bf.validate_batch(data).record_count == len(case["values"])
    decoded = bf.decode_batch(data)
    rows = decoded.records.to_pylist()
    count = len(case["values"])
    stamps = case["timestamps_ms"]
    expected_stamps = [stamps] * count if isinstance(stamps, int) else stamps
    assert [r["offset"] for r in rows] == list(
        range(case["base_offset"], case["base_offset"] + count)
    )
    assert [r["value"] for r in rows] == case["values"]
    assert [r["key"] for r in rows] == (case["keys"] or [None] * count)
    assert bf.timestamps_ms(decoded.records) == expected_stamps
    expected_headers = [list(h or []) for h in (case["headers"] or [None] * count)]
    assert [
        [(h["key"], h["value"]) for h in (r["headers"] or [])] for r in rows
    ] == expected_headers
    assert decoded.header.max_timestamp == max(expected_stamps)


def test_rewriting_base_offset_keeps_the_crc_valid() -> None:
    data = bf.encode_batch([b"a", b"b"])
    moved = bf.set_base_offset(data, 1234, 7)
    header = bf.verify_batch(moved)
    assert (header.base_offset, header.leader_epoch, header.next_offset) == (1234, 7, 1236)


@pytest.mark.parametrize("vector", VECTORS, ids=[v["name"] for v in VECTORS])
def test_published_vectors(vector: dict) -> None:
    data = bytes.fromhex(vector["batch_hex"])
    decoded = bf.decode_batch(data)
    assert decoded.header.crc == vector["crc"] == crc32c.crc32c(data[bf.CRC_START :])
    producer = (vector["producer_id"], vector["producer_epoch"], vector["base_sequence"])
    header = decoded.header
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == producer
    bf.validate_batch(data)  # a producer may send it as it is
    rows = decoded.records.to_pylist()
    assert len(rows) == len(vector["records"])
    for row, stamp, expected in zip(
        rows, bf.timestamps_ms(decoded.records), vector["records"], strict=True
    ):
        assert row["offset"] == expected["offset"]
        assert stamp == expected["timestamp_ms"]
        assert (row["key"].hex() if row["key"] is not None else None) == expected["key"]
        assert (row["value"].hex() if row["value"] is not None else None) == expected["value"]
        assert [
            [h["key"], h["value"].hex() if h["value"] is not None else None]
            for h in row["headers"] or []
        ] == expected["headers"]
    if vector["byte_exact"]:
        rebuilt = bf.encode_batch(
            [
                bytes.fromhex(r["value"]) if r["value"] is not None else None
                for r in vector["records"]
            ],
            keys=[
                bytes.fromhex(r["key"]) if r["key"] is not None else None for r in vector["records"]
            ],
            headers=[
                [(k, bytes.fromhex(v) if v is not None else None) for k, v in r["headers"]]
                for r in vector["records"]
            ],
            timestamps_ms=[r["timestamp_ms"] for r in vector["records"]],
            base_offset=vector["base_offset"],
            leader_epoch=vector["leader_epoch"],
            producer_id=vector["producer_id"],
            producer_epoch=vector["producer_epoch"],
            base_sequence=vector["base_sequence"],
        )
        if len({r["timestamp_ms"] for r in vector["records"]}) == 1:
            assert bf.decode_batch(rebuilt).records.equals(decoded.records)
        else:
            assert rebuilt == data


def test_vectors_file_is_current(tmp_path: Path) -> None:
    import runpy

    script = Path(__file__).parent.parent / "scripts/gen_test_vectors.py"
    namespace = runpy.run_path(str(script))
    namespace["OUT"] = tmp_path / "v.json"
    namespace["main"].__globals__["OUT"] = tmp_path / "v.json"
    namespace["main"]()
    fresh = json.loads((tmp_path / "v.json").read_text())["vectors"]
    for old, new in zip(VECTORS, fresh, strict=True):
        if old["byte_exact"]:
            assert old == new, "run python scripts/gen_test_vectors.py"


# --------------------------------------------------------------------------- malformed input


SAMPLE = bf.encode_batch(
    [b"alpha", None, b"gamma"],
    keys=[b"k", None, b"kk"],
    headers=[[("h", b"v")], None, []],
    timestamps_ms=[5, 9, 7],
)


def test_every_truncation_is_rejected() -> None:
    for size in range(len(SAMPLE)):
        with pytest.raises(bf.CorruptBatchError):
            bf.validate_batch(SAMPLE[:size])


def test_every_flipped_byte_outside_the_rewritable_fields_is_rejected() -> None:
    for position in range(8, len(SAMPLE)):
        if 12 <= position < 16:  # leader_epoch: rewritten by the broker, outside the CRC
            continue
        data = bytearray(SAMPLE)
        data[position] ^= 0x5A
        with pytest.raises(HeadwaterError) as info:
            bf.validate_batch(bytes(data))
        assert info.value.code in (
            ErrorCode.CORRUPT_MESSAGE,
            ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
        )


@pytest.mark.parametrize(
    ("offset", "fmt", "value", "fragment"),
    [
        (16, "<B", 2, "magic"),
        (24, "<H", 0x0001, "codec id 1"),
        (24, "<H", 0x0100, "0x0100"),
        (24, "<H", 0x0200, "unknown attribute bits"),
        (28, "<i", 0, "record_count"),
        (28, "<i", 5, "last_offset_delta"),
        (32, "<i", 7, "last_offset_delta"),
        (36, "<i", 9999, "body_length"),
        (48, "<q", -(2**62), "max_timestamp"),
        (72, "<i", 3, "uncompressed_body_length"),
    ],
)
def test_bad_header_fields_with_valid_crc(offset: int, fmt: str, value: int, fragment: str) -> None:
    data = bytearray(SAMPLE)
    struct.pack_into(fmt, data, offset, value)
    with pytest.raises(HeadwaterError) as info:
        bf.validate_batch(_rechecksummed(data))
    assert fragment in info.value.message


def test_bad_batch_length_is_rejected() -> None:
    for length in (-12, 3, len(SAMPLE) - 12 + 8, 2**31 - 1):
        data = bytearray(SAMPLE)
        struct.pack_into("<i", data, 8, length)
        with pytest.raises(bf.CorruptBatchError):
            bf.validate_batch(bytes(data))


@settings(max_examples=300)
@given(st.data())
def test_garbage_body_with_valid_crc_is_rejected_or_consistent(data: st.DataObject) -> None:
    """Random body bytes under a valid header and CRC: the decoder either rejects them
    with a typed error or yields exactly record_count records; never anything else."""
    body_size = bf.HEADER_BYTES + 8 * data.draw(st.integers(min_value=0, max_value=16))
    raw = bytearray(SAMPLE[: bf.HEADER_BYTES]) + bytearray(
        data.draw(
            st.binary(min_size=body_size - bf.HEADER_BYTES, max_size=body_size - bf.HEADER_BYTES)
        )
    )
    struct.pack_into("<i", raw, 8, len(raw) - 12)
    struct.pack_into("<ii", raw, 36, len(raw) - bf.HEADER_BYTES, 0)
    struct.pack_into("<i", raw, 72, len(raw) - bf.HEADER_BYTES)
    batch = _rechecksummed(raw)
    try:
        decoded = bf.decode_batch(batch)
    except HeadwaterError as error:
        code = error.code
    else:
        code = ErrorCode.NONE
        assert decoded.records.num_rows == decoded.header.record_count
    assert code in (ErrorCode.NONE, ErrorCode.CORRUPT_MESSAGE)


def test_bad_compressed_body_is_rejected() -> None:
    for codec in (bf.Compression.ZSTD, bf.Compression.LZ4):
        good = bf.encode_batch([b"x" * 100] * 10, compression=codec)
        data = bytearray(good)
        data[bf.HEADER_BYTES + 4] ^= 0xFF
        with pytest.raises(bf.CorruptBatchError):
            bf.validate_batch(_rechecksummed(data))
        data = bytearray(good)
        struct.pack_into("<i", data, 72, 12345)  # wrong uncompressed length
        with pytest.raises(bf.CorruptBatchError):
            bf.validate_batch(_rechecksummed(data))


def test_iter_headers_walks_a_concatenation_and_stops_at_a_torn_one() -> None:
    first = bf.set_base_offset(bf.encode_batch([b"a"]), 0, 0)
    second = bf.set_base_offset(bf.encode_batch([b"b", b"c"]), 1, 0)
    assert [h.base_offset for _, h in bf.iter_headers(first + second)] == [0, 1]
    with pytest.raises(bf.CorruptBatchError):
        list(bf.iter_headers(first + second[:-8]))


def test_encoder_rejects_impossible_inputs() -> None:
    with pytest.raises(ValueError, match="1 to"):
        bf.encode_batch([])
    with pytest.raises(ValueError, match="expected 2"):
        bf.encode_batch([b"a", b"b"], keys=[b"k"])
    with pytest.raises(ValueError, match="2\\*\\*31"):
        bf.encode_batch([b"a", b"b"], timestamps_ms=[0, 2**40])
    assert bf.Compression.parse("ZSTD") is bf.Compression.ZSTD
    with pytest.raises(HeadwaterError, match="valid: none, lz4, zstd"):
        bf.Compression.parse("gzip")


def test_large_timestamps_are_exact_to_the_millisecond() -> None:
    """Regression: converting through datetime floats lost 1 ms at 549755813887."""
    stamps = [549_755_813_887, 2**41 - 1, 1_700_000_000_005]
    for stamp in stamps:
        decoded = bf.decode_batch(bf.encode_batch([b"x"], timestamps_ms=[stamp]))
        assert bf.timestamps_ms(decoded.records) == [stamp]


# ----------------------------------------------------------------------- hostile batches


def _with_headers() -> bytearray:
    return bytearray(
        bf.encode_batch(
            [b"v1", b"v2"],
            keys=[b"k", b"k2"],
            headers=[[("hk", b"hv")], [("a", b"b"), ("c", None)]],
        )
    )


def test_a_corrupt_middle_header_key_offset_is_refused_not_cast() -> None:
    """The 240-byte Produce that killed a node: a header-key offset set to -2^30 (CRC
    recomputed) was cast to strings before its offsets were checked: a segfault in
    Arrow. Every int32 of the body is tried, at every boundary value."""
    original = _with_headers()
    for position in range(bf.HEADER_BYTES, len(original), 4):
        for value in (-(1 << 30), -1, 1 << 30, (1 << 31) - 1, 3):
            data = bytearray(original)
            struct.pack_into("<i", data, position, value)
            batch = _rechecksummed(data)
            for check in (bf.validate_batch, bf.decode_batches):
                assert _outcome(check, batch) in (
                    ErrorCode.NONE,
                    ErrorCode.CORRUPT_MESSAGE,
                    ErrorCode.INVALID_TIMESTAMP,
                )


def _outcome(check, batch: bytes) -> ErrorCode:
    try:
        check(batch)
    except HeadwaterError as error:
        return error.code
    return ErrorCode.NONE


def test_header_key_offsets_are_checked_before_the_utf8_cast() -> None:
    data = _with_headers()
    header = bf.read_header(bytes(data))
    # The body's sections, in order: key validity, key offsets, key data, value validity,
    # value offsets, value data, timestamp deltas, header list offsets, header key offsets.
    body = bf.HEADER_BYTES
    sizes = [8, 16, 8, 8, 16, 8, 8, 16]
    key_offsets = body + sum(sizes)
    assert struct.unpack_from("<4i", data, key_offsets) == (0, 2, 3, 4)
    struct.pack_into("<i", data, key_offsets + 4, -(1 << 30))
    with pytest.raises(bf.CorruptBatchError, match="header key"):
        bf.validate_batch(_rechecksummed(data))
    assert header.record_count == 2


def test_a_zstd_bomb_declaring_2_gib_is_refused_before_allocating() -> None:
    import tracemalloc

    import zstandard

    # 65 KB of zstd, expanding to 2 GiB - 8; its frame says so, and so does the header.
    stored = zstandard.ZstdCompressor(level=19).compress(bytes(64 << 20))
    bomb = compressed_batch(bf.Compression.ZSTD, stored, (1 << 31) - 8)
    tracemalloc.start()
    try:
        with pytest.raises(HeadwaterError, match="exceeds the limit of 1048576") as too_large:
            bf.validate_batch(bomb, max_uncompressed_bytes=1 << 20)
        assert too_large.value.code is ErrorCode.MESSAGE_TOO_LARGE  # not CORRUPT_MESSAGE
        with pytest.raises(bf.CorruptBatchError, match="exceeds the limit"):
            bf.decode_batches(bomb)  # a reader's own limit: 1 GiB
        assert tracemalloc.get_traced_memory()[1] < 8 << 20
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("codec", [bf.Compression.ZSTD, bf.Compression.LZ4])
def test_a_body_that_expands_past_its_declared_size_stops_there(codec: bf.Compression) -> None:
    """lz4 ignored the declared size (4.4 MB became 1 GiB): decompression now stops at
    uncompressed_body_length, whatever the frame says or omits."""
    import lz4.frame
    import zstandard

    zeros = bytes(64 << 20)
    stored = (
        zstandard.ZstdCompressor(write_content_size=False).compress(zeros)
        if codec is bf.Compression.ZSTD
        else lz4.frame.compress(zeros, store_size=False)
    )
    bomb = compressed_batch(codec, stored, 4096)
    with pytest.raises(bf.CorruptBatchError, match="more than 4096 bytes"):
        bf.validate_batch(bomb)
    lying = compressed_batch(
        codec,
        zstandard.ZstdCompressor().compress(zeros)
        if codec is bf.Compression.ZSTD
        else lz4.frame.compress(zeros),
        4096,
    )
    with pytest.raises(bf.CorruptBatchError, match="frame declares 67108864 bytes"):
        bf.validate_batch(lying)


@pytest.mark.parametrize("timestamp", [(1 << 63) - 1, -(1 << 63), -1, bf.TIMESTAMP_MAX_MS + 1])
def test_timestamps_outside_the_format_range_are_refused(timestamp: int) -> None:
    batch = bf.encode_batch([b"v"], timestamps_ms=timestamp)
    with pytest.raises(HeadwaterError) as info:
        bf.validate_batch(batch)
    assert info.value.code == ErrorCode.INVALID_TIMESTAMP
    assert str(bf.TIMESTAMP_MAX_MS) in info.value.message


def test_a_record_timestamp_below_the_range_is_refused_and_the_edges_accepted() -> None:
    bf.validate_batch(bf.encode_batch([b"a", b"b"], timestamps_ms=[0, 1 << 30]))
    edge = bf.TIMESTAMP_MAX_MS
    bf.validate_batch(bf.encode_batch([b"a", b"b"], timestamps_ms=[edge - (1 << 30), edge]))
    with pytest.raises(bf.InvalidTimestampError, match="a record timestamp -5"):
        bf.validate_batch(bf.encode_batch([b"a", b"b"], timestamps_ms=[10, -5]))
    window = (1000, 2000)
    bf.validate_batch(bf.encode_batch([b"a"], timestamps_ms=2000), timestamp_range=window)
    with pytest.raises(bf.InvalidTimestampError, match=r"\[1000, 2000\]"):
        bf.validate_batch(bf.encode_batch([b"a"], timestamps_ms=2001), timestamp_range=window)


def test_max_timestamp_must_be_the_largest_record_timestamp() -> None:
    data = bytearray(bf.encode_batch([b"a", b"b"], timestamps_ms=[10, 20]))
    struct.pack_into("<q", data, 48, 10**12)  # claims a later newest record: pins retention
    with pytest.raises(bf.CorruptBatchError, match="not the largest record timestamp"):
        bf.validate_batch(_rechecksummed(data))


@pytest.mark.parametrize(
    ("bit", "name"), [(0x08, "timestamp type"), (0x10, "transactional"), (0x20, "control")]
)
def test_attribute_bits_of_the_broker_are_refused_from_a_producer(bit: int, name: str) -> None:
    data = bytearray(SAMPLE)
    struct.pack_into("<H", data, 24, struct.unpack_from("<H", data, 24)[0] | bit)
    with pytest.raises(bf.CorruptBatchError, match=name):
        bf.validate_batch(_rechecksummed(data))
    # A reader still decodes what a broker may write (a log-append-time batch).
    assert bf.decode_batch(_rechecksummed(data)).records.num_rows == 3


def test_a_stored_timestamp_outside_datetime_still_reaches_a_consumer() -> None:
    """A batch stored before the broker checked timestamps: iterating it gave
    OverflowError in the consumer and INTERNAL in a records-format fetch."""
    from headwater.client.consumer import FetchedBatch, PollResult

    batch = bf.encode_batch([b"v"], timestamps_ms=(1 << 63) - 1)
    fetched = [FetchedBatch("t", 0, d.records) for d in bf.decode_batches(batch)]
    [record] = list(PollResult(fetched))
    assert record.timestamp_ms == (1 << 63) - 1 and record.value == b"v"


def test_the_fuzzer_finds_nothing() -> None:
    """A fixed run of the mutation fuzzer (tests/fuzz_batch.py; ``make fuzz`` runs a long
    one): any crash, hang or undocumented exception fails, with the case kept."""
    from tests import fuzz_batch

    lines: list[str] = []
    ok = fuzz_batch.fuzz(
        seed=20261124, cases=10_000, hang_s=60, out=Path(".build/fuzz"), report=lines.append
    )
    assert ok, "\n".join(lines)[-5000:]


REJECTIONS = json.loads(
    (Path(__file__).parent.parent / "docs/testvectors/record-batches.json").read_text()
)["rejections"]


@pytest.mark.parametrize("rejection", REJECTIONS, ids=[r["name"] for r in REJECTIONS])
def test_published_rejections(rejection: dict) -> None:
    """Each rejection vector breaks one rule of the spec: a "decoder" rule fails every
    reader and the broker; a "broker" rule (what a producer may write) fails only the
    broker's check of a produced batch, with the code the vector names."""
    data = bytes.fromhex(rejection["batch_hex"])
    expected = ErrorCode[rejection["error"]]
    if rejection["rejected_by"] == "decoder":
        with pytest.raises(HeadwaterError) as decoding:
            bf.decode_batches(data)
        assert decoding.value.code is expected
    else:
        assert rejection["rejected_by"] == "broker"
        assert len(bf.decode_batches(data)) == 1
    with pytest.raises(HeadwaterError) as producing:
        bf.validate_batch(data)
    assert producing.value.code is expected, producing.value


def test_rejections_cover_every_rule_class() -> None:
    names = {r["name"] for r in REJECTIONS}
    for rule in (
        "crc-register-preset-zero",
        "reserved-26-27",
        "reserved-70-71",
        "reserved-76-79",
        "control-bit",
        "zstd-two-frames",
        "zstd-skippable-frame",
        "lz4-trailing-bytes",
        "lz4-block-format",
    ):
        assert rule in names


def test_crc_is_standard_crc32c() -> None:
    """The spec's check value: CRC-32C of "123456789" (register preset to all ones,
    reflected, final xor) is 0xE3069283, which a reading of "initial value 0" misses."""
    assert crc32c.crc32c(b"123456789") == 0xE3069283


@pytest.mark.parametrize("count", [1, 7, 8, 9, 17])
def test_bitmaps_are_canonical(count: int) -> None:
    """Bits past the item count are 0, with or without nulls, from lists or Arrow arrays
    (a column without nulls used to be all 0xff bytes)."""
    spare = -count % 8
    for values in ([b"v"] * count, [None] + [b"v"] * (count - 1)):
        for column in (values, pa.array(values, type=pa.binary())):
            data = bf.encode_batch(column)
            last = data[bf.HEADER_BYTES + (count + 7) // 8 - 1]
            if spare:
                assert last >> (8 - spare) == 0
            assert bf.decode_batch(data).records.column("value").to_pylist() == values


def test_has_keys_only_with_a_key() -> None:
    for keys in ([None, None], pa.array([None, None], type=pa.binary())):
        assert not bf.decode_batch(bf.encode_batch([b"a", b"b"], keys=keys)).header.has_keys
    assert bf.decode_batch(bf.encode_batch([b"a"], keys=[b"k"])).header.has_keys
    assert not bf.decode_batch(bf.encode_batch([b"a"], headers=[[]])).header.has_headers


def test_consumers_skip_control_batches() -> None:
    """No control batch is written today (producers may not set the bit), but the spec
    says consumers skip them: the reference consumer drops one between two data batches."""
    first = bf.encode_batch([b"a"], base_offset=0)
    control = bytearray(bf.encode_batch([b"marker"], base_offset=1))
    control[24] |= 0x20
    last = bf.encode_batch([b"b"], base_offset=2)
    data = first + _rechecksummed(control) + last
    assert bf.decode_batches(data)[1].header.is_control
    fetched, resume = fetched_from(TopicPartition("t", 0), data, 0, check_crcs=True)
    assert [b.records.column("value").to_pylist() for b in fetched] == [[b"a"], [b"b"]]
    assert resume is None


# --------------------------------------------------------------------------- spans


def _stored_run(sizes: list[int]) -> bytes:
    """Whole stored batches, one after another, of ``sizes`` records each."""
    out, offset = [], 0
    for count in sizes:
        out.append(bf.encode_batch([b"v%d" % i for i in range(count)], base_offset=offset))
        offset += count
    return b"".join(out)


@given(st.lists(st.integers(1, 40), min_size=1, max_size=30))
@settings(max_examples=60, deadline=None)
def test_a_span_is_what_the_header_says(sizes: list[int]) -> None:
    data = _stored_run(sizes)
    for position, header in bf.iter_headers(data):
        assert bf.read_span(data, position) == (
            header.base_offset,
            header.total_size,
            header.next_offset,
        )


@given(st.binary(min_size=0, max_size=200), st.integers(0, 199))
@settings(max_examples=300, deadline=None)
def test_a_span_of_damaged_bytes_is_refused_or_bounded(garbage: bytes, at: int) -> None:
    """Bytes written over a batch: the span is refused as corrupt, or names a batch that
    lies within the buffer and ends after its start."""
    data = bytearray(_stored_run([3, 1]))
    data[at : at + len(garbage)] = garbage
    try:
        base_offset, size, next_offset = bf.read_span(bytes(data))
    except bf.CorruptBatchError:
        return
    assert bf.HEADER_BYTES <= size <= len(data)
    assert next_offset > base_offset


def test_batches_end_walks_whole_batches_within_counts_and_stops_at_a_bad_length() -> None:
    data = _stored_run([1, 2, 3, 4])
    ends = [position + header.total_size for position, header in bf.iter_headers(data)]
    assert [bf.batches_end(data, 0, n) for n in range(1, 6)] == [
        (ends[0], 1),
        (ends[1], 3),
        (ends[2], 6),
        (ends[3], 10),
        (ends[3], 10),
    ]
    assert bf.batches_end(data, ends[0], 2) == (ends[2], 5)
    assert bf.batches_end(data, 0, 4, records_max=5) == (ends[1], 3)
    assert bf.batches_end(data, ends[2], 4, records_max=1) == (ends[3], 4)  # the first always
    assert bf.batches_end(data, 0, 4, records_of_kafka=True) == (ends[3], 0)  # none counted
    damaged = bytearray(data)
    struct.pack_into("<i", damaged, ends[1] + 8, -5)  # the third batch's length
    assert bf.batches_end(bytes(damaged), 0, 4)[0] == len(damaged)
