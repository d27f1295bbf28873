"""The host model's ``floor`` switch (sim/host.py): the testbed's ``--slowdown-mode floor`` (common/pace.py)."""

from __future__ import annotations

import math

import pytest

from hermes.common.config import build_config
from hermes.sim.devices import ALWAYS_ON, DeviceProfile
from hermes.sim.events import run_virtual
from hermes.sim.host import FLOOR_STEP_S, Host, HostError, HostSpec, nominal_step_seconds, parse_host
from hermes.sim.links import transfer_seconds
from hermes.sim.run import Simulation
from hermes.sim.server_cost import CalibratedCost


def _sim(tmp_path, spec: HostSpec) -> Simulation:
    devices = [DeviceProfile(f"d{i}", "t", 2e8 / s, memory_mb=4096.0, up_mbps=math.inf, down_mbps=math.inf,
                             rtt_s=0.0, availability=ALWAYS_ON) for i, s in enumerate((1.0, 8.0))]
    config = build_config("asp", dataset="digits", model="mlp", seed=0, max_seconds=1)
    return Simulation(config, devices, out=tmp_path / "f", transfer=transfer_seconds, cost=CalibratedCost(),
                      population="test", host=spec)


def test_the_nominal_step_is_the_measured_least_cost_per_sample_times_its_samples():
    for batch, per_sample in FLOOR_STEP_S:
        assert nominal_step_seconds(batch) == pytest.approx(batch * per_sample)
    # Larger batches cost less a sample, as measured; between rows linear, outside the nearest row's.
    rows = sorted(FLOOR_STEP_S)
    assert all(a[1] > b[1] for a, b in zip(rows, rows[1:]))
    assert nominal_step_seconds(1000) == pytest.approx(1000 * rows[-1][1])
    assert nominal_step_seconds(0) == 0.0


def test_floor_parses_and_only_as_a_switch():
    assert parse_host("testbed:floor=1,background=0") == HostSpec(floor=1.0, background=0.0)
    with pytest.raises(HostError, match="floor must be 0"):
        parse_host("testbed:floor=0.5")


def test_the_cpu_rule_keeps_its_sleep_and_floor_paces_to_the_nominal_step():
    cpu, floor = Host(HostSpec(thread_flops=8e9)), Host(HostSpec(thread_flops=8e9, floor=1))
    # cpu: whatever split() said, untouched.
    assert cpu.step_sleep("d", 1e9, 32, 0.003, 0.021) == 0.021
    # floor, an 8x agent: its step lasts 8 x the nominal step of 32 samples, whatever the cpu rule's sleep.
    nominal = 8 * nominal_step_seconds(32)
    assert 0.003 + floor.step_sleep("d", 1e9, 32, 0.003, 0.5) == pytest.approx(nominal)
    # A step whose burst took longer than its nominal time does not sleep (the host is the bottleneck).
    assert floor.step_sleep("d", 1e9, 32, nominal * 1.5, 0.5) == 0.0
    # An unslowed agent (at the thread rate) never sleeps under either rule; nor does work that is not slowed.
    assert floor.step_sleep("f", 8e9, 32, 0.001, 0.0) == 0.0
    assert floor.step_sleep("d", 1e9, 32, 0.001, 0.0) == 0.0


def test_the_pacer_takes_the_least_cost_a_sample_over_its_window_as_the_testbeds_does():
    host = Host(HostSpec(thread_flops=8e9, floor=1))
    # After steps of 64 samples (cheaper a sample), a step of 32 is paced at the 64-sample step's cost a sample:
    # StepPacer's min over its window, the testbed's rule, not the 32-sample step's own nominal cost.
    host.step_sleep("d", 1e9, 64, 0.0, 1.0)
    short = host.step_sleep("d", 1e9, 32, 0.0, 1.0)
    assert short == pytest.approx(8 * 32 * dict(FLOOR_STEP_S)[64.0])
    assert short < 8 * nominal_step_seconds(32)
    # Another device keeps its own pacer.
    assert host.step_sleep("e", 1e9, 32, 0.0, 1.0) == pytest.approx(8 * nominal_step_seconds(32))


def test_a_slowed_device_on_a_free_host_lasts_its_nominal_steps_and_on_a_crowded_one_its_bursts(tmp_path):
    # The 8x device (2.5e7 FLOP/s against a 2e8 thread): 4 steps of 32 samples. The cpu rule makes the cycle
    # 8x its CPU whatever that is; floor makes it 4 x 8 x the nominal step on a free host.
    free = _sim(tmp_path, HostSpec(thread_flops=2e8, floor=1, wakeups=0))
    slowed = free.devices[1]

    async def cycles():
        return await slowed.busy(0.8 * nominal, 4, samples=128), await slowed.busy(0.5 * nominal, 4, samples=128)

    nominal = 4 * 8 * nominal_step_seconds(32)
    # The cycle's own work (the FLOPs model, jitter included) does not move it while its CPU fits the nominal.
    assert run_virtual(free.clock, cycles) == pytest.approx((nominal, nominal))
    # One core among 99 other processes: each step's CPU burst takes 100x its CPU, longer than the nominal step.
    crowded = _sim(tmp_path, HostSpec(thread_flops=2e8, floor=1, wakeups=0, cores=1, background=99))
    slowed = crowded.devices[1]
    seconds = 0.8 * nominal  # 1/8 of it is CPU: 0.1 x nominal, 10 x nominal at 1 % of a core

    async def crowded_cycle():
        return await slowed.busy(seconds, 4, samples=128)

    took = run_virtual(crowded.clock, crowded_cycle)
    assert took == pytest.approx(100 * seconds / 8)
