"""Static batches from declared cores (OmniLearn Eq. 4a), the allocator and the split."""

from __future__ import annotations

import pytest

from hermes.common.policies.allocation import (
    local_steps,
)
from hermes.common.policies.allocation.static import StaticAllocator, static_batches

from .cluster import HL8, HL8_CORES, Cluster, alloc_for


def test_static_batches_from_declared_cores_hl8():
    alloc, cfg = alloc_for("variable-batching")
    assert isinstance(alloc, StaticAllocator)
    c = Cluster(alloc, HL8, capacities=HL8_CORES)
    # Eq. 4a: b_k = c_k / sum(c) * K*b = 128 * (6, 6, 4, 32) / 48, exact sum 128.
    assert c.batches() == {"w1": 16, "w2": 16, "w3": 11, "w4": 85}
    for w in HL8:
        wl = alloc.workload(w)
        assert wl.dss == local_steps(cfg) * wl.batch_size and wl.accumulation == 1


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


HL8_BSP_CORES = [6, 6, 4, 32]  # OmniLearn Table I, HL8, BSP


def test_static_batches_hl8():
    # 128 * (6, 6, 4, 32) / 48 = (16, 16, 10.67, 85.33): largest remainder gives the unit to 10.67.
    assert static_batches(HL8_BSP_CORES, 128) == [16, 16, 11, 85]
    assert static_batches([12, 12, 12, 12], 128) == [32, 32, 32, 32]  # HL1 is uniform batching
