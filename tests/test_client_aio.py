"""The asyncio producer and consumer against a real node."""

from __future__ import annotations

import asyncio
import itertools

import grpc
import pytest

from headwater.client import Admin
from headwater.client.admin_types import OffsetSpec
from headwater.client.aio import AsyncConsumer, AsyncProducer
from headwater.client.partitioner import partition_for_key
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_errors import from_rpc_error
from tests.node_process import NodeProcess


def test_async_round_trip_in_order_with_keys(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        admin.create_topic("aio-keys", 3)

    async def run() -> list:
        async with AsyncConsumer(shared_node.address) as consumer:
            await consumer.assign_at("aio-keys", OffsetSpec.EARLIEST)
            async with AsyncProducer(shared_node.address, acks="all") as producer:
                futures = [
                    await producer.send("aio-keys", f"v{i}".encode(), key=f"k{i % 7}".encode())
                    for i in range(500)
                ]
                metadata = await asyncio.gather(*futures)
            for i, meta in enumerate(metadata):
                assert meta.partition == partition_for_key(f"k{i % 7}".encode(), 3)
            records = []
            while len(records) < 500:
                result = await consumer.poll(timeout_ms=10_000)
                assert result.batches, "nothing arrived within 10 s"
                records += list(result)
            return records

    records = asyncio.run(run())
    assert sorted(r.value for r in records) == sorted(f"v{i}".encode() for i in range(500))
    for partition in range(3):
        mine = [r for r in records if r.partition == partition]
        assert [r.offset for r in mine] == list(range(len(mine)))  # contiguous, in order
        sent_order = [
            f"v{i}".encode()
            for i in range(500)
            if partition_for_key(f"k{i % 7}".encode(), 3) == partition
        ]
        assert [r.value for r in mine] == sent_order


def test_async_errors_fail_the_futures(shared_node: NodeProcess) -> None:
    with Admin(shared_node.address) as admin:
        admin.create_topic("aio-small", 1, configs={"max_message_bytes": "1024"})

    async def run() -> None:
        async with AsyncProducer(shared_node.address) as producer:
            too_big = await producer.send("aio-small", b"x" * 5000)
            with pytest.raises(HeadwaterError) as info:
                await too_big
            assert info.value.code == ErrorCode.MESSAGE_TOO_LARGE
            fine = await producer.send("aio-small", b"ok")
            assert (await fine).offset == 0  # the stream goes on after a failed request
            with pytest.raises(HeadwaterError) as info:
                await producer.send("aio-small", b"x", partition=4)
            assert info.value.code == ErrorCode.PARTITION_OUT_OF_RANGE
            assert "[0, 1)" in info.value.message
            with pytest.raises(HeadwaterError) as info:
                await producer.send("nosuchtopic", b"x")
            assert info.value.code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION

    asyncio.run(run())


def test_flush_returns_while_another_task_keeps_sending(shared_node: NodeProcess) -> None:
    """flush waits for the records queued before it, as Kafka's does. It used to wait
    until nothing at all was queued, so a task that kept sending held it (and close) up
    for ever."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("aio-flush-busy", 1)

    async def run() -> None:
        async with AsyncProducer(shared_node.address, acks="1", linger_ms=5) as producer:
            before = [await producer.send("aio-flush-busy", b"before") for _ in range(100)]
            sending = True

            async def keep_sending() -> int:
                sent = 0
                while sending:
                    await producer.send("aio-flush-busy", b"meanwhile")
                    sent += 1
                    await asyncio.sleep(0)
                return sent

            task = asyncio.create_task(keep_sending())
            await asyncio.sleep(0.05)
            await asyncio.wait_for(producer.flush(), 30)
            assert all(f.done() for f in before)
            assert [f.result().offset for f in before] == list(range(100))
            sending = False
            assert await task > 0

    asyncio.run(run())


def test_records_sent_while_closing_are_sent_or_refused(shared_node: NodeProcess) -> None:
    """close refuses further sends first, then flushes: a record another task sent
    during close is either refused or sent. (Flushing first left the records sent during
    the flush unsent, their futures pending for ever.)"""
    with Admin(shared_node.address) as admin:
        admin.create_topic("aio-close-busy", 1)

    async def run() -> None:
        producer = AsyncProducer(shared_node.address, acks="1", linger_ms=5)
        futures = [await producer.send("aio-close-busy", b"first")]
        refusals: list[ErrorCode] = []

        async def keep_sending() -> None:
            while True:
                try:
                    futures.append(await producer.send("aio-close-busy", b"meanwhile"))
                except HeadwaterError as error:
                    refusals.append(error.code)
                    return
                await asyncio.sleep(0)

        task = asyncio.create_task(keep_sending())
        await asyncio.sleep(0.05)
        await asyncio.wait_for(producer.close(), 30)
        await asyncio.wait_for(task, 30)
        assert refusals == [ErrorCode.INVALID_REQUEST]
        landed = await asyncio.wait_for(asyncio.gather(*futures), 30)
        assert [m.offset for m in landed] == list(range(len(futures)))

    asyncio.run(run())


def test_async_producer_fails_pending_records_when_the_node_dies(node: NodeProcess) -> None:
    with Admin(node.address) as admin:
        admin.create_topic("aio-dies", 1)

    async def run() -> None:
        producer = AsyncProducer(node.address, request_timeout_ms=5000, delivery_timeout_ms=3000)
        assert (await (await producer.send("aio-dies", b"first"))).offset == 0
        node.kill()
        doomed = await producer.send("aio-dies", b"lost")
        with pytest.raises(HeadwaterError) as info:
            await asyncio.wait_for(doomed, 30)
        assert info.value.retriable
        await producer.close()

    asyncio.run(run())


def test_async_consumer_resumes_after_the_node_restarts(node: NodeProcess) -> None:
    """A fetch stream that breaks (the node was SIGKILLed and restarted) is reopened where
    it stopped: every record arrives once, in order, with no error raised by poll."""
    with Admin(node.address) as admin:
        admin.create_topic("aio-resume", 1)

    async def produce(first: int, count: int) -> None:
        async with AsyncProducer(node.address, acks="all") as producer:
            futures = [
                await producer.send("aio-resume", b"%d" % i) for i in range(first, first + count)
            ]
            await asyncio.gather(*futures)

    async def consume(consumer: AsyncConsumer, count: int) -> list:
        records: list = []
        while len(records) < count:
            result = await consumer.poll(timeout_ms=30_000)
            assert result.batches, f"only {len(records)} of {count} records within 30 s"
            records += list(result)
        return records

    async def run() -> list:
        async with AsyncConsumer(node.address) as consumer:
            await consumer.assign_at("aio-resume", OffsetSpec.EARLIEST)
            await produce(0, 100)
            records = await consume(consumer, 100)
            node.kill()
            await asyncio.to_thread(node.start)
            await produce(100, 100)
            return records + await consume(consumer, 100)

    records = asyncio.run(run())
    assert [r.offset for r in records] == list(range(200))
    assert [r.value for r in records] == [b"%d" % i for i in range(200)]


def test_async_keyless_records_spread_over_partitions(shared_node: NodeProcess) -> None:
    """Issue 12: the asyncio producer sent every keyless record to partition 0 (its sticky
    partition never moved). Now, as in the threaded producer, keyless records stick to one
    partition until their batch leaves, then move to another."""
    with Admin(shared_node.address) as admin:
        admin.create_topic("aio-spread", 4)

    async def run() -> list[int]:
        partitions = []
        async with AsyncProducer(shared_node.address, acks=1) as producer:
            for round_ in range(8):  # one batch per round: each round's records leave together
                futures = [
                    await producer.send("aio-spread", f"{round_}-{i}".encode()) for i in range(5)
                ]
                metadata = await asyncio.gather(*futures)
                assert len({m.partition for m in metadata}) == 1  # one batch, one partition
                partitions.append(metadata[0].partition)
        return partitions

    partitions = asyncio.run(run())
    assert all(a != b for a, b in itertools.pairwise(partitions)), partitions


def test_a_write_that_fails_as_the_stream_ends_is_a_network_error() -> None:
    """grpc.aio reports a stream write that fails as the call ends (the node was killed
    under it) as INTERNAL "Internal error from Core" instead of the call's own status
    (grpc/grpc#36066). The producers must retry it as a broken connection, not give up
    on it as a server error."""
    lost = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL,
        grpc.aio.Metadata(),
        grpc.aio.Metadata(),
        details="Internal error from Core",
    )
    error = from_rpc_error(lost, "127.0.0.1:7700")
    assert error.code is ErrorCode.NETWORK_EXCEPTION and error.retriable
    other = grpc.aio.AioRpcError(
        grpc.StatusCode.INTERNAL, grpc.aio.Metadata(), grpc.aio.Metadata(), details="bad frame"
    )
    assert from_rpc_error(other, "127.0.0.1:7700").code is ErrorCode.UNKNOWN_SERVER_ERROR
