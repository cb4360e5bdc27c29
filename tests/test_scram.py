"""SCRAM-SHA-256's messages (``headwater.shared.scram``): RFC 7677's example exchange byte for
byte, every wrong proof refused alike, and malformed messages refused with a typed error
(a seeded fuzz of the parsers)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headwater.shared import scram
from headwater.shared.credentials import credential_from_salted, salted_password
from headwater.shared.errors import ErrorCode, HeadwaterError

# RFC 7677, section 3.
USER = "user"
PASSWORD = "pencil"
CLIENT_NONCE = "rOprNGfwEbeRWgbNEkqO"
SERVER_NONCE = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
SALT_B64 = "W22ZaJ0SNY7soEsUEjb6gQ=="
SERVER_FIRST = f"r={CLIENT_NONCE}{SERVER_NONCE},s={SALT_B64},i=4096"
CLIENT_FINAL = (
    f"c=biws,r={CLIENT_NONCE}{SERVER_NONCE},p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
)
SERVER_FINAL = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _credential():
    import base64

    salt = base64.b64decode(SALT_B64)
    return credential_from_salted(salted_password(PASSWORD, salt, 4096), salt, 4096), salt


def test_rfc_7677_example_client_side() -> None:
    message, bare = scram.client_first(USER, CLIENT_NONCE)
    assert message == f"n,,n=user,r={CLIENT_NONCE}"
    server = scram.parse_server_first(SERVER_FIRST, CLIENT_NONCE)
    _, salt = _credential()
    final, expected = scram.client_final(salted_password(PASSWORD, salt, 4096), bare, server)
    assert final == CLIENT_FINAL
    scram.check_server_final(SERVER_FINAL, expected)


def test_rfc_7677_example_server_side() -> None:
    credential, salt = _credential()
    client = scram.parse_client_first(f"n,,n=user,r={CLIENT_NONCE}")
    assert (client.user, client.nonce) == (USER, CLIENT_NONCE)
    first = scram.server_first(client.nonce, SERVER_NONCE, salt, 4096)
    assert first == SERVER_FIRST
    assert scram.verify_client_final(credential, client, first, CLIENT_FINAL) == SERVER_FINAL


@pytest.mark.parametrize(
    "tampered",
    [
        CLIENT_FINAL.replace("p=dHzb", "p=dHzc"),  # another proof
        CLIENT_FINAL.replace("c=biws", "c=eSws"),  # another GS2 header
        CLIENT_FINAL.replace("r=rOpr", "r=rOps"),  # another nonce
        CLIENT_FINAL.replace(",p=", ",x="),
        CLIENT_FINAL + ",e=1",
    ],
)
def test_a_tampered_client_final_is_refused(tampered: str) -> None:
    credential, salt = _credential()
    client = scram.parse_client_first(f"n,,n=user,r={CLIENT_NONCE}")
    first = scram.server_first(client.nonce, SERVER_NONCE, salt, 4096)
    with pytest.raises(HeadwaterError) as refused:
        scram.verify_client_final(credential, client, first, tampered)
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


def test_a_wrong_password_and_an_unknown_user_read_alike() -> None:
    _, salt = _credential()
    other = credential_from_salted(salted_password("other", salt, 4096), salt, 4096)
    client = scram.parse_client_first(f"n,,n=user,r={CLIENT_NONCE}")
    first = scram.server_first(client.nonce, SERVER_NONCE, salt, 4096)
    with pytest.raises(HeadwaterError) as refused:
        scram.verify_client_final(other, client, first, CLIENT_FINAL)
    assert "unknown user or wrong password" in refused.value.message


def test_the_client_refuses_a_server_that_lacks_the_keys_or_asks_too_much() -> None:
    _, bare = scram.client_first(USER, CLIENT_NONCE)
    server = scram.parse_server_first(SERVER_FIRST, CLIENT_NONCE)
    _, expected = scram.client_final(b"\x00" * 32, bare, server)
    with pytest.raises(HeadwaterError, match="signature is wrong"):
        scram.check_server_final(SERVER_FINAL, expected)
    for bad, words in (
        (SERVER_FIRST.replace("i=4096", "i=100000000"), "iteration count"),
        (SERVER_FIRST.replace("i=4096", "i=1"), "iteration count"),
        (SERVER_FIRST.replace(f"r={CLIENT_NONCE}", "r=someone-elses-nonce"), "nonce"),
        (f"r={CLIENT_NONCE},s={SALT_B64},i=4096", "nonce"),
        (SERVER_FIRST.replace(SALT_B64, "AAAA"), "salt"),
    ):
        with pytest.raises(HeadwaterError, match=words):
            scram.parse_server_first(bad, CLIENT_NONCE)


def test_user_names_with_commas_and_equals_signs_travel_escaped() -> None:
    message, _ = scram.client_first("a,b=c", CLIENT_NONCE)
    assert message == f"n,,n=a=2Cb=3Dc,r={CLIENT_NONCE}"
    assert scram.parse_client_first(message).user == "a,b=c"


@pytest.mark.parametrize(
    ("message", "words"),
    [
        ("p=tls-unique,,n=user,r=" + CLIENT_NONCE, "channel binding"),
        ("n,a=admin,n=user,r=" + CLIENT_NONCE, "authorization identity"),
        ("n,,n=user,r=short", "client nonce"),
        ("n,,n=us=er,r=" + CLIENT_NONCE, "'='"),
        ("n,,r=" + CLIENT_NONCE + ",n=user", "attributes"),
        ("n,,n=user,r=" + "x" * 2000, "longer than"),
        ("n,,n=\x00,r=" + CLIENT_NONCE, "printable"),
    ],
)
def test_a_malformed_client_first_is_refused_naming_the_part(message: str, words: str) -> None:
    with pytest.raises(HeadwaterError, match=words) as refused:
        scram.parse_client_first(message)
    assert refused.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED


@settings(max_examples=400, derandomize=True, deadline=None)
@given(st.text(max_size=300))
def test_the_parsers_refuse_any_text_with_a_typed_error(text: str) -> None:
    credential, salt = _credential()
    client = scram.parse_client_first(f"n,,n=user,r={CLIENT_NONCE}")
    first = scram.server_first(client.nonce, SERVER_NONCE, salt, 4096)
    codes = set()
    for parse in (
        scram.parse_client_first,
        lambda t: scram.parse_server_first(t, CLIENT_NONCE),
        lambda t: scram.verify_client_final(credential, client, first, t),
        lambda t: scram.check_server_final(t, b"x" * 32),
    ):
        try:
            parse(text)
        except HeadwaterError as error:
            codes.add(error.code)
    assert codes <= {ErrorCode.SASL_AUTHENTICATION_FAILED, ErrorCode.INVALID_REQUEST}
