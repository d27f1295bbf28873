"""Sync strategies: when does a pushed update reach the global model?

A strategy never touches a socket or a tensor. The engine tells it about
joins, leaves and pushes; it answers with a Decision per push and, when a
barrier or a staleness bound lets held workers go, a Release. That shape fits
the gated async (``hermes``), bounded-staleness (``ssp``) and elastic-barrier
(``ebsp``) strategies other issues add:

- APPLY: fold the update in now and reply now (ASP, Hermes).
- APPLY_AND_WAIT: fold it in now, hold the reply until released (SSP).
- BUFFER: keep the update, hold the reply; a Release names which buffered
  updates are aggregated together and whose replies go out (BSP, EBSP).
- BUFFER_AND_REPLY: keep the update, reply now; the next Release folds
  every update kept this way (with those it names) as one step (FedBuff's
  buffer: nobody waits for it, and one worker may have several updates in it).
- REJECT: drop the update (too stale), reply now.
"""

from __future__ import annotations

import enum
import logging
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.allocation.straggler import iqr_bounds
from hermes.common.policies.base import Core, Policy, register

log = logging.getLogger(__name__)


class AsyncParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    max_staleness: int | None = Field(
        default=None, ge=0,
        description="Refuse updates computed from a model more than this many versions old (None: never).")


class SspParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    staleness: int = Field(
        default=3, ge=0,
        description="Pushes a worker may run ahead of the slowest active worker (Hermes Table III runs s = 125).")


class EbspParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    lookahead: int = Field(default=3, ge=1, description="Lookahead R: pushes of the fastest worker a barrier may fall within.")
    history: int = Field(default=10, ge=2, description="Push intervals kept per worker to predict its next pushes.")


class BarrierParams(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    deadline: bool = Field(
        default=True, description="Release a round without the workers that have not pushed once it has run "
                                  "past its deadline (issue 29: a silent or always-failing worker held bsp at "
                                  "version 0); false: wait for every active worker, as BSP does.")
    deadline_factor: float = Field(
        default=2.0, gt=1.0, description="Deadline: this x the upper box-plot fence (Q3 + 1.5 IQR, Hermes Sec. IV-A) "
                                         "of the recent complete rounds' durations.")
    min_wait_seconds: float = Field(
        default=1.0, gt=0.0, description="A round is never cut shorter than this (10 s cost a run with a silent "
                                         "worker 2 x 10 s, several times honest bsp's time to target on digits).")
    skip_after: int = Field(
        default=2, ge=1, description="Rounds a worker may miss in a row before rounds stop waiting for it; "
                                     "its next push brings it back.")


_ASP, _SSP, _EBSP, _BSP = AsyncParams(), SspParams(), EbspParams(), BarrierParams()
# Complete rounds whose durations set the deadline; fewer than _MIN_ROUNDS: the round's own arrivals do.
_ROUNDS, _MIN_ROUNDS = 20, 3
# Without round history, the deadline is this x the latest arrival once half the workers have pushed.
_FIRST_ROUND_FACTOR = 4.0


class Decision(str, enum.Enum):
    APPLY = "apply"
    APPLY_AND_WAIT = "apply_and_wait"
    BUFFER = "buffer"
    BUFFER_AND_REPLY = "buffer_and_reply"
    REJECT = "reject"


@dataclass(frozen=True)
class PushInfo:
    worker_id: str
    base_version: int
    current_version: int
    samples: int
    # The worker's clock: how many pushes it has made, this one included.
    iteration: int
    # When the push arrived (the engine's time.monotonic()); 0.0 when the
    # caller does not say. Only time-aware strategies (``ebsp``) read it.
    at: float = 0.0

    @property
    def staleness(self) -> int:
        return self.current_version - self.base_version


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str = ""


@dataclass(frozen=True)
class Release:
    """Buffered updates to aggregate as one step, and held replies to send."""

    aggregate: tuple[str, ...]
    wake: tuple[str, ...]


class SyncStrategy(Policy, ABC):
    """Base of the sync policies; ``provides`` says what the run may rely on (see policies.base)."""

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> SyncStrategy:
        return cls()

    def __init__(self) -> None:
        self.active: set[str] = set()

    def on_join(self, worker_id: str) -> None:
        self.active.add(worker_id)

    def on_leave(self, worker_id: str) -> None:
        self.active.discard(worker_id)

    @abstractmethod
    def on_push(self, push: PushInfo) -> Verdict: ...

    def take_release(self) -> Release | None:
        """A release that is due now, if any. Called after every event."""
        return None

    @property
    def ticks(self) -> bool:
        """Whether on_tick can release anything (a deadline); the engine skips the tick, and its lock, otherwise."""
        return False

    def on_tick(self, now: float) -> None:
        """Time passed with no push (the engine's monotonic clock): a deadline may fall due."""


@register("sync", "asp")
class AsyncStrategy(SyncStrategy):
    """ASP: every update is applied on arrival; optionally bounded staleness."""

    provides: ClassVar[frozenset[str]] = frozenset({"free_running", "asynchronous"})

    def __init__(self, max_staleness: int | None = _ASP.max_staleness) -> None:
        super().__init__()
        self.max_staleness = max_staleness

    def on_push(self, push: PushInfo) -> Verdict:
        if self.max_staleness is not None and push.staleness > self.max_staleness:
            return Verdict(Decision.REJECT, f"staleness {push.staleness} > max_staleness {self.max_staleness}")
        return Verdict(Decision.APPLY)

    sections: ClassVar[tuple[str, ...]] = ("asp",)

    @classmethod
    def build(cls, core: Core, *, asp: AsyncParams, **params: Any) -> SyncStrategy:
        return cls(max_staleness=asp.max_staleness)

    exclusive_params: ClassVar[tuple[str, ...]] = ("asp.max_staleness",)


@register("sync", "hermes")
class GatedAsyncStrategy(AsyncStrategy):
    """Hermes: asynchronous, every push applied. The gating happens at the
    agent (HermesGUP, Hermes Alg. 1): a push only arrives when the worker's
    validation loss improved significantly, so the server never drops one."""

    # asp.max_staleness is asp's alone: hermes never drops a push.
    sections: ClassVar[tuple[str, ...]] = ()
    exclusive_params: ClassVar[tuple[str, ...]] = ()

    def __init__(self) -> None:
        super().__init__(max_staleness=None)

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> SyncStrategy:
        return cls()


@register("sync", "bsp")
class BarrierStrategy(SyncStrategy):
    """BSP: one update per active worker per round, aggregated at the barrier.

    A worker that leaves mid-round no longer holds the barrier; its buffered
    update, if any, still counts (it was computed from the round's model).
    """

    provides: ClassVar[frozenset[str]] = frozenset({"barrier", "lockstep", "grouped"})

    def __init__(self, params: BarrierParams = _BSP) -> None:
        super().__init__()
        self.arrived: list[str] = []
        self.params = params
        self.now = 0.0
        self.round_started: float | None = None
        self.last_arrival = 0.0
        self.durations: list[float] = []
        # Rounds each worker missed in a row; those past skip_after are not waited for until they push.
        self.missed: dict[str, int] = {}
        self.excused: set[str] = set()

    sections: ClassVar[tuple[str, ...]] = ("bsp",)

    @classmethod
    def build(cls, core: Core, *, bsp: BarrierParams = _BSP, **params: Any) -> SyncStrategy:
        return cls(bsp)

    def on_leave(self, worker_id: str) -> None:
        super().on_leave(worker_id)
        self.excused.discard(worker_id)
        self.missed.pop(worker_id, None)

    @property
    def ticks(self) -> bool:
        return self.params.deadline

    def on_tick(self, now: float) -> None:
        self.now = max(self.now, now)

    def on_push(self, push: PushInfo) -> Verdict:
        if push.worker_id in self.arrived:
            # The agent protocol is one outstanding push per worker; a second
            # one in the same round means a confused or malicious peer.
            return Verdict(Decision.REJECT, "already pushed in this round")
        self.now = max(self.now, push.at)
        if self.round_started is None:
            self.round_started = push.at
        self.last_arrival = push.at
        if push.worker_id in self.excused:
            log.info("worker %s pushed again: rounds wait for it again", push.worker_id)
            self.excused.discard(push.worker_id)
        self.missed.pop(push.worker_id, None)
        self.arrived.append(push.worker_id)
        return Verdict(Decision.BUFFER)

    def deadline(self) -> float:
        """Seconds after the round's start past which it goes on without the missing workers (inf: never)."""
        p = self.params
        if not p.deadline or self.round_started is None:
            return math.inf
        if len(self.durations) >= _MIN_ROUNDS:
            # Hermes Sec. IV-A's straggler fence, on round durations: t > Q3 + 1.5 IQR is an outlier.
            _, fence = iqr_bounds(self.durations)
            return max(p.min_wait_seconds, p.deadline_factor * fence)
        waiting = self.active - self.excused
        if 2 * len(self.arrived) < len(waiting):
            return math.inf
        return max(p.min_wait_seconds, _FIRST_ROUND_FACTOR * (self.last_arrival - self.round_started))

    def take_release(self) -> Release | None:
        if not self.arrived:
            return None
        waiting = self.active - self.excused
        complete = waiting.issubset(self.arrived)
        if not complete:
            assert self.round_started is not None
            if self.now - self.round_started < self.deadline():
                return None
            for w in sorted(waiting.difference(self.arrived)):
                self.missed[w] = self.missed.get(w, 0) + 1
                log.warning("round released without worker %s after %.1fs (deadline; %d rounds missed in a row)",
                            w, self.now - self.round_started, self.missed[w])
                if self.missed[w] >= self.params.skip_after:
                    self.excused.add(w)
        elif self.round_started is not None and self.active.issubset(self.arrived):
            self.durations = (self.durations + [self.now - self.round_started])[-_ROUNDS:]
        group = tuple(self.arrived)
        self.arrived = []
        self.round_started = self.now
        return Release(aggregate=group, wake=group)


@register("sync", "ssp")
class StaleSynchronousStrategy(SyncStrategy):
    """SSP(s): a worker may run at most ``s`` pushes ahead of the slowest.

    Each active worker has a clock (pushes made). A push is folded in at once;
    its reply goes out now if the pusher's clock after the push is
    ``<= min_clock + s`` (Decision.APPLY), else it is held (APPLY_AND_WAIT)
    until the slowest active worker catches up, when ``take_release`` wakes
    it with ``Release(aggregate=(), wake=...)``. ``s = 0`` is lock-step.

    The strategy keeps its own clocks rather than trusting
    ``PushInfo.iteration``: a worker that joins (or rejoins) starts at the
    current minimum clock of the others, so it neither stalls everyone nor
    races ahead of the bound. A worker that leaves no longer holds anyone
    back; if it was held, it is woken too (its reply must not hang).
    A push from a worker that never joined is applied and not counted.
    """

    provides: ClassVar[frozenset[str]] = frozenset({"asynchronous"})

    def __init__(self, staleness: int = _SSP.staleness) -> None:
        super().__init__()
        if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
            raise ValueError(f"ssp staleness must be an integer >= 0, got {staleness!r}")
        self.staleness = staleness
        self.clock: dict[str, int] = {}
        # Held workers in the order they were held (release order is stable).
        self.waiting: list[str] = []

    def min_clock(self) -> int | None:
        clocks = [self.clock[w] for w in self.active if w in self.clock]
        return min(clocks) if clocks else None

    def on_join(self, worker_id: str) -> None:
        others = [self.clock[w] for w in self.active if w != worker_id and w in self.clock]
        super().on_join(worker_id)
        self.clock[worker_id] = min(others) if others else 0

    def on_leave(self, worker_id: str) -> None:
        super().on_leave(worker_id)
        self.clock.pop(worker_id, None)

    def on_push(self, push: PushInfo) -> Verdict:
        w = push.worker_id
        if w not in self.active:
            return Verdict(Decision.APPLY)
        self.clock[w] = self.clock.get(w, 0) + 1
        floor = self.min_clock()
        assert floor is not None  # w itself is active
        if self.clock[w] <= floor + self.staleness:
            return Verdict(Decision.APPLY)
        if w not in self.waiting:
            self.waiting.append(w)
        return Verdict(
            Decision.APPLY_AND_WAIT,
            f"clock {self.clock[w]} > slowest {floor} + staleness {self.staleness}",
        )

    def take_release(self) -> Release | None:
        if not self.waiting:
            return None
        floor = self.min_clock()
        go = tuple(
            w for w in self.waiting
            if w not in self.active or floor is None or self.clock[w] <= floor + self.staleness
        )
        if not go:
            return None
        self.waiting = [w for w in self.waiting if w not in go]
        return Release(aggregate=(), wake=go)

    sections: ClassVar[tuple[str, ...]] = ("ssp",)

    @classmethod
    def build(cls, core: Core, *, ssp: SspParams, **params: Any) -> SyncStrategy:
        return cls(staleness=ssp.staleness)
