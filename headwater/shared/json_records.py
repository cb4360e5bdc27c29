"""Records kept as UTF-8 JSON objects (group records, transaction states): the checks
every decoder makes before it reads a field (pure)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any


def json_object(
    data: bytes, *, bytes_max: int, what: str, error: Callable[[str], Exception]
) -> dict[str, Any]:
    """``data`` as a JSON object. Raises ``error(message)``, the message naming ``what``,
    when ``data`` has more than ``bytes_max`` bytes, is not JSON (or nests too deep to
    parse) or is not an object."""
    if len(data) > bytes_max:
        raise error(f"{what} is {len(data)} bytes; at most {bytes_max}")
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise error(f"{what} is not JSON: {type(exc).__name__}") from exc
    if not isinstance(body, dict):
        raise error(f"a {what} must be a JSON object")
    return body
