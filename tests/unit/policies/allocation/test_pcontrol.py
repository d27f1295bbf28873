"""Allocation 'pcontrol' (OmniLearn Eq. 6-8, ACSOS), driven the way the engine drives it."""

from __future__ import annotations

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import (
    Workload,
    local_steps,
)
from hermes.common.policies.allocation.pcontrol import PControlAllocator

from .cluster import HL8, Cluster, alloc_for


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
        assert r.workload.dss == local_steps(cfg) * r.workload.batch_size and r.workload.accumulation == 1
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
    assert alloc.workload("w4").batch_size == 85
    alloc.set_batch_limit("w4", 60)
    out = c.rebalance()
    assert set(out) == {"w4"}
    assert out["w4"].kind == "memory"
    assert out["w4"].workload == Workload(local_steps(cfg) * 60, 60)
    assert alloc.ctl.b_max_of("w4") == 60
    for _ in range(4):  # up to the next control step
        c.run_round()
        assert alloc.workload("w4").batch_size <= 60
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
    assert out["w4"].kind == "memory" and alloc.workload("w4").batch_size == 40


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


def test_pcontrol_switches_reach_the_controller():
    cfg = build_config("omnilearn-bsp", **{"pcontrol.deadband_order": "before-bounds",
                                           "pcontrol.deadband_reference": "old", "pcontrol.global_rule": "uniform",
                                           "pcontrol.throughput_cap": True, "pcontrol.drop_margin": 0.0,
                                           "pcontrol.drop_cap_updates": 0})
    ctl = cfg.build_policy("allocation", epoch_samples=1000).ctl
    assert (ctl.params.deadband_order, ctl.params.deadband_reference, ctl.params.global_rule) == ("before-bounds", "old", "uniform")
    assert (ctl.drop_margin, ctl.drop_cap_updates) == (0.0, None)  # ACSOS: any fall caps, for good
    default = build_config("omnilearn-bsp").build_policy("allocation", epoch_samples=1000).ctl
    assert (default.params.deadband_order, default.params.deadband_reference, default.params.global_rule) == (
        "after-bounds", "new", "proportional")
