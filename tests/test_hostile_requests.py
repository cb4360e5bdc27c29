"""Requests as an attacker or a careless client sends them, against a real node: each is
refused with a typed error, at once, and leaves no ERROR or traceback in the node's log.

One node for the module (each test its own topics); the tests that read the log for
what a call must not leave there stop their own node first, so that the event loop has
finalized every stream.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest

from headwater.client import Admin, Producer
from headwater.node.rpc.request_decoding import (
    CLIENT_GONE_PREFIX,
    INVALID_ENCODING_PREFIX,
    GrpcLogFilter,
)
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess

QUICK_S = 1.0
"""A refusal that needs nothing from other nodes answers within this."""


@pytest.fixture(scope="module")
def stubs(shared_node: NodeProcess) -> Iterator[tuple[Any, Any, grpc.Channel]]:
    with grpc.insecure_channel(shared_node.address) as channel:
        yield pb_grpc.AdminStub(channel), pb_grpc.BrokerStub(channel), channel


def refused(call: Callable[[], Any]) -> tuple[grpc.StatusCode, str, float]:
    began = time.monotonic()
    with pytest.raises(grpc.RpcError) as failed:
        call()
    error: Any = failed.value
    return error.code(), error.details(), time.monotonic() - began


def raw_unary(channel: grpc.Channel, method: str) -> Any:
    return channel.unary_unary(method, request_serializer=bytes, response_deserializer=bytes)


# ------------------------------------------------------------------ undecodable requests

GARBAGE = b"\xff\xff\xff\xff"
BAD_UTF8 = b"\x0a\x02\xc3\x28"  # field 1 (a string) holding invalid UTF-8


@pytest.mark.parametrize(
    ("method", "kind", "payload"),
    [
        ("/headwater.v1.Admin/ListTopics", "unary", GARBAGE),
        ("/headwater.v1.Admin/DescribeTopics", "unary", BAD_UTF8),
        ("/headwater.v1.Broker/Produce", "unary", GARBAGE),
        ("/grpc.health.v1.Health/Check", "unary", GARBAGE),
        ("/headwater.v1.Broker/FetchStream", "server-stream", GARBAGE),
        ("/headwater.v1.Broker/ProduceStream", "bidi", GARBAGE),
        ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", "bidi", GARBAGE),
    ],
)
def test_undecodable_requests_are_refused_as_invalid(
    shared_node: NodeProcess,
    stubs: tuple[Any, Any, grpc.Channel],
    method: str,
    kind: str,
    payload: bytes,
) -> None:
    channel = stubs[2]
    serializers = {"request_serializer": bytes, "response_deserializer": bytes}
    if kind == "unary":
        code, details, _ = refused(lambda: raw_unary(channel, method)(payload, timeout=5))
    elif kind == "server-stream":
        stream = channel.unary_stream(method, **serializers)
        code, details, _ = refused(lambda: list(stream(payload, timeout=5)))
    else:
        stream = channel.stream_stream(method, **serializers)
        code, details, _ = refused(lambda: list(stream(iter([payload]), timeout=5)))
    assert code is grpc.StatusCode.INVALID_ARGUMENT, details
    assert details.startswith("INVALID_REQUEST: ") and "does not decode" in details
    assert "Traceback" not in shared_node.log()
    assert " ERROR " not in shared_node.log()


# ------------------------------------------------------------------ streams


def test_cancelled_fetch_streams_leave_no_error_in_the_log(node: NodeProcess) -> None:
    """Cancelled while the node has answers the client has not read: its stream is
    suspended at a yield, and the event loop's finalizer closes it later, in a context of
    its own."""
    with Admin(node.address) as admin:
        admin.create_topic("cancelled", partitions=1)
    with Producer(node.address, acks="1") as producer:
        for future in producer.send_batch("cancelled", [b"x" * 1000] * 20_000, partition=0):
            future.result(30)
    with grpc.insecure_channel(node.address) as channel:
        broker = pb_grpc.BrokerStub(channel)
        for _ in range(10):
            stream = broker.FetchStream(
                pb.FetchRequest(
                    topic="cancelled", partition=0, offset=0, max_wait_ms=10_000, max_bytes=1
                )
            )
            next(stream)  # the node goes on answering, faster than this reads
            stream.cancel()
    node.stop()  # every stream the node still holds is finalized by now
    log = node.log()
    assert "Task exception was never retrieved" not in log and "ValueError" not in log, log


def test_an_idle_fetch_stream_answers_at_most_twice_a_second(
    shared_node: NodeProcess, stubs: tuple[Any, Any, grpc.Channel]
) -> None:
    with Admin(shared_node.address) as admin:
        admin.create_topic("idle", partitions=1)
    answers: list[pb.FetchResponse] = []
    stream = stubs[1].FetchStream(
        pb.FetchRequest(topic="idle", partition=0, offset=0, max_wait_ms=0), timeout=2.0
    )
    with pytest.raises(grpc.RpcError) as ended:
        answers.extend(stream)
    assert ended.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert 1 <= len(answers) <= 6, f"{len(answers)} empty answers in 2 s"


# ------------------------------------------------------------------ bounded echoes


def test_errors_quote_a_bounded_prefix_of_client_input(
    stubs: tuple[Any, Any, grpc.Channel],
) -> None:
    admin, broker, _channel = stubs
    long_name = "x" * 9000
    code, details, _ = refused(
        lambda: admin.DescribeTopics(pb.DescribeTopicsRequest(names=[long_name]), timeout=5)
    )
    assert code is grpc.StatusCode.NOT_FOUND, details
    assert details.startswith("UNKNOWN_TOPIC_OR_PARTITION: ") and len(details) < 1100
    assert "(9000 characters)" in details
    code, details, _ = refused(
        lambda: broker.Metadata(pb.MetadataRequest(topics=["é" * 5000]), timeout=5)
    )
    assert "UNKNOWN_TOPIC_OR_PARTITION" in details and len(details.encode()) <= 1024


# ------------------------------------------------------------------ refusals at once


def test_refusals_answer_at_once(stubs: tuple[Any, Any, grpc.Channel]) -> None:
    admin = stubs[0]
    began = time.monotonic()
    answer = admin.CreateTopics(
        pb.CreateTopicsRequest(topics=[pb.NewTopic(name="rf2", replication_factor=2)]), timeout=10
    )
    assert answer.results[0].error_code == pb.INVALID_REPLICATION_FACTOR
    assert time.monotonic() - began < QUICK_S
    entry = pb.QuotaEntry(entity_type="user", entity_name="u", key="request_rate", value=10)
    other = pb.QuotaEntry(entity_type="user", entity_name="u", key="request_rate", value=20)
    code, details, took = refused(
        lambda: admin.AlterQuotas(pb.AlterQuotasRequest(entries=[entry, other]), timeout=10)
    )
    assert code is grpc.StatusCode.INVALID_ARGUMENT and "twice" in details
    assert took < QUICK_S
    assert not admin.DescribeQuotas(pb.DescribeQuotasRequest(), timeout=5).entries


# ------------------------------------------------------------------ strict input


@pytest.mark.parametrize("value", ["1_000", "\u0663", " 5", "+7", "5 ", "1e3", ""])
def test_config_values_are_parsed_strictly(
    stubs: tuple[Any, Any, grpc.Channel], value: str
) -> None:
    answer = stubs[0].CreateTopics(
        pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="strict", configs={"retention_ms": value})]
        ),
        timeout=10,
    )
    assert answer.results[0].error_code == pb.INVALID_CONFIG, answer


def test_config_values_are_stored_as_the_node_writes_them(
    stubs: tuple[Any, Any, grpc.Channel],
) -> None:
    admin = stubs[0]
    created = admin.CreateTopics(
        pb.CreateTopicsRequest(
            topics=[pb.NewTopic(name="canonical", configs={"retention_ms": "0086400000"})]
        ),
        timeout=10,
    )
    assert created.results[0].error_code == pb.NONE
    (described,) = admin.DescribeTopics(
        pb.DescribeTopicsRequest(names=["canonical"]), timeout=5
    ).topics
    assert described.configs["retention_ms"] == "86400000"


def test_topic_names_that_collide_in_metric_names_are_refused(
    stubs: tuple[Any, Any, grpc.Channel],
) -> None:
    admin = stubs[0]
    first = admin.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="c.x")]), timeout=10)
    assert first.results[0].error_code == pb.NONE
    second = admin.CreateTopics(
        pb.CreateTopicsRequest(topics=[pb.NewTopic(name="c_x"), pb.NewTopic(name="d.y")]),
        timeout=10,
    )
    assert second.results[0].error_code == pb.INVALID_TOPIC_EXCEPTION
    assert "collides with topic 'c.x'" in second.results[0].error_message
    assert second.results[1].error_code == pb.NONE
    both = admin.CreateTopics(
        pb.CreateTopicsRequest(topics=[pb.NewTopic(name="e.z"), pb.NewTopic(name="e_z")]),
        timeout=10,
    )
    assert [r.error_code for r in both.results] == [pb.NONE, pb.INVALID_TOPIC_EXCEPTION]


def test_a_name_given_twice_in_one_request_is_refused(
    stubs: tuple[Any, Any, grpc.Channel],
) -> None:
    admin = stubs[0]
    twice = admin.CreateTopics(
        pb.CreateTopicsRequest(topics=[pb.NewTopic(name="dup"), pb.NewTopic(name="dup")]),
        timeout=10,
    )
    assert [r.error_code for r in twice.results] == [pb.INVALID_REQUEST] * 2
    admin.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="kept")]), timeout=10)
    deleted = admin.DeleteTopics(pb.DeleteTopicsRequest(names=["kept", "kept"]), timeout=10)
    assert [r.error_code for r in deleted.results] == [pb.INVALID_REQUEST] * 2
    names = {t.name for t in admin.ListTopics(pb.ListTopicsRequest(), timeout=5).topics}
    assert "kept" in names and "dup" not in names


def test_request_lists_are_bounded_and_names_answered_once(
    stubs: tuple[Any, Any, grpc.Channel],
) -> None:
    admin, broker, _channel = stubs
    admin.CreateTopics(pb.CreateTopicsRequest(topics=[pb.NewTopic(name="many")]), timeout=10)
    for call in (
        lambda: admin.DescribeTopics(
            pb.DescribeTopicsRequest(names=["many"] * 100_000), timeout=10
        ),
        lambda: broker.Metadata(pb.MetadataRequest(topics=["many"] * 100_000), timeout=10),
        lambda: admin.CreateTopics(
            pb.CreateTopicsRequest(
                topics=[pb.NewTopic(name=f"n{i}") for i in range(10_001)], validate_only=True
            ),
            timeout=10,
        ),
    ):
        code, details, took = refused(call)
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "topics_max" in details, details
        assert took < QUICK_S
    described = admin.DescribeTopics(pb.DescribeTopicsRequest(names=["many"] * 5000), timeout=10)
    assert [t.name for t in described.topics] == ["many"]


# ------------------------------------------------------------------ grpc's own log lines


def test_grpc_records_any_client_can_cause_are_one_warning_each_without_a_traceback() -> None:
    logger = logging.getLogger("test-client-gone")
    gone = GrpcLogFilter()
    kept: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            kept.append(record)

    logger.addFilter(gone)
    logger.addHandler(Keep())
    logger.propagate = False
    try:
        for _ in range(3):
            try:
                raise RuntimeError("execute_batch failed")
            except RuntimeError:
                logger.exception("%s [/headwater.v1.Broker/Fetch]", CLIENT_GONE_PREFIX)
        for _ in range(4):
            try:
                b"Basic \xff".decode()
            except UnicodeDecodeError:
                logger.exception("%s %r", INVALID_ENCODING_PREFIX, b"Basic \xff")
        logger.error("Unexpected [ValueError] raised by servicer method [/x/Y]")
    finally:
        logger.removeFilter(gone)
    assert [r.levelname for r in kept] == ["WARNING", "WARNING", "ERROR"]
    assert kept[0].exc_info is None and kept[1].exc_info is None
    assert kept[0].getMessage().startswith("a client went away before its answer to")
    assert kept[1].getMessage() == "refused a call whose metadata value is not UTF-8"


def test_small_calls_stay_fast_while_a_large_answer_is_built(
    shared_node: NodeProcess, stubs: tuple[Any, Any, grpc.Channel]
) -> None:
    """A DescribeTopics of every topic of a node with thousands of partitions (in a few
    wide topics) gives the event loop back every 100 partitions: a Metadata call answers
    meanwhile."""
    admin, broker, _channel = stubs
    with Admin(shared_node.address) as client:
        for i in range(30):
            client.create_topic(f"wide-{i}", partitions=100)
    latencies: list[float] = []
    stop = threading.Event()

    def describe_all() -> None:
        while not stop.is_set():
            admin.DescribeTopics(pb.DescribeTopicsRequest(), timeout=30)

    worker = threading.Thread(target=describe_all, daemon=True)
    worker.start()
    try:
        for _ in range(50):
            began = time.monotonic()
            broker.Metadata(pb.MetadataRequest(topics=["wide-0"]), timeout=5)
            latencies.append(time.monotonic() - began)
    finally:
        stop.set()
        worker.join()
    latencies.sort()
    assert latencies[len(latencies) // 2] < 0.1, latencies
