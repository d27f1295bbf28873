"""asyncio helpers shared by the server's background loops."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task | None) -> None:
    """Cancel a background loop and wait until it has really stopped."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
