"""``static``: open-loop variable batching from declared capacity (OmniLearn Eq. 4a, ACSOS static policy)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._common import BatchBounds, StepBatches, check_step_batch
from hermes.common.policies.allocation._state import malformed_as_state_error, stamp, unstamp
from hermes.common.policies.allocation.rounding import Bound, round_preserving_sum
from hermes.common.policies.base import Core, Policy, register

POLICY = "static"


def static_batches(capacities: Sequence[float], global_batch: int, *, lower: Bound = 1, upper: Bound = None) -> list[int]:
    """OmniLearn Eq. 4a / ACSOS static policy: b_k = c_k / sum(c) * K*b, exact sum.

    ``capacities`` are cores or FLOPs per worker; ``global_batch`` is K*b.
    """
    if any(c <= 0 for c in capacities):
        raise ValueError(f"capacities must be positive, got {list(capacities)}")
    return round_preserving_sum(capacities, global_batch, lower, upper)



@register("allocation", "static")
class StaticAllocator(Policy):
    """b_k = c_k / sum(c) * K*b over the active workers, recomputed when membership changes.

    c_k is what the worker declared at registration (cores, or FLOPs: any
    consistent unit); a worker that declared nothing counts as the median of
    those that did. Measurements never move a batch: that is the point of
    the static policy, and its weakness OmniLearn Fig. 7 shows.
    """

    needs_memory_profile: ClassVar[bool] = True
    sections: ClassVar[tuple[str, ...]] = ("batch_bounds",)

    @classmethod
    def check_params(cls, core: Core, *, batch_bounds: BatchBounds, **sections: Any) -> None:
        check_step_batch(core, batch_bounds, cls.name)

    def __init__(self, *, steps: int, batch_size: int, b_min: int, b_max: int) -> None:
        self.sizes = StepBatches(steps=steps, batch_size=batch_size, b_min=b_min, b_max=b_max)
        self.capacity: dict[str, float | None] = {}

    @classmethod
    def build(cls, core: Core, *, batch_bounds: BatchBounds, **params: Any) -> StaticAllocator:
        bounds = batch_bounds
        return cls(steps=core.local_steps, batch_size=core.batch_size, b_min=bounds.b_min, b_max=bounds.b_max)

    def _declared(self) -> dict[str, float]:
        known = sorted(c for c in self.capacity.values() if c)
        fill = known[len(known) // 2] if known else 1.0
        return {w: (c or fill) for w, c in sorted(self.capacity.items())}

    def _reallocate(self) -> None:
        caps = self._declared()
        if not caps:
            return
        ws = list(caps)
        upper = [self.sizes.cap(w) for w in ws]
        total = min(len(ws) * self.sizes.batch_size, sum(upper))  # K*b, unless the caps cannot hold it
        for w, batch_size in zip(ws, static_batches([caps[w] for w in ws], total, lower=self.sizes.b_min, upper=upper)):
            self.sizes.set(w, batch_size, "membership", capacity=caps[w], global_batch=total)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        declared = capacity if capacity and capacity > 0 else None
        if worker_id in self.capacity:
            # Registering again (a restarted agent, a resumed server): the split
            # stands unless what the worker declares has changed.
            if self.capacity[worker_id] != declared:
                self.capacity[worker_id] = declared
                self._reallocate()
            return
        self.capacity[worker_id] = declared
        self.sizes.add(worker_id)
        self._reallocate()

    def forget(self, worker_id: str) -> None:
        self.capacity.pop(worker_id, None)
        self.sizes.remove(worker_id)
        self._reallocate()

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        pass

    def workload(self, worker_id: str) -> Workload:
        return self.sizes.workload(worker_id)

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.set_batch_limit(worker_id, max_dss // self.sizes.steps)

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        self.sizes.limit(worker_id, max_batch_size)
        self._reallocate()

    def rebalance(self) -> dict[str, Resize]:
        return self.sizes.take_pending()

    def state_dict(self) -> dict[str, Any]:
        return stamp(POLICY, self.sizes.params(), batches=self.sizes.state_dict(), capacity=dict(self.capacity))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        body = unstamp(POLICY, state, self.sizes.params())
        with malformed_as_state_error(POLICY):
            sizes = self.sizes.restored(body["batches"])
            capacity = {str(w): (None if c is None else float(c)) for w, c in body["capacity"].items()}
            if set(capacity) != set(sizes.batch_size_of):
                raise ValueError("capacities and batches name different workers")
        self.sizes, self.capacity = sizes, capacity
