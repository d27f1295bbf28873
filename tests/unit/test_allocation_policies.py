"""Allocation policies driven the way the engine drives them.

``server/engine.py`` calls ``join`` (then ``rebalance``) on registration,
``observe(CycleObservation(dss, mbs, seconds, accumulation))`` and then
``rebalance`` after every finished cycle, and ``forget`` (then ``rebalance``)
on a leave. ``Cluster`` below does the same with simulated workers whose cycle
time is (samples per cycle) / speed: each round, every worker fetches the
workload it is assigned at that moment, trains it, and reports it.

The controllers' equations are tested in ``test_controllers.py``; here we test
the adapters: when they step, which measurements they use, what they keep
invariant across membership and memory changes, and the Resize objects.
"""

from __future__ import annotations

import math

import pytest

from hermes.common.config import RunConfig, build_config
from hermes.common.policies.allocation import (
    ALLOCATIONS,
    CycleObservation,
    Resize,
    Workload,
    local_steps,
)
from hermes.common.policies.allocation.dynamic_partitioning import PartitionAllocator
from hermes.common.policies.allocation.hermes_sizing import DualSearchAllocator
from hermes.common.policies.allocation.pcontrol import PControlAllocator
from hermes.common.policies.allocation.static import StaticAllocator
from hermes.common.policies.allocation.task_allocation import AdaptiveAllocator
from hermes.common.policies.allocation.uniform import UniformAllocator

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
        steps = math.ceil(wl.dss / wl.step_batch)
        return wl.dss / self.speed[worker] + self.overhead * steps

    def report(self, worker: str, wl: Workload, seconds: float | None = None) -> dict[str, Resize]:
        secs = self.seconds(worker, wl) if seconds is None else seconds
        self.alloc.observe(worker, CycleObservation(wl.dss, wl.mbs, secs, wl.accumulation))
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
        return {w: self.alloc.workload(w).step_batch for w in sorted(self.speed)}

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


# ---------------------------------------------------------------------------
# pcontrol: OmniLearn Eq. 6-9 / ACSOS Eq. 4-5


@pytest.mark.parametrize("overhead", [0.0, 0.02])
def test_pcontrol_bsp_equalises_hl8_in_a_few_steps_with_exact_global_batch(overhead):
    # ACSOS dynamic batching at HL8 from equal batches b = 32; bounds (4, 96) hold the
    # equilibrium (~16, 16, 11, 85). overhead > 0 adds a per-step cost, so the
    # proportional law no longer lands on the equilibrium in one step.
    alloc, cfg = alloc_for("dynamic-batching")
    assert isinstance(alloc, PControlAllocator) and alloc.fixed_global and alloc.interval == "round"
    c = Cluster(alloc, HL8, overhead=overhead)
    k_b = len(HL8) * cfg.batch_size
    assert c.batches() == {w: 32 for w in HL8}
    assert c.imbalance() > 5  # uniform batching at HL8: w3 takes 8x as long as w4 (less with overhead)
    for _ in range(30):
        c.run_round()
        # OmniLearn Eq. 8: sum(b_k) = K*b exactly, after every step.
        assert sum(c.batches().values()) == k_b
        assert all(cfg.batch_bounds.b_min <= b <= cfg.batch_bounds.b_max for b in c.batches().values())
    # OmniLearn Fig. 8: steady state after about 2-4 adjustments (then the dead-band holds it).
    assert 1 <= len(c.step_rounds()) <= 4, c.step_rounds()
    assert c.imbalance() <= 1.25, c.times()
    # Faster workers end up with bigger batches; the slow ones shrank ("slow"), w4 grew ("fast").
    b = c.batches()
    assert b["w4"] > b["w1"] == b["w2"] > b["w3"]
    first = [(w, r) for rnd, w, r in c.log if rnd == c.step_rounds()[0]]
    assert {w: r.kind for w, r in first} == {"w1": "slow", "w2": "slow", "w3": "slow", "w4": "fast"}
    for _, r in first:
        assert r.workload.dss == local_steps(cfg) * r.workload.mbs and r.workload.accumulation == 1
        assert r.detail["mean_seconds"] > 0 and r.detail["smoothed_seconds"] > 0


def test_pcontrol_first_step_without_overhead_is_the_static_split():
    # With cycle time exactly proportional to samples, Eq. 6b gives b_k ∝ X_k = speed, and
    # Eq. 8 rescales to K*b: 128 * (6, 6, 4, 32) / 48 = (16, 16, 10.67, 85.33) -> (16, 16, 11, 85).
    alloc, _ = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(6)
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}
    assert len(c.step_rounds()) == 1


def test_pcontrol_asp_batches_follow_throughput_without_a_global_sum():
    # OmniLearn ASP (Alg. 2): the same law, no Eq. 8 constraint. b_max wide enough for w4.
    alloc, cfg = alloc_for("omnilearn-asp", control_interval="round", b_max=256)
    assert not alloc.fixed_global and alloc.ctl.global_batch is None
    c = Cluster(alloc, HL8)
    c.run(12)
    b = c.batches()
    per_speed = [b[w] / HL8[w] for w in HL8]
    assert max(per_speed) / min(per_speed) < 1.1, b  # b_k ∝ throughput
    assert sum(b.values()) > 1.5 * len(HL8) * cfg.batch_size, b  # the total was not pulled back to K*b
    assert c.imbalance() <= 1.1
    assert b["w4"] > len(HL8) * cfg.batch_size  # more than all of K*b: impossible under Eq. 8


@pytest.mark.parametrize("fast,moves", [(1.05, False), (1.5, True)])
def test_pcontrol_dead_band_ignores_small_imbalance(fast, moves):
    # OmniLearn Eq. 7 / ACSOS: |b' - b| / b' < 0.1 on every worker -> no readjustment.
    alloc, _ = alloc_for("dynamic-batching", pcontrol_deadband=0.1)
    c = Cluster(alloc, {"w1": 100.0 * fast, "w2": 100.0, "w3": 100.0, "w4": 100.0})
    c.run(10)
    assert bool(c.log) is moves
    if not moves:
        assert c.batches() == {w: 32 for w in ("w1", "w2", "w3", "w4")}
        assert alloc.ctl.adjustments == 0


def test_pcontrol_dead_band_is_per_worker_without_a_global_batch():
    # OmniLearn Eq. 7 without Eq. 8 (ASP): each worker is gated on its own. Times
    # (1.22, 1.28, 1.28, 0.98) s, mean 1.19: w1 -> 31 (3%), w2/w3 -> 30 (7%) stay; w4 -> 39 (18%) moves.
    speeds = {"w1": 105.0, "w2": 100.0, "w3": 100.0, "w4": 130.0}
    alloc, _ = alloc_for("omnilearn-asp", control_interval="round", b_max=256)
    c = Cluster(alloc, speeds)
    c.run(3)
    assert c.step_rounds() == [3]
    assert {w for _, w, _ in c.log} == {"w4"}
    assert c.batches() == {"w1": 32, "w2": 32, "w3": 32, "w4": 39}
    # With the global batch (BSP), the same step moves everyone so the sum stays K*b (ACSOS dead-band).
    alloc, _ = alloc_for("dynamic-batching")
    c = Cluster(alloc, speeds)
    c.run(3)
    # 128 * (105, 100, 100, 130) / 435 = (30.9, 29.4, 29.4, 38.3): w4's move carries the others.
    assert {w for _, w, _ in c.log} == {"w1", "w2", "w3", "w4"}
    assert sum(c.batches().values()) == 128 and c.batches()["w4"] in (38, 39)


def test_pcontrol_ignores_cycles_reported_at_a_stale_workload():
    alloc, cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(3)
    assert c.step_rounds() == [3]
    stale = Workload(cfg.cycle_samples, cfg.batch_size)  # what everyone ran before the step
    assert all(alloc.workload(w) != stale for w in HL8)
    # Cycles handed out before the resize arrive after it, with absurd times that would
    # swing the controller (w4 now "slowest"): they must never reach a control step.
    smoothed = {w: alloc.ctl.smoothed(w) for w in HL8}
    for _ in range(3):
        for w in HL8:
            assert c.report(w, stale, seconds=10.0 if w == "w4" else 0.01) == {}
    assert {w: alloc.ctl.smoothed(w) for w in HL8} == smoothed
    before = c.batches()
    c.run(4)  # fresh cycles at the new workloads: the equilibrium holds
    assert c.batches() == before
    assert c.step_rounds() == [3]


@pytest.mark.parametrize("warmup", [1, 2])
def test_pcontrol_ignores_warmup_cycles(warmup):
    alloc, cfg = alloc_for("dynamic-batching", rebalance_warmup_cycles=warmup)
    c = Cluster(alloc, HL8)
    # First cycles: JIT/allocator warm-up, with times that invert the real ordering.
    for _ in range(warmup):
        c.round += 1
        for w in sorted(HL8):
            wl = alloc.workload(w)
            assert c.report(w, wl, seconds=50.0 if w == "w4" else 0.5) == {}
    c.run(cfg.rebalance.min_observations)
    # The first step comes after warmup + min_observations rounds, from the real times only.
    assert c.step_rounds() == [warmup + cfg.rebalance.min_observations]
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}


def test_pcontrol_join_adds_b_and_keeps_the_global_batch():
    alloc, cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(3)
    assert sum(c.batches().values()) == 128
    assert c.join("w5", 500.0) == {}  # nothing measured yet for w5: no step
    assert alloc.workload("w5") == Workload(local_steps(cfg) * cfg.batch_size, cfg.batch_size)
    assert sum(c.batches().values()) == 5 * cfg.batch_size  # K*b with K = 5
    assert alloc.ctl.global_batch == 160
    n = len(c.step_rounds())
    for _ in range(8):
        c.run_round()
        assert sum(c.batches().values()) == 160
    assert len(c.step_rounds()) > n
    assert c.imbalance() <= 1.25, c.times()


def test_pcontrol_leave_renormalises_at_the_next_step():
    alloc, cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(5)
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}
    # Everyone left has fresh measurements, so the next step is the rebalance after the leave.
    out = c.leave("w4")
    assert alloc.ctl.global_batch == 3 * cfg.batch_size
    # 96 = 3 * 32, split as (6, 6, 4): (36, 36, 24).
    assert c.batches() == {"w1": 36, "w2": 36, "w3": 24}
    assert {r.kind for r in out.values()} == {"fast"}
    assert c.imbalance() <= 1.25


def test_pcontrol_leave_waits_for_measurements_then_renormalises():
    alloc, _cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(3)  # the step at round 3 reset every worker's measurements
    assert c.leave("w4") == {}  # nobody has min_observations at its new batch yet
    assert sum(c.batches().values()) == 43
    c.run(2)
    assert c.batches() == {"w1": 36, "w2": 36, "w3": 24}


def test_pcontrol_batch_limit_shrinks_now_and_caps_later_steps():
    # OmniLearn Eq. 9: b_max from the worker's memory.
    alloc, cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(3)
    assert alloc.workload("w4").mbs == 85
    alloc.set_batch_limit("w4", 60)
    out = c.rebalance()
    assert set(out) == {"w4"}
    assert out["w4"].kind == "memory"
    assert out["w4"].workload == Workload(local_steps(cfg) * 60, 60)
    assert alloc.ctl.b_max_of("w4") == 60
    for _ in range(4):  # up to the next control step
        c.run_round()
        assert alloc.workload("w4").mbs <= 60
        if c.step_rounds()[-1] > 3:
            break
    assert c.step_rounds() == [3, 5]  # w4 needs min_observations at its new batch
    b = c.batches()
    # The other workers absorb the rest of K*b at that step, in proportion to speed (6, 6, 4).
    assert sum(b.values()) == 128 and b["w4"] == 60
    assert (b["w1"], b["w2"], b["w3"]) in ((26, 25, 17), (25, 26, 17))


def test_pcontrol_batch_limit_above_the_current_batch_only_caps():
    alloc, _cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    alloc.set_batch_limit("w4", 50)  # 32 < 50: nothing to shrink yet
    assert c.rebalance() == {}
    c.run(8)
    b = c.batches()
    assert b["w4"] == 50 and sum(b.values()) == 128
    # set_memory_limit caps the samples of a cycle: dss // steps is the batch cap.
    alloc.set_memory_limit("w4", 4 * 40 + 3)
    out = c.rebalance()
    assert out["w4"].kind == "memory" and alloc.workload("w4").mbs == 40


def test_pcontrol_epoch_interval_waits_for_a_data_epoch():
    # Epoch: 2048 samples = 4 rounds of 4 x 128. "round" steps at round 3 (warmup 1 +
    # min_observations 2); "epoch" (OmniLearn's granularity) waits for the epoch at round 4.
    by_round, _ = alloc_for("dynamic-batching")
    by_epoch, _ = alloc_for("omnilearn-bsp")
    assert by_epoch.interval == "epoch" and by_round.interval == "round"
    cr, ce = Cluster(by_round, HL8), Cluster(by_epoch, HL8)
    cr.run(5)
    ce.run(5)
    assert cr.step_rounds() == [3]
    assert ce.step_rounds() == [4]
    assert cr.batches() == ce.batches()
    # w3 slows down 2x from round 6 on: "round" reacts at once, "epoch" at the next
    # epoch boundary (2 epochs = end of round 8; the rounds keep 512 samples under Eq. 8).
    for c in (cr, ce):
        c.speed["w3"] /= 2
        c.run(3)
    assert cr.step_rounds()[:2] == [3, 6]
    assert ce.step_rounds() == [4, 8]
    assert ce.batches()["w3"] < 11 and sum(ce.batches().values()) == 128


def test_pcontrol_epoch_due_waits_for_min_observations():
    # The epoch ends (round 2) before every worker has min_observations counted cycles:
    # the step is remembered and taken as soon as it may be (round 3), not skipped.
    alloc, _ = alloc_for("omnilearn-bsp", epoch_samples=1024)
    c = Cluster(alloc, HL8)
    c.run(3)
    assert c.step_rounds() == [3]


def test_pcontrol_throughput_drop_caps_below_the_global_batch_do_not_raise():
    # ACSOS "Batch size bounds": a drop in throughput after b0 -> b sets b_max = b0. After w4
    # leaves, w1-w3 grow (16, 16, 11) -> (36, 36, 24) and really lose 30% throughput there:
    # their caps become (16, 16, 11), 43 < K*b = 96: every worker runs at its cap.
    # ACSOS's own smoothing (restarted at every change) sees the drop at the next step.
    alloc, _ = alloc_for("dynamic-batching", pcontrol_carry_smoothing=False)
    c = Cluster(alloc, HL8)
    c.run(5)
    c.leave("w4")
    assert c.batches() == {"w1": 36, "w2": 36, "w3": 24}
    for w in ("w1", "w2", "w3"):
        c.speed[w] *= 0.7  # thrashing at the larger batch: a 30% drop, well past any noise margin
    c.run(4)  # used to raise InfeasibleAllocation out of rebalance(), which the engine calls per cycle
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11}


def test_pcontrol_unchanged_throughput_never_lowers_b_max():
    # Cycle time = samples / speed: a worker's throughput does not depend on its batch, so the
    # ACSOS rule (b_max = b0 on a throughput *drop*) must never fire. w3 slows 2x at round 6;
    # equilibrium ∝ (6, 6, 2, 32): (17, 17, 5, 89), max/min 1.13. With a strict X < X0 the
    # same throughput re-measured at the new batch (46.875 vs 46.87500000000001) is one ulp
    # "lower": w1, w2, w4 got b_max = their old batches, w3 was forced back to 9 and max/min
    # stayed 1.69 for good. The controller's drop_margin (pcontrol_drop_margin) absorbs that.
    alloc, cfg = alloc_for("dynamic-batching")
    c = Cluster(alloc, HL8)
    c.run(5)
    c.speed["w3"] /= 2
    c.run(11)
    assert all(alloc.ctl.b_max_of(w) == cfg.batch_bounds.b_max for w in HL8), {w: alloc.ctl.b_max_of(w) for w in HL8}
    assert c.imbalance() <= 1.25, c.times()


# ---------------------------------------------------------------------------
# static: OmniLearn Eq. 4a, ACSOS static variable batching


def test_static_batches_from_declared_cores_hl8():
    alloc, cfg = alloc_for("variable-batching")
    assert isinstance(alloc, StaticAllocator)
    c = Cluster(alloc, HL8, capacities=HL8_CORES)
    # Eq. 4a: b_k = c_k / sum(c) * K*b = 128 * (6, 6, 4, 32) / 48, exact sum 128.
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}
    for w in HL8:
        wl = alloc.workload(w)
        assert wl.dss == local_steps(cfg) * wl.mbs and wl.accumulation == 1


@pytest.mark.parametrize("undeclared", [None, 0])
def test_static_undeclared_capacity_counts_as_the_median(undeclared):
    alloc, _ = alloc_for("variable-batching")
    # Declared (6, ?, 4, 32): the median of (4, 6, 32) is 6, so w2 counts as 6 cores.
    c = Cluster(alloc, HL8, capacities={**HL8_CORES, "w2": undeclared})
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}


def test_static_membership_changes_resplit_with_membership_kind():
    alloc, _ = alloc_for("variable-batching")
    c = Cluster(alloc, HL8, capacities=HL8_CORES)
    out = c.join("w5", 500.0, capacity=16)
    # K*b = 160 over (6, 6, 4, 32, 16) / 64: (15, 15, 10, 80, 40).
    assert c.batches() == {"w1": 15, "w2": 15, "w3": 10, "w4": 80, "w5": 40}
    assert set(out) == {"w1", "w2", "w3", "w4", "w5"}
    assert {r.kind for r in out.values()} == {"membership"}
    assert out["w5"].detail["global_batch"] == 160
    out = c.leave("w4")
    # K*b = 128 over (6, 6, 4, 16) / 32: (24, 24, 16, 64).
    assert c.batches() == {"w1": 24, "w2": 24, "w3": 16, "w5": 64}
    assert {r.kind for r in out.values()} == {"membership"} and "w4" not in out


def test_static_measurements_never_move_batches():
    alloc, _ = alloc_for("variable-batching")
    c = Cluster(alloc, HL8, capacities=HL8_CORES)
    before = c.batches()
    c.log.clear()
    c.speed["w4"] /= 20  # the declared cores are now badly wrong: static does not care
    c.run(12)
    assert c.log == [] and c.batches() == before


def test_static_batch_limit_resplits_within_the_cap():
    alloc, _ = alloc_for("variable-batching")
    c = Cluster(alloc, HL8, capacities=HL8_CORES)
    alloc.set_batch_limit("w4", 64)
    c.rebalance()
    b = c.batches()
    assert b["w4"] == 64 and sum(b.values()) == 128  # the rest (64) split (6, 6, 4): (24, 24, 16)
    assert (b["w1"], b["w2"], b["w3"]) == (24, 24, 16)


# ---------------------------------------------------------------------------
# adaptive: Chao et al. Eq. 10, Algorithm 1


def adaptive_cluster(**overrides):
    alloc, cfg = alloc_for("task-allocation", **overrides)
    assert isinstance(alloc, AdaptiveAllocator)
    return alloc, cfg, Cluster(alloc, HL8)


def accumulations(alloc, workers) -> dict[str, int]:
    return {w: alloc.workload(w).accumulation for w in sorted(workers)}


def test_adaptive_counts_follow_speed_with_a_constant_sum():
    alloc, cfg, c = adaptive_cluster()
    w0 = local_steps(cfg)
    assert w0 == 4 and accumulations(alloc, HL8) == {w: 4 for w in HL8}
    c.run(4)
    # Chao Eq. 10: w_i' = (w_i / t_i) / sum(w / t) * sum(w) ∝ speed; Eq. 4/16: sum(w) = C = K*w0 = 16.
    # 16 * (6, 6, 4, 32) / 48 = (2, 2, 1.33, 10.67) -> (2, 2, 1, 11).
    assert accumulations(alloc, HL8) == {"w1": 2, "w2": 2, "w3": 1, "w4": 11}
    for w in HL8:
        wl = alloc.workload(w)
        # One optimizer step per cycle of w_i micro-batches of the run's fixed MBS.
        assert wl.mbs == cfg.batch_size and wl.dss == wl.accumulation * wl.mbs
    kinds = {w: r.kind for _, w, r in c.log}
    assert kinds == {"w1": "slow", "w2": "slow", "w3": "slow", "w4": "fast"}
    for _ in range(16):
        c.run_round()
        assert sum(accumulations(alloc, HL8).values()) == len(HL8) * w0


def test_adaptive_updates_once_per_epoch_and_stops_once_stable():
    alloc, _cfg, c = adaptive_cluster()
    c.run(3)
    assert c.log == [] and not alloc.stopped  # one epoch = 4 rounds here
    c.run(1)
    assert c.step_rounds() == [4] and not alloc.stopped
    # The shares no longer move (< epsilon) for `patience` = 2 updates: stop (Chao: 4-5 epochs).
    c.run(8)
    assert alloc.stopped
    stable = accumulations(alloc, HL8)
    n = len(c.log)
    c.speed["w4"] /= 4  # a stopped allocation no longer reacts
    c.run(12)
    assert len(c.log) == n and accumulations(alloc, HL8) == stable


def test_adaptive_is_per_epoch_not_per_round():
    # An epoch is 4 rounds here: a speed change mid-epoch is only acted on at the epoch's end.
    _alloc, _cfg, c = adaptive_cluster()
    c.run(4)
    c.speed["w1"] *= 4
    c.run(3)
    assert c.step_rounds() == [4]
    c.run(1)
    assert c.step_rounds() == [4, 8]
    assert all(r % 4 == 0 for r in c.step_rounds())


def test_adaptive_restarts_on_join():
    alloc, cfg, c = adaptive_cluster()
    c.run(12)
    assert alloc.stopped
    c.join("w5", 500.0)
    assert not alloc.stopped
    assert alloc.workload("w5").accumulation == local_steps(cfg)
    total = sum(accumulations(alloc, c.speed).values())
    assert total == 20  # 16 + w0
    c.run(8)
    acc = accumulations(alloc, c.speed)
    assert sum(acc.values()) == total
    assert acc["w5"] < acc["w4"] and acc["w5"] > acc["w1"]  # 16 cores: between w1 (6) and w4 (32)


def test_adaptive_memory_limit_caps_the_counts():
    alloc, cfg, c = adaptive_cluster()
    alloc.set_memory_limit("w4", 8 * cfg.batch_size)  # w4 may hold 8 micro-batches of samples
    assert c.rebalance() == {}  # w0 = 4 fits
    c.run(12)
    acc = accumulations(alloc, HL8)
    assert acc["w4"] == 8
    assert sum(acc.values()) == 16  # the rest (8) goes to the others, (6, 6, 4): (3, 3, 2)
    assert acc == {"w1": 3, "w2": 3, "w3": 2, "w4": 8}


def test_adaptive_memory_limit_below_the_current_count_shrinks_now():
    alloc, cfg, c = adaptive_cluster()
    c.run(4)
    assert alloc.workload("w4").accumulation == 11
    alloc.set_memory_limit("w4", 8 * cfg.batch_size)
    out = c.rebalance()
    assert out["w4"].kind == "memory"
    assert out["w4"].workload == Workload(8 * cfg.batch_size, cfg.batch_size, 8)
    # The others take up the 3 micro-batches w4 gave back at once (sum(w) = K*w0 = 16).
    assert {w: r.kind for w, r in out.items() if w != "w4"} == {"w1": "membership", "w2": "membership",
                                                                   "w3": "membership"}
    assert sum(alloc.workload(w).accumulation for w in HL8) == 16


def test_adaptive_memory_shrink_keeps_the_round_work():
    alloc, cfg, c = adaptive_cluster()
    c.run(4)
    alloc.set_memory_limit("w4", 8 * cfg.batch_size)
    c.rebalance()
    c.run(8)
    acc = accumulations(alloc, HL8)
    assert acc["w4"] == 8
    # Chao Eq. 4/16: sum(w) = C = K*w0 = 16, as pcontrol restores K*b after a memory shrink: (3, 3, 2, 8).
    assert sum(acc.values()) == len(HL8) * local_steps(cfg), acc


def test_adaptive_leave_keeps_k_times_w0():
    alloc, cfg, c = adaptive_cluster()
    c.run(4)
    assert accumulations(alloc, HL8)["w4"] == 11
    c.leave("w4")
    c.run(8)
    acc = accumulations(alloc, c.speed)
    # K*w0 = 3*4 = 12 micro-batches per round (as pcontrol renormalises to K*b, static re-splits
    # K*b and partition cuts K*steps*b), split (6, 6, 4): (4.5, 4.5, 3).
    assert sum(acc.values()) == 3 * local_steps(cfg), acc


# ---------------------------------------------------------------------------
# partition: DP-SGD Algorithm 1, Eq. 2; EDP-SGD


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
    steady = alloc.workload("w4").mbs
    c.speed["w4"] /= 4  # epoch 2 only: a transient slowdown
    c.run(4)
    after = alloc.workload("w4").mbs
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


# ---------------------------------------------------------------------------
# Building the allocator and the dual-search / uniform adapters


@pytest.mark.parametrize("preset,overrides,cls", [
    ("bsp", {}, UniformAllocator),
    ("hermes", {}, DualSearchAllocator),
    ("variable-batching", {}, StaticAllocator),
    ("omnilearn-bsp", {}, PControlAllocator),
    ("task-allocation", {}, AdaptiveAllocator),
    ("dp-sgd", {}, PartitionAllocator),
    ("bsp", {"allocation": "pcontrol"}, PControlAllocator),
])
def test_build_policy_builds_the_configured_allocator(preset, overrides, cls):
    alloc, _cfg = alloc_for(preset, **overrides)
    assert type(alloc) is cls


def test_build_policy_covers_every_allocation_and_passes_the_config_on():
    built = set()
    for name in ALLOCATIONS:
        cfg = build_config("bsp", allocation=name) if name != "dual-search" else build_config("hermes")
        built.add(type(cfg.build_policy("allocation", dss_max=4096, epoch_samples=EPOCH)))
    assert len(built) == len(ALLOCATIONS)
    p, _ = alloc_for("omnilearn-asp", pcontrol_deadband=0.2, pcontrol_alpha=0.5, rebalance_warmup_cycles=3,
                     rebalance_min_observations=4, b_min=8, b_max=64, epoch_samples=777)
    assert (p.ctl.deadband, p.ctl.alpha, p.warmup, p.min_observations) == (0.2, 0.5, 3, 4)
    assert (p.b.b_min, p.b.b_max, p.b.base, p.b.steps, p.clock.epoch_samples) == (8, 64, 32, 4, 777)
    assert p.fixed_global is False and p.interval == "epoch"
    f, _ = alloc_for("omnilearn-asp", global_batch="free", sync="ssp", lr_scaling="none")
    assert f.fixed_global is False
    q, _ = alloc_for("dynamic-batching", global_batch="free")
    assert q.fixed_global is False
    part, _ = alloc_for("edp-sgd", partition_window=3)
    assert part.window == 3
    ad, _ = alloc_for("task-allocation", adaptive_epsilon=0.01, adaptive_patience=3, cycle_samples=256,
                      batch_size=16)
    assert (ad.epsilon, ad.patience, ad.w0, ad.b.base) == (0.01, 3, 16, 16)
    with pytest.raises(ValueError, match="unknown allocation"):
        RunConfig.model_construct(allocation="nope").build_policy("allocation", dss_max=1, epoch_samples=1)


def test_uniform_never_moves():
    alloc, cfg = alloc_for("bsp")
    c = Cluster(alloc, HL8)
    c.run(10)
    assert c.log == []
    assert all(alloc.workload(w) == Workload(cfg.cycle_samples, cfg.batch_size) for w in HL8)


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


def test_a_cycle_cut_short_counts_scaled_and_another_batch_not_at_all():
    wl = Workload(dss=1352, mbs=338)
    # A workload bigger than an epoch of data ran 1293 samples at the right batch: scaled up.
    assert CycleObservation(1293, 338, 1.0).seconds_at(wl) == pytest.approx(1352 / 1293)
    assert CycleObservation(1352, 338, 2.0).seconds_at(wl) == 2.0
    assert CycleObservation(1352, 300, 2.0).seconds_at(wl) is None  # assigned before a resize
    assert CycleObservation(1352, 338, 2.0, accumulation=2).seconds_at(wl) is None
