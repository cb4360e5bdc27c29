"""Server-side record encoding of the ``headwater.v1.Broker`` servicer, for thin clients
that send and read plain records instead of encoded batches (pure: no I/O, no clock).

Produce with ``records``: the records are grouped by target partition (the request's
partition when it names one; otherwise a keyed record goes by its key's hash,
``headwater.client.partitioner``, and a keyless one to the partition the caller chose for
the request's keyless records) and each group is encoded as one batch
(``headwater.log.batch``), which the caller then validates and appends like a batch a
client encoded. A record without a timestamp gets the time the caller passes in; the
timestamps of one request must span less than 2^31 ms, the most one batch can hold.

Fetch with ``RECORD_FORMAT_RECORDS``: the stored batches read for the request are decoded
into ``ConsumedRecord`` messages, leaving out the records of the first batch that come
before the fetch offset, and only as many as the answer holds (its size, and at most
DECODED_RECORDS_MAX records): the stored bytes never decide the work alone.

The caller (``headwater.node.rpc.broker_service``) checks the request's fields first; these
functions run on its thread, the node's event loop, and a Fetch's decoding in steps
(``decoding``) between which the caller gives the loop back.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Final

from headwater.log import batch as batch_format
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.partitioning import partition_for_key
from headwater.v1 import headwater_pb2 as pb


def encode_records(
    request: pb.ProduceRequest, partitions: int, keyless_target: int, now: int
) -> dict[int, bytes]:
    """Plain records, grouped by target partition and encoded as one batch each."""
    records = request.records.records
    groups: dict[int, list[pb.Record]] = {}
    for record in records:
        if request.partition != -1:
            target = request.partition
        elif record.HasField("key"):
            target = partition_for_key(record.key, partitions)
        else:
            target = keyless_target
        groups.setdefault(target, []).append(record)
    stamps = [r.timestamp_ms if r.HasField("timestamp_ms") else now for r in records]
    if max(stamps) - min(stamps) >= 1 << 31:
        raise HeadwaterError(
            ErrorCode.INVALID_TIMESTAMP,
            f"record timestamps {min(stamps)}..{max(stamps)} (the current time for records "
            "without one) span 2^31 ms (24.8 days) or more; one batch cannot hold them: "
            "send such records in separate requests",
        )
    return {
        target: batch_format.encode_batch(
            [r.value if r.HasField("value") else None for r in group],
            keys=[r.key if r.HasField("key") else None for r in group],
            headers=[
                [(h.key, h.value if h.HasField("value") else None) for h in r.headers]
                for r in group
            ],
            timestamps_ms=[r.timestamp_ms if r.HasField("timestamp_ms") else now for r in group],
            compression=batch_format.Compression(request.compression),
        )
        for target, group in groups.items()
    }


DECODED_RECORDS_MAX: Final = 1 << 16
"""Most records one decoded-records Fetch answer holds (the answer's ``next_offset`` says
where to go on). An answer is cut by its size first for all but the smallest records; the
count bounds the messages the broker builds on its event loop for records of a few bytes,
which compression packs by the hundred thousand into a batch of 200 bytes."""
RECORD_FRAMING_BYTES: Final = 6
"""A ConsumedRecord's field tag and length prefix (at most 5 bytes) in a FetchResponse."""


@dataclass(frozen=True, slots=True)
class DecodedAnswer:
    """The records of a decoded-records Fetch answer.

    ``resume_offset``: where the next fetch goes on when not every record of the data read
    fits the answer (its size or DECODED_RECORDS_MAX), else None. ``too_large_bytes``: the
    bytes the first record takes in an answer (its message and framing) when that
    record alone does not fit (then ``records`` is empty), else 0."""

    records: Sequence[pb.ConsumedRecord]
    resume_offset: int | None = None
    too_large_bytes: int = 0


DECODE_STEP_COST: Final = 2048
"""``decoding`` hands control back (one ``yield``) once it has done about this much work
since it last did, a record counting 1 and a batch decoded 8 (about 3 µs a record
message and 20 µs a batch on the machine of BENCHMARKS.md): a few milliseconds a step."""
BATCH_DECODE_COST: Final = 8


def decoding(
    data: bytes,
    first_offset: int,
    bytes_max: int,
    records_max: int = DECODED_RECORDS_MAX,
    into: pb.FetchResponse | None = None,
) -> Generator[None, None, DecodedAnswer]:
    """``decoded_records`` in steps: a generator that yields between pieces of its work
    (``DECODE_STEP_COST``) and returns the answer, so that a caller on an event loop gives
    the loop back between steps. Batches are decoded one at a time, only as far as the
    answer can take them: the first always, then each whose records keep the answer
    within ``records_max`` (as ``batch.decode_batches_within`` decides), so the work and
    the memory follow the answer, not what the stored bytes decompress to. The records
    are built in place in ``into``'s ``decoded`` (a new answer's when None): a message
    built apart and then added to an answer is copied whole."""
    out = (into if into is not None else pb.FetchResponse()).decoded
    used = 0
    cost = 0
    counted = 0
    decoded_up_to: int | None = None
    for position, header in batch_format.iter_headers(data, verify_crc=False):
        counted += header.record_count
        if decoded_up_to is not None and counted > records_max:
            return DecodedAnswer(out, decoded_up_to)
        decoded = batch_format.decode_batch(data, position, verify_crc=True)
        decoded_up_to = decoded.header.next_offset
        cost += BATCH_DECODE_COST
        if decoded.header.is_control:
            continue  # markers, not records (docs/record-batch-format.md)
        records = decoded.records
        if decoded.header.base_offset < first_offset:
            records = records.slice(first_offset - decoded.header.base_offset)
        room = records_max - len(out)
        taken = records.slice(0, room)
        for start in range(0, taken.num_rows, DECODE_STEP_COST):
            if cost >= DECODE_STEP_COST:
                cost = 0
                yield
            piece = taken.slice(start, DECODE_STEP_COST)
            cost += piece.num_rows
            for row, stamp in zip(
                batch_format.rows_without_timestamps(piece),
                batch_format.timestamps_ms(piece),
                strict=True,
            ):
                record = out.add(offset=row["offset"], timestamp_ms=stamp)
                for h in row["headers"] or ():
                    record.headers.add(key=h["key"], value=h["value"])
                if row["key"] is not None:
                    record.key = row["key"]
                if row["value"] is not None:
                    record.value = row["value"]
                size = record.ByteSize() + RECORD_FRAMING_BYTES
                if used + size > bytes_max:
                    del out[-1]
                    return DecodedAnswer(out, row["offset"], 0 if out else size)
                used += size
        if taken.num_rows < records.num_rows:  # cut inside this batch by the count
            return DecodedAnswer(out, records.column("offset")[room].as_py())
        if cost >= DECODE_STEP_COST:
            cost = 0
            yield
    return DecodedAnswer(out, None)


def decoded_records(
    data: bytes, first_offset: int, bytes_max: int, records_max: int = DECODED_RECORDS_MAX
) -> DecodedAnswer:
    """The records at or after ``first_offset`` of the stored batches ``data`` as
    messages, as many as fit ``bytes_max`` bytes of answer (each with its framing) and
    ``records_max`` records (``decoding``, run to its end)."""
    steps = decoding(data, first_offset, bytes_max, records_max)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            answer: DecodedAnswer = done.value
            return answer
