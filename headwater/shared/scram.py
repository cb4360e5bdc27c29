"""SCRAM-SHA-256 (RFC 5802, RFC 7677): the messages of both sides, pure.

A login in four messages, without the password or anything that could stand for it on
the wire::

    client-first  n,,n=<user>,r=<client nonce>
    server-first  r=<client nonce><server nonce>,s=<base64 salt>,i=<iterations>
    client-final  c=biws,r=<both nonces>,p=<base64 ClientProof>
    server-final  v=<base64 ServerSignature>

    SaltedPassword  = PBKDF2-HMAC-SHA256(password, salt, iterations)   (client only)
    ClientKey       = HMAC(SaltedPassword, "Client Key");  StoredKey = SHA-256(ClientKey)
    AuthMessage     = client-first-bare "," server-first "," client-final-without-proof
    ClientSignature = HMAC(StoredKey, AuthMessage);  ClientProof = ClientKey XOR ClientSignature
    ServerSignature = HMAC(ServerKey, AuthMessage)

The server keeps StoredKey and ServerKey (``headwater.shared.credentials.ScramCredential``); it
checks a proof with two HMACs and a hash (SHA-256(proof XOR ClientSignature) must be
StoredKey), so a login costs it microseconds, and the client pays the PBKDF2. The
server's signature proves to the client that the server holds ServerKey.

Scope: no channel binding (the GS2 header is ``n,,``, or ``y,,`` from a client that
could bind but believes the server cannot), no authorization identity, no extensions.
Limits: a message of at most ``MESSAGE_CHARS_MAX`` characters; nonces of
``NONCE_CHARS_MIN``..``NONCE_CHARS_MAX`` printable characters without ``,``;
iterations and salt within ``headwater.shared.credentials``' bounds. Anything else is
SASL_AUTHENTICATION_FAILED naming the part that is wrong.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Final

from headwater.shared.credentials import (
    ITERATIONS_MAX,
    ITERATIONS_MIN,
    KEY_BYTES,
    SALT_BYTES_MAX,
    SALT_BYTES_MIN,
    ScramCredential,
    authentication_failed,
    check_user_name,
)
from headwater.shared.errors import HeadwaterError

MECHANISM: Final = "SCRAM-SHA-256"
MESSAGE_CHARS_MAX: Final = 1024
NONCE_CHARS_MIN: Final = 16
NONCE_CHARS_MAX: Final = 256
_GS2_HEADERS: Final = {"n,,": "biws", "y,,": "eSws"}  # header -> base64 of it (c=)


def _fail(message: str) -> HeadwaterError:
    return authentication_failed(f"SCRAM: {message}")


def _hmac(key: bytes, data: bytes) -> bytes:
    return hmac.new(key, data, hashlib.sha256).digest()


def _escape(user: str) -> str:
    """RFC 5802's saslname: ``=`` as ``=3D`` and ``,`` as ``=2C``."""
    return user.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    rest = name.replace("=2C", "").replace("=3D", "")
    if "=" in rest:
        raise _fail("the user name holds '=' not followed by 2C or 3D")
    return name.replace("=2C", ",").replace("=3D", "=")


def _attributes(message: str, names: str, what: str) -> list[str]:
    """The values of ``message``'s comma-separated attributes, which must be ``names``
    (one letter each) in that order."""
    if len(message) > MESSAGE_CHARS_MAX:
        raise _fail(f"the {what} is longer than {MESSAGE_CHARS_MAX} characters")
    if not message.isprintable():
        raise _fail(f"the {what} holds characters that are not printable")
    parts = message.split(",")
    if len(parts) != len(names):
        raise _fail(f"the {what} must have the attributes {','.join(names)}")
    values = []
    for part, name in zip(parts, names, strict=True):
        if not part.startswith(f"{name}="):
            raise _fail(f"the {what} must have the attributes {','.join(names)}, in that order")
        values.append(part[2:])
    return values


def _check_nonce(nonce: str, what: str) -> str:
    if not NONCE_CHARS_MIN <= len(nonce) <= NONCE_CHARS_MAX:
        raise _fail(
            f"the {what} is {len(nonce)} characters, not {NONCE_CHARS_MIN}..{NONCE_CHARS_MAX}"
        )
    if not all(33 <= ord(c) <= 126 for c in nonce):
        raise _fail(f"the {what} must be printable ASCII")
    return nonce


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise _fail(f"the {what} is not base64") from None


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# ----------------------------------------------------------------------------- client


def client_first(user: str, nonce: str) -> tuple[str, str]:
    """(client-first message, its bare part) for ``user`` with ``nonce``."""
    check_user_name(user)
    _check_nonce(nonce, "client nonce")
    bare = f"n={_escape(user)},r={nonce}"
    return f"n,,{bare}", bare


@dataclass(frozen=True, slots=True)
class ServerFirst:
    """A server-first message as the client reads it."""

    message: str
    nonce: str
    salt: bytes
    iterations: int


def parse_server_first(message: str, client_nonce: str) -> ServerFirst:
    """The server-first message, checked: the nonce extends the client's, the salt and
    the iteration count are within the credential bounds (a server cannot make the
    client run PBKDF2 for more than ``ITERATIONS_MAX`` iterations)."""
    nonce, salt_text, iterations_text = _attributes(message, "rsi", "server-first message")
    _check_nonce(nonce, "combined nonce")
    if not nonce.startswith(client_nonce) or len(nonce) == len(client_nonce):
        raise _fail("the server's nonce does not extend the client's")
    salt = _b64decode(salt_text, "salt")
    if not SALT_BYTES_MIN <= len(salt) <= SALT_BYTES_MAX:
        raise _fail(f"the salt is {len(salt)} bytes, not {SALT_BYTES_MIN}..{SALT_BYTES_MAX}")
    if not iterations_text.isdigit() or len(iterations_text) > 9:
        raise _fail("the iteration count is not a number")
    iterations = int(iterations_text)
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise _fail(f"the iteration count {iterations} is not {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    return ServerFirst(message, nonce, salt, iterations)


def client_final(
    salted_password: bytes, client_first_bare: str, server: ServerFirst
) -> tuple[str, bytes]:
    """(client-final message, the ServerSignature the server must answer with)."""
    without_proof = f"c=biws,r={server.nonce}"
    auth_message = f"{client_first_bare},{server.message},{without_proof}".encode()
    client_key = _hmac(salted_password, b"Client Key")
    signature = _hmac(hashlib.sha256(client_key).digest(), auth_message)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    server_signature = _hmac(_hmac(salted_password, b"Server Key"), auth_message)
    return f"{without_proof},p={_b64(proof)}", server_signature


def check_server_final(message: str, expected_signature: bytes) -> None:
    """Return when the server-final message carries the expected ServerSignature (the
    server holds this user's ServerKey); SASL_AUTHENTICATION_FAILED otherwise."""
    if message.startswith("e="):
        raise _fail(f"the server refused the login: {message[2:200]}")
    (signature_text,) = _attributes(message, "v", "server-final message")
    if not hmac.compare_digest(_b64decode(signature_text, "server signature"), expected_signature):
        raise _fail("the server's signature is wrong: it does not hold this user's keys")


# ----------------------------------------------------------------------------- server


@dataclass(frozen=True, slots=True)
class ClientFirst:
    """A client-first message as the server reads it."""

    user: str
    nonce: str
    bare: str
    gs2_header: str


def parse_client_first(message: str) -> ClientFirst:
    """The client-first message, checked (see the module docstring's scope)."""
    if len(message) > MESSAGE_CHARS_MAX:
        raise _fail(f"the client-first message is longer than {MESSAGE_CHARS_MAX} characters")
    header = message[:3]
    if header not in _GS2_HEADERS:
        if message.startswith("p="):
            raise _fail("channel binding is not supported: send the GS2 header 'n,,'")
        if message[:1] in ("n", "y") and message[1:3] != ",,":
            raise _fail("an authorization identity is not supported: send the GS2 header 'n,,'")
        raise _fail("the client-first message must start with the GS2 header 'n,,'")
    bare = message[3:]
    name, nonce = _attributes(bare, "nr", "client-first message")
    user = _unescape(name)
    check_user_name(user)
    return ClientFirst(user, _check_nonce(nonce, "client nonce"), bare, header)


def server_first(client_nonce: str, server_nonce: str, salt: bytes, iterations: int) -> str:
    """The server-first message."""
    return f"r={client_nonce}{server_nonce},s={_b64(salt)},i={iterations}"


def verify_client_final(
    credential: ScramCredential, client: ClientFirst, server_first_message: str, message: str
) -> str:
    """The server-final message when ``message`` proves the password of ``credential``;
    SASL_AUTHENTICATION_FAILED otherwise (the same words for every wrong proof)."""
    binding, nonce, proof_text = _attributes(message, "crp", "client-final message")
    if binding != _GS2_HEADERS[client.gs2_header]:
        raise _fail("the channel binding (c=) does not match the client-first GS2 header")
    combined = server_first_message[2 : server_first_message.index(",")]
    if not hmac.compare_digest(nonce.encode(), combined.encode()):
        raise _fail("the nonce of the client-final message is not the server's")
    proof = _b64decode(proof_text, "proof")
    if len(proof) != KEY_BYTES:
        raise _fail(f"the proof is {len(proof)} bytes, not {KEY_BYTES}")
    without_proof = message[: message.rindex(",p=")]
    auth_message = f"{client.bare},{server_first_message},{without_proof}".encode()
    signature = _hmac(credential.stored_key, auth_message)
    client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
    if not hmac.compare_digest(hashlib.sha256(client_key).digest(), credential.stored_key):
        raise _fail(
            f"authentication failed for user {client.user[:128]!r}: unknown user or wrong password"
        )
    return f"v={_b64(_hmac(credential.server_key, auth_message))}"
