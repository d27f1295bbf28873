"""``ebsp``: elastic bulk-synchronous parallel (Zipline-style predicted barriers), one sync policy."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hermes.common.policies.base import Core, register
from hermes.common.policies.sync import _EBSP, Decision, EbspParams, PushInfo, Release, SyncStrategy, Verdict


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


@register("sync", "ebsp")
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

    provides: ClassVar[frozenset[str]] = frozenset({"barrier", "grouped"})

    def __init__(self, lookahead: int = _EBSP.lookahead, history: int = _EBSP.history) -> None:
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

    sections: ClassVar[tuple[str, ...]] = ("ebsp",)

    @classmethod
    def build(cls, core: Core, *, ebsp: EbspParams, **params: Any) -> SyncStrategy:
        return cls(lookahead=ebsp.lookahead, history=ebsp.history)
