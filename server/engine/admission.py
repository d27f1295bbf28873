"""Admission: at most ``concurrency.limit`` workers hold work at once (FedBuff's concurrency C).

The rule and its source are in ``hermes.common.policies.concurrency``. A
slot is taken by a work request, kept while its holder trains and given up
when the holder reports a finished cycle (``cycle_done``: a push, or a
gate-skipped cycle carried by a request or a stats report), if anybody
waits; then the longest-waiting request gets it (FIFO, deterministic). A
holder's own next request (its prefetcher's, sent as it starts its last
assignment) is answered at once while nobody waits, and otherwise waits for
that cycle's report and then its turn. A gate-skipped cycle is reported by
the next request (combine_messages), which is the one held: so a holder's
heartbeat while its request is held also ends its turn (``heartbeat``); an
agent whose data plane is silent sends one every interval.
Leaving, being marked lost and registering again free the slot and answer
the held request "gone" (the worker registers again). A stop or a shutdown
answers every held request, as the start gate does.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from typing import Any

from hermes.server.engine.telemetry import Telemetry

log = logging.getLogger(__name__)

__all__ = ["Admission"]


class Admission:
    def __init__(self, limit: int, telemetry: Telemetry) -> None:
        self.limit = limit
        self.telemetry = telemetry
        self.holders: set[str] = set()
        # Requests waiting for a slot, oldest first; a holder's request held until its cycle's report.
        self.waiting: OrderedDict[str, asyncio.Future[bool]] = OrderedDict()
        self.pending: dict[str, asyncio.Future[bool]] = {}
        self.open = limit <= 0
        self.granted = 0
        self.waited = 0
        self.peak = 0  # the most workers that held a slot at once

    async def admit(self, worker_id: str) -> bool:
        """Wait for the worker's slot; False when the worker left (or registered again) meanwhile."""
        if self.open:
            return True
        if worker_id in self.holders:
            if not self.waiting:
                return True
            return await self._hold(self.pending, worker_id)
        if len(self.holders) < self.limit and not self.waiting:
            self._take(worker_id)
            return True
        self.waited += 1
        return await self._hold(self.waiting, worker_id)

    async def _hold(self, where: dict[str, asyncio.Future[bool]], worker_id: str) -> bool:
        self._answer(worker_id, False)  # a request of an earlier session that was still held
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        where[worker_id] = future
        return await future

    def cycle_done(self, worker_id: str) -> None:
        """The worker reported a finished cycle: its round is over; the slot goes on if anybody waits."""
        if self.open or worker_id not in self.holders:
            return
        if not self.waiting:
            held = self.pending.pop(worker_id, None)
            if held is not None and not held.done():
                held.set_result(True)
            return
        self.holders.discard(worker_id)
        held = self.pending.pop(worker_id, None)
        if held is not None:
            self.waiting[worker_id] = held  # its next request waits its turn behind the others
        self._grant()

    def heartbeat(self, worker_id: str) -> None:
        """A holder whose next request is held and who is silent otherwise: its cycle may be over unreported."""
        if worker_id in self.pending:
            self.cycle_done(worker_id)

    def release(self, worker_id: str) -> None:
        """The worker left, was marked lost or registered again: its slot and held request are gone."""
        if self.open:
            return
        self._answer(worker_id, False)
        if worker_id in self.holders:
            self.holders.discard(worker_id)
            self._grant()

    def open_all(self, reason: str) -> None:
        """A stop or a shutdown: every held request is answered (with the stop, or going away)."""
        if self.open:
            return
        self.open = True
        for future in [*self.waiting.values(), *self.pending.values()]:
            if not future.done():
                future.set_result(True)
        self.waiting.clear()
        self.pending.clear()
        log.debug("admission open for all: %s", reason)

    def listener(self, fact: str, fields: dict[str, Any]) -> None:
        """Telemetry's join and leave facts free the worker's slot (a rejoin starts a new session)."""
        if fact in ("join", "leave"):
            self.release(str(fields["worker"]))

    def _answer(self, worker_id: str, value: bool) -> None:
        for where in (self.waiting, self.pending):
            future = where.pop(worker_id, None)
            if future is not None and not future.done():
                future.set_result(value)

    def _grant(self) -> None:
        while self.waiting and len(self.holders) < self.limit:
            worker_id, future = self.waiting.popitem(last=False)
            if future.done():
                continue
            self._take(worker_id)
            future.set_result(True)

    def _take(self, worker_id: str) -> None:
        self.holders.add(worker_id)
        self.granted += 1
        self.peak = max(self.peak, len(self.holders))

    def status(self) -> dict[str, Any]:
        return {"limit": self.limit, "training": len(self.holders), "waiting": len(self.waiting) + len(self.pending),
                "granted": self.granted, "waited": self.waited, "peak": self.peak}
