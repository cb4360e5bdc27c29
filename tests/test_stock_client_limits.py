"""A stock gRPC client (default 4 MiB receive limit, as tonic, grpc-go, grpc-java and
Python's grpc have) fetching with default settings: every answer fits its limit, and a
batch too large for it gets a distinct, documented error."""

from __future__ import annotations

import grpc
import pytest

from headwater.log import batch as batch_format
from headwater.shared.errors import ErrorCode, is_retriable
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess

STOCK_LIMIT = 4 << 20


def _produce(stub: pb_grpc.BrokerStub, topic: str, batches: list[bytes]) -> None:
    for batch in batches:
        stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=batch), timeout=30)


@pytest.fixture
def big_client_and_stock_client(node: NodeProcess):  # type: ignore[no-untyped-def]
    big = grpc.insecure_channel(
        node.address,
        options=[
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
        ],
    )
    stock = grpc.insecure_channel(node.address)  # gRPC's defaults: 4 MiB in
    try:
        yield pb_grpc.BrokerStub(big), pb_grpc.BrokerStub(stock)
    finally:
        big.close()
        stock.close()


def test_a_default_fetch_fits_a_stock_client(
    node: NodeProcess, big_client_and_stock_client
) -> None:  # type: ignore[no-untyped-def]
    """With max_bytes 0 the node answered up to 4 MiB of records plus framing: 4,194,315
    bytes, over a stock client's 4 MiB limit, even with 4 KiB batches."""
    big, stock = big_client_and_stock_client
    from headwater.client import Admin

    with Admin(node.address) as admin:
        admin.create_topic("small-batches", 1)
    batch = batch_format.encode_batch([b"v" * 192] * 20)
    assert len(batch) == 4096  # 1,024 of them fill 4 MiB exactly
    _produce(big, "small-batches", [batch] * 1300)
    answer = stock.Fetch(pb.FetchRequest(topic="small-batches", partition=0, offset=0))
    assert 0 < answer.ByteSize() <= STOCK_LIMIT
    assert answer.next_offset > 0
    streamed = stock.FetchStream(pb.FetchRequest(topic="small-batches", partition=0, offset=0))
    try:
        first = next(iter(streamed))
        assert 0 < first.ByteSize() <= STOCK_LIMIT
    finally:
        streamed.cancel()
    decoded = stock.Fetch(
        pb.FetchRequest(
            topic="small-batches", partition=0, offset=0, format=pb.RECORD_FORMAT_RECORDS
        )
    )
    assert 0 < decoded.ByteSize() <= STOCK_LIMIT
    assert decoded.next_offset == decoded.decoded[-1].offset + 1


@pytest.mark.parametrize("record_format", [pb.RECORD_FORMAT_BATCHES, pb.RECORD_FORMAT_RECORDS])
def test_the_largest_batch_a_default_topic_takes_fits_a_stock_client(
    node: NodeProcess,
    big_client_and_stock_client,  # type: ignore[no-untyped-def]
    record_format: pb.RecordFormat.ValueType,
) -> None:
    """A topic's default max_message_bytes was 8 MiB: a stock client could not read what
    the broker took. Now a batch of exactly the default limit, one record, or a record of
    the same size sent as plain records, is fetched by a client at gRPC's defaults."""
    big, stock = big_client_and_stock_client
    from headwater.client import Admin

    with Admin(node.address) as admin:
        admin.create_topic("largest", 1)
    limit = batch_format.MESSAGE_BYTES_DEFAULT
    value_bytes = limit - batch_format.HEADER_BYTES - 24  # validity, offsets, deltas: 8 each
    largest = batch_format.encode_batch([b"x" * value_bytes])
    assert len(largest) == limit
    _produce(big, "largest", [largest])
    with pytest.raises(grpc.RpcError) as refused:
        _produce(big, "largest", [batch_format.encode_batch([b"x" * (value_bytes + 8)])])
    assert from_rpc_error(refused.value, node.address).code is ErrorCode.MESSAGE_TOO_LARGE
    answer = stock.Fetch(
        pb.FetchRequest(topic="largest", partition=0, offset=0, format=record_format)
    )
    assert answer.next_offset == 1
    if record_format == pb.RECORD_FORMAT_BATCHES:
        assert answer.records[16:] == largest[16:]  # the broker stamps offset and epoch
    else:
        assert len(answer.decoded[0].value) == value_bytes


def test_a_batch_too_large_for_the_client_gets_a_distinct_error(
    node: NodeProcess, big_client_and_stock_client
) -> None:  # type: ignore[no-untyped-def]
    big, stock = big_client_and_stock_client
    from headwater.client import Admin

    with Admin(node.address) as admin:
        admin.create_topic("big-batch", 1, configs={"max_message_bytes": str(8 << 20)})
    large = batch_format.encode_batch([b"x" * (1 << 20)] * 5)  # 5 MiB, under 8 MiB
    _produce(big, "big-batch", [large])
    with pytest.raises(grpc.RpcError) as refused:
        stock.Fetch(pb.FetchRequest(topic="big-batch", partition=0, offset=0))
    error = from_rpc_error(refused.value, node.address)
    assert error.code is ErrorCode.FETCH_RESPONSE_TOO_LARGE, error
    assert not is_retriable(error.code)
    assert "max_response_bytes" in error.message
    # A client that declares a larger limit gets the batch.
    answer = big.Fetch(
        pb.FetchRequest(topic="big-batch", partition=0, offset=0, max_response_bytes=16 << 20)
    )
    assert len(answer.records) == len(large)
    assert "Traceback" not in node.log()


def test_a_max_response_bytes_below_64_kib_is_refused(
    node: NodeProcess, big_client_and_stock_client
) -> None:  # type: ignore[no-untyped-def]
    _big, stock = big_client_and_stock_client
    from headwater.client import Admin

    with Admin(node.address) as admin:
        admin.create_topic("tiny-limit", 1)
    with pytest.raises(grpc.RpcError) as refused:
        stock.Fetch(
            pb.FetchRequest(topic="tiny-limit", partition=0, offset=0, max_response_bytes=1000)
        )
    error = from_rpc_error(refused.value, node.address)
    assert error.code is ErrorCode.INVALID_REQUEST
    assert "max_response_bytes is 1000" in error.message and "65536" in error.message
