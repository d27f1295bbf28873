"""Allocation policies built from the run config, and cycle observations at a workload."""

from __future__ import annotations

import pytest

from hermes.common.config import RunConfig, build_config
from hermes.common.policies.allocation import (
    ALLOCATIONS,
    CycleObservation,
    Workload,
)
from hermes.common.policies.allocation.dynamic_partitioning import PartitionAllocator
from hermes.common.policies.allocation.hermes_sizing import DualSearchAllocator
from hermes.common.policies.allocation.pcontrol import PControlAllocator
from hermes.common.policies.allocation.static import StaticAllocator
from hermes.common.policies.allocation.task_allocation import AdaptiveAllocator
from hermes.common.policies.allocation.uniform import UniformAllocator

from .cluster import EPOCH, alloc_for


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
    assert (p.ctl.params.deadband, p.ctl.params.alpha, p.warmup, p.min_observations) == (0.2, 0.5, 3, 4)
    assert (p.sizes.b_min, p.sizes.b_max, p.sizes.batch_size, p.sizes.steps, p.clock.epoch_samples) == (8, 64, 32, 4, 777)
    assert p.fixed_global is False and p.interval == "epoch"
    f, _ = alloc_for("omnilearn-asp", global_batch="free", sync="ssp", lr_scaling="none")
    assert f.fixed_global is False
    q, _ = alloc_for("dynamic-batching", global_batch="free")
    assert q.fixed_global is False
    part, _ = alloc_for("edp-sgd", partition_window=3)
    assert part.window == 3
    ad, _ = alloc_for("task-allocation", adaptive_epsilon=0.01, adaptive_patience=3, cycle_samples=256,
                      batch_size=16)
    assert (ad.epsilon, ad.patience, ad.w0, ad.sizes.batch_size) == (0.01, 3, 16, 16)
    with pytest.raises(ValueError, match="unknown allocation"):
        RunConfig.model_construct(allocation="nope").build_policy("allocation", dss_max=1, epoch_samples=1)


def test_a_cycle_cut_short_counts_scaled_and_another_batch_not_at_all():
    wl = Workload(dss=1352, batch_size=338)
    # A workload bigger than an epoch of data ran 1293 samples at the right batch: scaled up.
    assert CycleObservation(1293, 338, 1.0).seconds_at(wl) == pytest.approx(1352 / 1293)
    assert CycleObservation(1352, 338, 2.0).seconds_at(wl) == 2.0
    assert CycleObservation(1352, 300, 2.0).seconds_at(wl) is None  # assigned before a resize
    assert CycleObservation(1352, 338, 2.0, accumulation=2).seconds_at(wl) is None
