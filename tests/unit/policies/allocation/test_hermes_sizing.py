"""Allocation 'dual-search' (Hermes Sec. IV-A), driven the way the engine drives it."""

from __future__ import annotations

import math

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import (
    CycleObservation,
    Resize,
    Workload,
)
from hermes.common.policies.allocation.hermes_sizing import DualSearchAllocator

# OmniLearn Table I, HL8 (BSP): CPU cores of the 4 workers. Speeds are
# proportional to cores, normalised to the fastest: 1000 samples/s for 32 cores.
HL8_CORES = {"w1": 6, "w2": 6, "w3": 4, "w4": 32}
HL8 = {w: 1000.0 * c / 32 for w, c in HL8_CORES.items()}
EPOCH = 2048  # samples per data epoch in these simulations: 4 rounds of 4 workers x 128 samples


class Cluster:
    """Simulated workers around one allocator, fed exactly as ``server/engine.py`` feeds it."""

    def __init__(self, alloc, speeds: dict[str, float] | None = None, *, overhead: float = 0.0,
                 capacities: dict[str, float | None] | None = None) -> None:
        self.alloc = alloc
        self.speed: dict[str, float] = {}
        self.overhead = overhead  # fixed seconds per optimizer step (a per-step cost the law does not model)
        self.round = 0
        self.log: list[tuple[int, str, Resize]] = []  # (round, worker, resize)
        for w, s in (speeds or {}).items():
            self.join(w, s, (capacities or {}).get(w))

    # -- membership, as engine.register / engine.leave --
    def join(self, worker: str, speed: float, capacity: float | None = None) -> dict[str, Resize]:
        self.speed[worker] = speed
        self.alloc.join(worker, capacity)
        return self.rebalance()

    def leave(self, worker: str) -> dict[str, Resize]:
        self.speed.pop(worker)
        self.alloc.forget(worker)
        return self.rebalance()

    def rebalance(self) -> dict[str, Resize]:
        out = self.alloc.rebalance()
        for w, r in out.items():
            assert isinstance(r, Resize)
            # What a Resize announces is what the allocator hands out from now on.
            assert r.workload == self.alloc.workload(w), (w, r)
            self.log.append((self.round, w, r))
        return out

    # -- the data plane --
    def seconds(self, worker: str, wl: Workload) -> float:
        steps = math.ceil(wl.dss / wl.effective_batch_size)
        return wl.dss / self.speed[worker] + self.overhead * steps

    def report(self, worker: str, wl: Workload, seconds: float | None = None) -> dict[str, Resize]:
        secs = self.seconds(worker, wl) if seconds is None else seconds
        self.alloc.observe(worker, CycleObservation(wl.dss, wl.batch_size, secs, wl.accumulation))
        return self.rebalance()

    def run_round(self) -> dict[str, Resize]:
        """Every worker runs one cycle at the workload it holds when the round starts."""
        self.round += 1
        assigned = {w: self.alloc.workload(w) for w in sorted(self.speed)}
        out: dict[str, Resize] = {}
        for w, wl in assigned.items():
            out.update(self.report(w, wl))
        return out

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.run_round()

    # -- what the tests look at --
    def batches(self) -> dict[str, int]:
        return {w: self.alloc.workload(w).effective_batch_size for w in sorted(self.speed)}

    def times(self) -> dict[str, float]:
        return {w: self.seconds(w, self.alloc.workload(w)) for w in sorted(self.speed)}

    def imbalance(self) -> float:
        t = self.times().values()
        return max(t) / min(t)

    def step_rounds(self) -> list[int]:
        return sorted({r for r, _, _ in self.log})


def alloc_for(preset: str, *, epoch_samples: int = EPOCH, **overrides):
    cfg = build_config(preset, **overrides)
    return cfg.build_policy("allocation", dss_max=10_000, epoch_samples=epoch_samples), cfg


def test_dual_search_resizes_carry_kind_and_predicted_target_seconds():
    # Shards of 16 samples: a DSS grid fine enough to land within tolerance of the median.
    alloc, cfg = alloc_for("hermes", shard_size=16)
    assert isinstance(alloc, DualSearchAllocator)
    c = Cluster(alloc, HL8)
    c.run(2)
    assert c.log == []
    c.run(1)  # warmup 1 + min_observations 2
    first = [(w, r) for rnd, w, r in c.log if rnd == c.step_rounds()[0]]
    got = dict(first)
    # HL8 cycle times at 128 samples: (0.683, 0.683, 1.024, 0.128); median 0.683.
    # w3 is beyond balance_band (20%) above it, w4 far below.
    assert set(got) == {"w3", "w4"}
    assert got["w3"].kind == "slow" and got["w4"].kind == "fast"
    median = 128 / HL8["w1"]
    for w, r in got.items():
        assert r.detail["target_seconds"] == pytest.approx(median, rel=1e-5)
        assert r.detail["predicted_seconds"] == pytest.approx(c.seconds(w, r.workload), rel=1e-4)
        assert r.detail["within_tolerance"] is True
        assert abs(r.detail["predicted_seconds"] - median) <= cfg.dual_search.tolerance * median
    # w3: 125 samples/s * 0.683 s = 85 -> 80 samples (0.64 s); w4: 683 -> 672 (0.672 s).
    assert got["w3"].workload.dss == 80 and got["w4"].workload.dss == 672
    assert all(r.workload.dss % 16 == 0 for r in got.values())
    c.run(4)
    assert c.step_rounds() == [3]  # within tolerance and balance band: no further resizes
    assert c.imbalance() <= 1.1


def test_dual_search_memory_limit_caps_the_workload():
    alloc, _cfg = alloc_for("hermes", shard_size=16)
    c = Cluster(alloc, HL8)
    alloc.set_memory_limit("w4", 256)
    c.run(3)
    assert alloc.workload("w4").dss <= 256
    assert any(w == "w4" and r.kind == "fast" for _, w, r in c.log)
    c.leave("w4")  # forget drops its history; the others are not disturbed
    assert all(alloc.workload(w).dss > 0 for w in c.speed)


def test_balance_band_zero_reaches_the_sizer():
    alloc = build_config("hermes", **{"dual_search.balance_band": 0}).build_policy("allocation", dss_max=4096)
    assert alloc.sizer.search.balance_band == 0
    assert build_config("hermes").build_policy("allocation", dss_max=4096).sizer.search.balance_band == 0.2
