"""``pcontrol``: dynamic batching by proportional control (OmniLearn Eq. 6-9, ACSOS Eq. 4-5).

The control law, smoothing, dead-band, bounds, exact global batch and the
throughput-drop b_max rule live in ``proportional_control.ProportionalController``;
this adapter feeds it the cycles that ran at each worker's current batch and
decides when to take a control step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

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
from hermes.common.policies.allocation.proportional_control import PControlParams, ProportionalController
from hermes.common.policies.base import Core, Policy, register

POLICY = "pcontrol"


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

    def __init__(self, *, steps: int, batch_size: int, b_min: int, b_max: int, params: PControlParams,
                 global_batch: bool, min_observations: int, warmup: int, epoch_samples: int) -> None:
        self.sizes = StepBatches(steps=steps, batch_size=batch_size, b_min=b_min, b_max=b_max)
        self.ctl = ProportionalController({}, params, b_min=b_min, b_max=b_max, global_batch=0 if global_batch else None)
        self.fixed_global = global_batch
        self.interval = params.interval
        self.min_observations = min_observations
        self.warmup = warmup
        self.clock = EpochClock(epoch_samples)
        self._seen: dict[str, int] = {}
        self._counted: dict[str, int] = {}
        self._epoch_due = False

    @classmethod
    def build(cls, core: Core, *, pcontrol: PControlParams, batch_bounds: BatchBounds, rebalance: RebalanceParams,
              epoch_samples: int, **params: Any) -> PControlAllocator:
        bounds, reb = batch_bounds, rebalance
        return cls(
            steps=core.local_steps, batch_size=core.batch_size, b_min=bounds.b_min, b_max=bounds.b_max, params=pcontrol,
            global_batch=cls.fixed_global_batch(core, pcontrol), min_observations=reb.min_observations,
            warmup=reb.warmup_cycles, epoch_samples=epoch_samples,
        )

    def _resize_global(self) -> None:
        if self.fixed_global:
            # K*b, unless memory caps and throughput-drop caps cannot hold it together.
            caps = sum(st.b_max for st in self.ctl.workers.values())
            self.ctl.global_batch = min(len(self.ctl.workers) * self.sizes.batch_size, caps)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        if worker_id in self.ctl.workers:
            return  # registering again: its batch, smoothed time and caps stand
        self.sizes.add(worker_id)
        self.ctl.add_worker(worker_id, self.sizes.batch_size_of[worker_id])
        self.ctl.set_b_max(worker_id, self.sizes.cap(worker_id))
        self._seen[worker_id] = self._counted[worker_id] = 0
        self._resize_global()

    def forget(self, worker_id: str) -> None:
        self.sizes.remove(worker_id)
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
        seconds = cycle.seconds_at(self.sizes.workload(worker_id))
        if self._seen[worker_id] <= self.warmup or seconds is None:
            return
        self.ctl.observe(worker_id, seconds)
        self._counted[worker_id] += 1

    def workload(self, worker_id: str) -> Workload:
        return self.sizes.workload(worker_id)

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.set_batch_limit(worker_id, max_dss // self.sizes.steps)

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        """b_max from the worker's memory (OmniLearn Eq. 9); a batch above it shrinks now."""
        if self.sizes.limit(worker_id, max_batch_size):
            self.ctl.workers[worker_id].batch_size = self.sizes.batch_size_of[worker_id]
            self.ctl.workers[worker_id].ewma = None
            self._counted[worker_id] = 0
        if worker_id in self.ctl.workers:
            self.ctl.set_b_max(worker_id, self.sizes.cap(worker_id))

    def _due(self) -> bool:
        ws = list(self.ctl.workers)
        if not ws or any(self._counted[w] < self.min_observations for w in ws):
            return False
        return self._epoch_due if self.interval == "epoch" else True

    def rebalance(self) -> dict[str, Resize]:
        if self._due():
            self._epoch_due = False
            # A worker not yet timed has no smoothed time; it is logged as None rather than failing the epoch.
            times = {w: t for w in self.ctl.workers if (t := self.ctl.smoothed(w)) is not None}
            old = {w: self.ctl.batch_size(w) for w in self.ctl.workers}
            self._resize_global()
            new = self.ctl.update()
            t_bar = round(sum(times.values()) / len(times), 6) if times else None
            for w, batch_size in new.items():
                if batch_size != old[w]:
                    self._counted[w] = 0
                    t_w = times.get(w)
                    self.sizes.set(w, batch_size, smoothed_seconds=None if t_w is None else round(t_w, 6), mean_seconds=t_bar,
                               b_max=self.ctl.b_max_of(w), adjustment=self.ctl.adjustments)
        return self.sizes.take_pending()

    def _params(self) -> dict[str, Any]:
        return {**self.sizes.params(), "global_batch": self.fixed_global, "epoch_samples": self.clock.epoch_samples}

    def state_dict(self) -> dict[str, Any]:
        return stamp(POLICY, self._params(), batches=self.sizes.state_dict(), controller=self.ctl.state_dict(),
                     clock=self.clock.state_dict(), seen=dict(self._seen), counted=dict(self._counted),
                     epoch_due=self._epoch_due)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        body = unstamp(POLICY, state, self._params())
        with malformed_as_state_error(POLICY):
            sizes = self.sizes.restored(body["batches"])
            ctl = self.ctl.restored(body["controller"])
            clock = self.clock.restored(body["clock"])
            seen, counted = str_ints(body["seen"]), str_ints(body["counted"])
            if not set(sizes.batch_size_of) == set(ctl.workers) == set(seen) == set(counted):
                raise ValueError("batches, controller and counts name different workers")
            epoch_due = bool(body["epoch_due"])
        self.sizes, self.ctl, self.clock = sizes, ctl, clock
        self._seen, self._counted, self._epoch_due = seen, counted, epoch_due
