"""The start gate: no work is handed out until ``min_workers`` have registered.

As Flower's ``min_available_clients`` and torchrun's ``--nnodes``: on a
cluster whose devices take different times to start (an import of torch
took 2-16 s here under load), the first agent to arrive could otherwise
finish a small run before the slow ones join, and a heterogeneous cluster
would train as a homogeneous one. Work requests wait (the reply is held);
pushes and pulls are never held, since nobody can push before being given
work. The gate opens for good: at ``min_workers`` registrations, after
``min_workers_timeout_seconds`` (with a warning), on a stop, on shutdown,
or at once for a resumed run, which started long ago.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hermes.server.engine.telemetry import Telemetry
from hermes.server.registry import Registry

log = logging.getLogger(__name__)


class StartGate:
    def __init__(self, min_workers: int, timeout_seconds: float, *, registry: Registry, telemetry: Telemetry) -> None:
        self.min_workers = min_workers
        self.timeout_seconds = timeout_seconds
        self.registry = registry
        self.telemetry = telemetry
        self._open = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self.reason: str | None = None
        if min_workers <= 1:
            self._open.set()
            self.reason = "min_workers 1"

    @property
    def is_open(self) -> bool:
        return self._open.is_set()

    def start(self, loop: asyncio.AbstractEventLoop | None, *, resumed: bool = False) -> None:
        """``resumed``: the run is past its start (a resumed model's version is above 0)."""
        if self.is_open:
            return
        if resumed:
            self.open("resumed")
        elif loop is not None:
            self._timer = loop.call_later(self.timeout_seconds, self._timed_out)

    def on_join(self) -> None:
        if not self.is_open and len(self.registry.active_ids()) >= self.min_workers:
            self.open("min_workers")

    def open(self, reason: str) -> None:
        if self.is_open:
            return
        self._open.set()
        self.reason = reason
        if self._timer is not None:
            self._timer.cancel()
        self.telemetry.emit("start_gate_open", reason=reason, workers=len(self.registry.active_ids()),
                            min_workers=self.min_workers)

    def _timed_out(self) -> None:
        if not self.is_open:
            log.warning("only %d of min_workers=%d workers registered within %gs: starting with them",
                        len(self.registry.active_ids()), self.min_workers, self.timeout_seconds)
            self.open("timeout")

    async def wait(self) -> None:
        await self._open.wait()

    def status(self) -> dict[str, Any]:
        return {"open": self.is_open, "reason": self.reason, "min_workers": self.min_workers,
                "workers": len(self.registry.active_ids())}
