"""Session tokens from SCRAM logins, in a node's memory.

A successful SCRAM exchange (``headwater.node.security.sasl_service``) makes a session: a
random token (32 bytes, URL-safe base64) the client presents as ``authorization: Bearer <token>``,
good on this node for ``sasl_session_lifetime_ms``. The node keeps a SHA-256 of each
token, never the token, with the user and the credential the login proved.

Invariants:
- a token names a session only while it is unexpired and its user's credential equals
  the one it was made with (by value: a snapshot restored on a follower rebuilds every
  credential as a new object): ``find`` gives None otherwise (and forgets it), so a deleted
  user or a changed password ends every session made before;
- at most ``SESSIONS_MAX`` sessions are held; when full, expired ones are forgotten and,
  if none has expired, the new login is refused (THROTTLING_QUOTA_EXCEEDED, retriable);
  a user holds at most ``SESSIONS_PER_USER_MAX`` (its oldest is forgotten for a new one).

Sessions do not survive a restart and are not shared between nodes: a client logs in
on each node it calls (the project's clients do, per channel).
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

from headwater.shared.credentials import ScramCredential
from headwater.shared.errors import ErrorCode, HeadwaterError

SESSIONS_MAX: Final = 65_536
SESSIONS_PER_USER_MAX: Final = 1024
TOKEN_BYTES: Final = 32
TOKEN_CHARS_MAX: Final = 64


@dataclass(frozen=True, slots=True)
class Session:
    user: str
    credential: ScramCredential
    expires_at: float
    """On the node's monotonic clock."""


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode(errors="surrogatepass")).digest()


class Sessions:
    """See the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._by_digest: dict[bytes, Session] = {}
        self._by_user: dict[str, collections.deque[bytes]] = {}

    def __len__(self) -> int:
        return len(self._by_digest)

    def create(self, user: str, credential: ScramCredential, lifetime_s: float) -> str:
        """A new session's token."""
        if len(self._by_digest) >= SESSIONS_MAX:
            self._forget_expired()
            if len(self._by_digest) >= SESSIONS_MAX:
                raise HeadwaterError(
                    ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                    f"this node holds {SESSIONS_MAX} sessions, the most it holds; retry once "
                    "some have expired",
                )
        mine = self._by_user.setdefault(user, collections.deque())
        while len(mine) >= SESSIONS_PER_USER_MAX:
            self._by_digest.pop(mine.popleft(), None)
        token = secrets.token_urlsafe(TOKEN_BYTES)
        digest = _digest(token)
        self._by_digest[digest] = Session(user, credential, self.clock() + lifetime_s)
        mine.append(digest)
        return token

    def find(self, token: str, users: Mapping[str, ScramCredential]) -> Session | None:
        """The live session ``token`` names, or None (see the invariants)."""
        if len(token) > TOKEN_CHARS_MAX:
            return None
        digest = _digest(token)
        session = self._by_digest.get(digest)
        if session is None:
            return None
        if session.expires_at <= self.clock() or users.get(session.user) != session.credential:
            self._forget(digest, session.user)
            return None
        return session

    def _forget(self, digest: bytes, user: str) -> None:
        self._by_digest.pop(digest, None)
        mine = self._by_user.get(user)
        if mine is not None:
            with contextlib.suppress(ValueError):
                mine.remove(digest)
            if not mine:
                del self._by_user[user]

    def _forget_expired(self) -> None:
        now = self.clock()
        for digest, session in list(self._by_digest.items()):
            if session.expires_at <= now:
                self._forget(digest, session.user)
