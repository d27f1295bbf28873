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
- REJECT: drop the update (too stale), reply now.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass


class Decision(str, enum.Enum):
    APPLY = "apply"
    APPLY_AND_WAIT = "apply_and_wait"
    BUFFER = "buffer"
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


class SyncStrategy(ABC):
    name: str = ""

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


class AsyncStrategy(SyncStrategy):
    """ASP: every update is applied on arrival; optionally bounded staleness."""

    name = "asp"

    def __init__(self, max_staleness: int | None = None) -> None:
        super().__init__()
        self.max_staleness = max_staleness

    def on_push(self, push: PushInfo) -> Verdict:
        if self.max_staleness is not None and push.staleness > self.max_staleness:
            return Verdict(Decision.REJECT, f"staleness {push.staleness} > max_staleness {self.max_staleness}")
        return Verdict(Decision.APPLY)


class GatedAsyncStrategy(AsyncStrategy):
    """Hermes: asynchronous, every push applied. The gating happens at the
    agent (HermesGUP, Hermes Alg. 1): a push only arrives when the worker's
    validation loss improved significantly, so the server never drops one."""

    name = "hermes"

    def __init__(self) -> None:
        super().__init__(max_staleness=None)


class BarrierStrategy(SyncStrategy):
    """BSP: one update per active worker per round, aggregated at the barrier.

    A worker that leaves mid-round no longer holds the barrier; its buffered
    update, if any, still counts (it was computed from the round's model).
    """

    name = "bsp"

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[str] = []

    def on_push(self, push: PushInfo) -> Verdict:
        if push.worker_id in self.arrived:
            # The agent protocol is one outstanding push per worker; a second
            # one in the same round means a confused or malicious peer.
            return Verdict(Decision.REJECT, "already pushed in this round")
        self.arrived.append(push.worker_id)
        return Verdict(Decision.BUFFER)

    def take_release(self) -> Release | None:
        if not self.arrived or not self.active.issubset(self.arrived):
            return None
        group = tuple(self.arrived)
        self.arrived = []
        return Release(aggregate=group, wake=group)


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

    name = "ssp"

    def __init__(self, staleness: int = 3) -> None:
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


def predict_push_times(last_at: float, intervals: list[float], until: float) -> list[float]:
    """A worker's next push times: ``last_at + k * mean(intervals)``, k = 1, 2, ...

    Every time up to ``until`` and at least one. Zipline/EBSP predicts each
    worker's iteration time from its recent history; the mean of the last
    few intervals is the plainest such predictor.
    """
    if not intervals:
        raise ValueError("need at least one measured interval to predict")
    step = sum(intervals) / len(intervals)
    if not step > 0:
        raise ValueError(f"mean push interval must be positive, got {step!r}")
    times = [last_at + step]
    while times[-1] + step <= until + 1e-12:
        times.append(last_at + step * (len(times) + 1))
    return times


def choose_barrier(
    predicted_push_times: Mapping[str, list[float]], lookahead: int
) -> tuple[float, dict[str, int]]:
    """Elastic BSP (Zipline) barrier: the time that minimises total waiting.

    ``predicted_push_times[w]`` are worker w's predicted future push times,
    ascending. Candidates are the predicted push times t (a barrier can only
    close on an arrival) with
      - t >= every worker's first predicted push (everyone pushes at least
        once per round), and
      - t <= the fastest worker's ``lookahead``-th push (the window R), unless
        the first bound is later, in which case that bound is the only choice.
    Waiting at t is ``sum_w (t - last predicted push of w at or before t)``.
    Ties go to the earliest t (fresher synchronisation). Returns the barrier
    time and how many pushes each worker makes up to and including it.
    """
    if lookahead < 1:
        raise ValueError(f"lookahead must be >= 1, got {lookahead}")
    if not predicted_push_times:
        raise ValueError("no workers to place a barrier for")
    times = {w: sorted(ts) for w, ts in predicted_push_times.items()}
    for w, ts in times.items():
        if not ts:
            raise ValueError(f"worker {w!r} has no predicted push")
    earliest = max(ts[0] for ts in times.values())
    # The fastest worker is the one whose R-th predicted push comes first;
    # workers predicted fewer than R times cannot be it.
    reach = [ts[lookahead - 1] for ts in times.values() if len(ts) >= lookahead]
    window = min(reach) if reach else max(ts[-1] for ts in times.values())
    end = max(earliest, window)
    candidates = sorted({t for ts in times.values() for t in ts if earliest <= t <= end})

    def waiting(t: float) -> float:
        return sum(t - max(p for p in ts if p <= t) for ts in times.values())

    best = min(candidates, key=lambda t: (waiting(t), t))
    return best, {w: sum(1 for p in ts if p <= best) for w, ts in times.items()}


class ElasticBarrierStrategy(SyncStrategy):
    """EBSP(R): elastic barriers placed to minimise waiting (Zipline-style).

    Each round gives every worker a quota of pushes, from ``choose_barrier``
    over predicted push times (mean of each worker's last ``history``
    compute intervals). Pushes before a worker's quota is reached are
    APPLIED at once and answered at once, so a fast worker keeps computing
    (the engine holds one reply per worker, so they cannot be buffered
    without blocking it). The push that fills the quota is BUFFERED; when
    every active worker has filled its quota, one Release aggregates the
    buffered updates and wakes them all: that is the barrier.

    A worker's compute interval is measured from when it was last answered
    (its previous APPLY, or the release that woke it) to its push, using
    ``PushInfo.at``; waiting at a barrier is not counted as compute.
    Until every worker of a round has a measured interval, or when the
    engine passes no timestamps (all ``at`` equal), the round is plain BSP
    (quota 1 each). A worker that joins mid-round gets quota 1; one that
    leaves stops holding the barrier, its buffered update still counts.
    """

    name = "ebsp"

    def __init__(self, lookahead: int = 3, history: int = 10) -> None:
        super().__init__()
        for label, v in (("lookahead", lookahead), ("history", history)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"ebsp {label} must be an integer >= 1, got {v!r}")
        self.lookahead, self.history = lookahead, history
        self.intervals: dict[str, list[float]] = {}
        self.resumed_at: dict[str, float] = {}
        self.quota: dict[str, int] = {}
        self.done: dict[str, int] = {}
        self.buffered: list[str] = []
        self.round_start = 0.0
        self.last_barrier: float | None = None

    def on_join(self, worker_id: str) -> None:
        super().on_join(worker_id)
        self.quota.setdefault(worker_id, 1)
        self.done.setdefault(worker_id, 0)

    def on_leave(self, worker_id: str) -> None:
        super().on_leave(worker_id)
        self.intervals.pop(worker_id, None)
        self.resumed_at.pop(worker_id, None)
        if worker_id not in self.buffered:
            self.quota.pop(worker_id, None)
            self.done.pop(worker_id, None)

    def _measure(self, push: PushInfo) -> None:
        w = push.worker_id
        start = self.resumed_at.get(w)
        if start is not None and push.at > start:
            iv = self.intervals.setdefault(w, [])
            iv.append(push.at - start)
            del iv[: -self.history]

    def on_push(self, push: PushInfo) -> Verdict:
        w = push.worker_id
        if w in self.buffered:
            return Verdict(Decision.REJECT, "already at this round's barrier")
        self._measure(push)
        self.quota.setdefault(w, 1)
        self.done[w] = self.done.get(w, 0) + 1
        if self.done[w] < self.quota[w]:
            self.resumed_at[w] = push.at
            return Verdict(Decision.APPLY)
        self.buffered.append(w)
        self.round_start = max(self.round_start, push.at)
        return Verdict(Decision.BUFFER)

    def take_release(self) -> Release | None:
        if not self.buffered or not self.active.issubset(self.buffered):
            return None
        group = tuple(self.buffered)
        # The barrier closes on the last arrival; everyone resumes from it.
        for w in group:
            self.resumed_at[w] = self.round_start
        self.buffered = []
        self._plan()
        return Release(aggregate=group, wake=group)

    def _plan(self) -> None:
        """Quotas for the next round from predicted push times."""
        workers = sorted(self.active)
        self.quota = {w: 1 for w in workers}
        self.done = {w: 0 for w in workers}
        self.last_barrier = None
        if len(workers) < 2 or any(not self.intervals.get(w) for w in workers):
            return
        start = self.round_start
        step = {w: sum(self.intervals[w]) / len(self.intervals[w]) for w in workers}
        earliest = max(start + step[w] for w in workers)
        window = min(start + self.lookahead * step[w] for w in workers)
        until = max(earliest, window)
        predicted = {w: predict_push_times(start, self.intervals[w], until) for w in workers}
        self.last_barrier, self.quota = choose_barrier(predicted, self.lookahead)
        self.done = {w: 0 for w in workers}


SYNC_STRATEGIES: dict[str, Callable[..., SyncStrategy]] = {
    "asp": AsyncStrategy,
    "bsp": BarrierStrategy,
    "ebsp": ElasticBarrierStrategy,
    "hermes": GatedAsyncStrategy,
    "ssp": StaleSynchronousStrategy,
}


def make_strategy(name: str, **params) -> SyncStrategy:
    try:
        factory = SYNC_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown sync strategy {name!r}; known: {sorted(SYNC_STRATEGIES)}") from None
    return factory(**params)
