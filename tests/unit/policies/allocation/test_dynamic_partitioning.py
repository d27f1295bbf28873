"""DP-SGD partitions by compute power (Alg. 1, Eq. 2), driven the way the engine drives the allocator."""

from __future__ import annotations

import pytest

from hermes.common.policies.allocation import (
    local_steps,
)
from hermes.common.policies.allocation.dynamic_partitioning import PartitionAllocator, compute_power

from .cluster import HL8, Cluster, alloc_for


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
