"""Attacks on logins, the authorization metadata, group descriptions, open streams and the
Raft port; each asserts what the attacker gets and that the node stays responsive.

The password-check tests drive ``PasswordChecks`` with real PBKDF2 in its own threads on
an event loop; the rest run against a real node process (users over plaintext on
loopback, the ACL authorizer, ``User:admin`` a super user).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from headwater.client import Admin, ClientSecurity, Producer, TopicPartition
from headwater.client.sessions import with_session
from headwater.node.security import password_checks
from headwater.node.security.password_checks import PasswordChecks
from headwater.raft import quorum
from headwater.shared.acls import parse_acl
from headwater.shared.credentials import credential_from_salted, new_salted_password
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.grpc_channels import open_channel
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc
from tests.node_process import NodeProcess, wait_until
from tests.raw_h2 import raw_call

DEADLINE_S = 30.0
SLOW_ITERATIONS = 65_536


def _credential(password: str, iterations: int) -> object:
    salt, salted = new_salted_password(password, iterations)
    return credential_from_salted(salted, salt, iterations)


USERS = {
    "slow": _credential("right", SLOW_ITERATIONS),
    "quick": _credential("right", 4096),
}


def _code(error: BaseException) -> ErrorCode:
    assert isinstance(error, HeadwaterError), repr(error)
    return error.code


# ------------------------------------------------------------------ password checks


def test_cancelled_checks_hold_their_place_until_the_hash_ends_and_count_as_failures() -> None:
    async def scenario() -> None:
        checks = PasswordChecks()
        calls = [
            asyncio.ensure_future(checks.check(USERS, "slow", f"guess{i}", "10.0.0.1"))
            for i in range(password_checks.PENDING_PER_HOST_MAX)
        ]
        await asyncio.sleep(0.005)
        for call in calls:
            call.cancel()
        await asyncio.gather(*calls, return_exceptions=True)
        # The two started hashes still run and still hold the host's places.
        assert checks.running == password_checks.CHECKS_AT_ONCE
        assert checks.held_total == password_checks.CHECKS_AT_ONCE
        while checks.running:
            await asyncio.sleep(0.005)
        assert checks.failed == password_checks.CHECKS_AT_ONCE
        assert checks.held_total == 0 and not checks.waiting

    asyncio.run(scenario())


def test_a_host_holds_at_most_its_share_of_checks() -> None:
    async def scenario() -> None:
        checks = PasswordChecks()
        flood = [
            asyncio.ensure_future(checks.check(USERS, "slow", f"guess{i}", "10.0.0.1"))
            for i in range(password_checks.PENDING_PER_HOST_MAX)
        ]
        await asyncio.sleep(0)
        with pytest.raises(HeadwaterError) as refused:
            await checks.check(USERS, "slow", "one-more", "10.0.0.1")
        assert refused.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
        assert refused.value.retriable
        # The addresses of one IPv6 /64 are one host.
        flood += [
            asyncio.ensure_future(checks.check(USERS, "slow", "g", f"2001:db8::{i + 1}"))
            for i in range(password_checks.PENDING_PER_HOST_MAX)
        ]
        await asyncio.sleep(0)
        with pytest.raises(HeadwaterError) as refused:
            await checks.check(USERS, "slow", "one-more", "2001:db8::ffff")
        assert refused.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
        results = await asyncio.gather(*flood, return_exceptions=True)
        assert {_code(r) for r in results} == {ErrorCode.SASL_AUTHENTICATION_FAILED}

    asyncio.run(scenario())


def test_another_hosts_first_login_is_next_in_line_during_a_flood(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A host keeps its queue full of wrong passwords; a login from another host is the
    next check to start (after at most one of the flood's, whose turn it was), not the
    last of the flood's queue."""
    started: list[str] = []
    hash_matches = password_checks.hash_matches

    def noting(credential: object, password: str, cost: int) -> bool:
        started.append(password)
        return hash_matches(credential, password, cost)  # type: ignore[arg-type]

    monkeypatch.setattr(password_checks, "hash_matches", noting)

    async def scenario() -> None:
        checks = PasswordChecks(checks_at_once=1)
        stop = asyncio.Event()

        async def flood(n: int) -> None:
            while not stop.is_set():
                try:
                    await checks.check(USERS, "slow", f"guess{n}", "10.0.0.1")
                except HeadwaterError:
                    await asyncio.sleep(0.001)

        flooders = [asyncio.ensure_future(flood(n)) for n in range(16)]
        while len(checks.waiting.get("10.0.0.1", ())) < password_checks.PENDING_PER_HOST_MAX - 1:
            await asyncio.sleep(0.001)
        arrived = len(started)
        credential = await checks.check(USERS, "quick", "right", "10.0.0.2")
        stop.set()
        await asyncio.gather(*flooders, return_exceptions=True)
        assert credential is USERS["quick"]
        flood_checks_before = started.index("right", arrived) - arrived
        # The one running when it came may have started since; then, round-robin, it is
        # next. Behind the flood's whole queue it would have waited for 7 more.
        assert flood_checks_before <= 2, started[arrived:]

    asyncio.run(scenario())


def test_password_checks_leave_the_default_executor_free() -> None:
    """Follower appends and fsyncs run in the loop's default executor: a flood of checks
    must not delay them."""

    async def scenario() -> None:
        checks = PasswordChecks()
        flood = [
            asyncio.ensure_future(checks.check(USERS, "slow", f"g{i}", f"10.0.1.{i}"))
            for i in range(64)
        ]
        await asyncio.sleep(0.05)
        waits = []
        for _ in range(20):
            began = time.monotonic()
            await asyncio.to_thread(lambda: None)
            waits.append(time.monotonic() - began)
        for call in flood:
            call.cancel()
        await asyncio.gather(*flood, return_exceptions=True)
        assert sorted(waits)[len(waits) // 2] < 0.02, waits

    asyncio.run(scenario())


def test_an_unknown_user_costs_what_the_most_costly_user_costs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every check runs the PBKDF2 iterations of the most costly user (65,536 here),
    counted at hashlib's door."""
    iterations: list[int] = []
    pbkdf2 = hashlib.pbkdf2_hmac

    def counting(name: str, password: bytes, salt: bytes, rounds: int, *rest: object) -> bytes:
        iterations.append(rounds)
        return pbkdf2(name, password, salt, rounds, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(hashlib, "pbkdf2_hmac", counting)
    monkeypatch.setattr(password_checks, "FAILED_LOGIN_DELAY_S", 0.0)

    async def counted(user: str) -> int:
        iterations.clear()
        with pytest.raises(HeadwaterError):
            await PasswordChecks().check(USERS, user, "wrong", "10.0.0.1")
        return sum(iterations)

    async def scenario() -> dict[str, int]:
        return {user: await counted(user) for user in ("slow", "quick", "nobody")}

    costs = asyncio.run(scenario())
    # The count, not the clock, decides: the hashing threads run at nice 19, where a
    # loaded machine's timings say little.
    assert set(costs.values()) == {SLOW_ITERATIONS}, costs


def test_a_failed_login_is_answered_late_and_logged_with_the_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> float:
        checks = PasswordChecks()
        began = time.monotonic()
        with pytest.raises(HeadwaterError) as refused:
            await checks.check(USERS, "quick", "wrong", "10.9.8.7")
        assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
        assert "nobody" not in str(refused.value)
        return time.monotonic() - began

    with caplog.at_level(logging.WARNING, logger=password_checks.__name__):
        took = asyncio.run(scenario())
    assert took >= password_checks.FAILED_LOGIN_DELAY_S
    assert "refused a login from 10.9.8.7 for user 'quick'" in caplog.text


# ------------------------------------------------------------------ a real node

ADMIN = ClientSecurity("SASL_PLAINTEXT", username="admin", password="admin-secret")
ALICE = ClientSecurity("SASL_PLAINTEXT", username="alice", password="alice-secret")


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """Users, topics, ACLs and offsets are set while ``authorizer`` is ``none`` (the first
    super user needs an identity before any ACL exists); then the node restarts with
    ``authorizer = "acl"``."""
    node = NodeProcess(
        tmp_path_factory.mktemp("attacks") / "data",
        env={"HEADWATER_CREDENTIALS_OVER_PLAINTEXT": "allow"},
    )
    node.start()
    try:
        with Admin(node.address) as admin:
            for user in ("admin", "alice"):
                admin.upsert_user(user, f"{user}-secret")
            for topic in ("seen", "hidden"):
                admin.create_topic(topic, 1)
            admin.create_acls(
                [
                    parse_acl("group", "g", "User:alice", "describe"),
                    parse_acl("topic", "seen", "User:alice", "describe"),
                    parse_acl("topic", "seen", "User:alice", "read"),
                ]
            )
            admin.alter_group_offsets(
                "g", {TopicPartition("seen", 0): 1, TopicPartition("hidden", 0): 2}
            )
        node.stop()
        node.env.update({"HEADWATER_AUTHORIZER": "acl", "HEADWATER_SUPER_USERS": "User:admin"})
        node.start()
        yield node
    finally:
        node.kill()


@pytest.mark.parametrize(
    "value",
    [b"Basic \xc3\xa9", b"Basic \xff\xfe", "Basic " + "é" * 3000],
    ids=["non-ascii", "not-utf8", "long-non-ascii"],
)
def test_an_authorization_value_that_is_not_base64_ascii_is_refused_quietly(
    node: NodeProcess, value: bytes | str
) -> None:
    raw = value if isinstance(value, bytes) else value.encode()
    before = len(node.log())
    for _ in range(20):
        answer = raw_call(node.address, "/headwater.v1.Admin/ListTopics", [(b"authorization", raw)])
        assert answer.get(b"grpc-status") == b"16", answer  # UNAUTHENTICATED
        assert b"SASL_AUTHENTICATION_FAILED" in answer.get(b"grpc-message", b""), answer
    written = node.log()[before:]
    assert "Traceback" not in written and " ERROR " not in written, written[:2000]
    assert len(written) < 1000, written
    with Admin(node.address, security=ADMIN) as admin:
        assert "seen" in [t.name for t in admin.list_topics()]


def test_describe_group_hides_the_topics_the_caller_may_not_describe(node: NodeProcess) -> None:
    with Admin(node.address, security=ALICE) as alice:
        described = alice.describe_group("g")
        assert {o.topic for o in described.offsets} == {"seen"}
        assert {tp.topic for tp in alice.group_offsets("g")} == {"seen"}
    with Admin(node.address, security=ADMIN) as admin:
        assert {o.topic for o in admin.describe_group("g").offsets} == {"seen", "hidden"}


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_changing_a_password_ends_the_users_open_streams(node: NodeProcess, mechanism: str) -> None:
    user = topic = f"carol-{mechanism.lower()}"
    with Admin(node.address, security=ADMIN) as admin:
        admin.upsert_user(user, "carol-secret")
        admin.create_topic(topic, 1)
        admin.create_acls([parse_acl("topic", topic, f"User:{user}", "read")])
    carol = ClientSecurity(
        "SASL_PLAINTEXT", username=user, password="carol-secret", sasl_mechanism=mechanism
    )
    channel = open_channel(node.address, None, [], carol.call_metadata())
    if carol.uses_sessions:
        channel = with_session(channel, node.address, user, "carol-secret")
    ended: list[BaseException] = []
    answers: list[pb.FetchResponse] = []

    def read() -> None:
        stream = pb_grpc.BrokerStub(channel).FetchStream(
            pb.FetchRequest(topic=topic, partition=0, offset=0, max_wait_ms=200),
            timeout=DEADLINE_S,
        )
        try:
            answers.extend(stream)
        except grpc.RpcError as error:
            ended.append(error)

    reader = threading.Thread(target=read, daemon=True)
    try:
        reader.start()
        wait_until(lambda: len(answers) >= 1, DEADLINE_S, "the stream's first answer")
        with Admin(node.address, security=ADMIN) as admin:
            admin.upsert_user(user, "a-new-secret")
        with Producer(node.address, security=ADMIN) as producer:
            producer.send(topic, b"after the change", partition=0).result(timeout=DEADLINE_S)
        reader.join(DEADLINE_S)
        assert not reader.is_alive(), "the stream went on after the password changed"
        [error] = ended
        refusal = from_rpc_error(error, node.address)
        assert refusal.code is ErrorCode.SASL_AUTHENTICATION_FAILED, refusal
        assert all(not a.records for a in answers), "a record was sent after the change"
    finally:
        channel.close()


def test_a_wrong_password_is_logged_with_the_callers_host(node: NodeProcess) -> None:
    mallory = ClientSecurity("SASL_PLAINTEXT", username="alice", password="guess")
    with Admin(node.address, security=mallory) as admin, pytest.raises(HeadwaterError) as refused:
        admin.list_topics()
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    wait_until(
        lambda: "refused a login from 127.0.0.1 for user 'alice'" in node.log(),
        DEADLINE_S,
        "the refused login in the node's log",
    )


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _quiet_cpu_seconds(pid: int, seconds: float) -> float:
    """The CPU time a process spends in ``seconds`` left alone."""
    before = _cpu_seconds(pid)
    time.sleep(seconds)  # the measured window itself, not a wait for a condition
    return _cpu_seconds(pid) - before


def test_64_mib_to_the_raft_port_costs_a_stranger_nothing(node: NodeProcess) -> None:
    """A stranger announces a 60 MiB message and sends 64 MiB of junk: the node drops
    the connection after a bounded read and spends under 50 ms of CPU on it."""
    host, port = node.raft_address.rsplit(":", 1)
    assert node.process is not None
    quiet = _quiet_cpu_seconds(node.process.pid, 0.5)
    before = _cpu_seconds(node.process.pid)
    began = time.monotonic()
    sent = 0
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        try:
            sock.sendall(struct.pack("i", 60 << 20))
            chunk = b"Z" * 65536
            for _ in range(1024):
                sock.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass  # the node closed the connection: what it should do
    window = time.monotonic() - began
    # Less what the node spends in as long without the junk (heartbeats, its timers).
    cost = _cpu_seconds(node.process.pid) - before - quiet * window / 0.5
    assert cost < 0.05, f"{cost:.3f} s of CPU for {sent} bytes"
    assert "dropped a Raft connection from 127.0.0.1" in node.log()
    with Admin(node.address, security=ADMIN) as admin:
        began = time.monotonic()
        admin.list_topics()
        assert time.monotonic() - began < 1.0


def test_many_hosts_flooding_together_cannot_keep_another_host_out() -> None:
    """Hosts that together hold the node's every place: a new host's login takes the
    place of a waiting check of the fullest host, whose caller is told to retry."""
    users = {"quick": USERS["quick"]}

    async def scenario() -> None:
        checks = PasswordChecks(checks_at_once=1)
        hosts = password_checks.PENDING_MAX // password_checks.PENDING_PER_HOST_MAX
        flood = [
            asyncio.ensure_future(checks.check(users, "quick", "guess", f"10.1.{h}.1"))
            for h in range(hosts)
            for _ in range(password_checks.PENDING_PER_HOST_MAX)
        ]
        await asyncio.sleep(0)
        assert checks.held_total == password_checks.PENDING_MAX
        credential = await checks.check(users, "quick", "right", "10.2.0.1")
        assert credential is users["quick"]
        results = await asyncio.gather(*flood, return_exceptions=True)
        codes = [_code(r) for r in results]
        assert codes.count(ErrorCode.THROTTLING_QUOTA_EXCEEDED) == 1, codes
        assert checks.held_total == 0 and not checks.waiting

    asyncio.run(scenario())


def test_raft_strangers_are_dropped_when_silent_or_too_many() -> None:
    class Connection:
        def __init__(self) -> None:
            self.dropped = False

        def disconnect(self) -> None:
            self.dropped = True

    connections = {Connection() for _ in range(quorum.STRANGER_CONNECTIONS_MAX + 6)}
    assert quorum.drop_strangers(connections, 100.0) == 6
    left = {c for c in connections if not c.dropped}
    voter = next(iter(left))
    voter._headwater_authenticated = True  # type: ignore[attr-defined]
    later = 100.0 + quorum.STRANGER_CONNECTION_S + 1
    assert quorum.drop_strangers(left, later) == len(left) - 1
    assert not voter.dropped


def test_a_silent_connection_to_the_raft_port_is_closed(node: NodeProcess) -> None:
    host, port = node.raft_address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=DEADLINE_S) as sock:
        began = time.monotonic()
        assert sock.recv(1) == b"", "the node sent something to a stranger"
        assert time.monotonic() - began < quorum.STRANGER_CONNECTION_S + 5
