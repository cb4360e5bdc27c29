"""Write docs/testvectors/record-batches.json: batches a client in any language can check.

Usage: python scripts/gen_test_vectors.py

Each vector gives the encoder's inputs, the exact batch bytes (hex), and the records a
decoder must produce. Uncompressed vectors are byte-exact for encoders too; compressed
ones pin only decoding (compressor output may differ between library versions), as do
the vectors that show what a decoder ignores (``byte_exact`` false).

``rejections`` are batches that break one rule each: ``rejected_by`` "decoder" means every
decoder refuses them (and so does the broker); "broker" means the broker refuses them as
produced while a decoder reads them (rules on what a producer may write). ``error`` is the
ErrorCode the broker answers.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from pathlib import Path
from typing import Any

import crc32c
import lz4.block
import lz4.frame
import pyarrow as pa
import zstandard

from headwater.log.batch import (
    CRC_START,
    HEADER_BYTES,
    HEADER_STRUCT,
    Compression,
    decode_batch,
    encode_batch,
    read_header,
    timestamps_ms,
)

OUT = Path(__file__).resolve().parent.parent / "docs/testvectors/record-batches.json"


def hexify(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


def vector(
    name: str, description: str, *, raw: bytes | None = None, **inputs: Any
) -> dict[str, Any]:
    """A vector from encoder inputs, or from ``raw`` bytes that decode to ``inputs``'s
    records (not byte-exact: a canonical encoder writes them otherwise)."""
    data = (
        raw
        if raw is not None
        else encode_batch(
            inputs["values"],
            keys=inputs.get("keys"),
            headers=inputs.get("headers"),
            timestamps_ms=inputs["timestamps_ms"],
            compression=inputs.get("compression", Compression.NONE),
            base_offset=inputs.get("base_offset", 0),
            leader_epoch=inputs.get("leader_epoch", -1),
            producer_id=inputs.get("producer_id", -1),
            producer_epoch=inputs.get("producer_epoch", -1),
            base_sequence=inputs.get("base_sequence", -1),
        )
    )
    decoded = decode_batch(data)
    stamps = timestamps_ms(decoded.records)
    records = [
        {
            "offset": row["offset"],
            "timestamp_ms": stamp,
            "key": hexify(row["key"]),
            "value": hexify(row["value"]),
            "headers": [[h["key"], hexify(h["value"])] for h in row["headers"] or []],
        }
        for row, stamp in zip(decoded.records.to_pylist(), stamps, strict=True)
    ]
    return {
        "name": name,
        "description": description,
        "compression": Compression(inputs.get("compression", Compression.NONE)).name.lower(),
        "byte_exact": raw is None
        and inputs.get("compression", Compression.NONE) == Compression.NONE,
        "base_offset": inputs.get("base_offset", 0),
        "leader_epoch": inputs.get("leader_epoch", -1),
        "producer_id": inputs.get("producer_id", -1),
        "producer_epoch": inputs.get("producer_epoch", -1),
        "base_sequence": inputs.get("base_sequence", -1),
        "crc": decoded.header.crc,
        "attributes": decoded.header.attributes,
        "batch_hex": data.hex(),
        "records": records,
    }


def with_crc(batch: bytes | bytearray) -> bytes:
    """``batch`` with its CRC computed again over bytes [24, end)."""
    fixed = bytearray(batch)
    struct.pack_into("<I", fixed, 20, crc32c.crc32c(bytes(fixed[CRC_START:])))
    return bytes(fixed)


def rebuild(batch: bytes, body: bytes | None = None, **fields: int) -> bytes:
    """``batch`` with header ``fields`` replaced and, given ``body`` (stored bytes), a new
    body: lengths, padding and CRC made consistent again."""
    header = read_header(batch)
    stored = batch[HEADER_BYTES : HEADER_BYTES + header.body_length] if body is None else body
    padding = bytes(-len(stored) % 8)
    lengths = {
        "batch_length": HEADER_BYTES + len(stored) + len(padding) - 12,
        "body_length": len(stored),
    }
    if body is not None and header.compression is Compression.NONE:
        lengths["uncompressed_body_length"] = len(stored)
    changed = dataclasses.replace(header, **{**lengths, **fields})
    return with_crc(HEADER_STRUCT.pack(*dataclasses.astuple(changed)) + stored + padding)


def patched(batch: bytes, position: int, new: bytes, crc: bool = True) -> bytes:
    """``batch`` with ``new`` written at ``position`` (and its CRC fixed, unless not)."""
    changed = bytearray(batch)
    changed[position : position + len(new)] = new
    return with_crc(changed) if crc else bytes(changed)


def rejection(
    name: str, description: str, batch: bytes, rejected_by: str, error: str
) -> dict[str, Any]:
    return {
        "name": name,
        "description": description,
        "rejected_by": rejected_by,
        "error": error,
        "batch_hex": batch.hex(),
    }


def lz4_descriptor_changed(frame: bytes, descriptor: bytes) -> bytes:
    """``frame`` (an LZ4 frame without a content size or dictionary id) with its frame
    descriptor (FLG, BD and optional fields, bytes 4 to 5) replaced by ``descriptor`` and
    a header checksum liblz4 accepts (found by trying the 256 values, which spares
    an xxHash32 implementation here)."""
    blocks = frame[7:]
    for checksum in range(256):
        candidate = frame[:4] + descriptor + bytes([checksum]) + blocks
        try:
            lz4.frame.get_frame_info(candidate)
        except RuntimeError:
            continue
        return candidate
    raise AssertionError("no header checksum fits")


def crc32c_register_preset_zero(data: bytes) -> int:
    """CRC-32C read as "initial value 0, no final xor": the wrong reading of the rule."""
    register = 0
    for byte in data:
        register ^= byte
        for _ in range(8):
            register = (register >> 1) ^ (0x82F63B78 if register & 1 else 0)
    return register


def rejections() -> list[dict[str, Any]]:
    one = encode_batch([b"hello"], timestamps_ms=1_700_000_000_000)
    two = encode_batch([b"ab", b"cd"], timestamps_ms=1_700_000_000_000)
    # `two`'s body: value validity at 80, offsets [0, 2, 4] at 88, data at 104, deltas at 112.
    with_headers = encode_batch(
        [b"v"], headers=[[("trace", b"abc")]], timestamps_ms=1_700_000_000_000
    )
    body = one[HEADER_BYTES:]
    zstd_body = zstandard.ZstdCompressor().compress(body)
    lz4_body = lz4.frame.compress(body)
    bare_frame = lz4.frame.compress(body, store_size=False)
    assert bare_frame[4] & 0x09 == 0  # no content size, no dictionary id: a 7-byte header
    flags, block_descriptor = bare_frame[4], bare_frame[5]
    lz4_size_zero = lz4_descriptor_changed(
        bare_frame, bytes([flags | 0x08, block_descriptor]) + bytes(8)
    )
    lz4_dictionary = lz4_descriptor_changed(
        bare_frame, bytes([flags | 0x01, block_descriptor]) + struct.pack("<I", 7)
    )
    zstd = rebuild(
        one, zstd_body, attributes=int(Compression.ZSTD), uncompressed_body_length=len(body)
    )
    lz4_batch = rebuild(
        one, lz4_body, attributes=int(Compression.LZ4), uncompressed_body_length=len(body)
    )
    skippable = b"\x50\x2a\x4d\x18" + struct.pack("<I", 4) + b"skip"
    wrong_crc = (
        one[:20] + struct.pack("<I", crc32c_register_preset_zero(one[CRC_START:])) + one[24:]
    )
    decoder = "decoder"
    broker = "broker"
    corrupt = "CORRUPT_MESSAGE"
    return [
        rejection(
            "crc-flipped",
            "one-value with a bit of its CRC flipped",
            patched(one, 20, bytes([one[20] ^ 1]), crc=False),
            decoder,
            corrupt,
        ),
        rejection(
            "crc-register-preset-zero",
            "one-value with its CRC computed with the register preset to 0 and no final xor (not CRC-32C)",
            wrong_crc,
            decoder,
            corrupt,
        ),
        rejection(
            "reserved-17-19",
            "reserved byte 18 (outside the CRC) is 1",
            patched(one, 18, b"\x01", crc=False),
            decoder,
            corrupt,
        ),
        rejection("magic-2", "magic 2", patched(one, 16, b"\x02", crc=False), decoder, corrupt),
        rejection(
            "size-not-multiple-of-8",
            "batch_length 4 more (total 116 bytes, 4 more bytes present)",
            patched(one + bytes(4), 8, struct.pack("<i", 104)),
            decoder,
            corrupt,
        ),
        rejection("truncated", "one-value cut 8 bytes short", one[:-8], decoder, corrupt),
        rejection(
            "attribute-bit-8",
            "attribute bit 8 (Kafka records, for the broker only) set",
            patched(one, 24, b"\x00\x01"),
            decoder,
            corrupt,
        ),
        rejection(
            "codec-gzip",
            "codec 1 (gzip, not supported)",
            rebuild(one, attributes=1),
            decoder,
            "UNSUPPORTED_COMPRESSION_TYPE",
        ),
        rejection(
            "record-count-0",
            "record_count 0",
            rebuild(one, record_count=0, last_offset_delta=-1),
            decoder,
            corrupt,
        ),
        rejection(
            "last-offset-delta",
            "last_offset_delta 1 with record_count 1",
            rebuild(one, last_offset_delta=1),
            decoder,
            corrupt,
        ),
        rejection(
            "body-length-short",
            "body_length 8 short of the batch (8 or more padding bytes)",
            rebuild(one, body_length=24, uncompressed_body_length=24),
            decoder,
            corrupt,
        ),
        rejection(
            "uncompressed-length",
            "no codec, uncompressed_body_length != body_length",
            rebuild(one, uncompressed_body_length=40),
            decoder,
            corrupt,
        ),
        rejection(
            "max-before-first",
            "max_timestamp 1 ms before first_timestamp",
            rebuild(one, max_timestamp=1_699_999_999_999),
            decoder,
            corrupt,
        ),
        rejection(
            "offsets-start",
            "value offsets start at 1",
            patched(one, 88, struct.pack("<i", 1)),
            decoder,
            corrupt,
        ),
        rejection(
            "offsets-decrease",
            "value offsets [0, 5, 4] (decreasing)",
            patched(two, 92, struct.pack("<i", 5)),
            decoder,
            corrupt,
        ),
        rejection(
            "offsets-end",
            "value offsets end at 9 with 8 bytes of data section left",
            patched(one, 92, struct.pack("<i", 9)),
            decoder,
            corrupt,
        ),
        rejection(
            "trailing-body-bytes",
            "8 zero bytes after the last section",
            rebuild(one, one[HEADER_BYTES:] + bytes(8)),
            decoder,
            corrupt,
        ),
        rejection(
            "header-key-utf8",
            "header key bytes ff 72 61 63 65 (not UTF-8)",
            patched(with_headers, with_headers.index(b"trace"), b"\xff"),
            decoder,
            corrupt,
        ),
        rejection(
            "zstd-two-frames",
            "zstd body of two frames",
            rebuild(zstd, zstd_body + zstd_body),
            broker,
            corrupt,
        ),
        rejection(
            "zstd-skippable-frame",
            "zstd body followed by a skippable frame",
            rebuild(zstd, zstd_body + skippable),
            broker,
            corrupt,
        ),
        rejection(
            "zstd-declared-size",
            "zstd frame declares another size than uncompressed_body_length",
            rebuild(zstd, zstandard.ZstdCompressor().compress(body + bytes(8))),
            decoder,
            corrupt,
        ),
        rejection(
            "lz4-trailing-bytes",
            "lz4 frame followed by 8 zero bytes",
            rebuild(lz4_batch, lz4_body + bytes(8)),
            broker,
            corrupt,
        ),
        rejection(
            "lz4-two-frames",
            "lz4 body of two frames",
            rebuild(lz4_batch, lz4_body + lz4_body),
            broker,
            corrupt,
        ),
        rejection(
            "lz4-content-size-zero",
            "lz4 frame with a content size field of 0 (the header says 32)",
            rebuild(lz4_batch, lz4_size_zero),
            decoder,
            corrupt,
        ),
        rejection(
            "lz4-dictionary-id",
            "lz4 frame naming dictionary 7 (batches use none)",
            rebuild(lz4_batch, lz4_dictionary),
            decoder,
            corrupt,
        ),
        rejection(
            "lz4-block-format",
            "lz4 raw block format (not a frame)",
            rebuild(lz4_batch, lz4.block.compress(body, store_size=False)),
            decoder,
            corrupt,
        ),
        rejection(
            "reserved-26-27", "reserved byte 26 is 1", patched(one, 26, b"\x01"), broker, corrupt
        ),
        rejection(
            "reserved-70-71", "reserved byte 71 is 1", patched(one, 71, b"\x01"), broker, corrupt
        ),
        rejection(
            "reserved-76-79", "reserved byte 79 is 1", patched(one, 79, b"\x01"), broker, corrupt
        ),
        rejection(
            "control-bit",
            "the control bit (5): the broker's",
            rebuild(one, attributes=0x20),
            broker,
            corrupt,
        ),
        rejection(
            "timestamp-type-bit",
            "log-append time (bit 3): the broker's",
            rebuild(one, attributes=0x08),
            broker,
            corrupt,
        ),
        rejection(
            "transactional-bit",
            "the transactional bit (4): the broker's",
            rebuild(one, attributes=0x10),
            broker,
            corrupt,
        ),
        rejection(
            "max-timestamp-not-max",
            "max_timestamp 1 ms after the only record's",
            rebuild(one, max_timestamp=1_700_000_000_001),
            broker,
            corrupt,
        ),
        rejection(
            "timestamp-negative",
            "a record timestamp of -1",
            rebuild(one, first_timestamp=-1, max_timestamp=-1),
            broker,
            "INVALID_TIMESTAMP",
        ),
        rejection(
            "producer-fields-mixed",
            "producer_id -1 with producer_epoch 0",
            rebuild(one, producer_epoch=0),
            broker,
            corrupt,
        ),
    ]


def decoder_ignores() -> list[dict[str, Any]]:
    """Batches whose bytes differ from the canonical encoding where the spec says a
    decoder ignores them: each decodes to the records listed."""
    stamp = 1_700_000_000_000
    one = encode_batch([b"hello"], timestamps_ms=stamp)
    spare_bits_set = patched(one, HEADER_BYTES, b"\xff")
    # Values [b"a", None, b"c"] where the null's slot holds 2 bytes ("xx").
    holed = pa.Array.from_buffers(
        pa.binary(),
        3,
        [
            pa.py_buffer(b"\x05"),
            pa.py_buffer(struct.pack("<4i", 0, 1, 3, 4)),
            pa.py_buffer(b"axxc"),
        ],
    )
    null_slot = encode_batch(holed, timestamps_ms=stamp)
    no_keys = encode_batch([b"v"], timestamps_ms=stamp)
    key_sections = b"\x00" + bytes(7) + struct.pack("<2i", 0, 0)
    all_null_keys = rebuild(no_keys, key_sections + no_keys[HEADER_BYTES:], attributes=0x40)
    no_headers = rebuild(
        no_keys,
        no_keys[HEADER_BYTES:]
        + struct.pack("<2i", 0, 0)
        + struct.pack("<i", 0)
        + bytes(4)
        + struct.pack("<i", 0)
        + bytes(4),
        attributes=0x80,
    )
    return [
        vector(
            "bitmap-spare-bits-set",
            "one-value with the bits past the record count of its value bitmap set (as batches written before 2026-11 have them): decoders ignore them",
            raw=spare_bits_set,
            values=[b"hello"],
            timestamps_ms=stamp,
        ),
        vector(
            "null-slot-with-bytes",
            "values a, null, c where the null's slot holds 2 bytes: decoders ignore a null slot's bytes",
            raw=null_slot,
            values=[b"a", None, b"c"],
            timestamps_ms=stamp,
        ),
        vector(
            "has-keys-all-null",
            "has keys set, every key null: valid (a canonical encoder leaves the bit and the section out)",
            raw=all_null_keys,
            values=[b"v"],
            timestamps_ms=stamp,
        ),
        vector(
            "has-headers-none",
            "has headers set, no record has a header: valid (a canonical encoder leaves the bit and the sections out)",
            raw=no_headers,
            values=[b"v"],
            timestamps_ms=stamp,
        ),
    ]


def main() -> None:
    vectors = [
        vector(
            "one-value",
            "one keyless record, no headers",
            values=[b"hello"],
            timestamps_ms=1_700_000_000_000,
        ),
        vector(
            "keys-nulls-headers",
            "keys with a null, a null value (tombstone), headers with a null value",
            values=[b"v0", None, b""],
            keys=[b"k0", None, b"k2"],
            headers=[[("trace", b"abc")], None, [("a", None), ("b", b"")]],
            timestamps_ms=[1_700_000_000_000, 1_700_000_000_005, 1_699_999_999_990],
            base_offset=42,
            leader_epoch=3,
        ),
        vector(
            "idempotent",
            "an idempotent producer's batch: producer id 1000, epoch 2, records at "
            "sequences 7 and 8",
            values=[b"a", b"b"],
            keys=[b"k", b"k"],
            timestamps_ms=1_700_000_000_000,
            producer_id=1000,
            producer_epoch=2,
            base_sequence=7,
        ),
        vector(
            "zstd",
            "zstd-compressed body",
            values=[f"record-{i}".encode() for i in range(20)],
            keys=[f"key-{i % 3}".encode() for i in range(20)],
            timestamps_ms=1_700_000_000_000,
            compression=Compression.ZSTD,
        ),
        vector(
            "lz4",
            "lz4-frame-compressed body",
            values=[f"record-{i}".encode() for i in range(20)],
            timestamps_ms=1_700_000_000_000,
            compression=Compression.LZ4,
        ),
    ]
    OUT.write_text(
        json.dumps(
            {
                "format": "headwater record batch v1",
                "vectors": vectors + decoder_ignores(),
                "rejections": rejections(),
            },
            indent=1,
        )
        + "\n"
    )
    print(OUT)


if __name__ == "__main__":
    main()
