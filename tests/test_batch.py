"""Record batch format v1: round trips (Hypothesis), test vectors, and malformed input."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headwater.errors import ErrorCode, HeadwaterError
from headwater.log import batch as bf

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


def _rechecksummed(data: bytearray) -> bytes:
    struct.pack_into("<I", data, 20, crc32c.crc32c(bytes(data[bf.CRC_START :])))
    return bytes(data)


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
        (24, "<H", 0x0100, "unknown attribute bits"),
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
