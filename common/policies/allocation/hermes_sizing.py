"""``dual-search``: Hermes Sec. IV-A, IQR straggler detection + dual binary search."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._common import RebalanceParams
from hermes.common.policies.allocation._state import malformed_as_state_error, stamp, unstamp
from hermes.common.policies.allocation.straggler import DualSearchParams, StragglerSizer
from hermes.common.policies.base import Core, Policy, register

POLICY = "dual-search"


@register("allocation", "dual-search")
class DualSearchAllocator(Policy):
    requires: ClassVar[dict[str, str]] = {
        "independent_steps": "sizes DSS and MBS independently, so ranks would disagree on the step count: "
                             "topology 'collective' needs the same number of optimizer steps on every rank per cycle",
    }

    sections: ClassVar[tuple[str, ...]] = ("dual_search", "rebalance")

    @classmethod
    def check_params(cls, core: Core, *, dual_search: DualSearchParams, **sections: Any) -> None:
        d = dual_search
        for name, v in (("dual_search.mbs_min", d.mbs_min), ("dual_search.mbs_max", d.mbs_max),
                        ("batch_size", core.batch_size)):
            if v & (v - 1):
                raise ValueError(f"{name}={v}: dual-search mini-batch sizes are powers of two")
        if not d.mbs_min <= core.batch_size <= d.mbs_max:
            raise ValueError(f"batch_size={core.batch_size} outside [mbs_min, mbs_max]=[{d.mbs_min}, {d.mbs_max}]")
        if d.dss_max is not None and not core.shard_size <= d.dss_max:
            raise ValueError(f"dual_search.dss_max={d.dss_max} < shard_size={core.shard_size}: a DSS is whole shards")


    def __init__(self, sizer: StragglerSizer, judgements_per_round: int = 0) -> None:
        self.sizer = sizer
        self._last_seconds: dict[str, float] = {}
        # dual_search.judgements_per_round: reports since the last judgement (a judgement is O(workers)).
        self.judgements_per_round = judgements_per_round
        self._reports = 0

    @classmethod
    def build(cls, core: Core, *, dual_search: DualSearchParams, rebalance: RebalanceParams, dss_max: int,
              **params: Any) -> DualSearchAllocator:
        return cls(StragglerSizer(dual_search, rebalance, base_dss=core.cycle_samples, base_batch_size=core.batch_size,
                                  dss_step=core.shard_size,
                                  dss_max=dss_max if dual_search.dss_max is None else min(dss_max, dual_search.dss_max)),
                   judgements_per_round=dual_search.judgements_per_round)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        # Hermes measures; it does not trust declared capacity. A worker
        # registering again keeps its workload and history: only forget drops them.
        pass

    def forget(self, worker_id: str) -> None:
        self.sizer.forget(worker_id)
        self._last_seconds.pop(worker_id, None)

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        self.sizer.observe(worker_id, cycle.dss, cycle.batch_size, cycle.seconds)
        self._last_seconds[worker_id] = cycle.seconds
        self._reports += 1

    def _due(self) -> bool:
        """Whether a judgement is due: at every ask (a report, a join, a leave) below 2 * judgements_per_round
        workers, as the paper; then once each workers // judgements_per_round reports."""
        if self.judgements_per_round <= 0:
            return True
        period = len(self._last_seconds) // self.judgements_per_round
        if period <= 1:
            return True
        if self._reports < period:
            return False
        self._reports = 0
        return True

    def workload(self, worker_id: str) -> Workload:
        return Workload(*self.sizer.workload(worker_id))

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.sizer.set_memory_limit(worker_id, max_dss)

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        # The search walks a power-of-two MBS grid bounded by mbs_max for all
        # workers; per-worker activation-memory caps are not part of Hermes.
        pass

    def state_dict(self) -> dict[str, Any]:
        """For a server checkpoint (``server.checkpoint``): the sizer's histories and workloads."""
        return stamp(POLICY, self.sizer.params(), sizer=self.sizer.state_dict(),
                     last_seconds=dict(self._last_seconds))

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if isinstance(state, Mapping) and "policy" not in state and "history" in state:
            # Checkpoints from before states were stamped hold the bare sizer
            # state (dual-search was the only policy that saved one).
            with malformed_as_state_error(POLICY):
                self.sizer.load_state_dict(state)
            self._last_seconds = {}
            return
        body = unstamp(POLICY, state, self.sizer.params())
        with malformed_as_state_error(POLICY):
            last = {str(w): float(t) for w, t in body["last_seconds"].items()}
            self.sizer.load_state_dict(body["sizer"])
        self._last_seconds = last

    def rebalance(self) -> dict[str, Resize]:
        out: dict[str, Resize] = {}
        if not self._due():
            return out
        for w, res in self.sizer.rebalance().items():
            kind = "slow" if res.target_seconds < self._last_seconds.get(w, res.target_seconds) else "fast"
            out[w] = Resize(Workload(res.dss, res.batch_size), kind, {
                "predicted_seconds": round(res.predicted_seconds, 6),
                "target_seconds": round(res.target_seconds, 6),
                "within_tolerance": res.within_tolerance,
            })
        return out
