"""``uniform``: every worker trains the run's default workload, whatever its speed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._state import stamp, unstamp
from hermes.common.policies.base import Core, Policy, register

POLICY = "uniform"


@register("allocation", "uniform")
class UniformAllocator(Policy):
    """Everyone gets the run's defaults, whatever its speed."""

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> UniformAllocator:
        return cls(Workload(core.cycle_samples, core.batch_size))


    def __init__(self, workload: Workload) -> None:
        self._workload = workload

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        pass

    def forget(self, worker_id: str) -> None:
        pass

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        pass

    def workload(self, worker_id: str) -> Workload:
        return self._workload

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        pass

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        pass

    def rebalance(self) -> dict[str, Resize]:
        return {}

    # Nothing to keep (the workload is the run config's), but the stamp still
    # tells a resumed run whose allocation changed that it cannot load this.
    def state_dict(self) -> dict[str, Any]:
        return stamp(POLICY, {})

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        unstamp(POLICY, state, {})
