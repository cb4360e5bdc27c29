"""SASL logins on the Kafka listener (``kafka_security_protocol = "SASL_PLAINTEXT"``):
Kafka's SaslHandshake (v1) then SaslAuthenticate (v0-v1), against the node's users and
with the same limits as the gRPC listener's logins.

- **PLAIN**: the client sends ``authzid NUL user NUL password`` (RFC 4616; an authzid
  must be empty or the user); the password is checked by ``PasswordChecks`` (its own
  threads, per-host limits, the failed-login delay).
- **SCRAM-SHA-256**: two SaslAuthenticate rounds carry the client-first and
  client-final messages; ``ScramLogins`` runs the server's half (the exchange's limits,
  unknown users refused like wrong passwords).

Before a login succeeds a connection may send only ApiVersions, SaslHandshake and
SaslAuthenticate, at most ``PRELOGIN_REQUESTS_MAX`` of them, each frame at most
``PRELOGIN_FRAME_BYTES_MAX``; anything else
closes it, as Kafka does (``refusal_before_login``). One SaslHandshake per connection: an
unsupported mechanism is answered UNSUPPORTED_SASL_MECHANISM (33), a second handshake
ILLEGAL_SASL_STATE (34), and either closes the connection after its answer, as Kafka
does. A failed login is answered SASL_AUTHENTICATION_FAILED (58) and the connection is
closed. The caller is then
``User:<name>`` with the credential it proved, so changing or removing the user ends what
the connection may do at its next request (the authorizer compares credentials).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from headwater.node.kafka import protocol
from headwater.node.security.authorizer import Caller
from headwater.node.security.password_checks import PasswordChecks
from headwater.node.security.sasl_service import ScramLogins
from headwater.shared.credentials import ScramCredential, authentication_failed
from headwater.shared.errors import HeadwaterError

PLAIN: Final = "PLAIN"
UNSUPPORTED_SASL_MECHANISM: Final = 33
ILLEGAL_SASL_STATE: Final = 34
SASL_AUTHENTICATION_FAILED: Final = 58
PLAIN_BYTES_MAX: Final = 4096
"""Longest PLAIN message taken (a user name and a password)."""
PRELOGIN_FRAME_BYTES_MAX: Final = 64 << 10
"""Largest request frame before a login (Kafka's ``sasl.server.max.receive.size``, 512 KiB
there for the Kerberos and OAuth tokens not served here; PLAIN and SCRAM take under
4 KiB). No larger than the listener's small frames, so that nothing a connection sends
before its login counts in the node's shared budget of request bytes."""
PRELOGIN_REQUESTS_MAX: Final = 8
"""Most requests a connection may send before its login succeeds (a login takes 3 or 4:
ApiVersions, perhaps again at a lower version, SaslHandshake, one or two
SaslAuthenticate)."""
_BEFORE_LOGIN: Final = frozenset(
    {protocol.API_VERSIONS, protocol.SASL_HANDSHAKE, protocol.SASL_AUTHENTICATE}
)


@dataclass(slots=True)
class SaslState:
    """One connection's login: the mechanism chosen, a SCRAM exchange under way, and the
    caller once logged in."""

    mechanism: str = ""
    exchange_id: str = ""
    caller: Caller | None = None
    requests_before_login: int = 0
    handshakes: int = 0


@dataclass(slots=True)
class KafkaSasl:
    """The logins of one node's Kafka listener."""

    mechanisms: tuple[str, ...]
    users: Callable[[], Mapping[str, ScramCredential]]
    passwords: PasswordChecks
    scram_logins: ScramLogins

    @staticmethod
    def refusal_before_login(state: SaslState, api_key: int, size: int) -> str | None:
        """Why a request of ``api_key`` in a frame of ``size`` bytes closes a connection
        that has not logged in (counting it), or None when it may be read."""
        if api_key not in _BEFORE_LOGIN:
            return f"api key {api_key} before a SASL login"
        if size > PRELOGIN_FRAME_BYTES_MAX:
            return (
                f"a request of {size} bytes before a SASL login (at most "
                f"{PRELOGIN_FRAME_BYTES_MAX})"
            )
        state.requests_before_login += 1
        if state.requests_before_login > PRELOGIN_REQUESTS_MAX:
            return f"more than {PRELOGIN_REQUESTS_MAX} requests before a SASL login"
        return None

    def handshake(self, state: SaslState, request: protocol.Request) -> tuple[Any, bool]:
        """(the answer, whether the connection must close after it)."""
        mechanism = request.body.mechanism
        schema = protocol.response_schema(request.api_key, request.api_version)
        state.handshakes += 1
        code = 0
        if state.caller is not None or state.handshakes > 1:
            code = ILLEGAL_SASL_STATE
        elif mechanism not in self.mechanisms:
            code = UNSUPPORTED_SASL_MECHANISM
        else:
            state.mechanism = mechanism
        answer = protocol.build(schema, error_code=code, mechanisms=list(self.mechanisms))
        return answer, code != 0

    async def authenticate(
        self, state: SaslState, request: protocol.Request, host: str
    ) -> tuple[Any, bool]:
        """(the answer, whether the connection must close after it)."""
        schema = protocol.response_schema(request.api_key, request.api_version)
        data = bytes(request.body.auth_bytes)
        try:
            if state.caller is not None or not state.mechanism:
                return (
                    protocol.build(
                        schema,
                        error_code=ILLEGAL_SASL_STATE,
                        error_message="SaslAuthenticate comes once, after SaslHandshake",
                    ),
                    True,
                )
            if state.mechanism == PLAIN:
                user, password = _plain(data)
                credential = await self.passwords.check(self.users(), user, password, host)
                state.caller = Caller(f"User:{user}", host, credential=credential)
                return protocol.build(schema, error_code=0, auth_bytes=b""), False
            if not state.exchange_id:
                state.exchange_id, server_first = self.scram_logins.begin(data.decode(), host)
                return protocol.build(schema, error_code=0, auth_bytes=server_first.encode()), False
            proved = await self.scram_logins.finish(state.exchange_id, data.decode(), host)
            state.exchange_id = ""
            state.caller = Caller(f"User:{proved.user}", host, credential=proved.credential)
            return (
                protocol.build(schema, error_code=0, auth_bytes=proved.server_final.encode()),
                False,
            )
        except (HeadwaterError, UnicodeDecodeError) as error:
            message = (
                error.message if isinstance(error, HeadwaterError) else "the login is not UTF-8"
            )
            return (
                protocol.build(
                    schema, error_code=SASL_AUTHENTICATION_FAILED, error_message=message
                ),
                True,
            )


def _plain(data: bytes) -> tuple[str, str]:
    """(user, password) of a PLAIN message; SASL_AUTHENTICATION_FAILED when malformed."""
    if len(data) > PLAIN_BYTES_MAX:
        raise authentication_failed(f"a PLAIN login of more than {PLAIN_BYTES_MAX} bytes")
    parts = data.split(b"\0")
    if len(parts) != 3:
        raise authentication_failed("a PLAIN login is authzid NUL user NUL password")
    authzid, user, password = (p.decode() for p in parts)
    if not user or (authzid and authzid != user):
        raise authentication_failed(
            "a PLAIN login names a user, and an authorization id only if it is that user"
        )
    return user, password
