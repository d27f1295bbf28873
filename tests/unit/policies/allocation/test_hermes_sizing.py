"""Allocation 'dual-search' (Hermes Sec. IV-A), driven the way the engine drives it."""

from __future__ import annotations

import pytest

from hermes.common.config import build_config
from hermes.common.policies.allocation import CycleObservation
from hermes.common.policies.allocation.hermes_sizing import DualSearchAllocator

from .cluster import HL8, Cluster, alloc_for


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


def test_dss_max_bounds_the_fast_workers_growth():
    # Unbounded, HL8's fast w4 grows from 128 to 672 samples (above); dual_search.dss_max stops it at the bound,
    # and the slow w3 is still cut.
    alloc, _cfg = alloc_for("hermes", shard_size=16, **{"dual_search.dss_max": 256})
    c = Cluster(alloc, HL8)
    c.run(3)
    got = {w: r for _, w, r in c.log}
    assert got["w4"].kind == "fast" and got["w4"].workload.dss == 256
    assert got["w3"].workload.dss == 80
    assert build_config("hermes").dual_search.dss_max is None  # off unless set
    with pytest.raises(ValueError, match="dss_max=8 < shard_size=16"):
        alloc_for("hermes", shard_size=16, **{"dual_search.dss_max": 8})


def _judge(recent: int | None) -> dict[str, str]:
    """Five devices tried once and gone idle (1 s cycles), then five in training (four at 0.1 s, one at 0.5 s): who
    the search resizes, and which way."""
    extra = {} if recent is None else {"dual_search.recent_reports": recent}
    alloc = build_config("hermes", shard_size=16, cycle_samples=128, **extra).build_policy("allocation", dss_max=4096)
    for w in ("s1", "s2", "s3", "s4", "s5"):
        for _ in range(3):  # warm-up 1 + min_observations 2
            alloc.observe(w, CycleObservation(128, 32, 1.0))
    for _ in range(4):
        for w, t in (("a1", 0.1), ("a2", 0.1), ("a3", 0.1), ("a4", 0.1), ("a5", 0.5)):
            alloc.observe(w, CycleObservation(128, 32, t))
    return {w: r.kind for w, r in alloc.rebalance().items()}


def test_recent_reports_judges_only_the_workers_training_now():
    # Every worker with a history (Hermes Sec. IV-A): the median, 0.75 s, lies between the idle devices' 1 s and
    # the 0.1 s of the four training, which are "fast" and grown (and the idle ones cut, though they do not train).
    got = _judge(None)
    assert {w: got[w] for w in ("a1", "a2", "a3", "a4")} == dict.fromkeys(("a1", "a2", "a3", "a4"), "fast")
    assert {got[w] for w in ("s1", "s2", "s3", "s4", "s5")} == {"slow"}
    # The last 10 reports are the five training now: their median is 0.1 s and only the 0.5 s one is cut.
    assert _judge(10) == {"a5": "slow"}
    assert build_config("hermes").dual_search.recent_reports is None  # off unless set
    with pytest.raises(ValueError):
        build_config("hermes", **{"dual_search.recent_reports": 0})
