"""Helpers for the node's long-running asyncio tasks."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (if any) and wait until it has finished."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
