"""User credentials: SCRAM-SHA-256 salted keys, and the ``authorization`` call metadata (pure).

**Stored form.** A user's credential is SCRAM-SHA-256's (RFC 5802/7677), as Kafka keeps
it: a random salt, an iteration count, and two keys derived from the password::

    SaltedPassword = PBKDF2-HMAC-SHA256(password, salt, iterations)   (32 bytes)
    StoredKey      = SHA-256(HMAC-SHA256(SaltedPassword, "Client Key"))
    ServerKey      = HMAC-SHA256(SaltedPassword, "Server Key")

The client that sets a credential (``headwater users add``) computes SaltedPassword
itself and sends it with the salt and count; the cluster keeps only StoredKey and
ServerKey (``credential_from_salted``), in the metadata quorum. Neither the password nor
SaltedPassword is stored, and neither key lets anyone present the password.

**Presented form.** A client authenticates every call with the gRPC metadata key
``authorization``, value ``Basic <base64(user ":" password)>`` (HTTP Basic's form, RFC
7617), which a node checks against the stored keys (``verify_password``). The password
travels, so it must travel over TLS: a node refuses credentials on a plaintext
listener unless told otherwise (docs/security.md).

Limits: a user name of 1..``USER_NAME_CHARS_MAX`` characters without ``:`` or control
characters, a password of at most ``PASSWORD_BYTES_MAX`` bytes, a salt of
``SALT_BYTES_MIN``..``SALT_BYTES_MAX`` bytes, ``ITERATIONS_MIN``..``ITERATIONS_MAX``
iterations, and an ``authorization`` value of at most ``AUTHORIZATION_CHARS_MAX``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass
from typing import Final

from headwater.shared.errors import ErrorCode, HeadwaterError

MECHANISM: Final = "SCRAM-SHA-256"
AUTHORIZATION_KEY: Final = "authorization"
ITERATIONS_DEFAULT: Final = 4096
ITERATIONS_MIN: Final = 4096
ITERATIONS_MAX: Final = 65536
SALT_BYTES_MIN: Final = 16
SALT_BYTES_MAX: Final = 64
SALT_BYTES_DEFAULT: Final = 32
KEY_BYTES: Final = 32
USER_NAME_CHARS_MAX: Final = 128
PASSWORD_BYTES_MAX: Final = 1024
AUTHORIZATION_CHARS_MAX: Final = 2048
USERS_MAX: Final = 10_000


@dataclass(frozen=True, slots=True)
class ScramCredential:
    """What the cluster keeps of one user's password (see the module docstring)."""

    iterations: int
    salt: bytes
    stored_key: bytes
    server_key: bytes
    mechanism: str = MECHANISM


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_REQUEST, message)


def check_user_name(name: str) -> str:
    """``name`` if it is a valid user name; INVALID_REQUEST naming the rule otherwise."""
    if not 1 <= len(name) <= USER_NAME_CHARS_MAX or ":" in name or name == "*":
        raise _invalid(
            f"user name {name[:80]!r}: 1..{USER_NAME_CHARS_MAX} characters, without ':', "
            "and not '*'"
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise _invalid("a user name may not hold control characters")
    return name


def salted_password(password: str, salt: bytes, iterations: int) -> bytes:
    """SCRAM's SaltedPassword: PBKDF2-HMAC-SHA256 of the UTF-8 password."""
    data = password.encode()
    if len(data) > PASSWORD_BYTES_MAX:
        raise _invalid(f"a password is at most {PASSWORD_BYTES_MAX} bytes, not {len(data)}")
    return hashlib.pbkdf2_hmac("sha256", data, salt, iterations)


def new_salted_password(
    password: str, iterations: int = ITERATIONS_DEFAULT, salt: bytes | None = None
) -> tuple[bytes, bytes]:
    """(salt, SaltedPassword) for a new credential, with a random salt unless given: what
    a client sends to set a user's credential."""
    check_iterations(iterations)
    salt = os.urandom(SALT_BYTES_DEFAULT) if salt is None else salt
    return salt, salted_password(password, salt, iterations)


def check_iterations(iterations: int) -> int:
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise _invalid(f"iterations {iterations}: {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    return iterations


def credential_from_salted(salted: bytes, salt: bytes, iterations: int) -> ScramCredential:
    """The stored credential for a SaltedPassword, checking each part's bounds."""
    check_iterations(iterations)
    if not SALT_BYTES_MIN <= len(salt) <= SALT_BYTES_MAX:
        raise _invalid(f"a salt is {SALT_BYTES_MIN}..{SALT_BYTES_MAX} bytes, not {len(salt)}")
    if len(salted) != KEY_BYTES:
        raise _invalid(f"a salted password is {KEY_BYTES} bytes, not {len(salted)}")
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return ScramCredential(
        iterations,
        salt,
        hashlib.sha256(client_key).digest(),
        hmac.new(salted, b"Server Key", hashlib.sha256).digest(),
    )


def verify_password(credential: ScramCredential, password: str) -> bool:
    """True when ``password`` is the one ``credential`` was made from (constant time in
    the comparison; the cost is the PBKDF2 iterations)."""
    try:
        salted = salted_password(password, credential.salt, credential.iterations)
    except HeadwaterError:
        return False
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    return hmac.compare_digest(hashlib.sha256(client_key).digest(), credential.stored_key)


def authorization_value(user: str, password: str) -> str:
    """The ``authorization`` metadata value a client sends with every call."""
    check_user_name(user)
    encoded = base64.b64encode(f"{user}:{password}".encode()).decode()
    return f"Basic {encoded}"


def authentication_failed(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.SASL_AUTHENTICATION_FAILED, message)


def parse_authorization(value: str) -> tuple[str, str]:
    """(user, password) of an ``authorization`` value; SASL_AUTHENTICATION_FAILED naming
    the expected form when it is not one."""
    if len(value) > AUTHORIZATION_CHARS_MAX:
        raise authentication_failed(
            f"the authorization metadata is longer than {AUTHORIZATION_CHARS_MAX} characters"
        )
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic":
        raise authentication_failed(
            "the authorization metadata must be 'Basic <base64(user:password)>'"
        )
    try:
        # Non-ASCII text raises ValueError, bad base64 binascii.Error and a decoded value
        # that is not UTF-8 UnicodeDecodeError: all three are ValueErrors.
        text = base64.b64decode(encoded.strip(), validate=True).decode()
    except ValueError:
        raise authentication_failed(
            "the authorization metadata is not base64 of UTF-8 'user:password'"
        ) from None
    user, colon, password = text.partition(":")
    if not colon or not user:
        raise authentication_failed("the authorization metadata must hold 'user:password'")
    return user, password
