"""Chao et al.'s self-adaptive accumulation counts (Eq. 10), the allocator and the algorithm."""

from __future__ import annotations

import numpy as np
import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import (
    CycleObservation,
    Workload,
    local_steps,
)
from hermes.common.policies.allocation.task_allocation import (
    AdaptiveAccumulation,
    AdaptiveAllocator,
    task_allocation_targets,
)

from .cluster import HL8, Cluster, alloc_for


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
        assert wl.batch_size == cfg.batch_size and wl.dss == wl.accumulation * wl.batch_size
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


def appendix_solution(w: list[float], v: list[float]) -> list[float]:
    """Solve A u = b (Chao appendix Eq. 19-21) numerically."""
    n = len(w)
    a = np.zeros((n, n))
    rhs = np.zeros(n)
    for i in range(n - 1):
        a[i, i], a[i, i + 1] = 1 / v[i], -1 / v[i + 1]
        rhs[i] = w[i + 1] / v[i + 1] - w[i] / v[i]
    a[n - 1, :] = 1.0
    return list(np.linalg.solve(a, rhs))


@pytest.mark.parametrize(
    "w,t",
    [([10, 10], [2.0, 1.0]), ([5, 10, 15], [1.0, 4.0, 2.0]), ([8, 8, 8, 8], [1.0, 1.0, 2.0, 4.0])],
)
def test_eq10_matches_appendix_eq22_and_linear_system(w, t):
    new = task_allocation_targets(w, t)
    # Eq. 22 closed form: u_i = v_i / sum(v) * sum(w) - w_i with v_i ∝ w_i / t_i.
    v = [wi / ti for wi, ti in zip(w, t)]
    u22 = [vi / sum(v) * sum(w) - wi for vi, wi in zip(v, w)]
    u21 = appendix_solution(w, v)
    assert new == pytest.approx([wi + ui for wi, ui in zip(w, u22)])
    assert new == pytest.approx([wi + ui for wi, ui in zip(w, u21)])
    assert sum(new) == pytest.approx(sum(w))  # Eq. 4/16: C constant, Eq. 5/17: sum(u) = 0
    # Eq. 8: after re-allocation every worker's compute time is the same.
    new_times = [ni / vi for ni, vi in zip(new, v)]
    assert max(new_times) == pytest.approx(min(new_times))


def test_adaptive_accumulation_stops_when_ratio_is_stable():
    per_step = [0.2, 0.1, 0.4]  # seconds per micro-batch, fixed hardware
    alg = AdaptiveAccumulation(current=[5, 5, 5], epsilon=0.05, patience=2)
    seen = []
    for _ in range(10):
        times = [w * s for w, s in zip(alg.current, per_step)]
        seen.append(alg.update(times))
        if alg.stopped:
            break
    assert alg.stopped and len(seen) <= 4  # Chao: "after 4-5 epochs ... basically stable"
    assert sum(seen[-1]) == 15 and seen[-1] == [4, 9, 2]  # 15 * (5, 10, 2.5) / 17.5 = (4.3, 8.6, 2.1)
    assert alg.update([100.0, 1.0, 1.0]) == seen[-1]  # stopped: no more re-allocation


def _chao(**adaptive: object):
    # Chao Sec. IV-C: mini-batch 100, total batch 1000, so sum(w) = C = 10 (w0 = 5 per worker, K = 2).
    cfg = build_config("task-allocation", batch_size=100, cycle_samples=500, adaptive=adaptive)
    alloc = cfg.build_policy("allocation", epoch_samples=2000)
    for w in ("a", "b"):
        alloc.join(w)
    alloc.rebalance()
    return alloc


def test_chao_static_allocation_with_operator_ratios():
    alloc = _chao(ratios={"a": 2, "b": 3}, reallocate=False)
    w = {k: alloc.workload(k) for k in ("a", "b")}
    assert {k: v.accumulation for k, v in w.items()} == {"a": 4, "b": 6}  # w_i = C * r_i / sum(r)
    assert sum(v.accumulation * v.batch_size for v in w.values()) == 1000  # the paper's total batch
    for _ in range(3):  # epochs go by, b is twice as slow: static allocation never moves
        for k, t in (("a", 1.0), ("b", 2.0)):
            alloc.observe(k, CycleObservation(dss=w[k].dss, batch_size=100, seconds=t, accumulation=w[k].accumulation))
        assert alloc.rebalance() == {}


def test_chao_ratios_start_the_self_adaptive_algorithm():
    alloc = _chao(ratios={"a": 2, "b": 3})
    assert alloc.workload("a").accumulation == 4
    for _ in range(2):
        for k, t in (("a", 1.0), ("b", 3.0)):
            wl = alloc.workload(k)
            alloc.observe(k, CycleObservation(dss=wl.dss, batch_size=100, seconds=t, accumulation=wl.accumulation))
    moved = alloc.rebalance()
    # Eq. 10: v = (4/1, 6/3) = (4, 2), w' = v / sum(v) * 10 = (6.67, 3.33) -> 7, 3.
    assert {k: r.workload.accumulation for k, r in moved.items()} == {"a": 7, "b": 3}


def test_chao_ratios_are_validated():
    with pytest.raises(ValueError, match="ratios must map worker names to positive"):
        build_config("task-allocation", **{"adaptive.ratios": {"a": 0}})
