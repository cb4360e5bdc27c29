"""The producer's settings, written once for both engines.

``ProducerSettings`` holds every setting of the threaded ``Producer`` and the asyncio
``AsyncProducer``, with its default, unit and valid range; building one checks them all
(``__post_init__``), raising the error a producer constructor raises for the first
setting out of range, which names the setting and its range: INVALID_CONFIG, or
INVALID_REQUIRED_ACKS for ``acks`` and UNSUPPORTED_COMPRESSION_TYPE for ``compression``.

The engines take the settings as keyword arguments, ``Producer("host:port", linger_ms=5,
acks="all")``, typed by ``ProducerOptions``: the same names and types as keys of a
TypedDict, for ``**options: Unpack[ProducerOptions]``, so that a type checker checks each
keyword. A TypedDict cannot carry defaults or take its keys from a dataclass, so the
names and types appear there a second time; tests/test_producer_settings.py checks that
the two agree.

No I/O and no protobuf: the engines turn ``acks_level`` into the wire's value.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal, TypedDict

from headwater.client.accumulator import AccumulatorSettings
from headwater.client.retry import RetryPolicy
from headwater.log.batch import Compression
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.shared.tls import ClientSecurity

AcksLevel = Literal["0", "1", "all"]
"""What a produce request waits for: nothing, the leader's append, or every in-sync
replica."""
_ACKS_SPELLINGS: Final[dict[str, AcksLevel]] = {"0": "0", "1": "1", "all": "all", "-1": "all"}

MAX_IN_FLIGHT_LIMIT: Final = 5
"""The most requests of a partition an idempotent producer keeps in flight: the leader
keeps the offsets of a producer's last 5 batches, so more in flight could not all be
answered as duplicates."""
ASYNC_LINGER_MS_DEFAULT: Final = 0
"""``AsyncProducer``'s default ``linger_ms``: records sent in one loop iteration, or while
their partition has a batch in flight, leave together."""

_SETTING_MINIMUM: Final = {
    "append_timeout_ms": 1,
    "linger_ms": 0,
    "batch_bytes": 1,
    "retries": 0,
    "retry_backoff_ms": 0,
    "request_timeout_ms": 1,
    "delivery_timeout_ms": 1,
    "buffer_bytes_max": 1,
    "max_block_ms": 0,
}
"""The least value of each bounded integer setting, in the order they are checked."""


def acks_level(acks: str | int) -> AcksLevel:
    """0, 1 or "all" (also -1, any case, surrounding blanks ignored) as an ``AcksLevel``;
    INVALID_REQUIRED_ACKS otherwise."""
    level = _ACKS_SPELLINGS.get(str(acks).strip().lower())
    if level is None:
        raise HeadwaterError(ErrorCode.INVALID_REQUIRED_ACKS, f"acks is {acks!r}; valid: 0, 1, all")
    return level


@dataclass(frozen=True, slots=True, kw_only=True)
class ProducerSettings:
    """Every setting of both producers (headwater.client.producer's module docstring says
    what they do together). Frozen; checked when built (see the module docstring)."""

    acks: str | int = "all"
    """0 (do not wait), 1 (the leader has appended the batch) or "all" (every in-sync
    replica has it; -1 is the same). INVALID_REQUIRED_ACKS for anything else."""
    linger_ms: int = 5
    """How long a batch waits for more records after its first one, in ms, >= 0. The
    default is for ``Producer``; ``AsyncProducer``'s is ``ASYNC_LINGER_MS_DEFAULT`` (0)."""
    batch_bytes: int = 1 << 20
    """The size a batch closes at, in bytes of records, >= 1 (a larger record goes alone)."""
    compression: str = "none"
    """The batches' codec: "none", "lz4" or "zstd", any case; UNSUPPORTED_COMPRESSION_TYPE
    for others."""
    retries: int = 10
    """Attempts after the first for a batch that failed with a retriable error, >= 0,
    each starting before the batch's ``delivery_timeout_ms``."""
    retry_backoff_ms: int = 100
    """The first retry's backoff in ms, >= 0, doubled at each retry up to
    ``retry_backoff_max_ms`` (with a jitter of +-20%); also the margin for node clocks
    behind this client's (at least 100 ms) when an attempt's outcome is unknown."""
    retry_backoff_max_ms: int = 1000
    """The longest backoff between two attempts, in ms."""
    delivery_timeout_ms: int = 120_000
    """A batch's delivery deadline, in ms after it opened, >= 1: a batch still unsent
    then fails with REQUEST_TIMED_OUT, and no retry starts after it."""
    request_timeout_ms: int = 30_000
    """How long one request may wait for its answer, in ms, >= 1: the node answers an
    acks="all" request still waiting for its replicas then, and a node that answers
    nothing for this long (and a second's grace) counts as failed."""
    buffer_bytes_max: int = 256 << 20
    """The most bytes of records waiting to be sent or acknowledged, >= 1."""
    max_block_ms: int = 60_000
    """How long ``send`` waits for room in the buffer, in ms, >= 0, before it raises
    REQUEST_TIMED_OUT."""
    append_timeout_ms: int = 5_000
    """Each attempt's append deadline, in ms after it is sent, >= 1 (at most
    ``request_timeout_ms`` is used): no node appends the request after it, and a retry
    after an unknown outcome waits until it has passed."""
    enable_idempotence: bool | None = None
    """Whether the producer is idempotent (retries never duplicate or reorder a
    partition's records). None (the default) means True with acks "all" and False with
    0 or 1, as Kafka; True with acks 0 or 1 is INVALID_CONFIG: deduplication covers only
    what the in-sync replicas hold."""
    max_in_flight_per_partition: int = 5
    """An idempotent producer's most requests of a partition in flight, in
    [1, ``MAX_IN_FLIGHT_LIMIT``]; without idempotence one at a time."""
    security: ClientSecurity | None = None
    """TLS and SASL settings (headwater.shared.tls.ClientSecurity); None takes the
    environment's."""

    def __post_init__(self) -> None:
        if not 1 <= self.max_in_flight_per_partition <= MAX_IN_FLIGHT_LIMIT:
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                f"max_in_flight_per_partition is {self.max_in_flight_per_partition}; valid "
                f"range is [1, {MAX_IN_FLIGHT_LIMIT}]",
            )
        for name, low in _SETTING_MINIMUM.items():
            value = getattr(self, name)
            if value < low:
                raise HeadwaterError(
                    ErrorCode.INVALID_CONFIG, f"{name} is {value}; must be >= {low}"
                )
        level = acks_level(self.acks)
        if self.enable_idempotence and level != "all":
            raise HeadwaterError(
                ErrorCode.INVALID_CONFIG,
                "enable_idempotence=True needs acks='all'; with acks 0 or 1 pass "
                "enable_idempotence=False (or leave it unset)",
            )
        Compression.parse(self.compression)

    @property
    def acks_level(self) -> AcksLevel:
        return acks_level(self.acks)

    @property
    def idempotent(self) -> bool:
        """``enable_idempotence`` when given, else whether acks is "all" (as Kafka)."""
        if self.enable_idempotence is None:
            return self.acks_level == "all"
        return self.enable_idempotence

    @property
    def codec(self) -> Compression:
        return Compression.parse(self.compression)

    def accumulator_settings(self) -> AccumulatorSettings:
        """What the shared accumulator (headwater.client.accumulator) takes."""
        return AccumulatorSettings(
            batch_bytes=self.batch_bytes,
            linger_s=self.linger_ms / 1000,
            delivery_timeout_s=self.delivery_timeout_ms / 1000,
            append_timeout_ms=min(self.append_timeout_ms, self.request_timeout_ms),
            retry=RetryPolicy(self.retries, self.retry_backoff_ms, self.retry_backoff_max_ms),
        )


class ProducerOptions(TypedDict, total=False):
    """``ProducerSettings``'s fields as keyword arguments of ``Producer`` and
    ``AsyncProducer`` (``**options: Unpack[ProducerOptions]``): the same names and types,
    every one optional; defaults and meanings are ``ProducerSettings``'s."""

    acks: str | int
    linger_ms: int
    batch_bytes: int
    compression: str
    retries: int
    retry_backoff_ms: int
    retry_backoff_max_ms: int
    delivery_timeout_ms: int
    request_timeout_ms: int
    buffer_bytes_max: int
    max_block_ms: int
    append_timeout_ms: int
    enable_idempotence: bool | None
    max_in_flight_per_partition: int
    security: ClientSecurity | None
