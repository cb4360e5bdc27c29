"""The Kafka listener with logins (``kafka_security_protocol = "SASL_PLAINTEXT"``) on a
node with the ACL authorizer: librdkafka logs in with PLAIN and with SCRAM-SHA-256 as the
node's users, gets what their ACLs give and nothing more; a wrong password, a login the
node does not know, and a request before any login all end the connection."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from headwater.client import Admin
from headwater.shared.acls import parse_acl
from headwater.shared.tls import ClientSecurity
from headwater.tools.ports import free_port
from headwater.tools.tls_certs import NamedPki, create_named_pki
from tests.node_process import NodeProcess

DEADLINE_S = 30.0
ADMIN = ClientSecurity("SASL_PLAINTEXT", username="admin", password="admin-secret")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """Users, topics and ACLs set while ``authorizer`` is ``none``; then the node restarts
    with ``authorizer = "acl"`` and logins on its Kafka listener."""
    node = NodeProcess(
        tmp_path_factory.mktemp("kafka-sasl") / "data",
        env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"},
        kafka_port=free_port(),
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            for user in ("admin", "alice"):
                admin.upsert_user(user, f"{user}-secret")
            for topic in ("open", "closed"):
                admin.create_topic(topic, 1)
            admin.create_acls(
                [
                    parse_acl("topic", "open", "User:alice", "write"),
                    parse_acl("topic", "open", "User:alice", "read"),
                    parse_acl("topic", "open", "User:alice", "describe"),
                    parse_acl("group", "alices", "User:alice", "read"),
                ]
            )
        node.stop()
        node.env.update(
            {
                "HEADWATER_AUTHORIZER": "acl",
                "HEADWATER_SUPER_USERS": "User:admin",
                "HEADWATER_KAFKA_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
            }
        )
        node.start()
        yield node
    finally:
        node.kill()


def settings(node: NodeProcess, mechanism: str, user: str, password: str) -> dict[str, object]:
    assert node.kafka_address is not None
    return {
        "bootstrap.servers": node.kafka_address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": mechanism,
        "sasl.username": user,
        "sasl.password": password,
    }


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_user_logs_in_and_gets_what_its_acls_give(node: NodeProcess, mechanism: str) -> None:
    login = settings(node, mechanism, "alice", "alice-secret")
    delivered: list[object] = []
    producer = Producer({**login, "acks": "all"})
    producer.produce(
        "open", value=mechanism.encode(), on_delivery=lambda e, _m: delivered.append(e)
    )
    producer.produce("closed", value=b"no", on_delivery=lambda e, _m: delivered.append(e))
    producer.flush(DEADLINE_S)
    codes = sorted(str(e.code()) if e else "ok" for e in delivered)  # type: ignore[attr-defined]
    assert codes == sorted(["ok", str(KafkaError.TOPIC_AUTHORIZATION_FAILED)]), delivered
    consumer = Consumer({**login, "group.id": "alices", "auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("open", 0, 0)])
    values: list[bytes] = []
    deadline = time.monotonic() + DEADLINE_S
    while mechanism.encode() not in values and time.monotonic() < deadline:
        values += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
    consumer.close()
    assert mechanism.encode() in values


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_a_wrong_password_is_refused(node: NodeProcess, mechanism: str) -> None:
    errors: list[KafkaError] = []
    producer = Producer(
        {
            **settings(node, mechanism, "alice", "guess"),
            "error_cb": errors.append,
            "message.timeout.ms": 3000,
        }
    )
    producer.produce("open", value=b"x")
    producer.flush(10)
    assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors


def test_a_request_before_a_login_closes_the_connection(node: NodeProcess) -> None:
    assert node.kafka_address is not None
    host, port = node.kafka_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        # Metadata v1 for every topic, with no login before it.
        body = struct.pack(">hhih", 3, 1, 7, -1) + struct.pack(">i", -1)
        sock.sendall(struct.pack(">i", len(body)) + body)
        assert sock.recv(1) == b""
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        # ApiVersions v0 is answered and lists the SASL APIs.
        body = struct.pack(">hhih", 18, 0, 8, -1)
        sock.sendall(struct.pack(">i", len(body)) + body)
        size, correlation_id, error_code, count = struct.unpack(
            ">iihi", sock.recv(14, socket.MSG_WAITALL)
        )
        listed = sock.recv(size - 10, socket.MSG_WAITALL)
        keys = {struct.unpack_from(">h", listed, 6 * i)[0] for i in range(count)}
        assert (correlation_id, error_code) == (8, 0) and {17, 36} <= keys


def test_the_admin_user_can_do_everything(node: NodeProcess) -> None:
    producer = Producer({**settings(node, "SCRAM-SHA-256", "admin", "admin-secret"), "acks": "all"})
    producer.produce("closed", value=b"admin")
    assert producer.flush(DEADLINE_S) == 0
    with Admin(node.address, security=ADMIN) as admin:
        (described,) = admin.describe_topics(["closed"])
        assert described.partitions[0].high_watermark >= 1


# ----------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> NamedPki:
    return create_named_pki(tmp_path_factory.mktemp("kafka-pki"), ("node-1",), ("admin", "alice"))


def _tls_node(root: Path, pki: NamedPki, protocol: str, env: dict[str, str]) -> NodeProcess:
    return NodeProcess(
        root / "data",
        env={"HEADWATER_KAFKA_SECURITY_PROTOCOL": protocol, **env},
        kafka_port=free_port(),
        tls=pki.nodes["node-1"],
        tls_client_auth=protocol == "SSL",
    )


def _tls_settings(node: NodeProcess, pki: NamedPki, client: str | None) -> dict[str, object]:
    assert node.kafka_address is not None
    found: dict[str, object] = {
        "bootstrap.servers": node.kafka_address,
        "security.protocol": "SSL",
        "ssl.ca.location": str(pki.ca_file),
        "ssl.endpoint.identification.algorithm": "none",
    }
    if client is not None:
        found["ssl.certificate.location"] = str(pki.clients[client].cert_file)
        found["ssl.key.location"] = str(pki.clients[client].key_file)
    return found


def test_mutual_tls_names_the_caller_by_its_certificate(tmp_path: Path, pki: NamedPki) -> None:
    node = _tls_node(
        tmp_path,
        pki,
        "SSL",
        {"HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:admin"},
    )
    node.start()
    admin_files = pki.clients["admin"]
    security = ClientSecurity(
        "SSL", str(pki.ca_file), str(admin_files.cert_file), str(admin_files.key_file)
    )
    try:
        with Admin(node.address, security=security) as admin:
            admin.create_topic("mine", 1)
            admin.create_topic("theirs", 1)
            admin.create_acls(
                [parse_acl("topic", "mine", "User:alice", op) for op in ("write", "describe")]
            )
        delivered: list[object] = []
        producer = Producer({**_tls_settings(node, pki, "alice"), "acks": "all"})
        producer.produce("mine", value=b"a", on_delivery=lambda e, _m: delivered.append(e))
        producer.produce("theirs", value=b"b", on_delivery=lambda e, _m: delivered.append(e))
        producer.flush(DEADLINE_S)
        codes = sorted(str(e.code()) if e else "ok" for e in delivered)  # type: ignore[attr-defined]
        assert codes == sorted(["ok", str(KafkaError.TOPIC_AUTHORIZATION_FAILED)]), delivered
        errors: list[KafkaError] = []
        stranger = Producer(
            {
                **_tls_settings(node, pki, None),
                "error_cb": errors.append,
                "message.timeout.ms": 3000,
            }
        )
        stranger.produce("mine", value=b"c")
        stranger.flush(10)
        assert errors, "a client without a certificate got through"
    finally:
        node.stop()


def test_sasl_over_tls_logs_in_without_allowing_plaintext_credentials(
    tmp_path: Path, pki: NamedPki
) -> None:
    node = _tls_node(tmp_path, pki, "SASL_SSL", {})
    node.start()
    try:
        admin_files = pki.clients["admin"]
        security = ClientSecurity(
            "SSL", str(pki.ca_file), str(admin_files.cert_file), str(admin_files.key_file)
        )
        with Admin(node.address, security=security) as admin:
            admin.upsert_user("bob", "bob-secret")
            admin.create_topic("sealed", 1)
        producer = Producer(
            {
                **_tls_settings(node, pki, None),
                "security.protocol": "SASL_SSL",
                "sasl.mechanism": "SCRAM-SHA-256",
                "sasl.username": "bob",
                "sasl.password": "bob-secret",
                "acks": "all",
            }
        )
        producer.produce("sealed", value=b"over tls")
        assert producer.flush(DEADLINE_S) == 0
    finally:
        node.stop()
