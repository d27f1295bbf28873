"""``pcontrol``: dynamic batching by proportional control (OmniLearn Eq. 6-9, ACSOS Eq. 4-5).

The control law, smoothing, dead-band, bounds, exact global batch and the
throughput-drop b_max rule live in ``proportional_control.ProportionalController``;
this adapter feeds it the cycles that ran at each worker's current batch and
decides when to take a control step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._common import (
    BatchBounds,
    EpochClock,
    RebalanceParams,
    StepBatches,
    check_step_batch,
)
from hermes.common.policies.allocation._state import (
    malformed_as_state_error,
    stamp,
    str_ints,
    unstamp,
)
from hermes.common.policies.allocation.proportional_control import ProportionalController
from hermes.common.policies.base import Core, Policy, register

POLICY = "pcontrol"


class PControlParams(BaseModel):
    """The run config's ``pcontrol`` section: the controller's settings for a run (ours where they differ from the papers)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    deadband: float = Field(default=0.1, ge=0.0, lt=1.0,
                            description="Dead-band: a batch change counts only if |b' - b| / b' >= this (OmniLearn Eq. 7).")
    alpha: float = Field(default=0.3, gt=0.0, le=1.0, description="EWMA weight of the newest cycle time (ACSOS smoothing).")
    interval: Literal["epoch", "round"] = Field(
        default="epoch", description="When to step: 'epoch' after each data epoch (OmniLearn), 'round' whenever every "
                                     "worker has new measurements (ACSOS).")
    # Where cycle times jitter by tens of percent (a shared CPU), restarting
    # left each step to 2-3 noisy cycles (measured: 400+ adjustments in 50 s at HL8).
    carry_smoothing: bool = Field(
        default=True, description="Keep the smoothed time across a batch change, rescaled by b_new/b_old; false "
                                  "restarts it (ACSOS).")
    throughput_cap: bool = Field(
        default=True, description="ACSOS throughput-drop rule: b_max <- b0 when throughput fell after b0 -> b.")
    # Cycle times on a shared CPU jitter by 10-30%; ACSOS Fig. 5's memory cliff is far steeper.
    drop_margin: float = Field(
        default=0.25, ge=0.0, lt=1.0, description="A throughput fall within this share is noise, not a drop "
                                                   "(0 = the paper's rule).")
    drop_cap_updates: int = Field(
        default=10, ge=0, description="Control steps after which a throughput-drop cap is lifted (0 = never, the paper's rule).")
    # The papers' rules, each one switch away (docs/papers.md, "Deviations from the papers").
    deadband_order: Literal["after-bounds", "before-bounds"] = Field(
        default="after-bounds", description="Dead-band tested on the bounded batch (ours, ACSOS) or, 'before-bounds', "
                                            "on the unbounded Eq. 6 value, then clamped (OmniLearn Alg. 1).")
    deadband_reference: Literal["new", "old"] = Field(
        default="new", description="Dead-band relative to the new batch (OmniLearn Eq. 7) or, 'old', to the old one "
                                   "(ACSOS step 4).")
    global_rule: Literal["proportional", "uniform"] = Field(
        default="proportional", description="Fixed global batch by rescaling proportionally, b_k = B*X_k/sum(X) "
                                            "(ours), or 'uniform': OmniLearn Eq. 8 literally, b_k' - dB/K.")
    global_batch: Literal["fixed", "free"] | None = Field(
        default=None, description="Global batch rule (OmniLearn Eq. 8): 'fixed' keeps sum(b) = K*b, 'free' does not; "
                                  "unset: fixed under a barrier, free for asynchronous pushes.")


@register("allocation", "pcontrol", "proportional-control")
class PControlAllocator(Policy):
    """When to step: ``interval="epoch"`` after each data epoch (OmniLearn's
    granularity), ``"round"`` at any round (ACSOS: any iteration); either
    way only once every worker has ``min_observations`` cycles at its current
    batch, since a single cycle after a change is mostly noise. Cycles
    assigned before a change still arrive after it and are skipped, and so
    are a worker's first ``warmup`` cycles (allocator and JIT warm-up).

    ``global_batch=True`` keeps sum(b) = K*b (Eq. 8) over the K active
    workers; a join adds b, a leave is re-normalised at the next step.
    """

    needs_memory_profile: ClassVar[bool] = True

    exclusive_params: ClassVar[tuple[str, ...]] = ("pcontrol.global_batch",)
    sections: ClassVar[tuple[str, ...]] = ("pcontrol", "batch_bounds", "rebalance")

    @classmethod
    def check_params(cls, core: Core, *, pcontrol: PControlParams, batch_bounds: BatchBounds,
                     **sections: Any) -> None:
        if pcontrol.global_batch == "fixed" and not core.barrier:
            raise ValueError(
                f"pcontrol.global_batch 'fixed' (OmniLearn Eq. 8) constrains the batches of one synchronous step; "
                f"{core.sync!r} pushes asynchronously, so there is no global batch to fix"
            )
        check_step_batch(core, batch_bounds, cls.name)

    @staticmethod
    def fixed_global_batch(core: Core, pcontrol: PControlParams) -> bool:
        """OmniLearn Eq. 8 holds: set by pcontrol.global_batch, else fixed exactly under a barrier."""
        if pcontrol.global_batch is not None:
            return pcontrol.global_batch == "fixed"
        return core.barrier

    def __init__(self, *, steps: int, base: int, b_min: int, b_max: int, deadband: float, alpha: float,
                 global_batch: bool, interval: str, min_observations: int, warmup: int, epoch_samples: int,
                 drop_margin: float = 0.0, drop_cap_updates: int | None = None,
                 carry_smoothing: bool = False, deadband_order: str = "after-bounds", deadband_reference: str = "new",
                 global_rule: str = "proportional") -> None:
        self.b = StepBatches(steps=steps, base=base, b_min=b_min, b_max=b_max)
        self.ctl = ProportionalController({}, b_min=b_min, b_max=b_max, deadband=deadband, alpha=alpha,
                                          global_batch=0 if global_batch else None, drop_margin=drop_margin,
                                          drop_cap_updates=drop_cap_updates, carry_smoothing=carry_smoothing,
                                          deadband_order=deadband_order, deadband_reference=deadband_reference,
                                          global_rule=global_rule)
        self.fixed_global = global_batch
        self.interval = interval
        self.min_observations = min_observations
        self.warmup = warmup
        self.clock = EpochClock(epoch_samples)
        self._seen: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._epoch_due = False

    @classmethod
    def build(cls, core: Core, *, pcontrol: PControlParams, batch_bounds: BatchBounds, rebalance: RebalanceParams,
              epoch_samples: int, **params: Any) -> PControlAllocator:
        pc, bounds, reb = pcontrol, batch_bounds, rebalance
        return cls(
            steps=core.local_steps, base=core.batch_size, b_min=bounds.b_min, b_max=bounds.b_max,
            deadband=pc.deadband, alpha=pc.alpha,
            global_batch=cls.fixed_global_batch(core, pc), interval=pc.interval,
            min_observations=reb.min_observations, warmup=reb.warmup_cycles,
            epoch_samples=epoch_samples,
            # No throughput-drop cap: a margin no fall can exceed.
            drop_margin=pc.drop_margin if pc.throughput_cap else 1.0,
            drop_cap_updates=pc.drop_cap_updates or None,
            carry_smoothing=pc.carry_smoothing, deadband_order=pc.deadband_order,
            deadband_reference=pc.deadband_reference, global_rule=pc.global_rule,
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
