"""Password checks whose cost a stranger cannot raise: bounded per host and per node,
fair between hosts, equal for every user, and off the threads replication uses.

A login (a call presenting a user and password that this node has not verified yet)
runs PBKDF2-HMAC-SHA256, tens of milliseconds of CPU, in a worker thread. The rules:

- **Own threads, low priority.** Checks run in this module's pool of ``CHECKS_AT_ONCE``
  threads (half the cores), never in the event loop's default executor, where follower
  appends and fsyncs run, and at nice ``HASHING_NICENESS``: a login flood cannot take
  the threads or the cores replication and acks=all writes need.
- **Held until the hash ends.** A check holds its place from the call until its hash
  has finished, even when the call is cancelled or its deadline passes; a check the
  caller gave up on before it started is withdrawn (it cost nothing). A finished check
  counts as a failure whether or not anyone still waits for it.
- **Fair between hosts, bounded.** Checks wait in one queue per host (an IPv4 address,
  or an IPv6 /64), taken round-robin, so a host flooding the node waits behind its own
  checks while another host's login is next in line. A host holds at most
  ``PENDING_PER_HOST_MAX`` checks (waiting or running) and the node ``PENDING_MAX``; one
  more is refused at once with THROTTLING_QUOTA_EXCEEDED (retriable) without hashing,
  except that a host holding fewer than the fullest host takes the place of that host's
  newest waiting check (whose caller gets THROTTLING_QUOTA_EXCEEDED): many hosts
  flooding together cannot keep another host out.
- **Slowed, not locked out.** A failed login is answered ``FAILED_LOGIN_DELAY_S`` after
  its check ends (Kafka's ``connection.failed.authentication.delay.ms``), without
  holding a thread: there is no failure cap that would refuse the right password.
- **Equal cost.** Every check costs the most iterations any user has (at least
  ``ITERATIONS_DEFAULT``): an unknown user's is checked against a stand-in credential
  and a user with fewer iterations is padded with more PBKDF2 rounds, so the time to
  refuse tells neither whether a user exists nor its iteration count.
- **Seen.** Each failure is counted (``failed``, ``on_failed``) and logged with the
  host and user, one line per host per ``LOG_INTERVAL_S`` at most with the count left
  out.

A verified (user, password) is remembered as a SHA-256 digest of the password, never
the password, until the user's credential changes, so PBKDF2 runs once per user and
password, not per call (``VERIFIED_MAX`` pairs; the memory is cleared when full).

Runs on one event loop (the node's); only the hash runs in the pool's threads.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import ipaddress
import logging
import os
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Final

from headwater.shared.credentials import (
    ITERATIONS_DEFAULT,
    KEY_BYTES,
    SALT_BYTES_MIN,
    ScramCredential,
    authentication_failed,
    credential_from_salted,
    verify_password,
)
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.log_limits import LogEvery

_log = logging.getLogger(__name__)

CHECKS_AT_ONCE: Final = max(1, (os.cpu_count() or 2) // 2)
"""Password checks hashing at once on a node (the pool's threads): half the cores."""
HASHING_NICENESS: Final = 19
"""The pool's threads run at this nice value (Linux: per thread), so that where the
cores are all busy, replication, appends and answers get them first."""
PENDING_PER_HOST_MAX: Final = 8
"""Checks one host may hold at once, waiting or hashing."""
PENDING_MAX: Final = 256
"""Checks the node holds at once, from all hosts."""
FAILED_LOGIN_DELAY_S: Final = 0.1
"""How long after its check a failed login is answered."""
VERIFIED_MAX: Final = 4096
FAILURE_HOSTS_MAX: Final = 4096
"""Hosts whose failure counts are kept for the log; the counts are cleared when full."""
LOG_INTERVAL_S: Final = 10.0
REFUSAL_LOG_HOSTS_MAX: Final = 256
"""Hosts whose refusals are rate-limited each on their own (so a loud host does not hide a
quiet one); the table is cleared when full."""

_STAND_IN: Final = credential_from_salted(
    bytes(KEY_BYTES), bytes(SALT_BYTES_MIN), ITERATIONS_DEFAULT
)
"""Checked against when the user does not exist (no password matches it)."""


def host_key(host: str) -> str:
    """Whom checks are counted against: the IPv4 address, or the /64 of an IPv6 one (one
    machine holds a whole /64); anything else (a unix socket) as it is."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.version == 6:
        return str(ipaddress.ip_network(f"{address}/64", strict=False))
    return str(address)


def _lower_priority() -> None:
    """Run the calling thread at ``HASHING_NICENESS`` (where the system allows it)."""
    # Not Linux, or not allowed: the thread keeps the process's priority.
    with contextlib.suppress(AttributeError, OSError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), HASHING_NICENESS)


def hash_matches(credential: ScramCredential, password: str, cost: int) -> bool:
    """Does ``password`` match ``credential``? Runs PBKDF2 for ``cost`` iterations in
    all, whatever the credential's own count (see "Equal cost")."""
    matches = verify_password(credential, password)
    if cost > credential.iterations:
        hashlib.pbkdf2_hmac("sha256", b"", credential.salt, cost - credential.iterations)
    return matches


@dataclass(eq=False)
class _Check:
    host: str
    key: str
    user: str
    credential: ScramCredential | None
    password: str
    cost: int
    answer: asyncio.Future[bool | None]
    """True or False once hashed; None when its place was given to another host."""
    started: bool = False


@dataclass
class _Cost:
    users: Mapping[str, ScramCredential] | None = None
    iterations: int = ITERATIONS_DEFAULT


@dataclass
class PasswordChecks:
    """See the module docstring."""

    on_failed: Callable[[], None] | None = None
    checks_at_once: int = CHECKS_AT_ONCE
    verified: dict[tuple[str, bytes], ScramCredential] = field(default_factory=dict)
    waiting: dict[str, collections.deque[_Check]] = field(default_factory=dict)
    """Checks not started, by host key; the dict's order is the round-robin order."""
    held: dict[str, int] = field(default_factory=dict)
    """Checks waiting or hashing, by host key."""
    held_total: int = 0
    running: int = 0
    failed: int = 0
    failures_by_host: dict[str, int] = field(default_factory=dict)
    _pool: ThreadPoolExecutor | None = None
    _cost: _Cost = field(default_factory=_Cost)
    _refusals_by_host: dict[str, LogEvery] = field(default_factory=dict)
    _busy: LogEvery = field(default_factory=lambda: LogEvery(_log, LOG_INTERVAL_S))

    @staticmethod
    def _verified_key(user: str, password: str) -> tuple[str, bytes]:
        return user, hashlib.sha256(password.encode(errors="surrogatepass")).digest()

    def known(
        self, users: Mapping[str, ScramCredential], user: str, password: str
    ) -> ScramCredential | None:
        """The user's current credential if this password was verified for it."""
        credential = users.get(user)
        if credential is None or self.verified.get(self._verified_key(user, password)) != (
            credential
        ):
            return None
        return credential

    def cost(self, users: Mapping[str, ScramCredential]) -> int:
        """The iterations every check runs: the most any user has, at least the default
        (worked out once per user table)."""
        if self._cost.users is not users:
            most = max((c.iterations for c in users.values()), default=ITERATIONS_DEFAULT)
            self._cost = _Cost(users, max(most, ITERATIONS_DEFAULT))
        return self._cost.iterations

    async def check(
        self, users: Mapping[str, ScramCredential], user: str, password: str, host: str
    ) -> ScramCredential:
        """The user's credential when ``password`` is theirs; SASL_AUTHENTICATION_FAILED
        (after ``FAILED_LOGIN_DELAY_S``) otherwise, THROTTLING_QUOTA_EXCEEDED when the
        host or the node holds as many checks as it may."""
        key = host_key(host)
        held = self.held.get(key, 0)
        if held >= PENDING_PER_HOST_MAX or (
            self.held_total >= PENDING_MAX and not self._make_room_for(key)
        ):
            self._busy.log(
                "refused a login from %s for user %r without checking it: the host holds %d "
                "password checks (at most %d), the node %d (at most %d)",
                host,
                user[:128],
                held,
                PENDING_PER_HOST_MAX,
                self.held_total,
                PENDING_MAX,
            )
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"this node holds {held} password checks from host {host} (at most "
                f"{PENDING_PER_HOST_MAX}) and {self.held_total} in all (at most {PENDING_MAX}); "
                "retry once one has ended",
            )
        credential = users.get(user)
        check = _Check(
            host,
            key,
            user,
            credential,
            password,
            self.cost(users),
            asyncio.get_running_loop().create_future(),
        )
        self.held[key] = held + 1
        self.held_total += 1
        self.waiting.setdefault(key, collections.deque()).append(check)
        self._start_next()
        try:
            matches = await asyncio.shield(check.answer)
        except asyncio.CancelledError:
            if not check.started:
                self._withdraw(check)
            raise
        if matches is None:
            raise HeadwaterError(
                ErrorCode.THROTTLING_QUOTA_EXCEEDED,
                f"this node holds {PENDING_MAX} password checks and gave this one's place to "
                "a host holding fewer; retry",
            )
        if matches and credential is not None:
            if len(self.verified) >= VERIFIED_MAX:
                self.verified.clear()
            self.verified[self._verified_key(user, password)] = credential
            return credential
        await asyncio.sleep(FAILED_LOGIN_DELAY_S)
        raise authentication_failed(
            f"authentication failed for user {user[:128]!r}: unknown user or wrong password"
        )

    def _make_room_for(self, key: str) -> bool:
        """The node holds ``PENDING_MAX`` checks: withdraw the newest waiting check of the
        host that holds the most, if that is more than host ``key`` holds (its caller is
        answered THROTTLING_QUOTA_EXCEEDED). So hosts flooding the node cannot keep
        another host's login out: True when room was made."""
        newcomer = self.held.get(key, 0)
        fullest = max(self.waiting, key=lambda k: self.held[k], default=None)
        if fullest is None or self.held[fullest] <= newcomer:
            return False
        evicted = self.waiting[fullest][-1]
        self._withdraw(evicted)
        evicted.answer.set_result(None)
        return True

    def _start_next(self) -> None:
        while self.running < self.checks_at_once and self.waiting:
            key = next(iter(self.waiting))
            queue = self.waiting.pop(key)
            check = queue.popleft()
            if queue:
                self.waiting[key] = queue  # to the back of the round
            check.started = True
            self.running += 1
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.checks_at_once,
                    thread_name_prefix="headwater-password-check",
                    initializer=_lower_priority,
                )
            hashing = asyncio.get_running_loop().run_in_executor(
                self._pool,
                hash_matches,
                check.credential or _STAND_IN,
                check.password,
                check.cost,
            )
            hashing.add_done_callback(functools.partial(self._finished, check))

    def _finished(self, check: _Check, hashing: asyncio.Future[bool]) -> None:
        self.running -= 1
        self._release(check)
        matches = (
            check.credential is not None
            and not hashing.cancelled()
            and hashing.exception() is None
            and hashing.result()
        )
        if not matches:
            self.refused(check.host, check.user)
        if not check.answer.done():
            check.answer.set_result(matches)
        self._start_next()

    def _withdraw(self, check: _Check) -> None:
        queue = self.waiting.get(check.key)
        if queue is not None and check in queue:
            queue.remove(check)
            if not queue:
                del self.waiting[check.key]
            self._release(check)

    def _release(self, check: _Check) -> None:
        left = self.held[check.key] - 1
        if left:
            self.held[check.key] = left
        else:
            del self.held[check.key]
        self.held_total -= 1

    def refused(self, host: str, user: str) -> None:
        """Count and log a refused login (a wrong password here, or a wrong SCRAM proof
        in ``headwater.node.security.sasl_service``)."""
        self.failed += 1
        if self.on_failed is not None:
            self.on_failed()
        if len(self.failures_by_host) >= FAILURE_HOSTS_MAX:
            self.failures_by_host.clear()
        key = host_key(host)
        count = self.failures_by_host.get(key, 0) + 1
        self.failures_by_host[key] = count
        lines = self._refusals_by_host.get(key)
        if lines is None:
            if len(self._refusals_by_host) >= REFUSAL_LOG_HOSTS_MAX:
                self._refusals_by_host.clear()
            lines = self._refusals_by_host[key] = LogEvery(_log, LOG_INTERVAL_S)
        lines.log(
            "refused a login from %s for user %r: unknown user or wrong password "
            "(%d failed logins from that host)",
            host,
            user[:128],
            count,
        )

    def close(self) -> None:
        """Let the pool's threads end once their hashes do."""
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
