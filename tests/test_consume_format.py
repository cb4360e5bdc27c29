"""``headwater consume --format`` (kcat's ``-f`` placeholders) and ``--json``, as pure
functions of a record."""

from __future__ import annotations

import json

import pytest

from headwater.cli.consume import json_line, record_format, renderer
from headwater.client.consumer import ConsumerRecord

ORDER = ConsumerRecord(
    "orders", 2, 41, 1_700_000_000_000, b"acme", b"order-1", [("source", b"web"), ("n", None)]
)
NULLS = ConsumerRecord("t", 0, 7, 5, None, None, [])


def test_every_placeholder_and_escape() -> None:
    render = record_format(r"%t %p %o %k %K %s %v %S %T %h 100%%\t\\\n")
    assert render(ORDER) == (
        b"orders 2 41 acme 4 order-1 order-1 7 1700000000000 source=web,n= 100%\t\\\n"
    )
    assert record_format("[%k][%s][%K][%S][%h]")(NULLS) == b"[][][-1][-1][]"
    assert record_format("plain")(ORDER) == b"plain"  # nothing added, as kcat


@pytest.mark.parametrize(
    ("spec", "words"),
    [("%x", "unknown placeholder %x"), ("a%", "lone %"), (r"\q", r"unknown escape \q")],
)
def test_a_format_that_does_not_parse_is_named(spec: str, words: str) -> None:
    with pytest.raises(ValueError, match="format") as refused:
        record_format(spec)
    assert words in str(refused.value)


def test_json_keeps_nulls_and_marks_bytes_that_are_not_text() -> None:
    assert json.loads(json_line(ORDER)) == {
        "topic": "orders",
        "partition": 2,
        "offset": 41,
        "timestamp_ms": 1_700_000_000_000,
        "key": "acme",
        "value": "order-1",
        "headers": [{"key": "source", "value": "web"}, {"key": "n", "value": None}],
    }
    binary = ConsumerRecord("t", 0, 1, 5, b"\xff", None, [("h", b"\xfe")])
    assert json.loads(json_line(binary)) == {
        "topic": "t",
        "partition": 0,
        "offset": 1,
        "timestamp_ms": 5,
        "key": "/w==",
        "key_encoding": "base64",
        "value": None,
        "headers": [{"key": "h", "value": "/g==", "encoding": "base64"}],
    }
    assert json_line(ORDER).endswith(b"}\n") and json_line(ORDER).count(b"\n") == 1


def test_the_default_lines_are_unchanged() -> None:
    assert renderer(False, None, False)(ORDER) == b"order-1\n"
    assert renderer(True, None, False)(ORDER) == b"acme\torder-1\n"
    assert renderer(True, None, False)(NULLS) == b"null\tnull\n"
