"""The producers' one list of settings (client/producer_settings.py): ``ProducerOptions``,
the keyword arguments' types, names exactly ``ProducerSettings``'s fields with the same
types; the defaults; every refusal names its setting and range, first one first; and
both engines take the settings as keywords (the asyncio one with linger_ms 0 unless
given). No node: constructors only."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, get_type_hints

import pytest

from headwater.client import Producer, ProducerOptions, ProducerSettings
from headwater.client.aio import AsyncProducer
from headwater.client.producer import parse_acks
from headwater.client.producer_settings import ASYNC_LINGER_MS_DEFAULT, acks_level
from headwater.client.retry import RetryPolicy
from headwater.log.batch import Compression
from headwater.shared.errors import ErrorCode, HeadwaterError
from headwater.v1 import headwater_pb2 as pb

UNREACHABLE = "127.0.0.1:1"


def test_the_keyword_types_are_the_settings_fields() -> None:
    fields = {f.name: f for f in dataclasses.fields(ProducerSettings)}
    assert list(ProducerOptions.__annotations__) == list(fields)
    assert get_type_hints(ProducerOptions) == get_type_hints(ProducerSettings)
    assert ProducerOptions.__required_keys__ == frozenset()
    assert all(f.default is not dataclasses.MISSING and f.kw_only for f in fields.values())


def test_defaults() -> None:
    settings = ProducerSettings()
    assert (settings.acks, settings.linger_ms, settings.batch_bytes) == ("all", 5, 1 << 20)
    assert (settings.compression, settings.codec) == ("none", Compression.NONE)
    assert (settings.retries, settings.retry_backoff_ms, settings.retry_backoff_max_ms) == (
        10,
        100,
        1000,
    )
    assert (settings.delivery_timeout_ms, settings.request_timeout_ms) == (120_000, 30_000)
    assert (settings.buffer_bytes_max, settings.max_block_ms) == (256 << 20, 60_000)
    assert (settings.append_timeout_ms, settings.max_in_flight_per_partition) == (5_000, 5)
    assert settings.enable_idempotence is None and settings.idempotent
    assert settings.security is None
    accumulator = settings.accumulator_settings()
    assert accumulator.linger_s == 0.005 and accumulator.delivery_timeout_s == 120.0
    assert accumulator.retry == RetryPolicy(10, 100, 1000)


def test_the_append_deadline_is_at_most_the_request_timeout() -> None:
    settings = ProducerSettings(append_timeout_ms=9_000, request_timeout_ms=2_000)
    assert settings.accumulator_settings().append_timeout_ms == 2_000


@pytest.mark.parametrize(
    ("bad", "code", "message"),
    [
        ({"max_in_flight_per_partition": 0}, ErrorCode.INVALID_CONFIG, "valid range is [1, 5]"),
        ({"max_in_flight_per_partition": 6}, ErrorCode.INVALID_CONFIG, "valid range is [1, 5]"),
        (
            {"append_timeout_ms": 0},
            ErrorCode.INVALID_CONFIG,
            "append_timeout_ms is 0; must be >= 1",
        ),
        ({"linger_ms": -1}, ErrorCode.INVALID_CONFIG, "linger_ms is -1; must be >= 0"),
        ({"batch_bytes": 0}, ErrorCode.INVALID_CONFIG, "batch_bytes is 0; must be >= 1"),
        ({"retries": -1}, ErrorCode.INVALID_CONFIG, "retries is -1; must be >= 0"),
        ({"retry_backoff_ms": -1}, ErrorCode.INVALID_CONFIG, "retry_backoff_ms is -1"),
        ({"request_timeout_ms": 0}, ErrorCode.INVALID_CONFIG, "request_timeout_ms is 0"),
        ({"delivery_timeout_ms": 0}, ErrorCode.INVALID_CONFIG, "delivery_timeout_ms is 0"),
        ({"buffer_bytes_max": 0}, ErrorCode.INVALID_CONFIG, "buffer_bytes_max is 0"),
        ({"max_block_ms": -1}, ErrorCode.INVALID_CONFIG, "max_block_ms is -1; must be >= 0"),
        ({"acks": "2"}, ErrorCode.INVALID_REQUIRED_ACKS, "acks is '2'; valid: 0, 1, all"),
        ({"acks": "1", "enable_idempotence": True}, ErrorCode.INVALID_CONFIG, "acks='all'"),
        ({"compression": "gzip"}, ErrorCode.UNSUPPORTED_COMPRESSION_TYPE, "'gzip'"),
        # The first setting out of range is named.
        ({"linger_ms": -1, "retries": -1, "acks": "2"}, ErrorCode.INVALID_CONFIG, "linger_ms"),
        ({"max_in_flight_per_partition": 9, "linger_ms": -1}, ErrorCode.INVALID_CONFIG, "max_in"),
    ],
)
def test_refusals_name_the_setting_and_its_range(
    bad: dict[str, Any], code: ErrorCode, message: str
) -> None:
    with pytest.raises(HeadwaterError) as refused:
        ProducerSettings(**bad)
    assert refused.value.code is code
    assert message in refused.value.message
    with pytest.raises(HeadwaterError) as by_producer:
        Producer(UNREACHABLE, **bad)
    assert (by_producer.value.code, by_producer.value.message) == (code, refused.value.message)


def test_acks_spellings() -> None:
    for spelling, level, wire in (
        (0, "0", pb.ACKS_NONE),
        ("1", "1", pb.ACKS_LEADER),
        (" ALL ", "all", pb.ACKS_ALL),
        (-1, "all", pb.ACKS_ALL),
    ):
        assert acks_level(spelling) == level
        assert parse_acks(spelling) == wire
    assert not ProducerSettings(acks=1).idempotent
    assert not ProducerSettings(enable_idempotence=False).idempotent


def test_settings_are_frozen() -> None:
    settings = ProducerSettings()
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.linger_ms = 9  # type: ignore[misc]


def test_both_engines_take_the_settings_as_keywords() -> None:
    with Producer(UNREACHABLE, acks=1, linger_ms=7, compression="zstd") as producer:
        assert producer.settings == ProducerSettings(acks=1, linger_ms=7, compression="zstd")
        assert (producer.acks, producer.compression) == (pb.ACKS_LEADER, Compression.ZSTD)
        assert not producer.idempotent
    with Producer(UNREACHABLE) as default:
        assert default.settings == ProducerSettings()
    with pytest.raises(TypeError):
        Producer(UNREACHABLE, lingr_ms=5)  # type: ignore[call-arg]

    async def asyncio_engine() -> None:
        async with AsyncProducer(UNREACHABLE, batch_bytes=4096) as producer:
            assert producer.settings == ProducerSettings(
                linger_ms=ASYNC_LINGER_MS_DEFAULT, batch_bytes=4096
            )
            assert producer.idempotent and producer.acks == pb.ACKS_ALL
        async with AsyncProducer(UNREACHABLE, linger_ms=20, acks="1") as lingering:
            assert lingering.settings.linger_ms == 20 and not lingering.idempotent
        with pytest.raises(HeadwaterError) as refused:
            AsyncProducer(UNREACHABLE, retries=-1)
        assert refused.value.code is ErrorCode.INVALID_CONFIG

    asyncio.run(asyncio_engine())
