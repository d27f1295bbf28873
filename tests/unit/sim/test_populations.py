"""Populations: the testbed's HL profiles, Hermes Table II, generated devices, FedScale traces."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from hermes.deploy.profiles import heterogeneity_level, worker_profiles
from hermes.sim.devices import ALWAYS_ON, IntervalAvailability, offline_share
from hermes.sim.populations import (
    FEDSCALE_REFERENCE_FORWARD_FLOPS,
    SAMPLE_TRACE,
    TESTBED_FAST_FLOPS,
    PopulationError,
    build_population,
    generate_fedscale_sample,
)

SAMPLE = str(SAMPLE_TRACE)


@pytest.mark.parametrize("profile, hl", [("hl1", 1), ("hl2", 2), ("hl4", 4), ("hl8", 8)])
def test_testbed_profiles_have_the_testbeds_slowdowns(profile, hl):
    # OmniLearn Table I via deploy/profiles.py: HL = fastest / slowest (Eq. 3).
    devices = build_population(profile, None, seed=0)
    assert len(devices) == 4
    assert heterogeneity_level([d.flops for d in devices]) == pytest.approx(hl)
    for d, wp in zip(devices, worker_profiles(profile, 4), strict=True):
        assert d.flops == pytest.approx(TESTBED_FAST_FLOPS / wp.slowdown)
        assert d.device_id == f"worker-{wp.index + 1}"  # the testbed's agent names
        assert d.availability is ALWAYS_ON and math.isinf(d.up_mbps) and d.rtt_s == 0.0


def test_hl8_cores_6_6_4_32():
    # OmniLearn Table I, HL8 row: 6, 6, 4 and 32 cores.
    flops = [d.flops for d in build_population("hl8", 4, seed=0)]
    assert [f / flops[3] for f in flops] == pytest.approx([6 / 32, 6 / 32, 4 / 32, 1.0])


def test_a_testbed_link_overrides_every_device_link():
    devices = build_population("hl8", 8, seed=0, link="lte")
    assert len(devices) == 8
    assert {(d.up_mbps, d.down_mbps, d.rtt_s) for d in devices} == {(10.0, 30.0, 0.05)}
    custom = build_population("table2", None, seed=0, link="custom:2mbit/4mbit/150ms")
    assert {(d.up_mbps, d.down_mbps, d.rtt_s) for d in custom} == {(2.0, 4.0, 0.15)}


def test_table2_is_the_papers_twelve_workers():
    # Hermes Table II: B1ms x2 (1 vCPU, 2 GB), F2s_v2 x3 (2, 4), DS2_v2 x3 (2, 7), E2ds_v4 x2 (2, 16), F4s_v2 x2 (4, 8).
    devices = build_population("table2", None, seed=0)
    assert len(devices) == 12
    families = [d.family for d in devices]
    assert {f: families.count(f) for f in families} == {"B1ms": 2, "F2s_v2": 3, "DS2_v2": 3, "E2ds_v4": 2,
                                                          "F4s_v2": 2}
    by_family = {d.family: d for d in devices}
    assert [by_family[f].memory_mb / 1024 for f in ("B1ms", "F2s_v2", "DS2_v2", "E2ds_v4", "F4s_v2")] == [
        2, 4, 7, 16, 8]
    vcpus = {f: by_family[f].flops / by_family["B1ms"].flops for f in by_family}
    assert vcpus == {"B1ms": 1, "F2s_v2": 2, "DS2_v2": 2, "E2ds_v4": 2, "F4s_v2": 4}
    # Total compute: 2*1 + 3*2 + 3*2 + 2*2 + 2*4 = 26 vCPUs; HL = 4.
    assert sum(d.flops for d in devices) == pytest.approx(26 * by_family["B1ms"].flops)


def test_generated_population_is_seeded_and_prefix_stable():
    a = build_population("generated", 200, seed=4)
    b = build_population("generated", 200, seed=4)
    small = build_population("generated", 50, seed=4)
    key = [(d.device_id, d.flops, d.memory_mb, d.up_mbps, d.down_mbps, d.rtt_s) for d in a]
    assert key == [(d.device_id, d.flops, d.memory_mb, d.up_mbps, d.down_mbps, d.rtt_s) for d in b]
    assert key[:50] == [(d.device_id, d.flops, d.memory_mb, d.up_mbps, d.down_mbps, d.rtt_s) for d in small]
    flips = [[d.availability.next_change(t) for t in (0.0, 500.0)] for d in a[:20]]
    assert flips == [[d.availability.next_change(t) for t in (0.0, 500.0)] for d in b[:20]]
    other = build_population("generated", 200, seed=5)
    assert [d.flops for d in other] != [d.flops for d in a]


def test_generated_distributions_match_their_parameters():
    devices = build_population("generated:flops=2e9,offline=0.2,mean_off_s=30", 2000, seed=0)
    logf = np.log([d.flops for d in devices])
    assert math.exp(np.median(logf)) == pytest.approx(2e9, rel=0.1)
    assert np.std(logf) == pytest.approx(0.6, rel=0.1)  # FedScale's log-normal speed skew
    assert np.median([d.down_mbps for d in devices]) == pytest.approx(30.0, rel=0.1)
    assert np.median([d.up_mbps for d in devices]) == pytest.approx(10.0, rel=0.1)
    share = np.mean([offline_share(d.availability, 5000.0) for d in devices[:300]])
    assert 0.17 < share < 0.23
    assert set(d.memory_mb for d in devices) <= {2048, 3072, 4096, 6144, 8192, 12288}
    always = build_population("generated:offline=0", 10, seed=0)
    assert all(d.availability is ALWAYS_ON for d in always)


@pytest.mark.parametrize("spec, n, fragment", [
    ("generated:speed=3", 10, "KEY=VALUE"),
    ("generated:flops=fast", 10, "not a number"),
    ("generated:offline=1", 10, "offline"),
    ("generated:flops=-1", 10, "flops"),
    ("generated", None, "number of devices"),
    ("hl3", 4, "unknown population"),
    ("hl8", 0, "positive"),
])
def test_bad_specs_are_refused_with_one_line(spec, n, fragment):
    with pytest.raises(PopulationError, match=fragment) as info:
        build_population(spec, n, seed=0)
    assert "\n" not in str(info.value)


def test_a_bad_link_is_refused_as_a_population_error():
    with pytest.raises(PopulationError, match="unknown link"):
        build_population("hl8", 4, seed=0, link="carrier-pigeon")


def test_the_shipped_sample_trace_reads_in_fedscale_format():
    devices = build_population(SAMPLE, None, seed=0)
    assert len(devices) == 50
    capacity = json.loads(open(f"{SAMPLE}/client_device_capacity.json").read())
    first = capacity["1"]
    assert devices[0].flops == pytest.approx(FEDSCALE_REFERENCE_FORWARD_FLOPS / (first["computation"] / 1000))
    assert devices[0].up_mbps == devices[0].down_mbps == pytest.approx(first["communication"] / 1000)
    assert all(isinstance(d.availability, IntervalAvailability) for d in devices)
    share = np.mean([offline_share(d.availability, 3600.0) for d in devices])
    assert 0.1 < share < 0.35
    # More devices than clients: the trace cycles, ids stay distinct.
    more = build_population(SAMPLE, 120, seed=0)
    assert len({d.device_id for d in more}) == 120


def test_the_generator_reproduces_the_shipped_sample(tmp_path):
    generate_fedscale_sample(tmp_path)
    for name in ("client_device_capacity.json", "client_behave_trace.json"):
        assert (tmp_path / name).read_text() == open(f"{SAMPLE}/{name}").read()


def test_a_capacity_file_alone_is_always_on(tmp_path):
    path = tmp_path / "cap.json"
    path.write_text(json.dumps({"7": {"computation": 50.0, "communication": 2000.0}}))
    [device] = build_population(str(path), None, seed=0)
    assert device.availability is ALWAYS_ON and device.up_mbps == 2.0
    assert device.flops == pytest.approx(FEDSCALE_REFERENCE_FORWARD_FLOPS / 0.05)


@pytest.mark.parametrize("capacity, behave, fragment", [
    ("not json", None, "not a readable JSON"),
    ({}, None, "non-empty"),
    ({"1": {"computation": 0, "communication": 10}}, None, "'computation' must be a positive"),
    ({"1": {"computation": 5, "communication": "fast"}}, None, "'communication'"),
    ({"1": {"computation": 5, "communication": 10}}, {"2": {}}, "no behaviour trace"),
    ({"1": {"computation": 5, "communication": 10}},
     {"1": {"active": [0, 5], "inactive": [3], "finish_time": 10}}, "equal length"),
    ({"1": {"computation": 5, "communication": 10}},
     {"1": {"active": [5], "inactive": [3], "finish_time": 10}}, "sorted"),
    ({"1": {"computation": 5, "communication": 10}},
     {"1": {"active": [0], "inactive": [3], "finish_time": 0}}, "finish_time"),
])
def test_bad_trace_files_are_refused_naming_the_client(tmp_path, capacity, behave, fragment):
    (tmp_path / "client_device_capacity.json").write_text(
        capacity if isinstance(capacity, str) else json.dumps(capacity))
    if behave is not None:
        (tmp_path / "client_behave_trace.json").write_text(json.dumps(behave))
    with pytest.raises(PopulationError, match=fragment) as info:
        build_population(str(tmp_path), None, seed=0)
    assert "\n" not in str(info.value)
