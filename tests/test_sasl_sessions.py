"""SCRAM-SHA-256 logins and session tokens.

The service's rules (``headwater.node.security.sasl_service``) run in-process on a fake call
context with real sessions and password accounting; the client's sessions
(``headwater.client.sessions``) run against real nodes: a node that refuses passwords
on calls, a short session lifetime with calls and a stream across renewals, and a node
restart.
"""

from __future__ import annotations

import asyncio
import base64
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc
import pytest

from headwater.client import Admin, ClientSecurity, Consumer, Producer
from headwater.client.admin_types import OffsetSpec
from headwater.client.aio import AsyncConsumer, AsyncProducer
from headwater.client.sessions import ScramLogin, Session, SessionInterceptor
from headwater.node.config import NodeConfig
from headwater.node.security.password_checks import FAILED_LOGIN_DELAY_S, PasswordChecks
from headwater.node.security.sasl_service import (
    EXCHANGE_TTL_S,
    EXCHANGES_MAX,
    EXCHANGES_PER_HOST_MAX,
    SaslService,
    ScramLogins,
)
from headwater.node.security.sessions import Sessions
from headwater.shared import scram
from headwater.shared.credentials import credential_from_salted, new_salted_password
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_channels import open_channel
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, wait_until
from tests.raw_h2 import raw_call

DEADLINE_S = 30.0


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class FakeContext:
    def __init__(self, peer: str) -> None:
        self._peer = peer

    def peer(self) -> str:
        return self._peer

    async def abort(self, code: grpc.StatusCode, details: str, _trailing: Any = None) -> None:
        raise Aborted(code, details)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _credential(password: str) -> Any:
    salt, salted = new_salted_password(password)
    return credential_from_salted(salted, salt, 4096)


class Image:
    """The part of a metadata image the service reads."""

    def __init__(self, users: dict[str, Any]) -> None:
        self.users = users


def _service(users: dict[str, Any], clock: Clock) -> tuple[SaslService, Sessions, PasswordChecks]:
    sessions, passwords = Sessions(clock), PasswordChecks()
    config = NodeConfig(credentials_over_plaintext="allow")
    image = Image(users)
    logins = ScramLogins(lambda: image, passwords, b"secret", clock)  # type: ignore[arg-type,return-value]
    service = SaslService(config, sessions, logins)
    return service, sessions, passwords


async def _log_in(
    service: SaslService, user: str, password: str, peer: str = "ipv4:10.0.0.1:5000"
) -> pb.SaslAuthenticateResponse:
    login = ScramLogin(user, password)
    first = await service.Authenticate(login.first_request, FakeContext(peer))
    final = await service.Authenticate(login.final_request(first), FakeContext(peer))
    login.session(final)  # the server's signature holds
    return final


def test_a_login_makes_a_session_that_ends_with_the_credential() -> None:
    clock = Clock()
    users = {"alice": _credential("right")}
    service, sessions, _ = _service(users, clock)
    final = asyncio.run(_log_in(service, "alice", "right"))
    assert final.session_lifetime_ms == 900_000
    session = sessions.find(final.session_token, users)
    assert session is not None and session.user == "alice"
    users["alice"] = _credential("changed")
    assert sessions.find(final.session_token, users) is None
    assert sessions.find("no-such-token", users) is None


def test_a_session_ends_with_its_lifetime() -> None:
    clock = Clock()
    users = {"alice": _credential("right")}
    service, sessions, _ = _service(users, clock)
    final = asyncio.run(_log_in(service, "alice", "right"))
    clock.now += 899
    assert sessions.find(final.session_token, users) is not None
    clock.now += 2
    assert sessions.find(final.session_token, users) is None


def test_a_wrong_password_and_an_unknown_user_are_refused_alike_late_and_counted() -> None:
    clock = Clock()
    service, _, passwords = _service({"alice": _credential("right")}, clock)
    messages = []
    for user, password in (("alice", "wrong"), ("nobody", "x")):
        began = time.monotonic()
        with pytest.raises(Aborted) as refused:
            asyncio.run(_log_in(service, user, password))
        assert time.monotonic() - began >= FAILED_LOGIN_DELAY_S
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        messages.append(refused.value.details.replace(user, "USER"))
    assert messages[0] == messages[1]
    assert passwords.failed == 2


def test_an_unknown_users_exchange_looks_like_a_real_one_and_the_same_every_time() -> None:
    service, _, _ = _service({"alice": _credential("right")}, Clock())

    async def server_first(user: str) -> scram.ServerFirst:
        login = ScramLogin(user, "x")
        answer = await service.Authenticate(login.first_request, FakeContext("ipv4:10.0.0.9:1"))
        return scram.parse_server_first(answer.message, login.nonce)

    first, again = asyncio.run(server_first("nobody")), asyncio.run(server_first("nobody"))
    real = asyncio.run(server_first("alice"))
    assert first.salt == again.salt and len(first.salt) == len(real.salt)
    assert first.iterations == real.iterations == 4096


def test_an_exchange_is_finished_only_by_its_host_and_within_its_time() -> None:
    clock = Clock()
    service, _, _ = _service({"alice": _credential("right")}, clock)

    async def scenario() -> None:
        login = ScramLogin("alice", "right")
        first = await service.Authenticate(login.first_request, FakeContext("ipv4:10.0.0.1:1"))
        final = login.final_request(first)
        with pytest.raises(Aborted, match="no unfinished login"):
            await service.Authenticate(final, FakeContext("ipv4:10.0.0.2:1"))
        clock.now += EXCHANGE_TTL_S + 1
        with pytest.raises(Aborted, match="no unfinished login"):
            await service.Authenticate(final, FakeContext("ipv4:10.0.0.1:1"))

    asyncio.run(scenario())


def test_a_host_holds_a_bounded_number_of_unfinished_exchanges() -> None:
    service, _, _ = _service({"alice": _credential("right")}, Clock())

    async def scenario() -> None:
        for _ in range(EXCHANGES_PER_HOST_MAX):
            await service.Authenticate(
                ScramLogin("alice", "x").first_request, FakeContext("ipv4:10.0.0.1:1")
            )
        with pytest.raises(Aborted) as refused:
            await service.Authenticate(
                ScramLogin("alice", "x").first_request, FakeContext("ipv4:10.0.0.1:2")
            )
        assert refused.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        # Another host is not held back by it.
        await _log_in(service, "alice", "right", "ipv4:10.0.0.2:1")

    asyncio.run(scenario())


# ------------------------------------------------------------------ real nodes


@pytest.fixture(scope="module")
def scram_only(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node that refuses passwords on calls, with sessions of 3 s."""
    node = NodeProcess(
        tmp_path_factory.mktemp("scram") / "data",
        env={
            "HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow",
            "HEADWATER_SASL_ENABLED_MECHANISMS": "SCRAM-SHA-256",
            "HEADWATER_SASL_SESSION_LIFETIME_MS": "3000",
        },
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.upsert_user("alice", "alice-secret")
            admin.create_topic("t", 1)
        yield node
    finally:
        node.kill()


ALICE = ClientSecurity("SASL_PLAINTEXT", username="alice", password="alice-secret")


def test_the_clients_log_in_without_sending_the_password(scram_only: NodeProcess) -> None:
    with Admin(scram_only.address, security=ALICE) as admin:
        assert "t" in [t.name for t in admin.list_topics()]
    basic = base64.b64encode(b"alice:alice-secret")
    answer = raw_call(
        scram_only.address,
        "/headwater.v1.Admin/ListTopics",
        [(b"authorization", b"Basic " + basic)],
    )
    assert answer[b"grpc-status"] == b"16", answer
    assert b"sasl_enabled_mechanisms" in answer[b"grpc-message"], answer
    plain = ClientSecurity(
        "SASL_PLAINTEXT", username="alice", password="alice-secret", sasl_mechanism="PLAIN"
    )
    with Admin(scram_only.address, security=plain) as admin, pytest.raises(HeadwaterError):
        admin.list_topics()


def test_a_wrong_password_is_refused_and_logged(scram_only: NodeProcess) -> None:
    wrong = ClientSecurity("SASL_PLAINTEXT", username="alice", password="guess")
    with (
        Admin(scram_only.address, security=wrong) as admin,
        pytest.raises(HeadwaterError) as refused,
    ):
        admin.list_topics()
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    wait_until(
        lambda: "refused a login from 127.0.0.1 for user 'alice'" in scram_only.log(),
        DEADLINE_S,
        "the refused login in the node's log",
    )


def test_sessions_are_renewed_and_a_stream_outlives_its_token(scram_only: NodeProcess) -> None:
    raw = open_channel(scram_only.address, None, [])
    session = Session("alice", "alice-secret")
    channel = grpc.intercept_channel(
        raw, SessionInterceptor(session, pb_grpc.SaslStub(raw), scram_only.address)
    )
    received: list[int] = []
    failures: list[BaseException] = []

    def read() -> None:
        stream = pb_grpc.BrokerStub(channel).FetchStream(
            pb.FetchRequest(topic="t", partition=0, offset=0, max_wait_ms=200),
            timeout=DEADLINE_S,
        )
        try:
            for answer in stream:
                if answer.records:
                    received.append(answer.next_offset)
                if len(received) >= 2:
                    stream.cancel()
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.CANCELLED:
                failures.append(error)

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        with Producer(scram_only.address, security=ALICE) as producer:
            producer.send("t", b"first", partition=0).result(timeout=DEADLINE_S)
            admin = pb_grpc.AdminStub(channel)
            ended = time.monotonic() + 7.0  # more than two lifetimes of 3 s
            while time.monotonic() < ended:
                admin.ListTopics(pb.ListTopicsRequest(), timeout=DEADLINE_S)
                time.sleep(0.2)
            producer.send("t", b"after the first token ended", partition=0).result(
                timeout=DEADLINE_S
            )
        reader.join(DEADLINE_S)
    finally:
        channel.close()
    assert not failures, failures
    assert len(received) >= 2, "the stream begun with the first token stopped"
    assert session.logins >= 3, f"{session.logins} logins in 7 s of 3 s sessions"


def test_a_client_logs_in_again_after_the_node_restarts(tmp_path: Any) -> None:
    node = NodeProcess(tmp_path / "data", env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"})
    node.start()
    try:
        with Admin(node.address) as admin:
            admin.upsert_user("alice", "alice-secret")
            admin.create_topic("r", 1)
        with (
            Admin(node.address, security=ALICE) as admin,
            Producer(node.address, security=ALICE) as producer,
        ):
            admin.list_topics()
            producer.send("r", b"before", partition=0).result(timeout=DEADLINE_S)
            node.stop()
            node.start()
            assert "r" in [t.name for t in admin.list_topics()]
            producer.send("r", b"after", partition=0).result(timeout=DEADLINE_S)
        with Consumer(node.address, security=ALICE, auto_offset_reset="earliest") as consumer:
            consumer.assign("r")
            values: list[bytes] = []
            wait_until(
                lambda: (
                    values.extend(bytes(r.value) for r in consumer.poll(timeout_ms=500))
                    or len(values) >= 2
                ),
                DEADLINE_S,
                "both records",
            )
            assert values == [b"before", b"after"]
    finally:
        node.kill()


def test_the_asyncio_clients_log_in_and_renew_too(scram_only: NodeProcess) -> None:
    async def scenario() -> list[bytes]:
        async with AsyncProducer(scram_only.address, acks="all", security=ALICE) as producer:
            first = await (await producer.send("aio", b"first", partition=0))
            ended = time.monotonic() + 4.0  # past a 3 s session
            while time.monotonic() < ended:
                await asyncio.sleep(0.5)
                await (await producer.send("aio", b"again", partition=0))
        async with AsyncConsumer(scram_only.address, security=ALICE) as consumer:
            await consumer.assign_at("aio", OffsetSpec.EARLIEST)
            values: list[bytes] = []
            while len(values) < 2:
                result = await consumer.poll(timeout_ms=10_000)
                assert result.batches, "nothing arrived within 10 s"
                values += [bytes(r.value) for r in result]
        assert first.offset == 0
        return values

    with Admin(scram_only.address, security=ALICE) as admin:
        admin.create_topic("aio", 1)
    assert asyncio.run(scenario())[0] == b"first"


def test_many_hosts_holding_every_exchange_cannot_keep_another_host_out() -> None:
    service, _, _ = _service({"alice": _credential("right")}, Clock())
    hosts = EXCHANGES_MAX // EXCHANGES_PER_HOST_MAX

    async def scenario() -> None:
        for h in range(hosts):
            for _ in range(EXCHANGES_PER_HOST_MAX):
                await service.Authenticate(
                    ScramLogin("alice", "x").first_request,
                    FakeContext(f"ipv4:10.{h // 256}.{h % 256}.1:1"),
                )
        final = await _log_in(service, "alice", "right", "ipv4:10.200.0.1:1")
        assert final.session_token

    asyncio.run(scenario())
