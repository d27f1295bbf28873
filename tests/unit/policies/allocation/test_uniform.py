"""Allocation 'uniform': everyone gets the run's defaults."""

from __future__ import annotations

from hermes.common.policies.allocation import (
    Workload,
)

from .cluster import HL8, Cluster, alloc_for


def test_uniform_never_moves():
    alloc, cfg = alloc_for("bsp")
    c = Cluster(alloc, HL8)
    c.run(10)
    assert c.log == []
    assert all(alloc.workload(w) == Workload(cfg.cycle_samples, cfg.batch_size) for w in HL8)
