"""The reference populations: the fastest device alone (hermes-sim --alone) and the ideal cluster (--homogeneous)."""

from __future__ import annotations

import math
from dataclasses import replace

from hermes.sim.devices import ALWAYS_ON, churn
from hermes.sim.populations import TESTBED_FAST_FLOPS, build_population
from hermes.sim.reference import fastest_alone, homogeneous


def test_alone_is_the_fastest_device_without_link_or_churn():
    devices = build_population("generated", 50, seed=3)
    (alone,) = fastest_alone(devices)
    best = max(devices, key=lambda d: d.flops)
    assert alone.device_id == best.device_id and alone.flops == best.flops
    assert math.isinf(alone.up_mbps) and math.isinf(alone.down_mbps) and alone.rtt_s == 0.0
    assert alone.availability is ALWAYS_ON
    assert any(not math.isinf(d.up_mbps) for d in devices)  # the population's own links were shaped


def test_alone_ties_go_to_the_smallest_device_id():
    # hl8's fastest agent is worker-4; made equal to it, worker-2 wins the tie by its id.
    devices = build_population("hl8", 4, seed=0)
    assert fastest_alone(devices)[0].device_id == "worker-4"
    tied = [replace(d, flops=TESTBED_FAST_FLOPS) if d.device_id == "worker-2" else d for d in devices]
    assert fastest_alone(tied)[0].device_id == "worker-2"
    assert fastest_alone([]) == []


def test_homogeneous_keeps_the_total_compute_links_and_availability():
    devices = build_population("table2", None, seed=0)
    devices[0] = replace(devices[0], availability=churn(0.2, 30.0, seed=1))
    ideal = homogeneous(devices)
    assert len(ideal) == 12 and len({d.flops for d in ideal}) == 1
    assert math.isclose(sum(d.flops for d in ideal), sum(d.flops for d in devices), rel_tol=1e-12)
    assert [(d.device_id, d.up_mbps, d.rtt_s, d.availability) for d in ideal] == \
        [(d.device_id, d.up_mbps, d.rtt_s, d.availability) for d in devices]
