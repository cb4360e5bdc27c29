"""The Sasl service: SCRAM-SHA-256 logins on the client listener (proto ``Sasl``).

``Authenticate`` runs the server's half of ``headwater.shared.scram`` in two calls and, when
the client's proof holds, makes a session (``headwater.node.security.sessions``). It needs no
credentials itself, and it costs the node no PBKDF2 (the client derives the keys): a
proof is checked with two HMACs and a hash.

Limits and rules:
- an unfinished exchange lives ``EXCHANGE_TTL_S`` on this node and may be finished only
  from the host that began it; a host (an IPv4 address or IPv6 /64) holds at most
  ``EXCHANGES_PER_HOST_MAX`` (more: THROTTLING_QUOTA_EXCEEDED, retriable), the node
  ``EXCHANGES_MAX``: when it is full, a host holding fewer than the fullest host takes
  the place of that host's oldest exchange, so hosts that flood the node together
  cannot keep another host from logging in;
- an unknown user gets a server-first message like a real one: a salt derived from the
  cluster secret and the name (the same every time) and the default iteration count,
  and is refused at the proof like a wrong password, so the exchange does not tell who
  exists;
- a wrong proof is SASL_AUTHENTICATION_FAILED, answered ``FAILED_LOGIN_DELAY_S`` late,
  counted and logged with the host as a refused password is
  (``PasswordChecks.refused``);
- on a plaintext listener logins are refused unless ``credentials_over_plaintext`` is
  ``allow`` (a token seen on the network can be replayed), and when
  ``sasl_enabled_mechanisms`` leaves SCRAM-SHA-256 out.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import grpc

from headwater.node.config import NodeConfig
from headwater.node.rpc.call_hooks import rpc_handler
from headwater.node.security.authorizer import host_of_peer
from headwater.node.security.password_checks import FAILED_LOGIN_DELAY_S, PasswordChecks, host_key
from headwater.node.security.sessions import Sessions
from headwater.raft.metadata.image import MetadataImage
from headwater.shared import scram
from headwater.shared.credentials import (
    ITERATIONS_DEFAULT,
    KEY_BYTES,
    SALT_BYTES_DEFAULT,
    ScramCredential,
    authentication_failed,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

EXCHANGE_TTL_S: Final = 30.0
EXCHANGES_PER_HOST_MAX: Final = 8
EXCHANGES_MAX: Final = 4096
EXCHANGE_ID_CHARS_MAX: Final = 64
SERVER_NONCE_BYTES: Final = 18


@dataclass(frozen=True, slots=True)
class _Exchange:
    host: str
    key: str
    client: scram.ClientFirst
    credential: ScramCredential | None
    server_first: str
    expires_at: float


class SaslService(pb_grpc.SaslServicer):
    """See the module docstring."""

    def __init__(
        self,
        config: NodeConfig,
        sessions: Sessions,
        logins: ScramLogins,
    ) -> None:
        self.enabled = scram.MECHANISM in config.sasl_enabled_mechanisms.split(",")
        self.plaintext_refused = not config.tls and config.credentials_over_plaintext != "allow"
        self.lifetime_s = config.sasl_session_lifetime_ms / 1000
        self.sessions = sessions
        self.logins = logins

    @rpc_handler
    async def Authenticate(
        self, request: pb.SaslAuthenticateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.SaslAuthenticateResponse:
        if not self.enabled:
            raise authentication_failed(
                "SCRAM-SHA-256 is not enabled on this node (sasl_enabled_mechanisms)"
            )
        if self.plaintext_refused:
            raise authentication_failed(
                "logins over a plaintext listener are refused (a session token would cross "
                "the network in the clear): connect with TLS, or set "
                "credentials_over_plaintext = allow on the node"
            )
        host = host_of_peer(context.peer())
        if not request.exchange_id:
            if request.mechanism != scram.MECHANISM:
                raise authentication_failed(
                    f"mechanism {request.mechanism[:40]!r} is not supported: use {scram.MECHANISM}"
                )
            exchange_id, server_first = self.logins.begin(request.message, host)
            return pb.SaslAuthenticateResponse(message=server_first, exchange_id=exchange_id)
        proved = await self.logins.finish(request.exchange_id, request.message, host)
        token = self.sessions.create(proved.user, proved.credential, self.lifetime_s)
        return pb.SaslAuthenticateResponse(
            message=proved.server_final,
            session_token=token,
            session_lifetime_ms=int(self.lifetime_s * 1000),
        )


@dataclass(frozen=True, slots=True)
class Proved:
    """A finished SCRAM login: the server's last message, the user and the credential
    its proof matched."""

    server_final: str
    user: str
    credential: ScramCredential


class ScramLogins:
    """The server's half of SCRAM-SHA-256 exchanges for every front (the gRPC Sasl
    service, Kafka's SaslAuthenticate), with the limits of the module docstring."""

    def __init__(
        self,
        image: Callable[[], MetadataImage],
        passwords: PasswordChecks,
        secret: bytes,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.image = image
        self.passwords = passwords
        self.clock = clock
        self._stand_in_key = hmac.new(secret, b"headwater scram stand-in", hashlib.sha256).digest()
        self._exchanges: dict[str, _Exchange] = {}
        self._per_host: dict[str, int] = {}

    def begin(self, client_first: str, host: str) -> tuple[str, str]:
        """(exchange id, server-first message) for a client-first message from ``host``."""
        client = scram.parse_client_first(client_first)
        self._forget_expired()
        key = host_key(host)
        held = self._per_host.get(key, 0)
        if held >= EXCHANGES_PER_HOST_MAX or (
            len(self._exchanges) >= EXCHANGES_MAX and not self._make_room_for(key)
        ):
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"host {host} holds {held} unfinished logins (at most {EXCHANGES_PER_HOST_MAX}), "
                f"the node {len(self._exchanges)} (at most {EXCHANGES_MAX}); finish one or "
                f"wait {EXCHANGE_TTL_S:.0f} s",
            )
        credential = self.image().users.get(client.user)
        salt, iterations = (
            (credential.salt, credential.iterations)
            if credential is not None
            else (self._stand_in_salt(client.user), ITERATIONS_DEFAULT)
        )
        server_first = scram.server_first(
            client.nonce, secrets.token_urlsafe(SERVER_NONCE_BYTES), salt, iterations
        )
        exchange_id = secrets.token_urlsafe(24)
        self._exchanges[exchange_id] = _Exchange(
            host, key, client, credential, server_first, self.clock() + EXCHANGE_TTL_S
        )
        self._per_host[key] = held + 1
        return exchange_id, server_first

    async def finish(self, exchange_id: str, client_final: str, host: str) -> Proved:
        """Check the client-final message of exchange ``exchange_id`` from ``host``:
        the proof's user and credential, or SASL_AUTHENTICATION_FAILED (late)."""
        exchange = (
            self._exchanges.get(exchange_id) if len(exchange_id) <= EXCHANGE_ID_CHARS_MAX else None
        )
        if (
            exchange is None
            or exchange.expires_at <= self.clock()
            or exchange.key != host_key(host)
        ):
            raise authentication_failed(
                "no unfinished login with this exchange_id from this host on this node (it "
                f"lives {EXCHANGE_TTL_S:.0f} s): start again"
            )
        self._drop(exchange_id, exchange)
        credential = exchange.credential
        current = self.image().users.get(exchange.client.user)
        try:
            proved = current if credential is not None and current == credential else None
            server_final = scram.verify_client_final(
                proved or self._stand_in(exchange.client.user),
                exchange.client,
                exchange.server_first,
                client_final,
            )
            if proved is None:
                raise authentication_failed("unknown user or wrong password")
        except HeadwaterError as error:
            if error.code is ErrorCode.SASL_AUTHENTICATION_FAILED:
                self.passwords.refused(host, exchange.client.user)
                await asyncio.sleep(FAILED_LOGIN_DELAY_S)
                raise authentication_failed(
                    f"authentication failed for user {exchange.client.user[:128]!r}: unknown "
                    "user or wrong password"
                ) from None
            raise
        return Proved(server_final, exchange.client.user, proved)

    def _stand_in_salt(self, user: str) -> bytes:
        return hmac.new(self._stand_in_key, user.encode(), hashlib.sha256).digest()[
            :SALT_BYTES_DEFAULT
        ]

    def _stand_in(self, user: str) -> ScramCredential:
        """Keys no proof matches (random), for an unknown user's exchange."""
        return ScramCredential(
            ITERATIONS_DEFAULT,
            self._stand_in_salt(user),
            secrets.token_bytes(KEY_BYTES),
            secrets.token_bytes(KEY_BYTES),
        )

    def _drop(self, exchange_id: str, exchange: _Exchange) -> None:
        self._exchanges.pop(exchange_id, None)
        left = self._per_host.get(exchange.key, 1) - 1
        if left > 0:
            self._per_host[exchange.key] = left
        else:
            self._per_host.pop(exchange.key, None)

    def _make_room_for(self, key: str) -> bool:
        """The node holds ``EXCHANGES_MAX`` exchanges: drop the oldest of the host that
        holds the most, if that is more than host ``key`` holds; True when room was
        made."""
        fullest = max(self._per_host, key=self._per_host.__getitem__, default=None)
        if fullest is None or self._per_host[fullest] <= self._per_host.get(key, 0):
            return False
        for exchange_id, exchange in self._exchanges.items():
            if exchange.key == fullest:
                self._drop(exchange_id, exchange)
                return True
        return False

    def _forget_expired(self) -> None:
        now = self.clock()
        if not self._exchanges or next(iter(self._exchanges.values())).expires_at > now:
            return  # kept in creation order: the first is the oldest
        for exchange_id, exchange in list(self._exchanges.items()):
            if exchange.expires_at > now:
                break
            self._drop(exchange_id, exchange)
