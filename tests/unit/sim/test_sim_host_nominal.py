"""The host model's ``nominal`` rule (sim/host.py): the testbed's ``--slowdown-mode nominal --pace P`` (common/pace.py)."""

from __future__ import annotations

import math

import pytest

from hermes.common.config import build_config
from hermes.sim.devices import ALWAYS_ON, DeviceProfile
from hermes.sim.events import run_virtual
from hermes.sim.host import Host, HostError, HostSpec, parse_host
from hermes.sim.links import transfer_seconds
from hermes.sim.run import Simulation
from hermes.sim.server_cost import CalibratedCost

NOMINAL_MS = 0.05  # a sample's nominal cost (the testbed's --nominal-sample-ms)
THREAD = 2e8


def _sim(tmp_path, spec: HostSpec) -> Simulation:
    # Device 0 unslowed, device 1 eight times slower, as the host model's hl* agents (sim.host.on_host).
    devices = [DeviceProfile(f"d{i}", "t", THREAD / s, memory_mb=4096.0, up_mbps=math.inf, down_mbps=math.inf,
                             rtt_s=0.0, availability=ALWAYS_ON) for i, s in enumerate((1.0, 8.0))]
    config = build_config("asp", dataset="digits", model="mlp", seed=0, max_seconds=1)
    return Simulation(config, devices, out=tmp_path / "f", transfer=transfer_seconds, cost=CalibratedCost(),
                      population="test", host=spec)


def _spec(**kw) -> HostSpec:
    return HostSpec(thread_flops=THREAD, nominal=NOMINAL_MS, pace=2.0, wakeups=0, background=0.0, **kw)


def test_nominal_and_pace_parse_and_only_together():
    assert parse_host("testbed:nominal=0.05,pace=2,background=0") == HostSpec(nominal=0.05, pace=2.0, background=0.0)
    assert parse_host("testbed:nominal=0.05") == HostSpec(nominal=0.05)
    with pytest.raises(HostError, match="pace needs nominal"):
        parse_host("testbed:pace=2")
    with pytest.raises(HostError, match="floor and nominal"):
        parse_host("testbed:floor=1,nominal=0.05")
    with pytest.raises(HostError, match="pace must be >= 1"):
        parse_host("testbed:nominal=0.05,pace=0.5")
    with pytest.raises(HostError, match="host nominal"):
        parse_host("testbed:nominal=-1")


def test_every_agent_the_unslowed_one_too_paces_its_step_to_s_times_pace_times_the_nominal():
    host = Host(_spec())
    step = 32 * NOMINAL_MS / 1000
    # The testbed agent's own class in its nominal mode, at its slowdown times the pace.
    assert host.pacer("fast", THREAD).mode == "nominal"
    assert host.pacer("fast", THREAD).slowdown == 2.0 and host.pacer("slow", THREAD / 8).slowdown == 16.0
    # S = 1 at pace 2 sleeps where the cpu and floor rules never pace it; the cpu rule's sleep (last arg) is ignored.
    assert 0.001 + host.step_sleep("fast", THREAD, 32, 0.001, 0.0) == pytest.approx(2 * step)
    assert 0.001 + host.step_sleep("slow", THREAD / 8, 32, 0.001, 0.7) == pytest.approx(16 * step)
    # The same cost a sample at every batch (one figure, not the pacer's least over its window).
    assert host.step_sleep("slow", THREAD / 8, 64, 0.0, 0.0) == pytest.approx(16 * 2 * step)
    # A burst longer than its nominal step does not sleep (the host is the bottleneck); nor does a non-step.
    assert host.step_sleep("fast", THREAD, 32, 3 * step, 0.0) == 0.0
    assert host.step_sleep("fast", THREAD, 0, 0.0, 0.0) == 0.0


def test_work_outside_steps_lasts_s_times_pace_its_cpu_under_nominal_only():
    host = Host(_spec())
    assert host.overhead_sleep("slow", THREAD / 8, 0.002, 0.003) == pytest.approx(16 * 0.002 - 0.003)
    assert host.overhead_sleep("fast", THREAD, 0.002, 0.005) == 0.0  # took longer than 2 x its CPU already
    assert host.overhead_sleep_seconds == pytest.approx(16 * 0.002 - 0.003)
    for other in (HostSpec(thread_flops=THREAD), HostSpec(thread_flops=THREAD, floor=1)):
        assert Host(other).overhead_sleep("slow", THREAD / 8, 0.002, 0.003) == 0.0


def test_a_cycle_on_the_simulated_host_lasts_its_nominal_steps_and_the_gate_s_times_pace_its_cpu(tmp_path):
    sim = _sim(tmp_path, _spec())
    fast, slow = sim.devices
    step = 32 * NOMINAL_MS / 1000
    cpu_eval = 0.001  # the gate's validation: CPU seconds at the thread's rate

    async def cycles():
        # The cycle's own work (FLOPs at the device's rate) does not move it while its bursts fit the nominal.
        a = await fast.busy(0.004, 4, samples=128)
        b = await slow.busy(8 * 0.004, 4, samples=128)
        c = await slow.busy(8 * cpu_eval, 1, slowed=False)
        d = await fast.busy(cpu_eval, 1, slowed=False)
        return a, b, c, d

    a, b, c, d = run_virtual(sim.clock, cycles)
    assert a == pytest.approx(4 * 2 * step)
    assert b == pytest.approx(4 * 16 * step)
    assert c == pytest.approx(16 * cpu_eval)
    assert d == pytest.approx(2 * cpu_eval)


def test_the_loop_threads_encoding_is_paced_and_other_threads_are_not(tmp_path):
    sim = _sim(tmp_path, _spec())
    slow = sim.devices[1]

    async def encode(paced):
        t0 = sim.driver.now()
        await sim.driver.agent_cpu(1000, 1e-6, slow if paced else None)
        return sim.driver.now() - t0

    assert run_virtual(sim.clock, lambda: encode(True)) == pytest.approx(16 * 0.001)
    assert run_virtual(sim.clock, lambda: encode(False)) == pytest.approx(0.001)
