"""``pcontrol``: dynamic batching by proportional control (OmniLearn Eq. 6-9, ACSOS Eq. 4-5).

The control law, smoothing, dead-band, bounds, exact global batch and the
throughput-drop b_max rule live in ``controllers.ProportionalController``;
this adapter feeds it the cycles that ran at each worker's current batch and
decides when to take a control step.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from hermes.common.policies.allocation import CycleObservation, Resize, Workload, local_steps
from hermes.common.policies.allocation._common import EpochClock, StepBatches, check_step_batch
from hermes.common.policies.allocation._state import (
    malformed_as_state_error,
    stamp,
    str_ints,
    unstamp,
)
from hermes.common.policies.allocation.rounding import round_preserving_sum
from hermes.common.policies.base import Policy, register

if TYPE_CHECKING:
    from hermes.common.config import RunConfig

POLICY = "pcontrol"


@dataclass
class _WorkerState:
    batch: int
    hard_max: int  # configured bound and memory model: never lifted
    ewma: float | None = None
    # For the ACSOS throughput-drop rule: batch and throughput before the last increase.
    before_increase: tuple[int, float] | None = None
    drop_cap: int | None = None
    drop_cap_age: int = 0

    @property
    def b_max(self) -> int:
        return self.hard_max if self.drop_cap is None else min(self.hard_max, self.drop_cap)


@dataclass
class ProportionalController:
    """Dynamic batching: equalise per-iteration compute time across workers.

    Per update (OmniLearn: every epoch; ACSOS: any iteration), for each worker k
    with smoothed compute time t_k at batch b_k:

    - X_k = b_k / t_k, tau_k = t_k - mean(t) (OmniLearn Eq. 6a)
    - b_k' = b_k - X_k * tau_k = b_k * mean(t) / t_k (Eq. 6b; ACSOS Eq. 4-5),
      i.e. proportional to throughput;
    - global batch (``global_batch`` set, BSP): rescaled to sum to B
      (Eq. 8), so b_k' = B * X_k / sum(X); ``global_rule='uniform'`` uses Eq. 8
      literally instead (subtract dB/K from every worker);
      without ``global_batch`` (ASP, and OmniLearn Fig. 8) no global rule;
    - bounds [b_min, b_max_k] (b_max_k per worker: memory, throughput drop);
    - dead-band (OmniLearn Eq. 7): a change counts only if
      |b_k' - b_k| / b_k' >= deadband. Without a global batch each worker is
      gated on its own; with one, the step is taken (for every worker) when
      any worker's change counts, else nothing changes (ACSOS dead-band), so
      sum(b) = B holds after every step.

    Smoothing: EWMA of the per-iteration compute time since the worker's last
    batch change, t <- alpha*t_new + (1-alpha)*t (ACSOS "EWMA across all the
    iterations since the previous batch readjustment"); alpha = 0.3 by
    default, so the newest iteration weighs most but one outlier moves the
    estimate by less than a third. With ``carry_smoothing`` the estimate
    survives a change, rescaled by b_new/b_old, instead of restarting from
    the few cycles since: where cycle times jitter by tens of percent (a
    shared CPU), a restart left each step to 2-3 noisy cycles and the
    controller chased noise (measured: 400+ adjustments in 50 s at HL8).

    Throughput drop (ACSOS Sec. "Batch size bounds"): if a worker's
    throughput after increasing its batch from b0 to b is lower than at b0
    (by more than ``drop_margin``, relative; 0 = the paper's rule), its b_max
    becomes b0. With ``drop_cap_updates`` set, that cap is lifted again after
    so many control steps: a throughput curve measured under one resource
    availability says little once it changes (OmniLearn's dynamic
    heterogeneity), and a cap learned from one noisy step would otherwise
    pin a worker for the rest of the run. Memory caps are never lifted.

    Until every worker has at least one measurement at its current batch,
    ``update`` changes nothing.
    """

    batches: Mapping[str, int]
    b_min: int = 1
    b_max: int = 1 << 30
    deadband: float = 0.1
    alpha: float = 0.3
    global_batch: int | None = None
    global_rule: str = "proportional"
    drop_margin: float = 0.0
    drop_cap_updates: int | None = None
    carry_smoothing: bool = False
    workers: dict[str, _WorkerState] = field(init=False)
    adjustments: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        if not 0 < self.alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {self.alpha}")
        if self.deadband < 0:
            raise ValueError(f"deadband must be >= 0, got {self.deadband}")
        if not 1 <= self.b_min <= self.b_max:
            raise ValueError(f"need 1 <= b_min <= b_max, got ({self.b_min}, {self.b_max})")
        if self.global_rule not in ("proportional", "uniform"):
            raise ValueError(f"global_rule must be 'proportional' or 'uniform', got {self.global_rule!r}")
        self.workers = {}
        for w, b in self.batches.items():
            self.add_worker(w, b)

    # ---- membership and limits -------------------------------------------

    def add_worker(self, worker: str, batch: int) -> None:
        self.workers[worker] = _WorkerState(batch=int(batch), hard_max=self.b_max)

    def remove_worker(self, worker: str) -> None:
        self.workers.pop(worker, None)

    def set_b_max(self, worker: str, b_max: int) -> None:
        """Lower a worker's b_max (memory model, OmniLearn Eq. 9); never below b_min."""
        st = self.workers[worker]
        st.hard_max = max(self.b_min, min(st.hard_max, int(b_max)))

    def batch(self, worker: str) -> int:
        return self.workers[worker].batch

    def b_max_of(self, worker: str) -> int:
        return self.workers[worker].b_max

    # ---- measurements ----------------------------------------------------

    def observe(self, worker: str, seconds: float) -> None:
        """One iteration's compute time at the worker's current batch."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"compute time must be positive, got {seconds!r}")
        st = self.workers[worker]
        st.ewma = seconds if st.ewma is None else self.alpha * seconds + (1 - self.alpha) * st.ewma

    def smoothed(self, worker: str) -> float | None:
        return self.workers[worker].ewma

    # ---- checkpoints -----------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able: per-worker batch, caps, smoothed time and throughput-drop memory."""
        workers = {w: {"batch": st.batch, "hard_max": st.hard_max, "ewma": st.ewma,
                       "before_increase": None if st.before_increase is None else list(st.before_increase),
                       "drop_cap": st.drop_cap, "drop_cap_age": st.drop_cap_age}
                   for w, st in self.workers.items()}
        return {"workers": workers, "global_batch": self.global_batch, "adjustments": self.adjustments}

    def restored(self, state: Mapping[str, Any]) -> ProportionalController:
        """A controller with these settings in the saved state (a new object: a bad state leaves this one alone)."""
        out = dataclasses.replace(self, batches={})
        for w, st in state["workers"].items():
            before = st["before_increase"]
            out.workers[str(w)] = _WorkerState(
                batch=int(st["batch"]), hard_max=int(st["hard_max"]),
                ewma=None if st["ewma"] is None else float(st["ewma"]),
                before_increase=None if before is None else (int(before[0]), float(before[1])),
                drop_cap=None if st["drop_cap"] is None else int(st["drop_cap"]),
                drop_cap_age=int(st["drop_cap_age"]),
            )
        out.global_batch = None if state["global_batch"] is None else int(state["global_batch"])
        out.adjustments = int(state["adjustments"])
        return out

    # ---- the control step ------------------------------------------------

    def update(self) -> dict[str, int]:
        ws = sorted(self.workers)
        if not ws or any(self.workers[w].ewma is None for w in ws):
            return {w: self.workers[w].batch for w in ws}
        st = {w: self.workers[w] for w in ws}
        t = {w: st[w].ewma for w in ws}
        x = {w: st[w].batch / t[w] for w in ws}  # throughput X_k, OmniLearn Eq. 6a
        # ACSOS throughput-drop rule: b_max <- b0 when X fell after b0 -> b.
        # A fall within ``drop_margin`` is measurement noise: one noisy cycle
        # on a shared machine would otherwise cap a fast worker for good.
        for w in ws:
            if st[w].drop_cap is not None:
                st[w].drop_cap_age += 1
                if self.drop_cap_updates is not None and st[w].drop_cap_age > self.drop_cap_updates:
                    st[w].drop_cap = None
            if st[w].before_increase is not None:
                b0, x0 = st[w].before_increase
                if x[w] < x0 * (1.0 - self.drop_margin):
                    st[w].drop_cap, st[w].drop_cap_age = max(self.b_min, min(st[w].b_max, b0)), 0
                st[w].before_increase = None
        t_bar = sum(t.values()) / len(ws)
        # OmniLearn Eq. 6b / ACSOS Eq. 4-5: b' = b - X*(t - t_bar) = X * t_bar.
        proposal = {w: st[w].batch - x[w] * (t[w] - t_bar) for w in ws}
        lo = [self.b_min] * len(ws)
        hi = [st[w].b_max for w in ws]
        old = {w: st[w].batch for w in ws}
        if self.global_batch is None:
            new = {w: int(min(max(math.floor(proposal[w] + 0.5), self.b_min), st[w].b_max)) for w in ws}
        else:
            new = dict(zip(ws, self._global(ws, [proposal[w] for w in ws], self.global_batch, lo, hi)))
        # Dead-band, OmniLearn Eq. 7: change only if |b' - b| / b' >= deadband.
        moving = [w for w in ws if new[w] != old[w] and abs(new[w] - old[w]) / new[w] >= self.deadband]
        if self.global_batch is None:
            # Per worker (OmniLearn Eq. 7): small moves are dropped one by one.
            new = {w: (new[w] if w in moving else old[w]) for w in ws}
        elif not moving and sum(old.values()) == self.global_batch:
            # Under the global rule the dead-band gates the whole step (ACSOS: "if the change
            # on all workers is less than the threshold, no readjustment"): freezing single
            # workers would pin the others, since the batches must still sum to B.
            new = old
        changed = [w for w in ws if new[w] != old[w]]
        for w in changed:
            if new[w] > old[w]:
                st[w].before_increase = (old[w], x[w])
            st[w].batch = new[w]
            if self.carry_smoothing:
                # The prior at the new batch is the old estimate scaled by the
                # proportional model (t ∝ b); the new batch's cycles then blend in.
                st[w].ewma = st[w].ewma * new[w] / old[w]
            else:
                st[w].ewma = None  # ACSOS: smoothing restarts at the new batch
        if changed:
            self.adjustments += 1
        return {w: st[w].batch for w in ws}

    def _global(self, ws: list[str], proposal: list[float], total: int, lo: list[int], hi: list[int]) -> list[int]:
        # Caps lowered by the throughput-drop rule (or memory) may no longer
        # hold B together: then every worker runs at its cap, the most the
        # cluster can do, rather than failing the step.
        total = min(total, sum(hi))
        if self.global_rule == "uniform":
            # OmniLearn Eq. 8 literally: b_k <- b_k' - dB/K, dB = sum(b') - K*b.
            shift = (sum(proposal) - total) / len(ws)
            proposal = [max(p - shift, 0.0) for p in proposal]
        # "proportionately reducing adjusted batches" (OmniLearn Sec. III-B1):
        # b_k = B * X_k / sum(X), exact integers within bounds.
        return round_preserving_sum(proposal, total, lo, hi)



@register("allocation", "pcontrol", "proportional-control")
class PControlAllocator(Policy):
    exclusive_params: ClassVar[tuple[str, ...]] = ("global_batch",)

    @classmethod
    def check_params(cls, config: RunConfig) -> None:
        if config.global_batch == "fixed" and not config.barrier_sync:
            raise ValueError(
                f"global_batch 'fixed' (OmniLearn Eq. 8) constrains the batches of one synchronous step; "
                f"{config.sync!r} pushes asynchronously, so there is no global batch to fix"
            )
        check_step_batch(config, cls.name)


    """When to step: ``interval="epoch"`` after each data epoch (OmniLearn's
    granularity), ``"round"`` at any round (ACSOS: any iteration); either
    way only once every worker has ``min_observations`` cycles at its current
    batch, since a single cycle after a change is mostly noise. Cycles
    assigned before a change still arrive after it and are skipped, and so
    are a worker's first ``warmup`` cycles (allocator and JIT warm-up).

    ``global_batch=True`` keeps sum(b) = K*b (Eq. 8) over the K active
    workers; a join adds b, a leave is re-normalised at the next step.
    """

    def __init__(self, *, steps: int, base: int, b_min: int, b_max: int, deadband: float, alpha: float,
                 global_batch: bool, interval: str, min_observations: int, warmup: int, epoch_samples: int,
                 drop_margin: float = 0.0, drop_cap_updates: int | None = None,
                 carry_smoothing: bool = False) -> None:
        self.b = StepBatches(steps=steps, base=base, b_min=b_min, b_max=b_max)
        self.ctl = ProportionalController({}, b_min=b_min, b_max=b_max, deadband=deadband, alpha=alpha,
                                          global_batch=0 if global_batch else None, drop_margin=drop_margin,
                                          drop_cap_updates=drop_cap_updates, carry_smoothing=carry_smoothing)
        self.fixed_global = global_batch
        self.interval = interval
        self.min_observations = min_observations
        self.warmup = warmup
        self.clock = EpochClock(epoch_samples)
        self._seen: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._epoch_due = False

    @classmethod
    def from_config(cls, config: RunConfig, *, epoch_samples: int, **context: Any) -> PControlAllocator:
        return cls(
            steps=local_steps(config), base=config.batch_size, b_min=config.b_min, b_max=config.b_max,
            deadband=config.pcontrol_deadband, alpha=config.pcontrol_alpha,
            global_batch=config.fixed_global_batch, interval=config.control_interval,
            min_observations=config.rebalance_min_observations, warmup=config.rebalance_warmup_cycles,
            epoch_samples=epoch_samples,
            # No throughput-drop cap: a margin no fall can exceed.
            drop_margin=config.pcontrol_drop_margin if config.pcontrol_throughput_cap else 1.0,
            drop_cap_updates=config.pcontrol_drop_cap_updates or None,
            carry_smoothing=config.pcontrol_carry_smoothing,
        )

    def _resize_global(self) -> None:
        if self.fixed_global:
            # K*b, unless memory caps and throughput-drop caps cannot hold it together.
            caps = sum(st.b_max for st in self.ctl.workers.values())
            self.ctl.global_batch = min(len(self.ctl.workers) * self.b.base, caps)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        if worker_id in self.ctl.workers:
            return  # registering again: its batch, smoothed time and caps stand
        self.b.add(worker_id)
        self.ctl.add_worker(worker_id, self.b.batch[worker_id])
        self.ctl.set_b_max(worker_id, self.b.cap(worker_id))
        self._seen[worker_id] = self._counted[worker_id] = 0
        self._resize_global()

    def forget(self, worker_id: str) -> None:
        self.b.remove(worker_id)
        self.ctl.remove_worker(worker_id)
        self._seen.pop(worker_id, None)
        self._counted.pop(worker_id, None)
        self._resize_global()

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        if worker_id not in self.ctl.workers:
            return
        if self.clock.add(cycle.dss):
            self._epoch_due = True
        self._seen[worker_id] += 1
        seconds = cycle.seconds_at(self.b.workload(worker_id))
        if self._seen[worker_id] <= self.warmup or seconds is None:
            return
        self.ctl.observe(worker_id, seconds)
        self._counted[worker_id] += 1

    def workload(self, worker_id: str) -> Workload:
        return self.b.workload(worker_id)

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.set_batch_limit(worker_id, max_dss // self.b.steps)

    def set_batch_limit(self, worker_id: str, max_batch: int) -> None:
        """b_max from the worker's memory (OmniLearn Eq. 9); a batch above it shrinks now."""
        if self.b.limit(worker_id, max_batch):
            self.ctl.workers[worker_id].batch = self.b.batch[worker_id]
            self.ctl.workers[worker_id].ewma = None
            self._counted[worker_id] = 0
        if worker_id in self.ctl.workers:
            self.ctl.set_b_max(worker_id, self.b.cap(worker_id))

    def _due(self) -> bool:
        ws = list(self.ctl.workers)
        if not ws or any(self._counted[w] < self.min_observations for w in ws):
            return False
        return self._epoch_due if self.interval == "epoch" else True

    def rebalance(self) -> dict[str, Resize]:
        if self._due():
            self._epoch_due = False
            times = {w: self.ctl.smoothed(w) for w in self.ctl.workers}
            old = {w: self.ctl.batch(w) for w in self.ctl.workers}
            self._resize_global()
            new = self.ctl.update()
            t_bar = sum(times.values()) / len(times)
            for w, b in new.items():
                if b != old[w]:
                    self._counted[w] = 0
                    self.b.set(w, b, smoothed_seconds=round(times[w], 6), mean_seconds=round(t_bar, 6),
                               b_max=self.ctl.b_max_of(w), adjustment=self.ctl.adjustments)
        return self.b.take_pending()

    def _params(self) -> dict[str, Any]:
        return {**self.b.params(), "global_batch": self.fixed_global, "epoch_samples": self.clock.epoch_samples}

    def state_dict(self) -> dict[str, Any]:
        return stamp(POLICY, self._params(), batches=self.b.state_dict(), controller=self.ctl.state_dict(),
                     clock=self.clock.state_dict(), seen=dict(self._seen), counted=dict(self._counted),
                     epoch_due=self._epoch_due)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        body = unstamp(POLICY, state, self._params())
        with malformed_as_state_error(POLICY):
            b = self.b.restored(body["batches"])
            ctl = self.ctl.restored(body["controller"])
            clock = self.clock.restored(body["clock"])
            seen, counted = str_ints(body["seen"]), str_ints(body["counted"])
            if not set(b.batch) == set(ctl.workers) == set(seen) == set(counted):
                raise ValueError("batches, controller and counts name different workers")
            epoch_due = bool(body["epoch_due"])
        self.b, self.ctl, self.clock = b, ctl, clock
        self._seen, self._counted, self._epoch_due = seen, counted, epoch_due
