"""Allocation policies: how much work each worker gets per cycle.

An allocator is told each worker's measured cycles and answers each worker's
workload, (DSS, MBS): samples per cycle and mini-batch size. ``uniform``
gives everyone the run's defaults; ``dual-search`` is Hermes' IQR straggler
detection with the dual binary search (hermes.common.sizing). Later issues
add OmniLearn's controllers and the task-allocation and partitioning rules.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from hermes.common.sizing import SearchConfig, SizingResult, StragglerSizer

if TYPE_CHECKING:
    from hermes.common.config import RunConfig


class Allocator(Protocol):
    def observe(self, worker_id: str, dss: int, mbs: int, seconds: float) -> None: ...
    def forget(self, worker_id: str) -> None: ...
    def workload(self, worker_id: str) -> tuple[int, int]: ...
    def set_memory_limit(self, worker_id: str, max_dss: int) -> None: ...
    def rebalance(self) -> dict[str, SizingResult]: ...


class UniformAllocator:
    """Every worker trains the same DSS at the same MBS, whatever its speed."""

    def __init__(self, dss: int, mbs: int) -> None:
        self.dss, self.mbs = dss, mbs

    def observe(self, worker_id: str, dss: int, mbs: int, seconds: float) -> None:
        pass

    def forget(self, worker_id: str) -> None:
        pass

    def workload(self, worker_id: str) -> tuple[int, int]:
        return self.dss, self.mbs

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        pass

    def rebalance(self) -> dict[str, SizingResult]:
        return {}


def make_allocator(config: "RunConfig", *, dss_max: int) -> Allocator:
    if config.allocation == "uniform":
        return UniformAllocator(config.cycle_samples, config.batch_size)
    if config.allocation == "dual-search":
        search = SearchConfig(
            mbs_min=config.mbs_min, mbs_max=config.mbs_max, tolerance=config.search_tolerance,
            fit=config.cost_fit, min_observations=config.rebalance_min_observations,
            balance_band=config.balance_band, warmup_cycles=config.rebalance_warmup_cycles,
        )
        return StragglerSizer(
            search, base_dss=config.cycle_samples, base_mbs=config.batch_size,
            dss_step=config.shard_size, dss_max=dss_max,
        )
    raise ValueError(f"unknown allocation {config.allocation!r}; known: uniform, dual-search")
