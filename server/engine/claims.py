"""Claims checked against what the server knows (issue 29).

A worker's push says how many samples it trained (``samples``, the weight of
the ``samples`` rule: Hermes Eq. 5 / FedAvg's n_k) and its cycle report how long
that took (``compute_seconds``, the compute power of the partition allocator and
the ``power`` rule: DP-SGD / EDP-SGD Eq. 2). Neither was compared with anything:
``samples: 1e9`` took weight 1.0 in every ``bsp`` round, "128 samples in 1e-6 s"
took power weight 0.99995 in ``edp-sgd``. The bounds:

* **Samples** are at most the largest ``cycle_samples`` of the worker's assignments
  not yet reported trained, and of the last few reported (the WORK reply; with local
  data the same count, drawn from the declared local set): what the server asked for
  is the most it can have got. Each cycle report retires the oldest outstanding
  assignment (an agent trains them in order). A fixed window of the last 4
  assignments clamped honest ``hermes`` reports 41 times in a 30 s run: with
  ``assignments_per_request`` 4 and prefetching, an agent trains a cycle handed
  out up to 8 assignments earlier, before a resize (2026-11-27).
  A worker that never asked for work: at most the smallest recent assignment of the
  others; before anyone has one, the allocator's current workload for it.
* **Cycle seconds** are at least ``min_compute_fraction`` x the time since the
  worker's previous push was answered (it cannot have trained the next cycle in
  less than a fraction of that), and the speed they imply, dss / seconds, at most
  ``power_factor`` x the median of the other workers' speeds (each the median of its
  last 5 bounded reports): edge fleets differ by 8x (HL8), a speed past that is a
  claim, not a device. Judged on the median of the worker's own last 5 claims: one
  fast cycle on a loaded machine (7 ms where the worker's usual is 30 ms) is noise,
  which clamped 1-3 honest reports in each of 8 of 16 presets' 30 s runs (2026-11-27);
  a speed claimed again and again is a claim, and a liar's first report is its median.
* **dss** of a cycle report is bounded like samples.

A claim out of bounds is **clamped**, not refused: the update itself may be
honest (a clock glitch, a stale report after a resize) and refusing it would throw
away the work; the clamp takes from the claim all it could win. Each clamp is an
``claim_clamped`` event (worker, field, claimed, bound): evidence for the quarantine
policy, which decides on a worker's record over time.
"""

from __future__ import annotations

import bisect
import logging
import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hermes.common.messages import CycleReport

if TYPE_CHECKING:
    from hermes.server.engine.telemetry import Telemetry
    from hermes.server.screening_params import ScreeningSettings

log = logging.getLogger(__name__)

# Assignments outstanding per worker (assignments_per_request <= 16, twice over with the prefetch);
# beyond this the oldest are forgotten (a lost report must not pin an old size for ever).
_OUTSTANDING = 64
# Assignments reported trained that a push may still claim (the push follows its cycle's report).
_TRAINED = 4
# Speed reports per worker the power bound judges by their median.
_SPEEDS = 5


@dataclass
class _Worker:
    # Handed out and not yet reported trained, oldest first.
    outstanding: deque[int] = field(default_factory=lambda: deque(maxlen=_OUTSTANDING))
    trained: deque[int] = field(default_factory=lambda: deque(maxlen=_TRAINED))
    replied_at: float | None = None
    claimed: deque[float] = field(default_factory=lambda: deque(maxlen=_SPEEDS))  # as claimed
    bounded: deque[float] = field(default_factory=lambda: deque(maxlen=_SPEEDS))  # after the bounds

    @property
    def speed(self) -> float | None:
        return statistics.median(self.bounded) if self.bounded else None


class Claims:
    def __init__(self, settings: ScreeningSettings, telemetry: Telemetry, clock: Callable[[], float],
                 workload: Callable[[str], int] | None = None) -> None:
        self.settings = settings
        # The samples the allocator would assign a worker now (its cycle size), for a claim before any assignment.
        self.workload = workload
        self.telemetry = telemetry
        self.clock = clock
        self.workers: dict[str, _Worker] = {}
        self.clamped: dict[str, int] = {}
        # Every worker's latest positive speed, sorted: the median of the others' without a pass over all
        # workers per cycle report (that pass was 4.6 ms of each push with 1,000 simulated devices).
        self.speeds: list[float] = []

    @property
    def on(self) -> bool:
        """Checked where screening is on (``screening.enabled`` and ``screening.claims``)."""
        return self.settings.enabled and self.settings.claims

    def _of(self, worker_id: str) -> _Worker:
        return self.workers.setdefault(worker_id, _Worker())

    def on_assign(self, worker_id: str, cycle_samples: int) -> None:
        self._of(worker_id).outstanding.append(cycle_samples)

    def on_reply(self, worker_id: str) -> None:
        self._of(worker_id).replied_at = self.clock()

    def _bound(self, worker_id: str) -> int:
        """The most samples a claim may count: the worker's largest outstanding or just-trained
        assignment; a worker that never asked for work gets the smallest latest assignment of the
        others (it cannot have more)."""
        me = self._of(worker_id)
        if me.outstanding or me.trained:
            return max((*me.outstanding, *me.trained))
        others = [(w.outstanding or w.trained)[-1] for w in self.workers.values() if w.outstanding or w.trained]
        if others:
            return min(others)
        if self.workload is not None:
            try:
                return self.workload(worker_id)  # what the allocator would assign it now
            except (KeyError, ValueError):
                pass
        return self.settings.max_samples_unassigned

    def _clamp(self, worker_id: str, name: str, claimed: float, bound: float) -> None:
        self.clamped[name] = self.clamped.get(name, 0) + 1
        self.telemetry.emit("claim_clamped", worker=worker_id, field=name, claimed=claimed, bound=round(bound, 6))

    def samples(self, worker_id: str, claimed: int) -> int:
        """A push's sample count, at most what the worker was assigned."""
        if not self.on:
            return claimed
        bound = self._bound(worker_id)
        if claimed > bound:
            self._clamp(worker_id, "samples", claimed, bound)
            return bound
        return claimed

    def cycle(self, worker_id: str, report: CycleReport) -> CycleReport:
        """A cycle report with dss and compute_seconds within bounds."""
        s = self.settings
        if not self.on:
            return report
        me = self._of(worker_id)
        dss, seconds = report.dss, report.compute_seconds
        if dss > (bound := self._bound(worker_id)):
            self._clamp(worker_id, "dss", dss, bound)
            dss = bound
        if me.outstanding:  # this report's cycle trained the oldest outstanding assignment
            me.trained.append(me.outstanding.popleft())
        # Timing claims within speed_tolerance of a bound are measurement noise, not lies: an honest
        # hl8 asp run had 223 clamps of a few ms each without it (2026-11-27).
        tol = s.speed_tolerance
        if me.replied_at is not None:
            floor = s.min_compute_fraction * (self.clock() - me.replied_at)
            if seconds * tol < floor:
                self._clamp(worker_id, "compute_seconds", seconds, floor)
                seconds = floor
        others = median_without(self.speeds, me.speed)
        if seconds > 0.0:
            me.claimed.append(dss / seconds)
        if others is not None and seconds > 0.0:
            cap = s.power_factor * others
            if dss / seconds > cap * tol and statistics.median(me.claimed) > cap * tol:
                floor = dss / cap
                self._clamp(worker_id, "compute_seconds", seconds, floor)
                seconds = floor
        if seconds > 0.0:
            self._add_speed(me, dss / seconds)
        if (dss, seconds) == (report.dss, report.compute_seconds):
            return report
        return report.model_copy(update={"dss": dss, "compute_seconds": seconds})

    def _add_speed(self, me: _Worker, speed: float) -> None:
        """Record a bounded speed; the sorted index holds each worker's median of its last few."""
        if me.speed:
            del self.speeds[bisect.bisect_left(self.speeds, me.speed)]
        me.bounded.append(speed)
        if me.speed:
            bisect.insort(self.speeds, me.speed)

    def forget(self, worker_id: str) -> None:
        me = self.workers.pop(worker_id, None)
        if me is not None and me.speed:
            del self.speeds[bisect.bisect_left(self.speeds, me.speed)]

    def public(self) -> dict[str, int]:
        return dict(self.clamped)


def median_without(ordered: list[float], mine: float | None) -> float | None:
    """statistics.median of ``ordered`` (sorted) with one occurrence of ``mine`` left out (None, 0: none is);
    None when nothing is left."""
    skip = bisect.bisect_left(ordered, mine) if mine else len(ordered)
    n = len(ordered) - (skip < len(ordered))
    if n <= 0:
        return None

    def kth(k: int) -> float:
        return ordered[k] if k < skip else ordered[k + 1]

    if n % 2:
        return kth(n // 2)
    return (kth(n // 2 - 1) + kth(n // 2)) / 2
