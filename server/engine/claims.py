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
* **Cycle seconds** are at least ``min_compute_fraction`` x the wall time the cycle
  can have taken: from when the server handed out the assignment it names
  (``CycleReport.assignment``, the id of its WORK reply), or the worker's previous
  push reply if that came later (a worker trains one cycle at a time, and a barrier
  holds it until the reply), to the arrival of the push that carries the report.
  Gate-skipped cycles reported since (carried on a work request or on that push)
  share the window: their seconds count together. Judged on the median of the worker's
  last 5 windows' ratios (one window stretched by load is noise). A report that names no assignment
  (agents before the field) or one the server did not hand out has no window: the
  floor is off for it, and only the speed bound below holds. The speed they imply, dss / seconds, at most
  ``power_factor`` x the median of the other workers' speeds (each the median of its
  last 5 bounded reports): edge fleets differ by 8x (HL8), a speed past that is a
  claim, not a device. Judged on the median of the worker's own last 5 claims: one
  fast cycle on a loaded machine (7 ms where the worker's usual is 30 ms) is noise,
  which clamped 1-3 honest reports in each of 8 of 16 presets' 30 s runs (2026-11-27);
  a speed claimed again and again is a claim, and a liar's first report is its median. A worker
  never handed an assignment is capped at 1x the others' median: it reports no work it was asked for.
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
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

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
    # Assignment id -> when it was handed out (the elapsed-time floor's start) and its work scale, oldest first.
    handed: OrderedDict[int, tuple[float, float | None]] = field(default_factory=OrderedDict)
    # The work scale of the assignment the cycle riding on the latest push trained (screening's norm scale).
    pushed_scale: float | None = None
    # The open window: the earliest start and the claimed seconds of the cycles reported since the last push closed one.
    window_start: float | None = None
    window_seconds: float = 0.0
    # The summed work scale of the window's cycles: what the push that closes it folds (gate-skipped cycles
    # train on into the next push's since-pull delta).
    window_work: float = 0.0
    # Claimed compute / wall time of the worker's last closed windows (the floor judges their median).
    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=_SPEEDS))
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
        # Fold-time power caps (cap_powers): how many powers were lowered.
        self.powers_capped = 0
        # Assignment ids, one counter for the run (unique across workers and rejoins).
        self._next_id = 0
        # The lowest claimed compute / elapsed wall time of a closed window, and how many were closed
        # (the floor's honest margin, in the false-refusal table).
        self.min_compute_ratio: float | None = None
        # The lowest median of a worker's last 5 ratios: what the floor is judged on.
        self.min_median_ratio: float | None = None
        self.windows = 0

    @property
    def on(self) -> bool:
        """Checked where screening is on (``screening.enabled`` and ``screening.claims``)."""
        return self.settings.enabled and self.settings.claims

    def _of(self, worker_id: str) -> _Worker:
        # Not setdefault: its default, five deques and a dict, was built on every call, twice a push (issue 31).
        me = self.workers.get(worker_id)
        if me is None:
            me = self.workers[worker_id] = _Worker()
        return me

    def on_assign(self, worker_id: str, cycle_samples: int, *, batch_size: int | None = None, accumulation: int = 1,
                  lr: float | None = None) -> int:
        """Record an assignment handed out now (its shape, where given: screening's work scale); its id."""
        me = self._of(worker_id)
        me.outstanding.append(cycle_samples)
        self._next_id += 1
        scale = None if batch_size is None or lr is None else work_scale(cycle_samples, batch_size, accumulation, lr)
        me.handed[self._next_id] = (self.clock(), scale)
        while len(me.handed) > _OUTSTANDING:  # a lost report must not keep its start for ever
            me.handed.popitem(last=False)
        return self._next_id

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

    def cycle(self, worker_id: str, report: CycleReport, *, on_push: bool = False) -> CycleReport:
        """A cycle report with dss and compute_seconds within bounds; ``on_push``: it rides on the push of
        its own update (``PushUpdate.cycle``), whose arrival closes its elapsed-time window."""
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
        seconds = self._floor(worker_id, me, report, seconds, on_push)
        others = median_without(self.speeds, me.speed)
        if seconds > 0.0:
            me.claimed.append(dss / seconds)
        # A worker whose claimed compute agrees with the server's own clock (the elapsed-time windows) is not
        # held to the others' speed: samples a second compare badly across batch sizes (a step's fixed cost
        # dominates a batch of 5), and edp-sgd's fast worker measured above 16x the others' median once the
        # partition cut their batches to 5-6, 5 honest clamps in 5 seeds (2026-11-27). Its own windows bound it:
        # the floor holds any claim to 1 / min_compute_fraction x what the wall time allows.
        if others is not None and seconds > 0.0 and not self.vouched(me):
            # A worker that was never handed an assignment reports no work the server asked for: its speed
            # counts at most as the others' median (a claimer that only pushed took 0.945 of edp-sgd rounds
            # beside three honest agents under the 8x bound, 2026-11-27). Agents ask for work before a cycle.
            cap = (s.power_factor if me.outstanding or me.trained else 1.0) * others
            if dss / seconds > cap * tol and statistics.median(me.claimed) > cap * tol:
                floor = dss / cap
                self._clamp(worker_id, "compute_seconds", seconds, floor)
                seconds = floor
        if seconds > 0.0:
            self._add_speed(me, dss / seconds)
        if (dss, seconds) == (report.dss, report.compute_seconds):
            return report
        return report.model_copy(update={"dss": dss, "compute_seconds": seconds})

    def _floor(self, worker_id: str, me: _Worker, report: CycleReport, seconds: float, on_push: bool) -> float:
        """The elapsed-time floor: the seconds of the cycles in a window at least min_compute_fraction x
        its wall time; the deficit, if any, is added to the report that closes it."""
        found = me.handed.pop(report.assignment, None) if report.assignment is not None else None
        if found is None:
            # No window of the server's own: an agent before CycleReport.assignment, or an id it
            # never handed this worker. The speed bound alone judges it, and screening the median.
            if on_push:
                me.pushed_scale = None
                me.window_start, me.window_seconds, me.window_work = None, 0.0, 0.0
            return seconds
        handed, work = found
        me.window_work += work or 0.0
        if on_push:
            me.pushed_scale = (me.window_work or None) if work is not None else None
            if not report.pushed:
                me.window_work = 0.0
        now = self.clock()
        # Not before the assignment existed, nor before the previous push's reply: the worker trains one
        # cycle at a time, and under a barrier it waited for that reply (a wait that is not its compute).
        start = handed if me.replied_at is None else max(handed, me.replied_at)
        me.window_start = start if me.window_start is None else min(me.window_start, start)
        me.window_seconds += seconds
        if not on_push or not report.pushed:
            return seconds  # a skipped cycle: its window closes with the next push
        elapsed = max(0.0, now - me.window_start)
        claimed = me.window_seconds
        me.window_start, me.window_seconds, me.window_work = None, 0.0, 0.0
        if elapsed <= 0.0:
            return seconds
        self.windows += 1
        ratio = claimed / elapsed
        if self.min_compute_ratio is None or ratio < self.min_compute_ratio:
            self.min_compute_ratio = ratio
        me.ratios.append(ratio)
        typical = statistics.median(me.ratios)
        if self.min_median_ratio is None or typical < self.min_median_ratio:
            self.min_median_ratio = typical
        # Judged on the median of the worker's last 5 windows, as speeds are: one window stretched by a
        # loaded machine is noise (an honest variable-batching window was 0.26 of its wall time, the
        # worker's usual 0.5-0.9, 2026-11-27); a liar's every window is near 0, its first one included.
        floor = self.settings.min_compute_fraction * elapsed
        if claimed < floor and typical < self.settings.min_compute_fraction:
            raised = seconds + (floor - claimed)
            self._clamp(worker_id, "compute_seconds", seconds, raised)
            return raised
        return seconds

    def vouched(self, me: _Worker) -> bool:
        """The worker's claimed compute is at least min_compute_fraction of the wall time of its windows, as
        they came (the median of its last 5, before any floor): the server's clock vouches for its speed."""
        fraction = self.settings.min_compute_fraction
        return fraction > 0.0 and bool(me.ratios) and statistics.median(me.ratios) >= fraction

    def take_scale(self, worker_id: str) -> float | None:
        """The work scale of the update this worker is pushing now, once: the sum over the cycles it folds
        (its own and the gate-skipped ones reported since the last push, each naming its assignment);
        None when unknown (no report on the push, no id, an id not handed to it)."""
        me = self.workers.get(worker_id)
        if me is None:
            return None
        scale, me.pushed_scale = me.pushed_scale, None
        return scale

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

    def cap_powers(self, worker_ids: Sequence[str], powers: list[float]) -> list[float]:
        """One round's compute powers (the power rule's CP_m, DP-SGD Eq. 2), each at most power_factor x the median
        of the OTHER members' powers in this round (1x for a worker never handed an assignment), unless its windows
        vouch for its speed (``vouched``).

        The claims bound a speed against the whole fleet's median, so a liar's share of a round grew as fewer
        honest workers were in it: 0.926 beside two (attack matrix, 2026-11-27), 0.673 beside three while its
        first, unbounded claims (no other speed to compare with yet) still made its epoch's power. Against the
        round's own members its weight CP_m / sum(CP) is at most f / (f + n - 1) in a round of n equal others,
        what an honest worker f times their speed earns, however few are in the round."""
        if not self.on or len(powers) < 2:
            return powers
        capped = list(powers)
        for i, (wid, power) in enumerate(zip(worker_ids, powers)):
            me = self.workers.get(wid)
            if me is not None and self.vouched(me):
                continue
            factor = self.settings.power_factor if me is not None and (me.outstanding or me.trained) else 1.0
            cap = factor * statistics.median(p for j, p in enumerate(powers) if j != i)
            if power > cap:
                capped[i] = cap
                self.powers_capped += 1
                self.telemetry.emit("power_capped", worker=wid, power=round(power, 6), bound=round(cap, 6),
                                    round_size=len(powers))
        return capped

    def public(self) -> dict[str, int]:
        """Clamps by field; ``power``: fold-time caps of a round's powers (cap_powers)."""
        return {**self.clamped, **({"power": self.powers_capped} if self.powers_capped else {})}

    def windows_public(self) -> dict[str, Any]:
        """The elapsed-time floor's record: windows closed, the lowest claimed compute / wall time, the floor."""
        ratio = None if self.min_compute_ratio is None else round(self.min_compute_ratio, 4)
        median = None if self.min_median_ratio is None else round(self.min_median_ratio, 4)
        return {"closed": self.windows, "min_ratio": ratio, "min_median_ratio": median,
                "floor": self.settings.min_compute_fraction}


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


def work_scale(cycle_samples: int, batch_size: int, accumulation: int, lr: float) -> float:
    """How large an honest update of this assignment can be, up to one constant: lr x steps / batch,
    steps = samples / (batch x accumulation), batch the effective one (batch x accumulation).

    An update is lr x the sum of its steps' mean gradients. Near convergence most samples' gradients are ~0
    and a few hard ones dominate: one hard sample in a step's batch moves it by g / batch. So a cycle's
    largest honest update grows as lr x steps / batch, not with the sqrt(1 / batch) of Gaussian noise
    (edp-sgd seed 2: batch-5 cycles at 14-70x the median norm of batch-32 ones, 2026-11-27; see
    docs/false-refusals.md).
    """
    batch = max(1, batch_size * max(1, accumulation))
    return lr * max(1, cycle_samples) / float(batch * batch)

