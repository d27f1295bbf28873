"""BodyLimits at the ASGI level: when an over-limit body is read before the 413, and when it is not."""

from __future__ import annotations

import asyncio
from typing import Any

from hermes.server.limits import DRAIN_MAX_BYTES, BodyLimits


async def _never_called(scope: Any, receive: Any, send: Any) -> None:
    raise AssertionError("an over-limit body reached the app")


def _run(announced: int, chunks: int) -> tuple[list[str], int]:
    """(the order of events: 'recv' per chunk read, 'start' for the response), chunks left unread."""
    events: list[str] = []
    left = [chunks]

    async def receive() -> dict[str, Any]:
        left[0] -= 1
        events.append("recv")
        return {"type": "http.request", "body": b"x" * 1024, "more_body": left[0] > 0}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            events.append(f"start {message['status']}")

    scope = {"type": "http", "method": "POST", "path": "/v1/workers/register",
             "headers": [(b"content-length", str(announced).encode())]}
    asyncio.run(BodyLimits(_never_called)(scope, receive, send))
    return events, left[0]


def test_a_modest_over_limit_body_is_read_to_its_end_before_the_413() -> None:
    # 100 kB against the 32 KiB registration limit: answered only once the client has sent it all,
    # so closing the connection sends no reset that could destroy the answer.
    events, left = _run(100 * 1024, chunks=100)
    assert left == 0 and events == ["recv"] * 100 + ["start 413"]


def test_a_huge_announced_body_is_refused_without_reading_it() -> None:
    events, left = _run(DRAIN_MAX_BYTES + 1, chunks=5)
    assert events == ["start 413"] and left == 5
