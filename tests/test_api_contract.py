"""What a client in another language relies on: the broker enforces the batch spec's
rules exactly (the published rejection vectors, over Produce and ProduceStream), errors
carry the documented gRPC status, ErrorInfo and retriable flag, per-item answers carry
the flag too, and every document the proto names exists."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import grpc
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2  # type: ignore[import-untyped]
from grpc_status import rpc_status

from headwater.client import Admin
from headwater.client.producer import parse_acks
from headwater.log import batch as batch_format
from headwater.shared.errors import GRPC_STATUS_OF, ErrorCode, is_retriable
from headwater.tools.error_table import render_markdown
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess

ROOT = Path(__file__).resolve().parent.parent
REJECTIONS = json.loads((ROOT / "docs/testvectors/record-batches.json").read_text())["rejections"]


def error_info(error: grpc.RpcError) -> tuple[grpc.StatusCode, error_details_pb2.ErrorInfo]:
    status = rpc_status.from_call(error)  # type: ignore[arg-type]
    assert status is not None, error
    (detail,) = status.details
    info = error_details_pb2.ErrorInfo()
    assert detail.Unpack(info)
    return error.code(), info  # type: ignore[attr-defined]


def assert_error(error: grpc.RpcError, code: ErrorCode) -> None:
    """The documented shape: status GRPC_STATUS_OF[code], ErrorInfo naming the code."""
    status, info = error_info(error)
    assert status.value[0] == int(GRPC_STATUS_OF[code]), (status, info)
    assert info.domain == "headwater.v1" and info.reason == code.name
    assert info.metadata["code"] == str(int(code))
    assert info.metadata["retriable"] == str(is_retriable(code)).lower()


@pytest.fixture(scope="module")
def topic(shared_node: NodeProcess) -> str:
    name = f"contract-{uuid.uuid4().hex[:8]}"
    with Admin(shared_node.address) as admin:
        admin.create_topic(name, 2)
    return name


@pytest.fixture(scope="module")
def stub(shared_node: NodeProcess) -> pb_grpc.BrokerStub:
    return pb_grpc.BrokerStub(grpc.insecure_channel(shared_node.address))


@pytest.mark.parametrize("rejection", REJECTIONS, ids=[r["name"] for r in REJECTIONS])
def test_the_broker_refuses_each_rejection_vector(
    stub: pb_grpc.BrokerStub, topic: str, rejection: dict[str, str]
) -> None:
    batch = bytes.fromhex(rejection["batch_hex"])
    code = ErrorCode[rejection["error"]]
    with pytest.raises(grpc.RpcError) as refused:
        stub.Produce(pb.ProduceRequest(topic=topic, partition=0, batch=batch), timeout=30)
    assert_error(refused.value, code)
    (answer,) = stub.ProduceStream(
        iter([pb.ProduceRequest(topic=topic, partition=0, batch=batch)]), timeout=30
    )
    assert answer.error_code == int(code) and not answer.retriable
    assert not answer.results


def test_the_broker_takes_what_decoders_must_ignore(stub: pb_grpc.BrokerStub, topic: str) -> None:
    """The vectors that differ from the canonical encoding only where the spec says a
    decoder ignores the bytes (spare bitmap bits, a null slot's bytes, has-keys or
    has-headers set with none) are valid batches."""
    vectors = json.loads((ROOT / "docs/testvectors/record-batches.json").read_text())["vectors"]
    for vector in vectors:
        batch = bytes.fromhex(vector["batch_hex"])
        if vector["producer_id"] != -1:
            continue  # an idempotent batch needs an allocated producer id
        answer = stub.Produce(pb.ProduceRequest(topic=topic, partition=1, batch=batch), timeout=30)
        assert answer.results[0].base_offset >= 0, vector["name"]


def test_a_partition_number_out_of_range_is_not_retriable(
    stub: pb_grpc.BrokerStub, topic: str
) -> None:
    """It used to be UNKNOWN_TOPIC_OR_PARTITION, retriable: a client retried forever."""
    good = batch_format.encode_batch([b"v"])
    calls = (
        lambda: stub.Produce(pb.ProduceRequest(topic=topic, partition=2, batch=good), timeout=30),
        lambda: stub.Fetch(pb.FetchRequest(topic=topic, partition=5, offset=0), timeout=30),
        lambda: stub.ListOffsets(pb.ListOffsetsRequest(topic=topic, partitions=[2]), timeout=30),
    )
    for call in calls:
        with pytest.raises(grpc.RpcError) as refused:
            call()
        assert_error(refused.value, ErrorCode.PARTITION_OUT_OF_RANGE)
        assert "[0, 2)" in refused.value.details()  # type: ignore[attr-defined]
    with pytest.raises(grpc.RpcError) as missing:
        stub.Fetch(pb.FetchRequest(topic="contract-no-such-topic", partition=0), timeout=30)
    assert_error(missing.value, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)


def test_per_item_answers_carry_the_retriable_flag(
    shared_node: NodeProcess, stub: pb_grpc.BrokerStub, topic: str
) -> None:
    good = batch_format.encode_batch([b"v"])
    answers = list(
        stub.ProduceStream(
            iter(
                [
                    pb.ProduceRequest(topic="contract-no-such-topic", partition=0, batch=good),
                    pb.ProduceRequest(topic=topic, partition=9, batch=good),
                    pb.ProduceRequest(topic=topic, partition=0, batch=good),
                ]
            ),
            timeout=30,
        )
    )
    assert [(a.error_code, a.retriable) for a in answers] == [
        (pb.UNKNOWN_TOPIC_OR_PARTITION, True),
        (pb.PARTITION_OUT_OF_RANGE, False),
        (pb.NONE, False),
    ]
    admin = pb_grpc.AdminStub(grpc.insecure_channel(shared_node.address))
    created = admin.CreateTopics(
        pb.CreateTopicsRequest(topics=[pb.NewTopic(name=topic, partitions=1)]), timeout=30
    )
    (result,) = created.results
    assert result.error_code == pb.TOPIC_ALREADY_EXISTS and not result.retriable


def test_docs_errors_md_is_generated_from_the_code() -> None:
    assert (ROOT / "docs/errors.md").read_text() == render_markdown(), (
        "run python -m headwater.tools.error_table > docs/errors.md"
    )


def test_every_document_the_proto_names_exists() -> None:
    """A reference such as ``docs/cluster.md "Metadata records"`` names a file that
    exists and, when it quotes a section, a heading of that file."""
    proto = (ROOT / "proto/headwater/v1/headwater.proto").read_text()
    references = re.findall(r'(docs/[\w./-]+\.md)(?:,? "([^"]+)")?', proto)
    assert references
    for path, section in references:
        document = ROOT / path
        assert document.is_file(), f"the proto names {path}, which does not exist"
        if section:
            headings = [line.lstrip("#").strip() for line in document.read_text().splitlines()]
            assert section in headings, f'{path} has no section "{section}"'


def test_acks_wire_values_and_kafka_spellings() -> None:
    """The proto's numbers are not Kafka's (ACKS_NONE = 1): they are pinned here, and
    every Kafka spelling the Python client and CLI take maps to the proto name with the
    same meaning; protobuf JSON (grpcurl) takes the names."""
    assert (pb.ACKS_UNSPECIFIED, pb.ACKS_NONE, pb.ACKS_LEADER, pb.ACKS_ALL) == (0, 1, 2, 3)
    kafka = {"0": pb.ACKS_NONE, "1": pb.ACKS_LEADER, "all": pb.ACKS_ALL, "-1": pb.ACKS_ALL}
    for spelling, value in kafka.items():
        assert parse_acks(spelling) == value
    request = json_format.Parse('{"topic": "t", "acks": "ACKS_LEADER"}', pb.ProduceRequest())
    assert request.acks == pb.ACKS_LEADER
