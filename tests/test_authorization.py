"""Authorization against a real node: for every RPC of the client listener, a principal
without the ACL it needs is refused (or sees nothing), and the same principal with it
succeeds. Principals come from client certificates (mutual TLS, ``tls_principal_mapping``
cn) and from credentials (``headwater users``)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from headwater.client import Admin, ClientSecurity
from headwater.shared.acls import parse_acl, parse_filter
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_channels import open_channel
from headwater.shared.grpc_errors import from_rpc_error
from headwater.shared.tls import TLS
from headwater.tools.tls_certs import NamedPki, TlsFiles, create_named_pki
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, run_cli

TOPIC = "orders"
GROUP = "billing"
TIMEOUT_S = 20.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> NamedPki:
    return create_named_pki(
        tmp_path_factory.mktemp("pki"), ("node-1",), ("admin", "alice", "mallory")
    )


def _security(files: TlsFiles, **credentials: str) -> ClientSecurity:
    return ClientSecurity(
        TLS, str(files.ca_file), str(files.cert_file), str(files.key_file), **credentials
    )


@pytest.fixture(scope="module")
def secured_node(pki: NamedPki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """One node: mutual TLS, authorizer acl, User:admin a super user."""
    node = NodeProcess(
        tmp_path_factory.mktemp("authz") / "data",
        tls=pki.nodes["node-1"],
        tls_client_auth=True,
        env={"HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:admin"},
    )
    node.start()
    try:
        with Admin(node.address, security=_security(pki.clients["admin"])) as admin:
            admin.create_topic(TOPIC, 1)
            admin.alter_group_offsets(GROUP, {_tp(): 0})
        yield node
    finally:
        node.kill()


def _tp() -> Any:
    from headwater.client import TopicPartition

    return TopicPartition(TOPIC, 0)


@dataclass
class Stubs:
    channel: grpc.Channel
    broker: pb_grpc.BrokerStub = field(init=False)
    groups: pb_grpc.GroupsStub = field(init=False)
    admin: pb_grpc.AdminStub = field(init=False)

    def __post_init__(self) -> None:
        self.broker = pb_grpc.BrokerStub(self.channel)
        self.groups = pb_grpc.GroupsStub(self.channel)
        self.admin = pb_grpc.AdminStub(self.channel)


@pytest.fixture(scope="module")
def stubs(secured_node: NodeProcess, pki: NamedPki) -> Iterator[dict[str, Stubs]]:
    opened = {}
    for name in ("alice", "mallory"):
        security = _security(pki.clients[name])
        channel = open_channel(
            secured_node.address, security.credentials(), security.channel_options()
        )
        opened[name] = Stubs(channel)
    try:
        yield opened
    finally:
        for each in opened.values():
            each.channel.close()


def _records() -> pb.RecordList:
    return pb.RecordList(records=[pb.Record(value=b"x")])


def _produce() -> pb.ProduceRequest:
    return pb.ProduceRequest(topic=TOPIC, partition=-1, records=_records(), acks=pb.ACKS_ALL)


def _produce_stream(s: Stubs) -> None:
    answer = next(iter(s.broker.ProduceStream(iter([_produce()]), timeout=TIMEOUT_S)))
    if answer.error_code:
        raise HeadwaterError(ErrorCode(answer.error_code), answer.error_message)


def _fetch_stream(s: Stubs) -> None:
    request = pb.FetchRequest(topic=TOPIC, partition=0, offset=0, max_wait_ms=10)
    call = s.broker.FetchStream(request, timeout=TIMEOUT_S)
    try:
        next(iter(call))
    finally:
        call.cancel()


@dataclass(frozen=True)
class Case:
    """One RPC: what it needs (``resource_type:name:operation`` each), and a call."""

    rpc: str
    needs: tuple[str, ...]
    call: Callable[[Stubs], Any]
    denied: ErrorCode


T, G, C = (
    ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ErrorCode.GROUP_AUTHORIZATION_FAILED,
    (ErrorCode.CLUSTER_AUTHORIZATION_FAILED),
)
CLUSTER = "cluster:headwater-cluster"
CASES = (
    Case("Broker/Produce", (f"topic:{TOPIC}:write",), lambda s: s.broker.Produce(_produce()), T),
    Case("Broker/ProduceStream", (f"topic:{TOPIC}:write",), _produce_stream, T),
    Case(
        "Broker/Fetch",
        (f"topic:{TOPIC}:read",),
        lambda s: s.broker.Fetch(pb.FetchRequest(topic=TOPIC, partition=0, offset=0)),
        T,
    ),
    Case("Broker/FetchStream", (f"topic:{TOPIC}:read",), _fetch_stream, T),
    Case(
        "Broker/ListOffsets",
        (f"topic:{TOPIC}:describe",),
        lambda s: s.broker.ListOffsets(pb.ListOffsetsRequest(topic=TOPIC)),
        T,
    ),
    Case(
        "Broker/Metadata",
        (f"topic:{TOPIC}:describe",),
        lambda s: s.broker.Metadata(pb.MetadataRequest(topics=[TOPIC])),
        T,
    ),
    Case(
        "Broker/InitProducerId",
        (f"topic:{TOPIC}:write",),
        lambda s: s.broker.InitProducerId(pb.InitProducerIdRequest()),
        C,
    ),
    Case(
        "Groups/FindCoordinator",
        (f"group:{GROUP}:describe",),
        lambda s: s.groups.FindCoordinator(pb.FindCoordinatorRequest(group_id=GROUP)),
        G,
    ),
    Case(
        "Groups/ConsumerGroupHeartbeat",
        ("group:alice-group:read", f"topic:{TOPIC}:describe"),
        lambda s: s.groups.ConsumerGroupHeartbeat(
            pb.ConsumerGroupHeartbeatRequest(
                group_id="alice-group", member_epoch=0, subscribed_topics=[TOPIC]
            )
        ),
        G,
    ),
    Case(
        "Groups/OffsetCommit",
        (f"group:{GROUP}:read", f"topic:{TOPIC}:read"),
        lambda s: s.groups.OffsetCommit(
            pb.OffsetCommitRequest(
                group_id=GROUP,
                member_epoch=-1,
                offsets=[pb.OffsetCommitPartition(topic=TOPIC, partition=0, offset=0)],
            )
        ),
        G,
    ),
    Case(
        "Groups/OffsetFetch",
        (f"group:{GROUP}:describe",),
        lambda s: s.groups.OffsetFetch(pb.OffsetFetchRequest(group_id=GROUP)),
        G,
    ),
    Case(
        "Groups/DescribeGroup",
        (f"group:{GROUP}:describe",),
        lambda s: s.groups.DescribeGroup(pb.DescribeGroupRequest(group_id=GROUP)),
        G,
    ),
    Case(
        "Groups/DeleteGroup",
        ("group:doomed-group:delete",),
        lambda s: s.groups.DeleteGroup(pb.DeleteGroupRequest(group_id="doomed-group")),
        G,
    ),
    Case(
        "Admin/CreateTopics",
        ("topic:alice-new:create",),
        lambda s: s.admin.CreateTopics(
            pb.CreateTopicsRequest(topics=[pb.NewTopic(name="alice-new", partitions=1)])
        ),
        T,
    ),
    Case(
        "Admin/DeleteTopics",
        ("topic:doomed-topic:delete",),
        lambda s: s.admin.DeleteTopics(pb.DeleteTopicsRequest(names=["doomed-topic"])),
        T,
    ),
    Case(
        "Admin/DescribeTopics",
        (f"topic:{TOPIC}:describe",),
        lambda s: s.admin.DescribeTopics(pb.DescribeTopicsRequest(names=[TOPIC])),
        T,
    ),
    Case(
        "Admin/CreatePartitions",
        ("topic:growing:alter",),
        lambda s: s.admin.CreatePartitions(
            pb.CreatePartitionsRequest(topic="growing", partitions=2)
        ),
        T,
    ),
    Case(
        "Admin/AlterTopicConfigs",
        (f"topic:{TOPIC}:alter",),
        lambda s: s.admin.AlterTopicConfigs(
            pb.AlterTopicConfigsRequest(
                topic=TOPIC, changes=[pb.TopicConfigChange(name="retention.ms", value="3600000")]
            )
        ),
        T,
    ),
    Case(
        "Admin/ReassignPartition",
        (f"{CLUSTER}:alter",),
        lambda s: s.admin.ReassignPartition(
            pb.ReassignPartitionRequest(topic=TOPIC, partition=0, replicas=[1])
        ),
        C,
    ),
    Case(
        "Admin/DescribeReplicaLog",
        (f"{CLUSTER}:describe",),
        lambda s: s.admin.DescribeReplicaLog(
            pb.DescribeReplicaLogRequest(topic=TOPIC, partition=0)
        ),
        C,
    ),
    Case(
        "Admin/CreateAcls",
        (f"{CLUSTER}:alter",),
        lambda s: s.admin.CreateAcls(
            pb.CreateAclsRequest(
                acls=[
                    pb.AclBinding(
                        resource_type="topic",
                        resource_name="x",
                        principal="User:nobody",
                        operation="read",
                    )
                ]
            )
        ),
        C,
    ),
    Case(
        "Admin/DescribeAcls",
        (f"{CLUSTER}:describe",),
        lambda s: s.admin.DescribeAcls(pb.DescribeAclsRequest()),
        C,
    ),
    Case(
        "Admin/DeleteAcls",
        (f"{CLUSTER}:alter",),
        lambda s: s.admin.DeleteAcls(
            pb.DeleteAclsRequest(filters=[pb.AclBinding(principal="User:nobody")])
        ),
        C,
    ),
    Case(
        "Admin/AlterUserCredentials",
        (f"{CLUSTER}:alter",),
        lambda s: s.admin.AlterUserCredentials(
            pb.AlterUserCredentialsRequest(
                upsertions=[
                    pb.UserCredentialUpsertion(
                        name="carol",
                        mechanism="SCRAM-SHA-256",
                        iterations=4096,
                        salt=b"s" * 16,
                        salted_password=b"k" * 32,
                    )
                ]
            )
        ),
        C,
    ),
    Case(
        "Admin/AlterQuotas",
        (f"{CLUSTER}:alter",),
        lambda s: s.admin.AlterQuotas(
            pb.AlterQuotasRequest(
                entries=[
                    pb.QuotaEntry(
                        entity_type="user", entity_name="nobody", key="request_rate", value=1e6
                    )
                ]
            )
        ),
        C,
    ),
    Case(
        "Admin/DescribeQuotas",
        (f"{CLUSTER}:describe",),
        lambda s: s.admin.DescribeQuotas(pb.DescribeQuotasRequest()),
        C,
    ),
    Case(
        "Admin/DescribeUsers",
        (f"{CLUSTER}:describe",),
        lambda s: s.admin.DescribeUsers(pb.DescribeUsersRequest()),
        C,
    ),
)
LISTING_RPCS = ("Admin/ListTopics", "Groups/ListGroups")
"""RPCs that never refuse: they list only what the caller may describe."""


def _acls(principal: str, needs: tuple[str, ...]) -> list[Any]:
    acls = []
    for need in needs:
        resource_type, rest = need.split(":", 1)
        name, operation = rest.rsplit(":", 1)
        acls.append(parse_acl(resource_type, name, principal, operation))
    return acls


def _error_of(call: Callable[[], Any]) -> HeadwaterError | None:
    try:
        call()
    except grpc.RpcError as exc:
        return from_rpc_error(exc, "node")
    except HeadwaterError as exc:
        return exc
    return None


def test_every_client_rpc_has_a_row() -> None:
    """A new RPC without a row here fails this test: every RPC is authorized."""
    services = ("Broker", "Groups", "Admin")
    every = {
        f"{service}/{method.name}"
        for service in services
        for method in pb.DESCRIPTOR.services_by_name[service].methods
    }
    assert every == {case.rpc for case in CASES} | set(LISTING_RPCS)


@pytest.mark.parametrize("case", CASES, ids=[c.rpc for c in CASES])
def test_rpc_needs_its_acl(
    case: Case, secured_node: NodeProcess, stubs: dict[str, Stubs], pki: NamedPki
) -> None:
    with Admin(secured_node.address, security=_security(pki.clients["admin"])) as admin:
        for name in ("doomed-topic", "growing"):
            if name not in {t.name for t in admin.list_topics()}:
                admin.create_topic(name, 1)
        admin.alter_group_offsets("doomed-group", {_tp(): 0})
        denied = _error_of(lambda: case.call(stubs["mallory"]))
        assert denied is not None and denied.code is case.denied, denied
        assert "User:mallory" in denied.message
        granted = _acls("User:alice", case.needs)
        admin.create_acls(granted)
        try:
            error = _error_of(lambda: case.call(stubs["alice"]))
            assert error is None or error.code not in (
                ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                ErrorCode.GROUP_AUTHORIZATION_FAILED,
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
            ), error
            # each needed ACL is needed: without any one of them, refused again
            for missing in granted if len(granted) > 1 else ():
                admin.delete_acls([_exact(missing)])
                refused = _error_of(lambda: case.call(stubs["alice"]))
                assert refused is not None and refused.code in (T, G, C), refused
                admin.create_acls([missing])
        finally:
            admin.delete_acls([parse_filter(principal="User:alice")])


def _exact(acl: Any) -> Any:
    return parse_filter(
        acl.resource_type.value,
        acl.resource_name,
        acl.principal,
        acl.operation.value,
        acl.permission.value,
        acl.pattern_type.value,
        acl.host,
    )


def test_listings_show_only_what_may_be_described(
    secured_node: NodeProcess, stubs: dict[str, Stubs], pki: NamedPki
) -> None:
    mallory = stubs["mallory"]
    digest = _error_of(lambda: mallory.broker.Metadata(pb.MetadataRequest(include_digest=True)))
    assert digest is not None and digest.code is C  # it covers every topic, ACL and user
    assert not mallory.admin.ListTopics(pb.ListTopicsRequest()).topics
    assert not mallory.broker.Metadata(pb.MetadataRequest()).topics
    assert not mallory.groups.ListGroups(pb.ListGroupsRequest()).groups
    alice = stubs["alice"]
    with Admin(secured_node.address, security=_security(pki.clients["admin"])) as admin:
        admin.create_acls(
            [
                parse_acl("topic", TOPIC, "User:alice", "read"),
                parse_acl("group", GROUP, "User:alice", "describe"),
            ]
        )
        try:
            assert [t.name for t in alice.admin.ListTopics(pb.ListTopicsRequest()).topics] == [
                TOPIC
            ]
            assert [t.name for t in alice.broker.Metadata(pb.MetadataRequest()).topics] == [TOPIC]
            groups = alice.groups.ListGroups(pb.ListGroupsRequest()).groups
            assert [g.group_id for g in groups] == [GROUP]
        finally:
            admin.delete_acls([parse_filter(principal="User:alice")])


def test_deny_wins_and_prefixes_match(
    secured_node: NodeProcess, stubs: dict[str, Stubs], pki: NamedPki
) -> None:
    alice = stubs["alice"]
    fetch = pb.FetchRequest(topic=TOPIC, partition=0, offset=0)
    with Admin(secured_node.address, security=_security(pki.clients["admin"])) as admin:
        admin.create_acls(
            [parse_acl("topic", "ord", "User:alice", "read", pattern_type="prefixed")]
        )
        try:
            assert _error_of(lambda: alice.broker.Fetch(fetch)) is None
            admin.create_acls([parse_acl("topic", TOPIC, "User:*", "read", "deny")])
            denied = _error_of(lambda: alice.broker.Fetch(fetch))
            assert denied is not None and denied.code is T
        finally:
            admin.delete_acls(
                [parse_filter(resource_name=TOPIC), parse_filter(principal="User:alice")]
            )


def test_a_pattern_subscription_needs_describe_on_every_topic(
    secured_node: NodeProcess, stubs: dict[str, Stubs], pki: NamedPki
) -> None:
    """A pattern such as '.*' would otherwise list every topic in the assignment."""
    heartbeat = pb.ConsumerGroupHeartbeatRequest(
        group_id="pattern-group", member_epoch=0, subscribed_pattern=".*"
    )
    with Admin(secured_node.address, security=_security(pki.clients["admin"])) as admin:
        admin.create_acls([parse_acl("group", "pattern-group", "User:alice", "read")])
        try:
            refused = _error_of(lambda: stubs["alice"].groups.ConsumerGroupHeartbeat(heartbeat))
            assert refused is not None and refused.code is T and "'*'" in refused.message
            admin.create_acls([parse_acl("topic", "*", "User:alice", "describe")])
            assert (
                _error_of(lambda: stubs["alice"].groups.ConsumerGroupHeartbeat(heartbeat)) is None
            )
        finally:
            admin.delete_acls([parse_filter(principal="User:alice")])


def test_a_topic_that_does_not_exist_is_not_revealed(stubs: dict[str, Stubs]) -> None:
    mallory = stubs["mallory"]
    for topic in (TOPIC, "no-such-topic"):
        request = pb.ProduceRequest(topic=topic, partition=-1, records=_records())
        error = _error_of(functools.partial(mallory.broker.Produce, request))
        assert error is not None and error.code is T
        assert error.message.endswith("no ACL allows it")


def test_acls_cli_round_trip(secured_node: NodeProcess, pki: NamedPki) -> None:
    files = pki.clients["admin"]
    flags = [
        "--tls-ca-file",
        str(files.ca_file),
        "--tls-cert-file",
        str(files.cert_file),
        "--tls-key-file",
        str(files.key_file),
    ]
    where = ["--bootstrap", secured_node.address]
    add = run_cli(
        *flags,
        "acls",
        "add",
        *where,
        "--principal",
        "User:bob",
        "--operation",
        "read",
        "--topic",
        "logs-",
        "--prefixed",
    )
    assert add.returncode == 0, add.stderr
    listed = run_cli(*flags, "acls", "list", *where, "--principal", "User:bob", "--json")
    assert listed.returncode == 0, listed.stderr
    import json

    assert json.loads(listed.stdout) == [
        {
            "resource_type": "topic",
            "pattern_type": "prefixed",
            "resource_name": "logs-",
            "principal": "User:bob",
            "host": "*",
            "operation": "read",
            "permission": "allow",
        }
    ]
    removed = run_cli(*flags, "acls", "remove", *where, "--principal", "User:bob", "--json")
    assert removed.returncode == 0, removed.stderr
    assert len(json.loads(removed.stdout)) == 1
    bad = run_cli(
        *flags, "acls", "add", *where, "--principal", "bob", "--operation", "read", "--topic", "x"
    )
    assert bad.returncode != 0 and b"User:<name>" in bad.stderr


def test_users_authenticate_over_tls(tmp_path: Path, pki: NamedPki) -> None:
    """Credentials made while the authorizer is off keep working once it is on (they
    are in the metadata quorum); a wrong password and a plaintext listener are refused
    with SASL_AUTHENTICATION_FAILED."""
    server_only = {"HEADWATER_TLS_CLIENT_AUTH": "none"}
    node = NodeProcess(tmp_path / "data", tls=pki.nodes["node-1"], env=server_only)
    ca_only = ClientSecurity(TLS, str(pki.ca_file))
    node.start()
    try:
        with Admin(node.address, security=ca_only) as admin:
            admin.upsert_user("admin", "admin-secret")
            admin.upsert_user("alice", "alice-secret")
            admin.create_topic(TOPIC, 1)
            assert [u.name for u in admin.list_users()] == ["admin", "alice"]
    finally:
        node.kill()
    node = NodeProcess(
        tmp_path / "data",
        tls=pki.nodes["node-1"],
        port=node.port,
        quorum=node.quorum,
        env={**server_only, "HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:admin"},
    )
    node.start()
    try:

        def as_user(user: str, password: str) -> Admin:
            security = ClientSecurity(TLS, str(pki.ca_file), username=user, password=password)
            return Admin(node.address, security=security, request_timeout_s=5)

        with as_user("admin", "admin-secret") as admin:
            admin.create_acls([parse_acl("topic", TOPIC, "User:alice", "describe")])
        with as_user("alice", "alice-secret") as alice:
            assert [t.name for t in alice.list_topics()] == [TOPIC]
            with pytest.raises(HeadwaterError) as refused:
                alice.create_topic("mine", 1)
            assert refused.value.code is ErrorCode.TOPIC_AUTHORIZATION_FAILED
        for user, password in (("alice", "wrong"), ("nobody", "x")):
            with as_user(user, password) as client, pytest.raises(HeadwaterError) as failed:
                client.list_topics()
            assert failed.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
            assert "unknown user or wrong password" in failed.value.message
        with as_user("admin", "admin-secret") as admin:
            admin.upsert_user("alice", "rotated")
        with as_user("alice", "alice-secret") as stale, pytest.raises(HeadwaterError) as old:
            stale.list_topics()
        assert old.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
        with as_user("alice", "rotated") as alice:
            assert [t.name for t in alice.list_topics()] == [TOPIC]
    finally:
        node.kill()


def test_credentials_over_plaintext_are_refused(node: NodeProcess) -> None:
    """By the client unless SASL_PLAINTEXT is named, and then by the node unless
    credentials_over_plaintext = allow."""
    with pytest.raises(HeadwaterError, match="in the clear"):
        ClientSecurity(username="alice", password="secret")
    security = ClientSecurity("SASL_PLAINTEXT", username="alice", password="secret")
    with Admin(node.address, security=security, request_timeout_s=5) as client:
        with pytest.raises(HeadwaterError) as refused:
            client.list_topics()
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert "plaintext" in refused.value.message
