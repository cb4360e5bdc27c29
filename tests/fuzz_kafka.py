"""A mutation fuzzer for the Kafka front's decoders: request frames
(``headwater.node.kafka.protocol.decode_request``), produced record batches
(``headwater.log.kafka_records.to_stored``, and the stored batch it makes read back
as Kafka and as columns) and the consumer protocol's subscriptions
and assignments (``headwater.node.groups.consumer_protocol``, read to describe groups).

Request cases start from a valid frame of every API and version served (topics,
partitions and records filled in), batch cases from valid batches of every codec; each
is mutated by a seeded generator: bit flips, an int16/int32 set to a boundary value
(-2^31, -1, 0, 1, 2^31 - 1, ...), truncation, extension, or bytes spliced from another
case. Batch cases mostly get their CRC fixed afterwards, so the checks past it are what
is tried. The only outcomes allowed are success, MalformedRequestError (the connection
is closed) and, for batches, a HeadwaterError with one of ALLOWED_CODES; anything else is
a finding, raised with the case in hex.

    python -m tests.fuzz_kafka --cases 200000 --seed 7    # make fuzz runs a long one
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import random
import struct
from typing import Any

import crc32c
from aiokafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema
from kio.serial import entity_writer

from headwater.log import batch as batch_format
from headwater.log import kafka_records as records
from headwater.node.groups import consumer_protocol
from headwater.node.kafka import protocol, request_shape
from headwater.node.kafka.request_shape import MalformedRequestError, RequestLimits
from headwater.shared.errors import ErrorCode, HeadwaterError

ALLOWED_CODES = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,
        ErrorCode.INVALID_RECORD,
        ErrorCode.INVALID_TIMESTAMP,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.UNSUPPORTED_COMPRESSION_TYPE,
    }
)
LARGE_VARINTS = (b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x08", b"\xff\xff\x03")
"""Unsigned varints of 2^32 - 1, 2^31 and 65,535: lengths and counts past any frame."""
BOUNDARIES = (-(2**31), -(2**30), -2, -1, 0, 1, 2, 2**15 - 1, 2**30, 2**31 - 1)
LIMIT = 1 << 20


def _batch(rng: random.Random, codec: int) -> bytes:
    producer_id, producer_epoch, base_sequence = rng.choice(
        ((-1, -1, -1), (-1, 0, 0), (5, 0, 0), (5, 0, 99))
    )
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=0,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        batch_size=1 << 30,
    )
    for i in range(rng.randint(1, 20)):
        builder.append(
            i,
            1_767_225_600_000 + i,
            rng.choice((None, b"k%d" % i)),
            rng.choice((None, b"", b"v" * rng.randint(1, 300))),
            rng.choice(([], [("h", b"x")], [("a", None), ("b", b"")])),
        )
    return bytes(builder.build())


def _request_frames() -> list[bytes]:
    """A valid frame of every API and version served."""
    frames = []
    batch = _batch(random.Random(0), 0)
    for api_key, (low, high) in sorted(protocol.SUPPORTED_VERSIONS.items()):
        for version in range(low, high + 1):
            schema = load_request_schema(api_key, version)
            frames.append(_frame(api_key, version, _filled(schema, batch)))
    return frames


def _frame(api_key: int, version: int, body: Any) -> bytes:
    """A request of ``body`` (a message of ``api_key`` at ``version``) with its header."""
    header_schema = load_request_schema(api_key, version).__header_schema__
    header = protocol.build(
        header_schema,
        request_api_key=api_key,
        request_api_version=version,
        correlation_id=7,
        client_id="fuzz",
    )
    out = io.BytesIO()
    entity_writer(header_schema)(out, header)
    entity_writer(type(body))(out, body)
    return out.getvalue()


def _filled(schema: type[Any], batch: bytes) -> Any:
    """A request message with one of each nested array and the batch as records."""
    values: dict[str, Any] = {}
    for field, kind, nested in protocol._fields(schema):
        if kind == "entities":
            values[field.name] = [_filled(nested, batch)]
        elif kind.endswith("records"):
            values[field.name] = batch
        elif kind.endswith("string") and field.name.endswith("name"):
            values[field.name] = "topic-a"
    return protocol.build(schema, **values)


def _mutate(rng: random.Random, data: bytes, others: list[bytes]) -> bytes:
    buffer = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        choice = rng.random()
        if choice < 0.3 and buffer:
            at = rng.randrange(len(buffer))
            buffer[at] ^= 1 << rng.randrange(8)
        elif choice < 0.6 and len(buffer) >= 4:
            at = rng.randrange(len(buffer) - 3)
            kind = rng.random()
            if kind < 0.35:
                struct.pack_into(">i", buffer, at, rng.choice(BOUNDARIES))
            elif kind < 0.7:
                struct.pack_into(
                    ">h", buffer, at, max(-(2**15), min(2**15 - 1, rng.choice(BOUNDARIES)))
                )
            else:  # a flexible version's length or count (unsigned varint) set large
                buffer[at : at + 1] = rng.choice(LARGE_VARINTS)
        elif choice < 0.75:
            del buffer[rng.randrange(len(buffer) + 1) :]
        elif choice < 0.9:
            buffer += bytes(rng.randrange(256) for _ in range(rng.randint(1, 16)))
        else:
            other = rng.choice(others)
            at = rng.randrange(len(buffer) + 1)
            buffer[at:] = other[rng.randrange(len(other) + 1) :]
    return bytes(buffer)


def fuzz_requests(seed: int, cases: int) -> None:
    rng = random.Random(seed)
    frames = _request_frames()
    for frame in frames:
        protocol.decode_request(frame)  # the seeds themselves decode
    for _ in range(cases):
        case = _mutate(rng, rng.choice(frames), frames)
        try:
            protocol.decode_request(case, RequestLimits())
        except MalformedRequestError:
            pass
        except Exception as exc:
            raise AssertionError(
                f"request {case.hex()} raised {type(exc).__name__}: {exc}"
            ) from exc


SMALL_LIMITS = RequestLimits(topics_max=6, partitions_max=9, members_max=4, entries_max=10**6)
"""Limits small enough for seeds to hold arrays just under, at and just over each."""


def _sized_request(rng: random.Random, api_key: int, version: int, batch: bytes) -> bytes:
    """A frame of ``api_key`` at ``version`` whose every array holds a count drawn near
    its bound in ``SMALL_LIMITS``: 0, 1, or the bound -1, +0 or +1 (a cumulative bound
    split over the arrays that share it)."""

    def count(owner: str, field: str) -> int:
        kind = request_shape.ARRAY_KINDS.get((owner, field))
        if kind is None:
            return rng.choice((0, 1, 2))
        bound = SMALL_LIMITS.bound(kind)[0]
        if kind in request_shape.CUMULATIVE_KINDS:
            bound = max(1, bound // 3)
        return rng.choice((0, 1, bound - 1, bound, bound, bound + 1, bound + 1))

    def filled(schema: type[Any]) -> Any:
        values: dict[str, Any] = {}
        for field, kind, nested in protocol._fields(schema):
            base = kind.removeprefix("nullable ")
            if base == "entities":
                values[field.name] = [
                    filled(nested) for _ in range(count(schema.__name__, field.name))
                ]
            elif base == "array":
                item = "t" if field.metadata.get("kafka_type") == "string" else 3
                values[field.name] = [item] * count(schema.__name__, field.name)
            elif base == "records":
                values[field.name] = batch
            elif base == "string" and field.name.endswith("name"):
                values[field.name] = "topic-a"
        return protocol.build(schema, **values)

    return _frame(api_key, version, filled(load_request_schema(api_key, version)))


def over_limits(body: Any, limits: RequestLimits) -> list[str]:
    """What a decoded request holds past ``limits``, counted on the decoded message
    itself (the oracle for the walk's bounds): each array against its kind's bound,
    partitions over the whole request."""
    found: list[str] = []
    totals: dict[str, int] = {}

    def visit(message: Any) -> None:
        for field in dataclasses.fields(message):
            value = getattr(message, field.name)
            if dataclasses.is_dataclass(value):
                visit(value)
            if not isinstance(value, tuple):
                continue
            kind = request_shape.ARRAY_KINDS.get((type(message).__name__, field.name))
            if kind is not None:
                bound = limits.bound(kind)[0]
                if kind in request_shape.CUMULATIVE_KINDS:
                    totals[kind] = totals.get(kind, 0) + len(value)
                elif len(value) > bound:
                    found.append(f"{field.name}: {len(value)} {kind}")
            for item in value:
                if dataclasses.is_dataclass(item):
                    visit(item)

    visit(body)
    found += [
        f"{total} {kind} in all" for kind, total in totals.items() if total > limits.bound(kind)[0]
    ]
    return found


def fuzz_request_limits(seed: int, cases: int) -> None:
    """Requests of every API and version served with arrays near and over their bounds:
    each is refused exactly when the decoded request would hold more than the bounds
    allow (``over_limits``), and a refusal names the bound."""
    rng = random.Random(seed)
    batch = _batch(rng, 0)
    served = [
        (key, version)
        for key, (low, high) in sorted(protocol.SUPPORTED_VERSIONS.items())
        for version in range(low, high + 1)
    ]
    refused = 0
    for _ in range(cases):
        api_key, version = rng.choice(served)
        frame = _sized_request(rng, api_key, version, batch)
        over = over_limits(protocol.decode_request(frame).body, SMALL_LIMITS)
        try:
            protocol.decode_request(frame, SMALL_LIMITS)
        except MalformedRequestError as error:
            if not over or "at most" not in str(error):
                raise AssertionError(
                    f"request {frame.hex()} refused ({error}) within its bounds"
                ) from error
            refused += 1
            continue
        if over:
            raise AssertionError(f"request {frame.hex()} taken holding {over}")
    assert refused, "no case went over a bound"


def fuzz_batches(seed: int, cases: int) -> None:
    rng = random.Random(seed)
    seeds = [_batch(rng, codec) for codec in (0, 1, 2, 3, 4) for _ in range(4)]
    for batch in seeds:
        records.to_stored(batch, LIMIT)  # the seeds themselves are taken
    for _ in range(cases):
        case = _mutate(rng, rng.choice(seeds), seeds)
        if rng.random() < 0.8 and len(case) > records.CRC_START:
            case = (
                case[:17] + struct.pack(">I", crc32c.crc32c(case[records.CRC_START :])) + case[21:]
            )
        try:
            produced = records.to_stored(case, LIMIT)
        except HeadwaterError as error:
            if error.code not in ALLOWED_CODES:
                raise AssertionError(
                    f"batch {case.hex()} refused with {error.code.name}"
                ) from error
            continue
        except Exception as exc:
            raise AssertionError(f"batch {case.hex()} raised {type(exc).__name__}: {exc}") from exc
        try:
            _reads_back(case, produced)
        except Exception as exc:
            raise AssertionError(
                f"batch {case.hex()} was taken and does not read back: {type(exc).__name__}: {exc}"
            ) from exc


def _reads_back(case: bytes, produced: records.ProducedBatch) -> None:
    """What the log took reads back over both protocols: to a Kafka fetch the bytes the
    producer sent, to a gRPC fetch as many records as the header says."""
    stored = batch_format.set_base_offset(produced.stored, 1000, 3)
    fetched = records.to_kafka(stored, LIMIT)
    if fetched[records.KAFKA_BODY_START :] != case[records.KAFKA_BODY_START :]:
        raise ValueError("a Kafka fetch does not return the batch as produced")
    columnar, cut_at = records.to_columnar(stored, LIMIT)
    decoded = batch_format.decode_batches(columnar)
    if (
        cut_at is not None
        or sum(d.records.num_rows for d in decoded) != produced.header.record_count
    ):
        raise ValueError("a gRPC fetch does not return every record")


def _consumer_protocol_seeds() -> list[bytes]:
    """A subscription and an assignment of every version (each with two topics)."""
    seeds = []
    for name, schema_name in (
        ("ConsumerProtocolSubscription", "consumer_protocol_subscription"),
        ("ConsumerProtocolAssignment", "consumer_protocol_assignment"),
    ):
        for version in range(consumer_protocol.NEWEST_VERSION + 1):
            module = __import__(f"kio.schema.{schema_name}.v{version}", fromlist=[name])
            schema = getattr(module, name)
            values: dict[str, Any] = {}
            for field, kind, nested in protocol._fields(schema):
                if kind == "entities":
                    values[field.name] = [
                        protocol.build(nested, topic=t, partitions=[0, 2]) for t in ("a", "b")
                    ]
                elif field.name == "topics":
                    values[field.name] = ("a", "b")
            out = io.BytesIO()
            out.write(struct.pack(">h", version))
            entity_writer(schema)(out, protocol.build(schema, **values))
            seeds.append(out.getvalue())
    return seeds


def fuzz_consumer_protocol(seed: int, cases: int) -> None:
    rng = random.Random(seed)
    seeds = _consumer_protocol_seeds()
    half = len(seeds) // 2
    for data in seeds[:half]:
        assert consumer_protocol.subscribed_topics(data) == ("a", "b")
    for data in seeds[half:]:
        assert consumer_protocol.assigned_partitions(data) == (("a", (0, 2)), ("b", (0, 2)))
    for _ in range(cases):
        case = _mutate(rng, rng.choice(seeds), seeds)
        try:
            consumer_protocol.subscribed_topics(case)
            consumer_protocol.assigned_partitions(case)
        except Exception as exc:
            raise AssertionError(
                f"consumer protocol bytes {case.hex()} raised {type(exc).__name__}: {exc}"
            ) from exc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    fuzz_requests(args.seed, args.cases)
    fuzz_request_limits(args.seed + 3, args.cases // 10)
    fuzz_batches(args.seed + 1, args.cases)
    fuzz_consumer_protocol(args.seed + 2, args.cases)
    print(
        f"{args.cases} request frames, {args.cases // 10} near the limits, {args.cases} "
        f"batches and {args.cases} consumer protocol payloads: no finding"
    )


if __name__ == "__main__":
    main()
