"""Fetch in batches against fetch in broker-decoded records, in one run (BENCHMARKS.md).

Usage: python scripts/bench_fetch_formats.py [--records N] [--record-size B] [--rounds R]

Starts ``headwater serve`` on a free loopback port with data in a temporary folder,
produces N records of B bytes to one partition, then reads them all back from offset 0
with unary Fetch calls (max_bytes 1 MiB), alternating, R rounds each:

- ``batches``: RECORD_FORMAT_BATCHES, each answer decoded by the client into Arrow
  columns (``decode_batches``), so that both paths end with the records in hand;
- ``records``: RECORD_FORMAT_RECORDS, one ConsumedRecord message per record, decoded by
  the broker.

Prints records/s of each (median of the rounds) and their ratio, as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

import grpc

from headwater.client import Admin, Producer
from headwater.log.batch import decode_batches
from headwater.tools.devcluster import LocalNode
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

TOPIC = "fetch-formats"
MAX_BYTES = 1 << 20


def read_all(stub: pb_grpc.BrokerStub, count: int, record_format: int) -> float:
    """Seconds to read ``count`` records from offset 0 in ``record_format``."""
    offset = 0
    began = time.perf_counter()
    while offset < count:
        response = stub.Fetch(
            pb.FetchRequest(
                topic=TOPIC,
                partition=0,
                offset=offset,
                max_bytes=MAX_BYTES,
                format=record_format,  # type: ignore[arg-type]
                max_response_bytes=64 << 20,
            ),
            timeout=60,
        )
        if record_format == pb.RECORD_FORMAT_BATCHES:
            decode_batches(response.records)
        else:
            assert len(response.decoded) > 0
        offset = response.next_offset
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=500_000)
    parser.add_argument("--record-size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        node = LocalNode(Path(folder) / "data")
        node.start()
        try:
            with Admin(node.address) as admin:
                admin.create_topic(TOPIC, 1)
            value = b"x" * args.record_size
            with Producer(node.address, acks="1") as producer:
                for start in range(0, args.records, 10_000):
                    producer.send_batch(
                        TOPIC, [value] * min(10_000, args.records - start), partition=0
                    )
                producer.flush()
            stub = pb_grpc.BrokerStub(
                grpc.insecure_channel(
                    node.address, options=[("grpc.max_receive_message_length", 64 << 20)]
                )
            )
            seconds: dict[str, list[float]] = {"batches": [], "records": []}
            for _ in range(args.rounds):
                seconds["batches"].append(read_all(stub, args.records, pb.RECORD_FORMAT_BATCHES))
                seconds["records"].append(read_all(stub, args.records, pb.RECORD_FORMAT_RECORDS))
        finally:
            node.kill()
    rates = {name: args.records / statistics.median(s) for name, s in seconds.items()}
    print(
        json.dumps(
            {
                "records": args.records,
                "record_size": args.record_size,
                "rounds": args.rounds,
                "batches_records_per_s": round(rates["batches"]),
                "records_records_per_s": round(rates["records"]),
                "batches_over_records": round(rates["batches"] / rates["records"], 1),
                "machine": f"{platform.machine()} {platform.processor() or ''}".strip(),
            }
        )
    )


if __name__ == "__main__":
    main()
