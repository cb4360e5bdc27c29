"""Telling a task being stopped from a gRPC call cancelled under it.

grpc.aio raises ``asyncio.CancelledError`` both when the awaiting task is cancelled and
when the call itself was cancelled (by a watchdog, a dead peer, the channel closing).
Code that must outlive the second kind re-raises only the first: ``task_is_stopping``.
"""

from __future__ import annotations

import asyncio


def task_is_stopping() -> bool:
    """True when the running task has a cancellation request pending (it is being
    stopped), False when a CancelledError came from a cancelled call."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0
