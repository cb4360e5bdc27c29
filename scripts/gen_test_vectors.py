"""Write docs/testvectors/record-batches.json: batches a client in any language can check.

Usage: python scripts/gen_test_vectors.py

Each vector gives the encoder's inputs, the exact batch bytes (hex), and the records a
decoder must produce. Uncompressed vectors are byte-exact for encoders too; compressed
ones pin only decoding (compressor output may differ between library versions).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from headwater.log.batch import Compression, decode_batch, encode_batch, timestamps_ms

OUT = Path(__file__).resolve().parent.parent / "docs/testvectors/record-batches.json"


def hexify(value: bytes | None) -> str | None:
    return None if value is None else value.hex()


def vector(name: str, description: str, **inputs: Any) -> dict[str, Any]:
    data = encode_batch(
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
        "byte_exact": inputs.get("compression", Compression.NONE) == Compression.NONE,
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
        json.dumps({"format": "headwater record batch v1", "vectors": vectors}, indent=1) + "\n"
    )
    print(OUT)


if __name__ == "__main__":
    main()
