"""Compressed batches that decode into far more records than their bytes: 400,000 null
records compress with zstd into a 200-byte batch, so 4 MiB of them decode into 8 billion.
A reader (the broker answering a decoded-records Fetch, the consumers, the Spark source)
used to decode every batch of what it fetched before cutting: one Fetch of such a topic
built a message per record on the broker's event loop, and a consumer decoded them all
into one poll. Now what is decoded follows what the reader can take
(``batch.decode_batches_within``)."""

from __future__ import annotations

import asyncio
import time

import grpc
import pyarrow as pa
import pytest

from headwater.client import Admin, Consumer, TopicPartition
from headwater.client.aio import AsyncConsumer
from headwater.client.consumer import fetched_from
from headwater.log import batch as bf
from headwater.node.rpc.record_encoding import DECODED_RECORDS_MAX, decoded_records
from headwater.sparkconnector.planning import OffsetRange
from headwater.sparkconnector.source import output_schema, to_output
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess

BOMB_RECORDS = 400_000


def bomb(base_offset: int = 0, records: int = BOMB_RECORDS) -> bytes:
    """One zstd batch of ``records`` null-value records (about 200 bytes)."""
    return bf.encode_batch(
        pa.nulls(records, pa.binary()),
        timestamps_ms=int(time.time() * 1000),
        compression=bf.Compression.ZSTD,
        base_offset=base_offset,
    )


def bombs(count: int) -> bytes:
    return b"".join(bomb(i * BOMB_RECORDS) for i in range(count))


def test_a_bomb_is_small() -> None:
    assert len(bomb()) < 1024
    assert bf.decoded_records_max(len(bombs(10))) == bf.DECODED_RECORDS_MIN


def test_decoding_stops_before_the_batch_past_the_budget() -> None:
    data = bombs(3)
    decoded, resume = bf.decode_batches_within(data, records_max=1000)
    assert [d.header.base_offset for d in decoded] == [0]  # always one
    assert resume == BOMB_RECORDS
    decoded, resume = bf.decode_batches_within(data, records_max=2 * BOMB_RECORDS)
    assert len(decoded) == 2 and resume == 2 * BOMB_RECORDS
    decoded, resume = bf.decode_batches_within(data, records_max=3 * BOMB_RECORDS)
    assert len(decoded) == 3 and resume is None
    small = b"".join(bf.encode_batch([b"v"] * 10, base_offset=10 * i) for i in range(5))
    decoded, resume = bf.decode_batches_within(small)
    assert len(decoded) == 5 and resume is None
    # A batch past the stop damaged where its CRC covers is left for the read that gets
    # there.
    damaged = bytearray(bombs(2))
    damaged[-5] ^= 0xFF
    decoded, resume = bf.decode_batches_within(bytes(damaged) + bomb(), records_max=1)
    assert len(decoded) == 1 and resume == BOMB_RECORDS


def test_the_broker_decodes_only_what_an_answer_holds() -> None:
    data = bombs(10)
    answer = decoded_records(data, 0, bytes_max=4 << 20)
    assert len(answer.records) == DECODED_RECORDS_MAX
    assert answer.resume_offset == DECODED_RECORDS_MAX
    assert answer.records[-1].offset == DECODED_RECORDS_MAX - 1
    assert not any(r.HasField("value") or r.HasField("key") for r in answer.records)
    # From inside a batch, cut by the answer's size.
    answer = decoded_records(data, 390_000, bytes_max=1000)
    assert 0 < len(answer.records) < 100
    assert answer.records[0].offset == 390_000
    assert answer.resume_offset == answer.records[-1].offset + 1
    # The last records of a batch, then the next batch is left for the next answer.
    answer = decoded_records(data, BOMB_RECORDS - 5, bytes_max=4 << 20, records_max=10)
    assert [r.offset for r in answer.records] == list(range(BOMB_RECORDS - 5, BOMB_RECORDS))
    assert answer.resume_offset == BOMB_RECORDS
    # A record alone over the answer's size.
    answer = decoded_records(bf.encode_batch([b"x" * 500]), 0, bytes_max=100)
    assert answer.records == [] and answer.too_large_bytes > 500
    whole = decoded_records(bf.encode_batch([b"a", b"b"]), 0, bytes_max=100)
    assert len(whole.records) == 2 and whole.resume_offset is None


def test_a_consumer_decodes_one_batch_of_a_bomb_at_a_time() -> None:
    fetched, resume = fetched_from(TopicPartition("t", 0), bombs(10), 0, check_crcs=True)
    assert [f.records.num_rows for f in fetched] == [BOMB_RECORDS]
    assert resume == BOMB_RECORDS


def test_the_spark_source_decodes_one_batch_of_a_bomb_at_a_time() -> None:
    schema = output_schema(False, ("offset",))
    batch, after, cut = to_output(bombs(10), OffsetRange("t", 0, 0, 10 * BOMB_RECORDS), 0, schema)
    assert batch is not None and batch.num_rows == BOMB_RECORDS
    assert (after, cut) == (BOMB_RECORDS, True)
    batch, after, cut = to_output(bomb(), OffsetRange("t", 0, 0, 10), 0, schema)
    assert batch is not None and batch.num_rows == 10 and not cut


BOMBS_STORED = 5


@pytest.fixture(scope="module")
def bombed(shared_node: NodeProcess) -> NodeProcess:
    with Admin(shared_node.address) as admin:
        admin.create_topic("bombed", 1)
    with grpc.insecure_channel(shared_node.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        for _ in range(BOMBS_STORED):
            stub.Produce(pb.ProduceRequest(topic="bombed", partition=0, batch=bomb()), timeout=30)
    return shared_node


def test_a_decoded_fetch_of_bombs_is_bounded(bombed: NodeProcess) -> None:
    """The broker built a message for each of the 2M records, on its event loop, before
    cutting the answer to 4 MiB: 247,680 records."""
    with grpc.insecure_channel(bombed.address) as channel:
        stub = pb_grpc.BrokerStub(channel)
        offset = 0
        for _ in range(3):
            answer = stub.Fetch(
                pb.FetchRequest(
                    topic="bombed", partition=0, offset=offset, format=pb.RECORD_FORMAT_RECORDS
                ),
                timeout=30,
            )
            assert len(answer.decoded) == DECODED_RECORDS_MAX
            assert [r.offset for r in answer.decoded[:1]] == [offset]
            assert answer.next_offset == offset + DECODED_RECORDS_MAX
            offset = answer.next_offset


def _ranges(polled: list[pa.RecordBatch]) -> list[tuple[int, int]]:
    offsets = [b.column("offset") for b in polled]
    return [(o[0].as_py(), o[-1].as_py() + 1) for o in offsets]


def test_consumers_read_a_bombed_topic_a_batch_a_poll(bombed: NodeProcess) -> None:
    """A poll decoded every batch of what arrived: the 2M records of one answer at once
    (and 8 billion for 4 MiB of such batches)."""
    with Consumer(bombed.address, auto_offset_reset="earliest") as consumer:
        consumer.assign([TopicPartition("bombed", 0)])
        polled: list[pa.RecordBatch] = []
        deadline = time.monotonic() + 60
        while sum(b.num_rows for b in polled) < BOMBS_STORED * BOMB_RECORDS:
            assert time.monotonic() < deadline, _ranges(polled)
            result = consumer.poll(1000)
            assert len(result) <= BOMB_RECORDS
            polled += [b.records for b in result.batches]
    expected = [(i * BOMB_RECORDS, (i + 1) * BOMB_RECORDS) for i in range(BOMBS_STORED)]
    assert _ranges(polled) == expected  # each record once, in order

    async def read_async() -> list[pa.RecordBatch]:
        async with AsyncConsumer(bombed.address, auto_offset_reset="earliest") as consumer:
            await consumer.assign([TopicPartition("bombed", 0)])
            got: list[pa.RecordBatch] = []
            deadline = time.monotonic() + 60
            while sum(b.num_rows for b in got) < BOMBS_STORED * BOMB_RECORDS:
                assert time.monotonic() < deadline, _ranges(got)
                result = await consumer.poll(1000)
                assert len(result) <= BOMB_RECORDS
                got += [b.records for b in result.batches]
            return got

    assert _ranges(asyncio.run(read_async())) == expected
