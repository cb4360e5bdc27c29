"""The pure parts of authentication and authorization: SCRAM credentials, the
``authorization`` metadata, ACL and user metadata records through the image, the
controller's decisions, and the authorizer's helpers."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest

from headwater.node.security.authorizer import certificate_principal, host_of_peer
from headwater.raft.metadata import decisions
from headwater.raft.metadata import records as r
from headwater.raft.metadata.image import MetadataImage, apply, image_digest, snapshot_records
from headwater.shared.acls import ACLS_MAX, Acl, parse_acl, parse_filter
from headwater.shared.credentials import (
    ITERATIONS_MIN,
    ScramCredential,
    authorization_value,
    credential_from_salted,
    new_salted_password,
    parse_authorization,
    verify_password,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

EPOCH = 1


def _credential(password: str = "pencil") -> ScramCredential:
    salt, salted = new_salted_password(password, ITERATIONS_MIN, salt=b"s" * 16)
    return credential_from_salted(salted, salt, ITERATIONS_MIN)


def test_scram_keys_match_rfc_7677_vector() -> None:
    """RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil", salt
    W22ZaJ0SNY7soEsUEjb6gQ==, 4096 iterations; its ClientProof checks our StoredKey."""
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    salted = hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096)
    credential = credential_from_salted(salted, salt, 4096)
    auth_message = (
        b"n=user,r=rOprNGfwEbeRWgbNEkqO,"
        b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,"
        b"i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    )
    proof = base64.b64decode("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    signature = hmac.new(credential.stored_key, auth_message, hashlib.sha256).digest()
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    assert hashlib.sha256(client_key).digest() == credential.stored_key
    server_signature = hmac.new(credential.server_key, auth_message, hashlib.sha256).digest()
    assert base64.b64encode(server_signature) == b"6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_verify_password() -> None:
    credential = _credential("pencil")
    assert verify_password(credential, "pencil")
    assert not verify_password(credential, "Pencil")
    assert not verify_password(credential, "x" * 5000)  # over the limit: no, not an error


@pytest.mark.parametrize(
    ("salted", "salt", "iterations", "problem"),
    [
        (b"k" * 32, b"s" * 15, 4096, "salt"),
        (b"k" * 32, b"s" * 65, 4096, "salt"),
        (b"k" * 31, b"s" * 16, 4096, "salted password"),
        (b"k" * 32, b"s" * 16, 4095, "iterations"),
        (b"k" * 32, b"s" * 16, 65537, "iterations"),
    ],
)
def test_credential_bounds(salted: bytes, salt: bytes, iterations: int, problem: str) -> None:
    with pytest.raises(HeadwaterError) as refused:
        credential_from_salted(salted, salt, iterations)
    assert refused.value.code is ErrorCode.INVALID_REQUEST
    assert problem in refused.value.message


def test_authorization_round_trip_and_malformed_values() -> None:
    assert parse_authorization(authorization_value("alice", "p:a:ss")) == ("alice", "p:a:ss")
    for value in (
        "Bearer abc",
        "Basic !!!",
        "Basic " + base64.b64encode(b"no-colon").decode(),
        "Basic " + base64.b64encode(b":nouser").decode(),
        "Basic " + base64.b64encode(b"\xff\xfe:x").decode(),
        "Basic " + "A" * 5000,
    ):
        with pytest.raises(HeadwaterError) as refused:
            parse_authorization(value)
        assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    for name in ("", "a:b", "*", "x" * 129, "tab\there"):
        with pytest.raises(HeadwaterError):
            authorization_value(name, "p")


def _image_with(*batches: tuple[r.Record, ...]) -> MetadataImage:
    image = MetadataImage()
    for batch in batches:
        result = apply(image, r.decode_batch(r.encode_batch(batch)))
        assert result.refusal is None, result.refusal
        image = result.image
    return image


def test_acl_and_user_records_build_the_image_and_its_snapshot() -> None:
    acls = [
        parse_acl("topic", "orders", "User:alice", "read"),
        parse_acl("group", "g-", "User:*", "describe", pattern_type="prefixed"),
    ]
    created = decisions.create_acls(MetadataImage(), EPOCH, acls)
    users = decisions.alter_users(
        MetadataImage(), EPOCH, [decisions.UserUpsertion("alice", _credential())], []
    )
    image = _image_with(created.records, users.records)
    assert image.acls == frozenset(acls)
    assert image.users == {"alice": _credential()}
    rebuilt = _image_with(tuple(snapshot_records(image)))
    assert rebuilt.acls == image.acls and rebuilt.users == image.users
    assert image_digest(image) != image_digest(
        _image_with(created.records)
    )  # the users are in the digest
    # A batch with no ACL record keeps the image's own set: the authorizer's index stays.
    later = apply(image, (r.ProducerIdsAllocated(EPOCH, 1, 0, 1000),)).image
    assert later.next_producer_id == 1000 and later.acls is image.acls


def test_apply_refuses_inconsistent_acl_and_user_records() -> None:
    acl = parse_acl("topic", "orders", "User:alice", "read")
    image = _image_with(decisions.create_acls(MetadataImage(), EPOCH, [acl]).records)
    fields = ("topic", "literal", "orders", "User:alice", "*", "read", "allow")
    for batch in (
        (r.AclCreated(EPOCH, *fields),),  # exists already
        (r.AclDeleted(EPOCH, "topic", "literal", "other", "User:alice", "*", "read", "allow"),),
        (r.AclCreated(EPOCH, "topic", "literal", "x", "alice", "*", "read", "allow"),),
        (r.UserDeleted(EPOCH, "nobody"),),
        (r.UserCredentialSet(EPOCH, "bob", "SCRAM-SHA-256", 4096, "zz", "00", "00"),),
        (r.UserCredentialSet(EPOCH, "bob", "PLAIN", 4096, "00", "00", "00"),),
    ):
        result = apply(image, batch)
        assert result.refusal is not None
        assert result.image.acls == image.acls and result.image.users == image.users


def test_decisions_create_once_delete_by_filter_and_bound_counts() -> None:
    alice_read = parse_acl("topic", "orders", "User:alice", "read")
    bob_write = parse_acl("topic", "orders", "User:bob", "write")
    image = _image_with(decisions.create_acls(MetadataImage(), EPOCH, [alice_read]).records)
    again = decisions.create_acls(image, EPOCH, [alice_read, bob_write])
    assert [type(x) for x in again.records] == [r.AclCreated]  # only the new one
    image = _image_with(
        decisions.create_acls(MetadataImage(), EPOCH, [alice_read, bob_write]).records
    )
    deleted = decisions.delete_acls(image, EPOCH, [parse_filter(principal="User:bob")])
    assert deleted.response == [bob_write]
    nothing = decisions.delete_acls(image, EPOCH, [parse_filter(principal="User:carol")])
    assert nothing.records == () and nothing.response == []
    crowded = MetadataImage(
        acls=frozenset(
            Acl(
                *(alice_read.resource_type, alice_read.pattern_type, f"t{i}"),
                *(
                    alice_read.principal,
                    alice_read.host,
                    alice_read.operation,
                    alice_read.permission,
                ),
            )
            for i in range(ACLS_MAX)
        )
    )
    with pytest.raises(HeadwaterError) as full:
        decisions.create_acls(crowded, EPOCH, [bob_write])
    assert str(ACLS_MAX) in full.value.message


def test_alter_users_refuses_unknown_deletions_and_repeated_names() -> None:
    alice = decisions.UserUpsertion("alice", _credential())
    with pytest.raises(HeadwaterError, match="no user 'bob'"):
        decisions.alter_users(MetadataImage(), EPOCH, [alice], ["bob"])
    with pytest.raises(HeadwaterError, match="twice"):
        decisions.alter_users(MetadataImage(), EPOCH, [alice, alice], [])
    with pytest.raises(HeadwaterError, match="user name"):
        decisions.alter_users(
            MetadataImage(), EPOCH, [decisions.UserUpsertion("a:b", _credential())], []
        )


def test_host_of_peer() -> None:
    assert host_of_peer("ipv4:10.0.0.5:51234") == "10.0.0.5"
    assert host_of_peer("ipv6:[::1]:51234") == "::1"
    assert host_of_peer("unix:/tmp/sock") == "unix:/tmp/sock"


def test_certificate_principal_mapping() -> None:
    context = {
        "x509_subject": [b"CN=alice,O=Example"],
        "x509_common_name": [b"alice"],
        "peer_dns": [b"alice.example.com"],
    }
    assert certificate_principal(context, "cn") == "User:alice"
    assert certificate_principal(context, "subject") == "User:CN=alice,O=Example"
    assert certificate_principal(context, "san_dns") == "User:alice.example.com"
    with pytest.raises(HeadwaterError) as refused:
        certificate_principal(context, "san_email")
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert certificate_principal({"transport_security_type": [b"ssl"]}, "cn") is None


def test_client_security_takes_credentials_from_the_environment_and_layers() -> None:
    from headwater.cli.security import apply_client_settings
    from headwater.shared.tls import ClientSecurity

    env = {
        "HEADWATER_SECURITY_PROTOCOL": "SASL_PLAINTEXT",
        "HEADWATER_USERNAME": "alice",
        "HEADWATER_PASSWORD": "secret",
    }
    security = ClientSecurity.from_env(env)
    assert (security.protocol, security.username, security.password) == (
        "sasl_plaintext",
        "alice",
        "secret",
    )
    assert "secret" not in repr(security)
    # SCRAM-SHA-256 by default: no fixed credentials, a session token per channel.
    assert security.uses_sessions and security.call_metadata() == ()
    plain = ClientSecurity.from_env({**env, "HEADWATER_SASL_MECHANISM": "plain"})
    assert not plain.uses_sessions
    ((key, value),) = plain.call_metadata()
    assert key == "authorization" and parse_authorization(value) == ("alice", "secret")
    assert ClientSecurity().call_metadata() == ()
    with pytest.raises(HeadwaterError, match="SCRAM-SHA-256, PLAIN"):
        ClientSecurity.from_env({**env, "HEADWATER_SASL_MECHANISM": "GSSAPI"})
    with pytest.raises(HeadwaterError, match="in the clear"):
        ClientSecurity.from_env({"HEADWATER_USERNAME": "alice", "HEADWATER_PASSWORD": "x"})
    # A file's username under the environment's TLS: checked once, on the last layer.
    assert apply_client_settings(
        {}, None, {"HEADWATER_TLS_CA_FILE": "/ca.pem", "HEADWATER_USERNAME": "alice"}
    ).tls
    with pytest.raises(HeadwaterError, match="needs credentials"):
        ClientSecurity.from_env({"HEADWATER_SECURITY_PROTOCOL": "SASL_SSL"})
    with pytest.raises(HeadwaterError, match="without a username"):
        ClientSecurity(password="x")
    # The --username flag over the environment's user keeps the environment's password.
    layered = apply_client_settings({"username": "bob"}, None, dict(env))
    assert (layered.username, layered.password) == ("bob", "secret")


def test_quota_precedence_user_then_client_id_then_defaults() -> None:
    from headwater.shared.quotas import PRODUCER_BYTE_RATE as P
    from headwater.shared.quotas import quota_for

    quotas = {
        ("user", "alice"): {P: 100.0},
        ("client-id", "etl"): {P: 200.0},
        ("user", ""): {P: 300.0},
        ("client-id", ""): {P: 400.0},
    }
    assert quota_for(quotas, "alice", "etl", P) == (("user", "alice"), 100.0)
    # Kafka's order: a user default wins over a client id (which the client names itself).
    assert quota_for(quotas, "bob", "etl", P) == (("user", "bob"), 300.0)  # bob's own bucket
    del quotas[("user", "")]
    assert quota_for(quotas, "bob", "etl", P) == (("client-id", "etl"), 200.0)
    assert quota_for(quotas, "bob", "other", P) == (("client-id", "other"), 400.0)
    assert quota_for({}, "bob", "", P) is None
    assert quota_for(quotas, "bob", "", "consumer_byte_rate") is None


def test_a_quota_must_be_a_positive_rate() -> None:
    from headwater.shared.quotas import check_entity, check_quota

    for value in (0.0, -1.0, float("inf"), float("nan"), 1e14):
        with pytest.raises(HeadwaterError) as refused:
            check_quota("producer_byte_rate", value)
        assert refused.value.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(HeadwaterError, match="deny ACL"):
        check_quota("producer_byte_rate", 0.0)
    with pytest.raises(HeadwaterError, match="valid: producer_byte_rate"):
        check_quota("bytes", 1.0)
    with pytest.raises(HeadwaterError, match="valid: user, client-id"):
        check_entity("group", "x")
    check_quota("request_rate", None)  # a removal


def test_throttle_holds_a_waiting_client_to_its_rate() -> None:
    """A client that sends its next request when the last is answered, as fast as it
    can, gets the quota's rate over simulated time: within 1 % over 10 s after the
    bucket's first burst, whatever its request size."""
    from headwater.shared.quotas import BURST_S, Throttle

    rate = 1_000_000.0
    for request_bytes in (10_000, 64_000, 3_000_000):
        throttle = Throttle()
        now, sent, served_in_first_10s = 0.0, 0, 0
        while now < 10.0:
            now += throttle.charge("p", ("user", "alice"), rate, request_bytes, now)
            sent += request_bytes
            if now <= 10.0:
                served_in_first_10s = sent
        assert served_in_first_10s <= rate * (10.0 + BURST_S) + request_bytes
        assert served_in_first_10s >= rate * 10.0 * 0.99 - request_bytes
    # Another bucket is untouched.
    assert throttle.charge("p", ("user", "bob"), rate, 1000, now) == 0.0
    # One huge burst holds its sender for at most THROTTLE_S_MAX, and no longer after.
    from headwater.shared.quotas import THROTTLE_S_MAX

    huge = Throttle()
    assert huge.charge("p", ("user", "x"), rate, rate * 1000, 0.0) == THROTTLE_S_MAX
    assert huge.charge("p", ("user", "x"), rate, 1, THROTTLE_S_MAX + 1) == 0.0


def test_quota_records_build_the_image() -> None:
    changes = decisions.alter_quotas(
        MetadataImage(),
        EPOCH,
        [("user", "alice", "producer_byte_rate", 1e6), ("client-id", "", "request_rate", 50.0)],
    )
    image = _image_with(changes.records)
    assert image.quotas == {
        ("user", "alice"): {"producer_byte_rate": 1e6},
        ("client-id", ""): {"request_rate": 50.0},
    }
    assert _image_with(tuple(snapshot_records(image))).quotas == image.quotas
    removed = decisions.alter_quotas(image, EPOCH, [("user", "alice", "producer_byte_rate", None)])
    assert apply(image, removed.records).image.quotas == {("client-id", ""): {"request_rate": 50.0}}
    with pytest.raises(HeadwaterError):
        decisions.alter_quotas(image, EPOCH, [("user", "alice", "producer_byte_rate", 0.0)])
    assert apply(image, (r.QuotaChanged(EPOCH, "user", "x", "bytes", 1.0),)).refusal


def test_connection_rate_counts_new_connections_per_host_and_second() -> None:
    from headwater.node.security.authorizer import ConnectionRate

    now = [100.0]
    rate = ConnectionRate(2, clock=lambda: now[0])
    rate.admit("ipv4:10.0.0.1:1", "10.0.0.1")
    rate.admit("ipv4:10.0.0.1:2", "10.0.0.1")
    rate.admit("ipv4:10.0.0.1:1", "10.0.0.1")  # a known connection: always admitted
    rate.admit("ipv4:10.0.0.2:1", "10.0.0.2")  # another host has its own count
    with pytest.raises(HeadwaterError) as refused:
        rate.admit("ipv4:10.0.0.1:3", "10.0.0.1")
    assert refused.value.code is ErrorCode.THROTTLING_QUOTA_EXCEEDED
    assert "connection_rate_per_host_max" in refused.value.message
    now[0] = 101.0
    rate.admit("ipv4:10.0.0.1:3", "10.0.0.1")  # the next second has room


def test_acl_hosts_are_ip_addresses_in_one_canonical_form() -> None:
    assert parse_acl("topic", "t", "User:a", "read", host="2001:DB8:0::1").host == "2001:db8::1"
    assert parse_acl("topic", "t", "User:a", "read", host="::ffff:10.0.0.5").host == "10.0.0.5"
    assert parse_filter(host="2001:DB8::1").host == "2001:db8::1"
    for bad in ("node1.example", "10.0.0.256", "", "10.0.0.0/8"):
        with pytest.raises(HeadwaterError, match="an IP address"):
            parse_acl("topic", "t", "User:a", "read", host=bad)
    assert host_of_peer("ipv6:[::ffff:10.0.0.5]:4000") == "10.0.0.5"
    assert host_of_peer("ipv6:[2001:DB8::1]:4000") == "2001:db8::1"


@pytest.mark.parametrize(
    "body",
    [
        {"type": "AclCreated", "resource_type": 5},
        {"type": "AclCreated", "resource_name": ["x", "y"]},
        {"type": "QuotaChanged", "value": 10**400},
        {"type": "QuotaChanged", "value": "5"},
        {"type": "QuotaChanged", "entity_name": 7},
        {"type": "UserCredentialSet", "name": {"a": 1}},
        {"type": "UserCredentialSet", "iterations": True},
        {"type": "PartitionCreated", "replicas": [1, "2"]},
    ],
)
def test_hostile_record_fields_are_refused_at_decode(body: dict[str, object]) -> None:
    """A record whose field has the wrong type is a RecordFormatError (the batch is
    refused), never an exception that would stop every node applying it."""
    good = {
        "AclCreated": r.AclCreated(EPOCH, "topic", "literal", "t", "User:a", "*", "read", "allow"),
        "QuotaChanged": r.QuotaChanged(EPOCH, "user", "a", "request_rate", 5.0),
        "UserCredentialSet": r.UserCredentialSet(
            EPOCH, "a", "SCRAM-SHA-256", 4096, "00" * 16, "00" * 32, "00" * 32
        ),
        "PartitionCreated": r.PartitionCreated(EPOCH, "id", 0, (1,), (1,), 1, 0, 0),
    }[str(body["type"])]
    fields = {**r.record_to_json(good), **body}
    with pytest.raises(r.RecordFormatError):
        r.decode_batch(json.dumps([fields]).encode())


def test_records_built_with_bad_values_are_refused_by_apply() -> None:
    for record in (
        r.UserCredentialSet(EPOCH, "a", "SCRAM-SHA-256", 10**12, "00" * 16, "00" * 32, "00" * 32),
        r.UserCredentialSet(EPOCH, "a", "SCRAM-SHA-256", 4096, "", "00" * 32, "00" * 32),
        r.UserCredentialSet(EPOCH, "a:b\n", "SCRAM-SHA-256", 4096, "00" * 16, "00" * 32, "00" * 32),
        r.AclCreated(EPOCH, 5, "literal", "t", "User:a", "*", "read", "allow"),  # type: ignore[arg-type]
        r.QuotaChanged(EPOCH, "user", "a", "request_rate", "5"),  # type: ignore[arg-type]
    ):
        result = apply(MetadataImage(), (record,))
        assert result.refusal is not None, record
        assert result.image.users == {} and result.image.acls == frozenset()
