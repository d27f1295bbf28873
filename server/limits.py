"""HTTP request limits: body size per route and a read deadline, before any parsing.

FastAPI reads and parses a whole body before a handler (or a token check)
runs: a 200 MB body without a token was read and parsed before its 401, and
a request announcing 100 GB and sending 8 bytes held its connection for
more than 70 s. This ASGI middleware answers 413 from the announced
Content-Length alone, counts the bytes of a body sent without one, and
answers 408 when the body stops arriving; nothing of it reaches a handler.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

from pydantic import BaseModel
from starlette.exceptions import HTTPException

log = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Registration carries the name and a few hints (at most 16 KiB as JSON, checked
# after parsing); every other route's body is a few fields.
DEFAULT_BODY_LIMITS: Mapping[str, int] = {"/v1/workers/register": 32 * 1024}
DEFAULT_BODY_BYTES = 4 * 1024
# An over-limit body up to this size is read and dropped before the 413 (a clean answer);
# a larger one is answered at once and its connection closed (never read 200 MB to say no).
DRAIN_MAX_BYTES = 1024 * 1024


class BodyLimits:
    """Refuse a body over its route's limit (413) or one that stalls (408), before the app reads it.

    ``limits`` maps a path (or, for ``/v1/workers/{id}/...``, its last
    segment: ``heartbeat``, ``leave``, ``regroup``) to bytes; other paths get
    ``default``. ``read_timeout`` bounds the wait for each body chunk.
    """

    def __init__(self, app: ASGIApp, *, limits: Mapping[str, int] | None = None,
                 default: int = DEFAULT_BODY_BYTES, read_timeout: float = 10.0) -> None:
        self.app = app
        self.limits = dict(DEFAULT_BODY_LIMITS if limits is None else limits)
        self.default = default
        self.read_timeout = read_timeout

    def limit_for(self, path: str) -> int:
        return self.limits.get(path, self.limits.get(path.rsplit("/", 1)[-1], self.default))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        limit = self.limit_for(path)
        announced = _content_length(scope)
        if announced is not None and announced > limit:
            if announced <= DRAIN_MAX_BYTES:
                # Read (and drop) a modest body before answering: closing a connection with
                # unread bytes makes the kernel send a reset, which can destroy the 413 before
                # the client reads it (seen under load: "connection reset by peer" for 100 kB).
                await self._drain(receive)
            await _refuse(send, 413, f"body of {announced} bytes exceeds the {limit}-byte limit of {path}")
            return
        received = 0

        async def bounded_receive() -> Message:
            # Raised as HTTPException: FastAPI turns any other error while reading a body into a 400.
            nonlocal received
            try:
                message = await asyncio.wait_for(receive(), timeout=self.read_timeout)
            except TimeoutError:
                log.warning("request body for %s stalled for %.0fs; refused", path, self.read_timeout)
                raise HTTPException(408, f"request body not received within {self.read_timeout:g}s") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, f"body exceeds the {limit}-byte limit of {path}")
            return message

        await self.app(scope, bounded_receive, send)


    async def _drain(self, receive: Receive) -> None:
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=self.read_timeout)
            except TimeoutError:
                return  # a stalled body: answer anyway
            if message["type"] != "http.request" or not message.get("more_body", False):
                return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Send, status: int, detail: str) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class ErrorBody(BaseModel):
    """Every refusal's body: one line saying what was wrong (422 lists the fields)."""

    detail: str | list[dict[str, Any]]


_MEANING = {
    400: "body is not decodable (not JSON)", 401: "missing or wrong token", 403: "no admin token configured", 404: "unknown worker",
    408: "request body not received in time", 409: "conflicts with the collective group",
    410: "the run is over, or the worker must register again", 413: "body over the route's limit",
    422: "malformed body (fields named)", 426: "unsupported protocol version",
    429: "too many registrations from this address, or names from this join token", 503: "server full or shutting down",
}


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses=`` for the refusals a route can answer."""
    return {code: {"model": ErrorBody, "description": _MEANING[code]} for code in codes}
