"""The client's SCRAM sessions: log in on each node once, then present a token.

A channel to a node whose ``ClientSecurity`` has a username and the SCRAM-SHA-256
mechanism carries, on every call, ``authorization: Bearer <token>``, the token of a
session the channel got from that node's ``Sasl.Authenticate`` (``headwater.shared.scram``:
the password never travels; the node proves it holds the user's keys). The session is
made at the channel's first call, made again once ``RENEW_AT`` of its lifetime has
passed (after a failed renewal the old token is kept while it lasts, and the next
attempt waits ``RENEW_RETRY_S``), and forgotten when the
node refuses it (UNAUTHENTICATED: expired, the node restarted, the password changed),
so the next call logs in again. A unary call refused with SASL_SESSION_EXPIRED is made
once more at once with a new session; a stream that is refused fails with it
(retriable), and the client's retries make the next one. Streams keep the token they
started with.

PBKDF2 runs once per user, password, salt and iteration count in a process
(``SALTED_CACHED_MAX`` kept), not once per node or per renewal.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import grpc

from headwater.shared import scram
from headwater.shared.credentials import AUTHORIZATION_KEY, salted_password
from headwater.shared.errors import ErrorCode
from headwater.shared.grpc_channels import (
    AioStreamStreamInterceptor,
    AioUnaryStreamInterceptor,
    AioUnaryUnaryInterceptor,
    CallDetails,
)
from headwater.shared.grpc_errors import from_rpc_error
from headwater.v1 import headwater_pb2 as pb
from headwater.v1 import headwater_pb2_grpc as pb_grpc

RENEW_AT: Final = 0.75
RENEW_RETRY_S: Final = 5.0
"""After a failed renewal, the old token is used this long before the next attempt."""
LOGIN_TIMEOUT_S: Final = 15.0
SALTED_CACHED_MAX: Final = 64
SASL_METHOD_PREFIX: Final = "/headwater.v1.Sasl/"

_salted: dict[tuple[str, bytes, bytes, int], bytes] = {}
_salted_lock = threading.Lock()


def _salted_password(user: str, password: str, salt: bytes, iterations: int) -> bytes:
    key = (user, hashlib.sha256(password.encode()).digest(), salt, iterations)
    with _salted_lock:
        found = _salted.get(key)
    if found is not None:
        return found
    salted = salted_password(password, salt, iterations)
    with _salted_lock:
        if len(_salted) >= SALTED_CACHED_MAX:
            _salted.clear()
        _salted[key] = salted
    return salted


class ScramLogin:
    """One login's client half: the two requests, and the check of the last answer."""

    def __init__(self, user: str, password: str) -> None:
        self.user = user
        self.password = password
        self.nonce = secrets.token_urlsafe(24)
        first, self.bare = scram.client_first(user, self.nonce)
        self.first_request = pb.SaslAuthenticateRequest(mechanism=scram.MECHANISM, message=first)
        self.expected_signature = b""

    def final_request(self, answer: pb.SaslAuthenticateResponse) -> pb.SaslAuthenticateRequest:
        server = scram.parse_server_first(answer.message, self.nonce)
        salted = _salted_password(self.user, self.password, server.salt, server.iterations)
        message, self.expected_signature = scram.client_final(salted, self.bare, server)
        return pb.SaslAuthenticateRequest(exchange_id=answer.exchange_id, message=message)

    def session(self, answer: pb.SaslAuthenticateResponse) -> tuple[str, float]:
        """(token, lifetime in seconds), once the server's signature holds."""
        scram.check_server_final(answer.message, self.expected_signature)
        return answer.session_token, answer.session_lifetime_ms / 1000


class _Token:
    """A session token and when to renew it and when it ends (monotonic seconds)."""

    def __init__(self, token: str, lifetime_s: float, now: float) -> None:
        self.value = f"Bearer {token}"
        self.renew_at = now + lifetime_s * RENEW_AT
        self.ends_at = now + lifetime_s


class _Tokens:
    """What both kinds of session share: the current token and the choices around it
    (not thread-safe by itself: the callers hold their lock while logging in)."""

    def __init__(self, user: str, password: str, clock: Callable[[], float]) -> None:
        self.user = user
        self.password = password
        self.clock = clock
        self._token: _Token | None = None
        self.logins = 0

    def usable(self) -> str | None:
        """The current token's value while it needs no renewal."""
        token = self._token
        return token.value if token is not None and self.clock() < token.renew_at else None

    def logged_in(self, login: ScramLogin, final: pb.SaslAuthenticateResponse, began: float) -> str:
        self._token = _Token(*login.session(final), began)
        self.logins += 1
        return self._token.value

    def after_failure(self) -> str | None:
        """A login failed: the old token's value while it lasts (tried again after
        ``RENEW_RETRY_S``), else None."""
        token = self._token
        now = self.clock()
        if token is None or now >= token.ends_at:
            return None
        token.renew_at = now + RENEW_RETRY_S
        return token.value

    def forget(self, value: str) -> None:
        """The node refused ``value``: the next call logs in again."""
        token = self._token
        if token is not None and token.value == value:
            self._token = None


class Session(_Tokens):
    """A threaded channel's session (see the module docstring)."""

    def __init__(
        self, user: str, password: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(user, password, clock)
        self._lock = threading.Lock()

    def authorization(self, stub: pb_grpc.SaslStub, target: str) -> str:
        """The ``authorization`` value for a call, logging in first when needed."""
        value = self.usable()
        if value is not None:
            return value
        with self._lock:
            value = self.usable()
            if value is not None:
                return value
            login, began = ScramLogin(self.user, self.password), self.clock()
            try:
                first = stub.Authenticate(login.first_request, timeout=LOGIN_TIMEOUT_S)
                final = stub.Authenticate(login.final_request(first), timeout=LOGIN_TIMEOUT_S)
                return self.logged_in(login, final, began)
            except Exception as exc:
                value = self.after_failure()
                if value is not None:
                    return value
                if isinstance(exc, grpc.RpcError):
                    raise from_rpc_error(exc, target) from None
                raise


def _status_code(call: Any) -> grpc.StatusCode | None:
    """The status a finished threaded call ended with (an intercepted call that failed
    is a future whose exception holds it)."""
    try:
        failure: Any = call.exception() if isinstance(call, grpc.Future) else None
        source: Any = failure if failure is not None else call
        code = getattr(source, "code", None)
        return code() if callable(code) else None
    except Exception:  # a cancelled call has no status to read
        return None


def _session_expired(call: Any) -> bool:
    """Did a finished threaded call fail with SASL_SESSION_EXPIRED? (A call still running,
    a ``future()``'s, is not waited for.)"""
    if not isinstance(call, grpc.Future) or not call.done():
        return False
    try:
        failure = call.exception() if isinstance(call, grpc.Future) else None
    except Exception:  # cancelled
        return False
    return (
        isinstance(failure, grpc.RpcError)
        and from_rpc_error(failure, "").code is ErrorCode.SASL_SESSION_EXPIRED
    )


class SessionInterceptor(
    grpc.UnaryUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.UnaryStreamClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamUnaryClientInterceptor,  # type: ignore[type-arg]
    grpc.StreamStreamClientInterceptor,  # type: ignore[type-arg]
):
    """Adds the session's token to every call but the login's own."""

    def __init__(self, session: Session, login_stub: pb_grpc.SaslStub, target: str) -> None:
        self.session = session
        self.login_stub = login_stub
        self.target = target

    def _call(self, continuation: Any, details: Any, request: Any) -> Any:
        if str(details.method).startswith(SASL_METHOD_PREFIX):
            return continuation(details, request)
        value = self.session.authorization(self.login_stub, self.target)
        call = continuation(CallDetails(details, [(AUTHORIZATION_KEY, value)]), request)
        add_done_callback = getattr(call, "add_done_callback", None)
        if add_done_callback is not None:
            add_done_callback(lambda done: self._check(done, value))
        return call

    def _check(self, call: Any, value: str) -> None:
        if _status_code(call) == grpc.StatusCode.UNAUTHENTICATED:
            self.session.forget(value)

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        call = self._call(continuation, details, request)
        if _session_expired(call):
            return self._call(continuation, details, request)  # with a new session
        return call

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return self._call(continuation, details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)

    def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return self._call(continuation, details, requests)


def with_session(channel: grpc.Channel, target: str, user: str, password: str) -> grpc.Channel:
    """``channel`` with a SCRAM session for ``user`` on the node at ``target``."""
    session = Session(user, password)
    return grpc.intercept_channel(
        channel, SessionInterceptor(session, pb_grpc.SaslStub(channel), target)
    )


# ---------------------------------------------------------------------------- asyncio


class AioSession(_Tokens):
    """An asyncio channel's session: the same as ``Session``, logging in on the channel
    itself (the interceptors let the login's calls through)."""

    def __init__(
        self, user: str, password: str, target: str, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(user, password, clock)
        self.target = target
        self.channel: grpc.aio.Channel | None = None
        self._lock: asyncio.Lock | None = None
        self.checks: set[asyncio.Future[None]] = set()
        """The checks of ended calls still running (kept so they are not collected)."""

    async def authorization(self) -> str:
        value = self.usable()
        if value is not None:
            return value
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            value = self.usable()
            if value is not None:
                return value
            assert self.channel is not None, "the session's channel is set when it is made"
            stub = pb_grpc.SaslStub(self.channel)
            login, began = ScramLogin(self.user, self.password), self.clock()
            try:
                first = await stub.Authenticate(login.first_request, timeout=LOGIN_TIMEOUT_S)
                final = await stub.Authenticate(login.final_request(first), timeout=LOGIN_TIMEOUT_S)
                return self.logged_in(login, final, began)
            except Exception as exc:
                value = self.after_failure()
                if value is not None:
                    return value
                if isinstance(exc, grpc.RpcError):
                    raise from_rpc_error(exc, self.target) from None
                raise


class _AioSessionBase:
    def __init__(self, session: AioSession) -> None:
        self.session = session

    async def _details(self, details: Any) -> tuple[Any, str | None]:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if method.startswith(SASL_METHOD_PREFIX):
            return details, None
        value = await self.session.authorization()
        metadata = grpc.aio.Metadata(*(details.metadata or ()), (AUTHORIZATION_KEY, value))
        return (
            grpc.aio.ClientCallDetails(
                details.method,
                details.timeout,
                metadata,
                details.credentials,
                details.wait_for_ready,
            ),
            value,
        )

    def _watch(self, call: Any, value: str | None) -> Any:
        """``call``, whose end is checked: a refused token is forgotten (grpc.aio gives a
        call's status only to a coroutine, so the check is a task of its own)."""
        if value is not None:

            def ended(done: Any) -> None:
                check = asyncio.ensure_future(self._check(done, value))
                self.session.checks.add(check)
                check.add_done_callback(self.session.checks.discard)

            call.add_done_callback(ended)
        return call

    async def _check(self, call: Any, value: str) -> None:
        try:
            refused = await call.code() == grpc.StatusCode.UNAUTHENTICATED
        except Exception:  # a cancelled call has no status to read
            return
        if refused:
            self.session.forget(value)


class _AioSessionUnary(_AioSessionBase, AioUnaryUnaryInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        given = details
        details, value = await self._details(given)
        call = self._watch(await continuation(details, request), value)
        if value is None:
            return call
        try:
            await call
        except grpc.aio.AioRpcError as failure:
            if from_rpc_error(failure, "").code is not ErrorCode.SASL_SESSION_EXPIRED:
                return call
            self.session.forget(value)
            details, value = await self._details(given)  # with a new session
            return self._watch(await continuation(details, request), value)
        return call


class _AioSessionUnaryStream(_AioSessionBase, AioUnaryStreamInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        details, value = await self._details(details)
        return self._watch(await continuation(details, request), value)


class _AioSessionStream(_AioSessionBase, AioStreamStreamInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        details, value = await self._details(details)
        return self._watch(await continuation(details, requests), value)


def aio_session_interceptors(session: AioSession) -> list[Any]:
    """Interceptors for an asyncio channel with ``session`` (set ``session.channel`` to
    the channel once it is made)."""
    return [
        _AioSessionUnary(session),
        _AioSessionUnaryStream(session),
        _AioSessionStream(session),
    ]
