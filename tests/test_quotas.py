"""Quotas against a real node: a producer over its byte-rate quota is held to it by
delayed answers (throttle_time_ms), never by lost data, while another principal's
producer on the same node is not throttled; quotas are managed with ``headwater quotas``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from headwater.client import Admin, ClientSecurity
from headwater.client.sessions import with_session
from headwater.log import batch as batch_format
from headwater.shared.grpc_channels import open_channel
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, run_cli

QUOTA_BYTES_PER_S = 2_000_000
MEASURE_S = 10.0
RECORD = b"q" * 1000
RECORDS_PER_BATCH = 50


@pytest.fixture(scope="module")
def quota_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node where users log in over plaintext (loopback only) with no authorizer."""
    node = NodeProcess(
        tmp_path_factory.mktemp("quotas") / "data",
        env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"},
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.upsert_user("alice", "a-secret")
            admin.upsert_user("bob", "b-secret")
            admin.create_topic("metered", 1)
        yield node
    finally:
        node.kill()


def _produce_for(
    address: str, user: str, password: str, seconds: float, out: dict[str, float]
) -> None:
    """ProduceStream batches as fast as answers come back; count the bytes answered
    within ``seconds`` and the longest throttle_time_ms."""
    channel = with_session(open_channel(address, None, []), address, user, password)
    batch = batch_format.encode_batch([RECORD] * RECORDS_PER_BATCH)
    stop = threading.Event()

    def requests() -> Iterator[pb.ProduceRequest]:
        while not stop.is_set():
            yield pb.ProduceRequest(topic="metered", partition=0, batch=batch, acks=pb.ACKS_LEADER)

    answered = throttled_ms = 0
    began = time.monotonic()
    stream = pb_grpc.BrokerStub(channel).ProduceStream(requests())
    try:
        for answer in stream:
            assert answer.error_code == 0, answer.error_message
            if time.monotonic() - began > seconds:
                break
            answered += len(RECORD) * RECORDS_PER_BATCH
            throttled_ms = max(throttled_ms, answer.throttle_time_ms)
    finally:
        stop.set()
        stream.cancel()
        channel.close()
    out["bytes_per_s"] = answered / seconds
    out["throttle_ms_max"] = throttled_ms


def test_a_throttled_producer_keeps_its_quota_and_another_is_unaffected(
    quota_node: NodeProcess,
) -> None:
    with Admin(quota_node.address) as admin:
        admin.alter_quotas("user", "alice", {"producer_byte_rate": QUOTA_BYTES_PER_S})
    alice: dict[str, float] = {}
    bob: dict[str, float] = {}
    threads = [
        threading.Thread(target=_produce_for, args=(quota_node.address, *who, MEASURE_S, result))
        for who, result in ((("alice", "a-secret"), alice), (("bob", "b-secret"), bob))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=MEASURE_S * 4)
    print(f"alice {alice}, bob {bob}")
    # Payload bytes a little under the batch bytes the quota counts: within 10 % below.
    assert 0.9 * QUOTA_BYTES_PER_S <= alice["bytes_per_s"] <= 1.1 * QUOTA_BYTES_PER_S, alice
    assert alice["throttle_ms_max"] > 0
    assert bob["throttle_ms_max"] == 0
    assert bob["bytes_per_s"] > 3 * QUOTA_BYTES_PER_S, bob
    with Admin(quota_node.address) as admin:
        admin.alter_quotas("user", "alice", remove=["producer_byte_rate"])


def test_quotas_cli(quota_node: NodeProcess) -> None:
    where = ["--bootstrap", quota_node.address]
    done = run_cli("quotas", "set", *where, "--default-user", "--request-rate", "500")
    assert done.returncode == 0, done.stderr
    listed = run_cli("quotas", "list", *where, "--json")
    assert json.loads(listed.stdout) == [
        {"entity_type": "user", "entity_name": "", "key": "request_rate", "value": 500.0}
    ]
    zero = run_cli("quotas", "set", *where, "--user", "alice", "--producer-byte-rate", "0")
    assert zero.returncode == 1 and b"deny ACL" in zero.stderr
    assert run_cli("quotas", "remove", *where, "--default-user").returncode == 0
    assert json.loads(run_cli("quotas", "list", *where, "--json").stdout) == []


def test_a_fetch_over_its_quota_is_held_back(quota_node: NodeProcess, tmp_path: Path) -> None:
    with Admin(quota_node.address) as admin:
        admin.alter_quotas("client-id", "slow-reader", {"consumer_byte_rate": 100_000})
    security = ClientSecurity(client_id="slow-reader")
    channel = open_channel(quota_node.address, None, [], security.call_metadata())
    try:
        stub = pb_grpc.BrokerStub(channel)
        stub.Produce(
            pb.ProduceRequest(
                topic="metered", partition=0, batch=batch_format.encode_batch([RECORD] * 100)
            )
        )
        answer = stub.Fetch(
            pb.FetchRequest(topic="metered", partition=0, offset=0, max_bytes=60_000)
        )
        assert answer.throttle_time_ms > 0
        assert answer.records  # the data comes, later
    finally:
        channel.close()
        with Admin(quota_node.address) as admin:
            admin.alter_quotas("client-id", "slow-reader", remove=["consumer_byte_rate"])


def test_new_connections_beyond_the_host_rate_are_refused(tmp_path: Path) -> None:
    import grpc

    from headwater.shared.grpc_errors import from_rpc_error
    from headwater.tools.devcluster import wait_until

    node = NodeProcess(tmp_path / "data", env={"HEADWATER_CONNECTION_RATE_PER_HOST_MAX": "3"})
    node.start()
    own = [("grpc.use_local_subchannel_pool", 1)]
    channels = [grpc.insecure_channel(node.address, options=own) for _ in range(12)]
    try:
        refused = []
        for channel in channels:
            try:
                pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=10)
            except grpc.RpcError as exc:
                refused.append(from_rpc_error(exc, node.address))
        assert refused, "12 new connections within a second or two, at most 3 a second"
        assert all("connection_rate_per_host_max" in e.message for e in refused)
        assert all(e.retriable for e in refused)

        def a_new_connection_is_admitted() -> bool:
            with grpc.insecure_channel(node.address, options=own) as channel:
                try:
                    pb_grpc.BrokerStub(channel).Metadata(pb.MetadataRequest(), timeout=10)
                except grpc.RpcError:
                    return False
                return True

        wait_until(a_new_connection_is_admitted, 10, "a new connection in a later second")
    finally:
        for channel in channels:
            channel.close()
        node.kill()


def test_a_client_id_over_255_characters_is_refused(quota_node: NodeProcess) -> None:
    import grpc

    from headwater.shared.errors import ErrorCode, HeadwaterError
    from headwater.shared.grpc_errors import from_rpc_error

    with pytest.raises(HeadwaterError, match="at most 255"):
        ClientSecurity(client_id="c" * 256)
    with grpc.insecure_channel(quota_node.address) as channel:
        with pytest.raises(grpc.RpcError) as refused:
            pb_grpc.BrokerStub(channel).Metadata(
                pb.MetadataRequest(), metadata=(("client-id", "c" * 256),), timeout=10
            )
    error = from_rpc_error(refused.value, quota_node.address)
    assert error.code is ErrorCode.INVALID_REQUEST and "255" in error.message
