"""Quotas: produce and fetch byte rates and request rates per user or client id, and the
throttle that enforces them (pure).

**What a quota is.** A rate (``PRODUCER_BYTE_RATE`` and ``CONSUMER_BYTE_RATE`` in bytes
a second, ``REQUEST_RATE`` in requests a second) set for an entity: a user (the
principal ``User:<name>``'s name) or a client id (the ``client-id`` call metadata), each
either named or the type's default (``DEFAULT_NAME``). Quotas are kept in the metadata
quorum and apply on each node separately, as Kafka's do: a client talking to three nodes
may use the rate on each.

**Which quota applies** (``quota_for``), for a caller's user and client id, first match,
in Kafka's order: the user's own, the user default, the client id's own, the client-id
default. (A client id is whatever the client says it is, so it never lifts a user
default.) A named
entity's callers share one bucket (all of alice's connections together); under a
default, each user (or client id) gets its own bucket at the default rate.

**Enforcement** is by delay, never by dropping data (``Throttle``): each entity has a
token bucket that fills at the rate and holds at most ``BURST_S`` seconds of it. A
request takes its bytes (or 1 request) from the bucket after it is served, and may take
it below zero (to at most ``THROTTLE_S_MAX`` seconds of debt); the response is then
held back until the debt would be paid, and reports the delay as ``throttle_time_ms``.
A client that waits for its responses (every Headwater client does; their in-flight
requests are bounded) is thereby held to the rate. One that does not (many parallel
calls, or a stream's 32 pipelined requests) gets its data appended ahead of its
answers, by at most what it has in flight.

A rate must be above 0 and at most ``RATE_MAX``: a zero quota is an INVALID_REQUEST
that says to use a deny ACL to stop a principal altogether.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from headwater.shared.errors import ErrorCode, HeadwaterError

USER: Final = "user"
CLIENT_ID: Final = "client-id"
ENTITY_TYPES: Final = (USER, CLIENT_ID)
DEFAULT_NAME: Final = ""
"""The entity name of a type's default quota."""
PRODUCER_BYTE_RATE: Final = "producer_byte_rate"
CONSUMER_BYTE_RATE: Final = "consumer_byte_rate"
REQUEST_RATE: Final = "request_rate"
KEYS: Final = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_RATE)
RATE_MAX: Final = 1e13
ENTITY_NAME_CHARS_MAX: Final = 255
QUOTA_ENTITIES_MAX: Final = 10_000
BURST_S: Final = 0.2
"""Seconds of its rate a bucket holds when full: what a quiet entity may send at once."""
THROTTLE_S_MAX: Final = 30.0
BUCKETS_MAX: Final = 100_000

Entity = tuple[str, str]
"""(entity type, name): ("user", "alice"), ("client-id", ""), ..."""


def _invalid(message: str) -> HeadwaterError:
    return HeadwaterError(ErrorCode.INVALID_REQUEST, message)


def check_entity(entity_type: str, name: str) -> Entity:
    if entity_type not in ENTITY_TYPES:
        raise _invalid(f"quota entity type {entity_type[:40]!r}; valid: {', '.join(ENTITY_TYPES)}")
    if len(name) > ENTITY_NAME_CHARS_MAX or any(ord(c) < 32 for c in name):
        raise _invalid(
            f"quota entity name {name[:80]!r}: at most {ENTITY_NAME_CHARS_MAX} characters, no "
            "control characters ('' is the type's default)"
        )
    return entity_type, name


def check_quota(key: str, value: float | None) -> None:
    """INVALID_REQUEST unless ``key`` is a quota key and ``value`` (None: remove) a valid
    rate."""
    if key not in KEYS:
        raise _invalid(f"quota key {key[:40]!r}; valid: {', '.join(KEYS)}")
    if value is None:
        return
    if not (math.isfinite(value) and 0 < value <= RATE_MAX):
        raise _invalid(
            f"{key} {value}: a rate above 0 and at most {RATE_MAX:g}; to stop a principal "
            "altogether, use a deny ACL"
        )


QuotaChange = tuple[str, str, str, float | None]
"""(entity type, entity name, key, rate or None to remove)."""


def check_quota_changes(changes: Sequence[QuotaChange]) -> None:
    """INVALID_REQUEST unless every change is valid (``check_entity``, ``check_quota``)
    and no entity's key is changed twice in one request (which change would win is not
    the client's to guess)."""
    seen: set[tuple[str, str, str]] = set()
    for entity_type, name, key, value in changes:
        check_entity(entity_type, name)
        check_quota(key, value)
        if (entity_type, name, key) in seen:
            raise _invalid(
                f"quota {key} of {entity_type} {name[:80]!r} is changed twice in one request; "
                "change each entity's key once"
            )
        seen.add((entity_type, name, key))


def quota_for(
    quotas: Mapping[Entity, Mapping[str, float]], user: str, client_id: str, key: str
) -> tuple[Entity, float] | None:
    """(bucket, rate) of the quota ``key`` that applies to a caller (see the module
    docstring), or None when none does."""
    candidates: list[tuple[Entity, Entity]] = [
        ((USER, user), (USER, user)),
        ((USER, DEFAULT_NAME), (USER, user)),
    ]
    if client_id:
        candidates.append(((CLIENT_ID, client_id), (CLIENT_ID, client_id)))
    candidates.append(((CLIENT_ID, DEFAULT_NAME), (CLIENT_ID, client_id)))
    for entity, bucket in candidates:
        rate = quotas.get(entity, {}).get(key)
        if rate is not None:
            return bucket, rate
    return None


@dataclass
class _Bucket:
    tokens: float
    at: float


class Throttle:
    """Token buckets by (key, entity) (see the module docstring); ``now`` comes from the
    caller, so tests drive the clock. At most ``BUCKETS_MAX`` are kept: the least
    recently charged goes first."""

    def __init__(self) -> None:
        self.buckets: OrderedDict[tuple[str, Entity], _Bucket] = OrderedDict()

    def charge(self, key: str, bucket: Entity, rate: float, amount: float, now: float) -> float:
        """Take ``amount`` from the bucket; return the seconds to hold the response (0
        when the bucket is not in debt)."""
        capacity = rate * BURST_S
        found = self.buckets.get((key, bucket))
        if found is None:
            if len(self.buckets) >= BUCKETS_MAX:
                self.buckets.popitem(last=False)
            found = self.buckets[(key, bucket)] = _Bucket(capacity, now)
        else:
            self.buckets.move_to_end((key, bucket))
        refilled = min(capacity, found.tokens + max(0.0, now - found.at) * rate)
        found.tokens = max(-rate * THROTTLE_S_MAX, refilled - amount)
        found.at = now
        if found.tokens >= 0:
            return 0.0
        return min(-found.tokens / rate, THROTTLE_S_MAX)
