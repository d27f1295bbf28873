"""``dual-search``: Hermes Sec. IV-A, IQR straggler detection + dual binary search (hermes.common.sizing)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from hermes.common.allocation import CycleObservation, Resize, Workload
from hermes.common.sizing import SearchConfig, StragglerSizer

if TYPE_CHECKING:
    from hermes.common.config import RunConfig


class DualSearchAllocator:
    def __init__(self, sizer: StragglerSizer) -> None:
        self.sizer = sizer
        self._last_seconds: dict[str, float] = {}

    @classmethod
    def from_config(cls, config: "RunConfig", *, dss_max: int) -> "DualSearchAllocator":
        search = SearchConfig(
            mbs_min=config.mbs_min, mbs_max=config.mbs_max, tolerance=config.search_tolerance,
            fit=config.cost_fit, min_observations=config.rebalance_min_observations,
            balance_band=config.balance_band, warmup_cycles=config.rebalance_warmup_cycles,
        )
        return cls(StragglerSizer(search, base_dss=config.cycle_samples, base_mbs=config.batch_size,
                                  dss_step=config.shard_size, dss_max=dss_max))

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        pass  # Hermes measures; it does not trust declared capacity

    def forget(self, worker_id: str) -> None:
        self.sizer.forget(worker_id)
        self._last_seconds.pop(worker_id, None)

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        self.sizer.observe(worker_id, cycle.dss, cycle.mbs, cycle.seconds)
        self._last_seconds[worker_id] = cycle.seconds

    def workload(self, worker_id: str) -> Workload:
        return Workload(*self.sizer.workload(worker_id))

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.sizer.set_memory_limit(worker_id, max_dss)

    def set_batch_limit(self, worker_id: str, max_batch: int) -> None:
        # The search walks a power-of-two MBS grid bounded by mbs_max for all
        # workers; per-worker activation-memory caps are not part of Hermes.
        pass

    def state_dict(self) -> dict:
        """For a server checkpoint (``server.checkpoint``): the sizer's histories and workloads."""
        return self.sizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sizer.load_state_dict(state)

    def rebalance(self) -> dict[str, Resize]:
        out = {}
        for w, res in self.sizer.rebalance().items():
            kind = "slow" if res.target_seconds < self._last_seconds.get(w, res.target_seconds) else "fast"
            out[w] = Resize(Workload(res.dss, res.mbs), kind, {
                "predicted_seconds": round(res.predicted_seconds, 6),
                "target_seconds": round(res.target_seconds, 6),
                "within_tolerance": res.within_tolerance,
            })
        return out
