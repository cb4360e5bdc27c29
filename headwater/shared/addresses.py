"""HOST:PORT addresses, shared by clients and nodes (pure, no dependency beyond errors)."""

from __future__ import annotations

from typing import Final

from headwater.shared.errors import ErrorCode, HeadwaterError

DEFAULT_PORT: Final = 7700
DEFAULT_LISTEN: Final = f"127.0.0.1:{DEFAULT_PORT}"


def parse_address(text: str, what: str) -> tuple[str, int]:
    """Split HOST:PORT (IPv6 hosts in brackets); raise INVALID_CONFIG naming ``what``."""
    host, sep, port_text = text.strip().rpartition(":")
    try:
        port = int(port_text.strip().replace("_", "")) if port_text.strip() else None
    except ValueError:
        port = None
    if not sep or not host or port is None or not 0 <= port <= 65535:
        raise HeadwaterError(
            ErrorCode.INVALID_CONFIG,
            f"{what} must be HOST:PORT with a port in [0, 65535], got {text!r}",
        )
    return host.strip("[]"), port


def format_address(host: str, port: int) -> str:
    """HOST:PORT, an IPv6 host in brackets (what ``parse_address`` reads back)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
