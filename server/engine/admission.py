"""Admission: at most ``concurrency.limit`` workers hold work at once (FedBuff's concurrency C).

The rule and its source are in ``hermes.common.policies.concurrency``. A
worker takes a slot with a work request; while it holds one, its requests
(its prefetcher's next assignment) are answered at once. Its push ends its
turn if anybody waits: the slot goes to the longest-waiting worker (FIFO,
deterministic) and the push's reply waits in line for the next free slot.
The reply brings the model as it is when the turn comes (combine_messages),
so a worker never trains from a model it got before it waited: waiting
before the work request instead would have the worker train, after its
wait, from the model of its previous push (1,000 devices, limit 100,
K = 10: deltas 77 versions stale instead of about 10, and the model
collapsed). For the same reason a pull from a worker without a slot (its
registration's) waits for one and takes it (``hold_pull``): otherwise the
first turn trained from the model of the registration, before the wait
(10,000 devices, limit 100: up to ~800 versions stale). A gate-skipped cycle, reported with the next work request or a
stats report, also ends the turn, and that request waits (unless
``concurrency.turn_ends`` is "push": then only a push does). Leaving, being
marked lost and registering again free the slot and answer a held work
request "gone" (the worker registers again). A stop or a shutdown answers
everything held, as the start gate does.

``concurrency.admit`` "fastest" (Oort's system utility; the rule and its source
are in the policy module) gives a freed slot to the waiting worker with the
highest observed speed instead of the longest-waiting one: speeds come from
the ``cycle`` telemetry facts (dss / compute_seconds after the claims'
bounds, the median of the last 5), and untried workers go first while fewer
than ``explore`` x limit slots hold untried workers (the oldest first, or with
``explore_order`` "declared" the one declaring the most compute).
"""

from __future__ import annotations

import asyncio
import logging
import math
import statistics
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping
from typing import Any

from hermes.server.engine.telemetry import Telemetry

log = logging.getLogger(__name__)

__all__ = ["Admission"]


class Admission:
    def __init__(self, limit: int, telemetry: Telemetry, *, hold_pull: bool = True,
                 skipped_ends_turn: bool = True, admit: str = "fifo", explore: float = 0.1,
                 clock: Callable[[], float] | None = None,
                 declared: Callable[[str], float | None] | None = None) -> None:
        self.limit = limit
        # concurrency.admit "fastest" / "quickest": a freed slot goes to the fastest waiting worker (Oort's
        # system utility), by samples a second of compute / of its whole turn (transfers and replies included).
        self.fastest = admit in ("fastest", "quickest")
        self.quickest = admit == "quickest"
        if self.quickest and clock is None:
            raise ValueError("concurrency.admit 'quickest' times turns: it needs a clock")
        self.clock = clock
        # quickest: when each holder's turn began and the samples its cycles reported since.
        self.turn_began: dict[str, float] = {}
        self.turn_samples: dict[str, int] = {}
        # Untried workers may hold at most this many slots at once (Oort's bounded exploration), at least one.
        self.explore_slots = max(1, math.ceil(explore * limit))
        # concurrency.explore_order "declared": the untried worker tried next is the one declaring the most compute.
        self.declared = declared
        self.speeds: dict[str, deque[float]] = {}
        # concurrency.turn_ends "cycle": a cycle the gate did not push ends the turn too ("push": only a push).
        self.skipped_ends_turn = skipped_ends_turn
        # A pull from a worker without a slot waits for one (handlers.on_pull; concurrency.hold_pull).
        self.hold_pull = hold_pull
        self.telemetry = telemetry
        self.holders: set[str] = set()
        # Workers waiting for a slot, oldest first: a held work request or a held push reply each.
        self.waiting: OrderedDict[str, asyncio.Future[bool]] = OrderedDict()
        self.open = limit <= 0
        self.granted = 0
        self.waited = 0
        self.peak = 0  # the most workers that held a slot at once

    async def admit(self, worker_id: str) -> bool:
        """A work request: the worker's slot (at once while it holds one); False when it left meanwhile."""
        if self.open or worker_id in self.holders:
            return True
        if len(self.holders) < self.limit and not self.waiting:
            self._take(worker_id)
            return True
        return await self._wait(worker_id)

    async def next_turn(self, worker_id: str) -> bool:
        """A push: the worker's turn ends if anybody waits, and its reply waits for its next slot."""
        if self.quickest and not self.open:
            self._time_turn(worker_id)
        if self.open or (worker_id in self.holders and not self.waiting):
            return True
        if self.fastest and worker_id in self.holders and self._keeps(worker_id):
            return True
        if worker_id in self.holders:
            self._drop(worker_id)
            self._grant()
        elif len(self.holders) < self.limit and not self.waiting:
            self._take(worker_id)
            return True
        return await self._wait(worker_id)

    def cycle_done(self, worker_id: str) -> None:
        """A cycle its gate did not push was reported: the worker's turn ends if anybody waits."""
        if self.skipped_ends_turn and not self.open and worker_id in self.holders and self.waiting:
            self._drop(worker_id)
            self._grant()

    def release(self, worker_id: str) -> None:
        """The worker left, was marked lost or registered again: its slot and what it had held are gone."""
        if self.open:
            return
        future = self.waiting.pop(worker_id, None)
        if future is not None and not future.done():
            future.set_result(False)
        if worker_id in self.holders:
            self._drop(worker_id)
            self._grant()

    def open_all(self, reason: str) -> None:
        """A stop or a shutdown: everything held is answered (with the stop, or going away)."""
        if self.open:
            return
        self.open = True
        for future in self.waiting.values():
            if not future.done():
                future.set_result(True)
        self.waiting.clear()
        log.debug("admission open for all: %s", reason)

    def listener(self, fact: str, fields: Mapping[str, Any]) -> None:
        """Telemetry's join and leave facts free the worker's slot (a rejoin starts a new session)."""
        if fact in ("join", "leave"):
            self.release(str(fields["worker"]))
        elif fact == "cycle" and self.quickest:
            worker_id = str(fields["worker"])
            if worker_id in self.turn_samples:
                self.turn_samples[worker_id] += int(fields["dss"])
        elif fact == "cycle" and self.fastest:
            seconds = float(fields.get("compute_seconds") or 0.0)
            if seconds > 0.0:
                self._observe(str(fields["worker"]), float(fields["dss"]) / seconds)

    def _observe(self, worker_id: str, speed: float) -> None:
        self.speeds.setdefault(worker_id, deque(maxlen=5)).append(speed)

    def _time_turn(self, worker_id: str) -> None:
        """quickest: a push closes the holder's turn; its samples over the turn's seconds are its speed, and a
        holder that keeps its slot (nobody waits) starts the next turn now."""
        began = self.turn_began.get(worker_id)
        if began is None or worker_id not in self.holders:
            return
        assert self.clock is not None
        now = self.clock()
        samples = self.turn_samples.get(worker_id, 0)
        if samples > 0 and now > began:
            self._observe(worker_id, samples / (now - began))
        self.turn_began[worker_id], self.turn_samples[worker_id] = now, 0

    def speed(self, worker_id: str) -> float | None:
        """The worker's observed samples a second of compute (the median of its last 5 cycles); None untried."""
        seen = self.speeds.get(worker_id)
        return statistics.median(seen) if seen else None

    async def _wait(self, worker_id: str) -> bool:
        self.waited += 1
        earlier = self.waiting.pop(worker_id, None)  # an earlier session's, still held: void now
        if earlier is not None and not earlier.done():
            earlier.set_result(False)
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.waiting[worker_id] = future
        return await future

    def _grant(self) -> None:
        while self.waiting and len(self.holders) < self.limit:
            if self.fastest:
                worker_id = self._pick()
                future = self.waiting.pop(worker_id)
            else:
                worker_id, future = self.waiting.popitem(last=False)
            if future.done():
                continue
            self._take(worker_id)
            future.set_result(True)

    def _keeps(self, worker_id: str) -> bool:
        """``admit`` "fastest": a pushing holder keeps its slot (its reply goes at once) unless an untried worker
        is due a turn or a waiting worker is faster: the slot goes to the best of the waiting and the pusher."""
        mine = self.speed(worker_id)
        others = [h for h in self.holders if h != worker_id]
        worker, speed = self._candidate(sum(1 for h in others if h not in self.speeds))
        if worker is None:
            return True
        if speed is None:  # an untried worker: due while the exploration share has room, else never before me
            return not (sum(1 for h in others if h not in self.speeds) < self.explore_slots)
        return mine is not None and mine >= speed

    def _candidate(self, trying: int) -> tuple[str | None, float | None]:
        """The waiting worker "fastest" would admit next, with its speed (None: untried); void entries skipped."""
        untried: str | None = None
        untried_capacity = -math.inf
        best: str | None = None
        best_speed = -1.0
        for worker_id, future in self.waiting.items():
            if future.done():
                continue
            speed = self.speed(worker_id)
            if speed is None:
                if self.declared is not None:
                    capacity = self.declared(worker_id)
                    capacity = -1.0 if capacity is None else capacity
                    if untried is None or capacity > untried_capacity:  # the oldest of equals
                        untried, untried_capacity = worker_id, capacity
                elif untried is None:
                    untried = worker_id
                    if trying < self.explore_slots:
                        return worker_id, None
            elif speed > best_speed:
                best, best_speed = worker_id, speed
        if untried is not None and self.declared is not None and trying < self.explore_slots:
            return untried, None
        if best is not None:
            return best, best_speed
        return untried, None

    def _pick(self) -> str:
        """``admit`` "fastest": the oldest untried waiting worker while untried holders are under the exploration
        share, else the fastest tried one (the oldest of equals), else the oldest: a free slot never stays idle."""
        worker, _ = self._candidate(sum(1 for h in self.holders if h not in self.speeds))
        if worker is None:  # only void entries wait: drop one (the caller skips it)
            return next(iter(self.waiting))
        return worker

    def _drop(self, worker_id: str) -> None:
        self.holders.discard(worker_id)
        self.turn_began.pop(worker_id, None)
        self.turn_samples.pop(worker_id, None)

    def _take(self, worker_id: str) -> None:
        if self.quickest:
            assert self.clock is not None
            self.turn_began[worker_id], self.turn_samples[worker_id] = self.clock(), 0
        self.holders.add(worker_id)
        self.granted += 1
        self.peak = max(self.peak, len(self.holders))

    def status(self) -> dict[str, Any]:
        return {"limit": self.limit, "training": len(self.holders), "waiting": len(self.waiting),
                "granted": self.granted, "waited": self.waited, "peak": self.peak}
