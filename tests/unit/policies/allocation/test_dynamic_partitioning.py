"""DP-SGD partitions by compute power (Alg. 1, Eq. 2), driven the way the engine drives the allocator."""

from __future__ import annotations

import math

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import (
    CycleObservation,
    Resize,
    Workload,
    local_steps,
)
from hermes.common.policies.allocation.dynamic_partitioning import PartitionAllocator, compute_power

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


def test_partition_epoch_zero_even_then_proportional_to_compute_power():
    alloc, cfg = alloc_for("dp-sgd")
    assert isinstance(alloc, PartitionAllocator) and alloc.window == 1
    c = Cluster(alloc, HL8)
    steps = local_steps(cfg)
    for _ in range(4):
        c.run_round()
        if c.round < 4:
            # Alg. 1 line 5: CP_m = 1/M in epoch 0, every worker the same share.
            assert c.batches() == {w: cfg.batch_size for w in HL8}
            assert all(alloc.power(w) is None for w in HL8)
    assert c.step_rounds() == [4]
    # Eq. 2: CP_m = |D_m| / X_m, samples per second of compute: the simulated speed.
    for w, speed in HL8.items():
        assert alloc.power(w) == pytest.approx(speed)
    # Lines 8-10 on one round: K*steps*b = 512 samples ∝ CP, whole step batches.
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}
    assert alloc.partitions == [{w: steps * b for w, b in c.batches().items()}]
    assert sum(alloc.partitions[-1].values()) == len(HL8) * steps * cfg.batch_size
    c.run(8)
    assert sum(alloc.workload(w).dss for w in HL8) == 512
    assert c.imbalance() <= 1.1


def test_partition_resizes_once_per_epoch():
    alloc, _ = alloc_for("dp-sgd")
    c = Cluster(alloc, HL8)
    c.run(4)
    c.speed["w4"] /= 2
    c.run(3)
    assert c.step_rounds() == [4]  # the slowdown in rounds 5-7 waits for the epoch's end
    c.run(1)
    assert c.step_rounds() == [4, 8]
    assert len(alloc.partitions) == 2 and alloc.power("w4") == pytest.approx(HL8["w4"] / 2)


def _w4_batch_after_a_transient_slowdown(window: int) -> tuple[int, int, float]:
    alloc, _ = alloc_for("dp-sgd", partition_window=window)
    c = Cluster(alloc, HL8)
    c.run(8)  # epochs 0 and 1 at full speed
    steady = alloc.workload("w4").batch_size
    c.speed["w4"] /= 4  # epoch 2 only: a transient slowdown
    c.run(4)
    after = alloc.workload("w4").batch_size
    return steady, after, alloc.power("w4")


def test_partition_window_resists_transient_changes():
    # DP-SGD Sec. 4.1: the previous epoch alone adapts fast; a longer history resists transients.
    steady1, after1, p1 = _w4_batch_after_a_transient_slowdown(1)
    steady3, after3, p3 = _w4_batch_after_a_transient_slowdown(3)
    assert steady1 == steady3 == 85
    assert p1 == pytest.approx(HL8["w4"] / 4)
    assert p3 == pytest.approx((HL8["w4"] + HL8["w4"] + HL8["w4"] / 4) / 3)  # mean over the window
    assert after3 < steady3
    assert steady1 - after1 > 1.5 * (steady3 - after3)


def test_partition_cap_keeps_the_round_samples():
    alloc, cfg = alloc_for("dp-sgd")
    c = Cluster(alloc, HL8)
    alloc.set_batch_limit("w4", 64)
    c.run(4)
    b = c.batches()
    assert b["w4"] == 64
    # K*steps*b = 512 per round, as static and pcontrol keep K*b under the same cap:
    # w4 64, the rest (64) ∝ (6, 6, 4) = (24, 24, 16).
    assert sum(alloc.workload(w).dss for w in HL8) == len(HL8) * local_steps(cfg) * cfg.batch_size, b


def test_compute_power():
    assert compute_power(1000, 4.0) == 250.0  # DP-SGD Eq. 2
