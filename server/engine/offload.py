"""Where tensor work runs: on the event loop when small, in a worker thread when big."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, TypeVar

from hermes.common.wire import Payload

log = logging.getLogger(__name__)

T = TypeVar("T")

# Tensor work on payloads up to this size runs on the event loop itself: a
# thread hop costs ~0.35 ms each way here, more than checksumming, checking
# and folding 8 MB (measured: 3 hops were a third of a 1M-parameter push).
# Bigger payloads go to a worker thread so the loop keeps serving.
INLINE_BYTES = 8 * 1024 * 1024


async def offload(nbytes: int, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    if nbytes <= INLINE_BYTES:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def payload_bytes(payload: Payload | None) -> int:
    return 0 if payload is None else sum(c.numel() * c.element_size() for c in payload.chunks)
