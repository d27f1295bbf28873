"""Marks silent workers lost.

A worker is alive while it talks: every authenticated data-plane message and
every control-plane heartbeat refreshes ``last_seen``. One silent for longer
than the timeout is marked ``lost``: the sync strategy stops waiting for it
(its barrier share is released), its unfinished shards go back to the
queue, and the allocator forgets it. It can register again under the same
name, gets its old id back, and pulls the current model. After a resume,
workers the checkpoint's allocator state holds are given the same timeout
to register again before the allocator forgets them.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from hermes.server.aio import cancel_and_wait

if TYPE_CHECKING:
    from hermes.server.engine import Engine

log = logging.getLogger(__name__)


class HeartbeatMonitor:
    def __init__(self, engine: Engine, timeout: float) -> None:
        self.engine = engine
        self.timeout = timeout
        self.lost = 0
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        # Runs with timeout 0 too (nobody is marked lost then): its loop is also the engine's tick, which
        # releases a barrier at its deadline; without it --heartbeat-timeout 0 silently lost bsp.deadline.
        self._task = asyncio.create_task(self._run(), name="hermes-heartbeats")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)

    async def _run(self) -> None:
        # Check several times per timeout so a loss is noticed within ~1.25 timeouts.
        period = max(0.05, min(1.0, self.timeout / 4)) if self.timeout > 0 else 1.0
        while True:
            await asyncio.sleep(period)
            try:
                await self.sweep()
                await self.engine.tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # the monitor must outlive any one bad sweep
                log.exception("heartbeat sweep failed")

    async def sweep(self, now: float | None = None) -> list[str]:
        """Mark every active worker silent past the timeout lost; returns their ids (none with timeout 0)."""
        if self.timeout <= 0:
            return []
        now = self.engine.clock.time() if now is None else now
        silent = [r for r in self.engine.registry.all()
                  if r.state == "active" and now - r.last_seen > self.timeout]
        for rec in silent:
            quiet = now - rec.last_seen
            log.warning("worker %s (%s) silent for %.1fs (timeout %.1fs): marked lost", rec.id, rec.name,
                        quiet, self.timeout)
            self.engine.metrics.workers_lost.inc()
            self.lost += 1
            await self.engine.leave(rec.id, f"no heartbeat for {quiet:.1f}s", state="lost")
        # The same timeout for workers a resumed server restored: one that has
        # not registered again by then is gone as far as the allocator is concerned.
        self.engine.membership.forget_unreturned(self.timeout, now)
        return [r.id for r in silent]
