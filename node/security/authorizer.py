"""Who is calling, and may they: authentication of client calls and the authorizer.

**Authentication** (``Authenticate``, a server interceptor on the client listener) names
the caller of every call, before its handler runs, as a ``Caller`` (principal and host)
kept in the ``CALLER`` context variable for the call's task:

1. a call with ``authorization: Bearer <token>`` is the user of the session the token
   names (``headwater.node.security.sessions``, made by a SCRAM login on this node,
   ``headwater.node.security.sasl_service``); an unknown, expired or outdated token is refused with
   SASL_SESSION_EXPIRED (retriable: log in again). A call with ``authorization: Basic``
   (``headwater.shared.credentials``; only where ``sasl_enabled_mechanisms`` has PLAIN) is the
   user it names, if the password matches the user's stored SCRAM keys; otherwise it is refused
   with SASL_AUTHENTICATION_FAILED (UNAUTHENTICATED), which does not say whether the user
   exists. On a plaintext listener credentials are refused unless
   ``credentials_over_plaintext`` is ``allow``. A password once verified is remembered
   (keyed by a SHA-256 of it, never the password) until the user's credential changes,
   so PBKDF2 runs once per user and password, not per call. Checks run in threads of
   their own, bounded per host and per node, fair between hosts, each as costly as the
   most costly user's, a failure answered late (``headwater.node.security.password_checks``): so
   guessing can take neither the event loop nor replication's threads, lock no one out,
   and not tell which users exist. The caller keeps the credential it was checked
   against: once the user's credential changes or the user is deleted, the caller's
   next authorization (each message of a stream) is refused with
   SASL_AUTHENTICATION_FAILED, which ends its open streams;
2. otherwise a call over mutual TLS is the principal its certificate names by
   ``tls_principal_mapping``;
3. otherwise it is ``User:ANONYMOUS``.

The host is the peer's IP address. The inter-broker listener's calls (``TrustMembers``)
come from nodes that proved the cluster secret (and their certificate, with TLS): they
carry requests a node has already authorized, and are trusted.

**Authorization** (``Authorizer``): with ``authorizer`` ``acl``, each handler asks
``require`` (or ``allows``, to filter a list) before it acts, naming the operation and
the resource; the decision is ``headwater.shared.acls``' (deny wins, then allow, else deny),
except that super users and trusted callers are always allowed. With ``authorizer``
``none`` everything is allowed. A denial is TOPIC_ / GROUP_ / CLUSTER_AUTHORIZATION_FAILED
(PERMISSION_DENIED) naming the principal, operation and resource, and is the same whether
or not the resource exists. Denials are logged at most ``AUDIT_LINES_PER_S`` a second
(with a count of the rest) and counted in ``denied``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from headwater.node.config import NodeConfig
from headwater.node.rpc.call_hooks import HooksInterceptor, service_and_method
from headwater.node.security.host_rates import HostRates
from headwater.node.security.password_checks import PasswordChecks
from headwater.node.security.sessions import Sessions
from headwater.raft.metadata.image import MetadataImage
from headwater.shared.acls import (
    CLUSTER_RESOURCE,
    AclIndex,
    Operation,
    ResourceType,
    normalize_host,
)
from headwater.shared.credentials import (
    AUTHORIZATION_KEY,
    ScramCredential,
    authentication_failed,
    parse_authorization,
)
from headwater.shared.errors import ErrorCode, HeadwaterError

_log = logging.getLogger(__name__)
ANONYMOUS: Final = "User:ANONYMOUS"
AUDIT_LINES_PER_S: Final = 5
CLIENT_ID_KEY: Final = "client-id"
CLIENT_ID_CHARS_MAX: Final = 255
UNAUTHENTICATED_SERVICES: Final = frozenset({"grpc.health.v1.Health", "headwater.v1.Sasl"})
"""Services that need no identity: health checks carry no credentials, and logging in is
how a caller gets one."""
BEARER: Final = "bearer"
BASIC: Final = "basic"
PLAIN: Final = "PLAIN"


@dataclass(frozen=True, slots=True)
class Caller:
    principal: str
    host: str
    trusted: bool = False
    """A node of the cluster on the inter-broker listener: every call is allowed."""
    client_id: str = ""
    """The ``client-id`` call metadata (quotas by client id); '' when not sent."""
    credential: ScramCredential | None = None
    """The credential a user's password was checked against (None: no password)."""


TRUSTED_MEMBER: Final = Caller("User:headwater-node", "", trusted=True)
CALLER: contextvars.ContextVar[Caller | None] = contextvars.ContextVar(
    "headwater_caller", default=None
)
"""The caller of the call the current task serves (None outside a call: anonymous)."""


def current_caller() -> Caller:
    return CALLER.get() or Caller(ANONYMOUS, "")


@functools.lru_cache(maxsize=4096)
def host_of_peer(peer: str) -> str:
    """The IP address of a grpc peer string, in the canonical form ACL hosts are kept in
    (``headwater.shared.acls.normalize_host``): "ipv4:10.0.0.5:51234" -> "10.0.0.5",
    "ipv6:[::1]:51234" -> "::1", "ipv6:[::ffff:10.0.0.5]:1" -> "10.0.0.5"; anything else
    (a unix socket) as it is. Remembered per peer (one per connection), since every call
    asks."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer
    text = rest.rpartition(":")[0].strip("[]")
    try:
        return normalize_host(text)
    except HeadwaterError:
        return text


_CERTIFICATE_KEYS: Final = {
    "cn": "x509_common_name",
    "subject": "x509_subject",
    "san_dns": "peer_dns",
    "san_uri": "peer_uri",
    "san_email": "peer_email",
}


def certificate_principal(auth_context: dict[str, list[bytes]], mapping: str) -> str | None:
    """``User:<name>`` from a verified client certificate's properties in a grpc auth
    context, by ``tls_principal_mapping``; None when the call has no client certificate;
    SASL_AUTHENTICATION_FAILED when the certificate lacks the part the mapping names."""
    if not auth_context.get("x509_pem_cert") and not auth_context.get("x509_subject"):
        return None
    values = auth_context.get(_CERTIFICATE_KEYS[mapping]) or []
    if not values:
        raise authentication_failed(
            f"the client certificate has no {mapping} to name its principal (tls_principal_mapping)"
        )
    return "User:" + values[0].decode(errors="replace")


@dataclass(frozen=True, slots=True)
class _Login:
    """A call whose password must be checked (PBKDF2) before it has a caller."""

    caller: Caller
    user: str
    password: str


SEEN_CONNECTIONS_MAX: Final = 100_000
SEEN_CONNECTION_IDLE_S: Final = 300.0


class ConnectionRate:
    """New connections a second per client host, at most ``per_host_max`` (see
    ``connection_rate_per_host_max``; ``HostRates``, as on the Kafka listener). A
    connection is known by its gRPC peer (address and port); it is new at its first call.
    A refused connection is not remembered, so each of its calls is refused until the
    host has room again. Connections idle for ``SEEN_CONNECTION_IDLE_S`` are forgotten
    once ``SEEN_CONNECTIONS_MAX`` are known (such a connection counts as new again at its
    next call)."""

    def __init__(self, per_host_max: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_host_max = per_host_max
        self.clock = clock
        self.seen: dict[str, float] = {}
        self.opened = HostRates(per_host_max)

    def admit(self, peer: str, host: str) -> None:
        now = self.clock()
        if peer in self.seen:
            self.seen[peer] = now
            return
        if self.opened.take(host, now) > 0:
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"host {host} opened more than {self.per_host_max} connections this second "
                "(connection_rate_per_host_max); retry in a second, or reuse connections",
            )
        if len(self.seen) >= SEEN_CONNECTIONS_MAX:
            self.seen = {p: t for p, t in self.seen.items() if now - t < SEEN_CONNECTION_IDLE_S}
        self.seen[peer] = now


class Authenticate(HooksInterceptor):
    """Names the caller of each client-listener call (see the module docstring)."""

    def __init__(
        self,
        config: NodeConfig,
        image: Callable[[], MetadataImage],
        request_delay_s: Callable[[Caller], float] | None = None,
        on_failed_login: Callable[[], None] | None = None,
    ) -> None:
        """``request_delay_s``: the seconds to hold a caller's call back for its request
        quota (``headwater.node.core.throttling``); None: no request quotas.
        ``on_failed_login``: called for each refused password (a metric)."""
        super().__init__()
        self.image = image
        self.request_delay_s = request_delay_s
        self.tls = config.tls
        self.plaintext_credentials = config.credentials_over_plaintext == "allow"
        self.mapping = config.tls_principal_mapping
        self.client_certificates = config.tls_client_auth == "required"
        self.passwords = PasswordChecks(on_failed_login)
        self.sessions = Sessions()
        self.plain_enabled = PLAIN in config.sasl_enabled_mechanisms.split(",")
        self.connections = (
            ConnectionRate(config.connection_rate_per_host_max)
            if config.connection_rate_per_host_max
            else None
        )

    def skip(self, method: str) -> bool:
        return service_and_method(method)[0] in UNAUTHENTICATED_SERVICES

    def identify(self, context: Any) -> Caller | _Login:
        peer = context.peer()
        host = host_of_peer(peer)
        if self.connections is not None:
            self.connections.admit(peer, host)
        value = None
        client_id = ""
        for key, found in context.invocation_metadata() or ():
            if key == AUTHORIZATION_KEY:
                value = found.decode() if isinstance(found, bytes) else str(found)
            elif key == CLIENT_ID_KEY:
                client_id = found.decode() if isinstance(found, bytes) else str(found)
                if len(client_id) > CLIENT_ID_CHARS_MAX:
                    raise HeadwaterError(
                        ErrorCode.INVALID_REQUEST,
                        f"the client-id metadata is longer than {CLIENT_ID_CHARS_MAX} characters",
                    )
        if value is not None:
            if not self.tls and not self.plaintext_credentials:
                raise authentication_failed(
                    "credentials over a plaintext listener are refused (they would cross the "
                    "network in the clear): connect with TLS, or set "
                    "credentials_over_plaintext = allow on the node"
                )
            scheme, _, token = value.partition(" ")
            if scheme.lower() == BEARER:
                return self._session_caller(token.strip(), host, client_id)
            if not self.plain_enabled and scheme.lower() == BASIC:
                raise authentication_failed(
                    "a password with every call (authorization: Basic) is not enabled on "
                    "this node (sasl_enabled_mechanisms): log in with SCRAM-SHA-256 "
                    "(Sasl.Authenticate) and present the session token as "
                    "'authorization: Bearer <token>'"
                )
            user, password = parse_authorization(value)
            caller = Caller(f"User:{user}", host, client_id=client_id)
            credential = self.passwords.known(self.image().users, user, password)
            if credential is not None:
                return dataclasses.replace(caller, credential=credential)
            return _Login(caller, user, password)
        if self.client_certificates:
            principal = certificate_principal(context.auth_context(), self.mapping)
            if principal is not None:
                return Caller(principal, host, client_id=client_id)
        return Caller(ANONYMOUS, host, client_id=client_id)

    def _session_caller(self, token: str, host: str, client_id: str) -> Caller:
        session = self.sessions.find(token, self.image().users)
        if session is None:
            raise HeadwaterError(
                ErrorCode.SASL_SESSION_EXPIRED,
                "this node holds no session for the token (it expired, its user's "
                "credential changed, or the node restarted): log in again",
            )
        return Caller(
            f"User:{session.user}", host, client_id=client_id, credential=session.credential
        )

    def started(
        self, context: Any
    ) -> contextvars.Token[Caller | None] | Awaitable[contextvars.Token[Caller | None]]:
        found = self.identify(context)
        if isinstance(found, _Login):
            return self._log_in(found)
        return self._begin(found)

    async def _log_in(self, login: _Login) -> contextvars.Token[Caller | None]:
        credential = await self.passwords.check(
            self.image().users, login.user, login.password, login.caller.host
        )
        begun = self._begin(dataclasses.replace(login.caller, credential=credential))
        return await begun if inspect.isawaitable(begun) else begun

    def _begin(
        self, caller: Caller
    ) -> contextvars.Token[Caller | None] | Awaitable[contextvars.Token[Caller | None]]:
        token = CALLER.set(caller)
        delay = self.request_delay_s(caller) if self.request_delay_s is not None else 0.0
        if delay <= 0:
            return token
        return _after(delay, token)

    def ended(self, token: contextvars.Token[Caller | None], _error: Any, _context: Any) -> None:
        reset_caller(token)


def reset_caller(token: contextvars.Token[Caller | None]) -> None:
    """Undo a call's ``CALLER.set``. A stream the client cancelled is closed by the event
    loop's async-generator finalizer, in a task and context of its own: ``reset`` raises
    ValueError there (the token belongs to the call's context). That context ended with
    the call's task, so there is nothing left to restore."""
    with contextlib.suppress(ValueError):
        CALLER.reset(token)


async def _after(delay_s: float, token: contextvars.Token[Caller | None]) -> Any:
    """``token`` after ``delay_s``: a call over its request quota starts late."""
    await asyncio.sleep(delay_s)
    return token


class TrustMembers(HooksInterceptor):
    """Marks every call on the inter-broker listener as a trusted cluster member's (the
    listener's other interceptors have checked the cluster secret already)."""

    def started(self, _context: Any) -> contextvars.Token[Caller | None]:
        return CALLER.set(TRUSTED_MEMBER)

    def ended(self, token: contextvars.Token[Caller | None], _error: Any, _context: Any) -> None:
        reset_caller(token)


_DENIED_CODE: Final = {
    ResourceType.TOPIC: ErrorCode.TOPIC_AUTHORIZATION_FAILED,
    ResourceType.GROUP: ErrorCode.GROUP_AUTHORIZATION_FAILED,
    ResourceType.CLUSTER: ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
}


class Authorizer:
    """The decision for the current call's caller (see the module docstring)."""

    def __init__(
        self,
        config: NodeConfig,
        image: Callable[[], MetadataImage],
        on_denied: Callable[[Operation, ResourceType], None] | None = None,
    ) -> None:
        self.enabled = config.authorizer == "acl"
        self.super_users = config.super_user_set
        self.image = image
        self.on_denied = on_denied
        self._index = AclIndex()
        self.denied = 0
        self._audit_second = 0
        self._audit_lines = 0
        self._audit_suppressed = 0

    def index(self) -> AclIndex:
        acls = self.image().acls
        if self._index.acls is not acls:
            self._index = AclIndex(acls)
            self._index.acls = acls  # the image's own set: rebuilt only when it changes
        return self._index

    def allows(self, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        """May the current caller perform ``operation`` on the resource? (No audit: for
        filtering lists, where what is left out is not a refusal.) SASL_AUTHENTICATION_FAILED
        when the caller's credential is no longer the user's (see the module docstring)."""
        caller = current_caller()
        if caller.credential is not None:
            self._check_credential(caller)
        if not self.enabled:
            return True
        if caller.trusted or caller.principal in self.super_users:
            return True
        return self.index().allows(caller.principal, caller.host, operation, resource_type, name)

    def _check_credential(self, caller: Caller) -> None:
        user = caller.principal.removeprefix("User:")
        # By value: a snapshot restored on a follower makes new objects of the same keys.
        if self.image().users.get(user) != caller.credential:
            raise authentication_failed(
                f"the credential of user {user[:128]!r} was changed or deleted after this call "
                "logged in: log in again"
            )

    def require(self, operation: Operation, resource_type: ResourceType, name: str) -> None:
        """Raise the resource type's AUTHORIZATION_FAILED unless the current caller may
        perform ``operation`` on the resource."""
        if self.allows(operation, resource_type, name):
            return
        caller = current_caller()
        self._audit(caller, operation, resource_type, name)
        what = (
            "the cluster"
            if resource_type is ResourceType.CLUSTER
            else (f"{resource_type.value} {name[:255]!r}")
        )
        raise HeadwaterError(
            _DENIED_CODE[resource_type],
            f"principal {caller.principal} (host {caller.host or '?'}) may not "
            f"{operation.value} {what}: no ACL allows it",
        )

    def require_cluster(self, operation: Operation) -> None:
        self.require(operation, ResourceType.CLUSTER, CLUSTER_RESOURCE)

    def require_any(
        self, operation: Operation, alternatives: Iterable[tuple[ResourceType, str]]
    ) -> None:
        """Allowed when ``operation`` is allowed on any of ``alternatives``; otherwise the
        first one's denial."""
        first: tuple[ResourceType, str] | None = None
        for resource_type, name in alternatives:
            if self.allows(operation, resource_type, name):
                return
            first = first or (resource_type, name)
        if first is not None:
            self.require(operation, *first)

    def visible(self, resource_type: ResourceType, names: Iterable[str]) -> list[str]:
        """The names among ``names`` the current caller may describe."""
        if not self.enabled:
            return list(names)
        return [n for n in names if self.allows(Operation.DESCRIBE, resource_type, n)]

    def _audit(
        self, caller: Caller, operation: Operation, resource_type: ResourceType, name: str
    ) -> None:
        self.denied += 1
        if self.on_denied is not None:
            self.on_denied(operation, resource_type)
        second = int(time.monotonic())
        if second != self._audit_second:
            if self._audit_suppressed:
                _log.warning("%d more denied requests not logged", self._audit_suppressed)
            self._audit_second, self._audit_lines, self._audit_suppressed = second, 0, 0
        if self._audit_lines >= AUDIT_LINES_PER_S:
            self._audit_suppressed += 1
            return
        self._audit_lines += 1
        _log.warning(
            "denied: principal=%r host=%s operation=%s resource=%s:%r",
            caller.principal,
            caller.host,
            operation.value,
            resource_type.value,
            name[:255],
        )
