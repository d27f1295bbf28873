"""The host model (sim/host.py): processor sharing of the testbed machine's cores, and a run under it."""

from __future__ import annotations

import asyncio
import math
from dataclasses import replace

import pytest

from hermes.common.config import build_config
from hermes.sim.devices import ALWAYS_ON, DeviceProfile
from hermes.sim.events import VirtualClock, run_virtual
from hermes.sim.host import Host, HostError, HostSpec, on_host, parse_host
from hermes.sim.links import transfer_seconds
from hermes.sim.run import SimError, Simulation, deterministic_view
from hermes.sim.server_cost import CalibratedCost, MeasuredCost


def _finish_times(spec: HostSpec, jobs: list[tuple[float, float]], cancel: tuple[int, float] | None = None,
                  woken: tuple[int, ...] = ()):
    """Start each (start time, CPU seconds) job on one host; the virtual time each one ends (None: cancelled).
    ``woken``: the indices of jobs that are a sleeper's burst (``Host.run(woken=True)``)."""
    clock = VirtualClock(start=0.0)
    host = Host(spec)

    async def one(start: float, cpu: float, sleeper: bool) -> float:
        await asyncio.sleep(start)
        await host.run(cpu, woken=sleeper)
        return clock.monotonic()

    async def main():
        tasks = [asyncio.ensure_future(one(s, c, i in woken)) for i, (s, c) in enumerate(jobs)]
        if cancel is not None:
            await asyncio.sleep(cancel[1])
            tasks[cancel[0]].cancel()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        return [None if isinstance(d, asyncio.CancelledError) else d for d in done], host

    return run_virtual(clock, main)


def test_jobs_share_the_cores_as_kleinrocks_processor_sharing():
    # One core, 1 s and 0.5 s of CPU started together: both at half speed until the short one ends at 1.0 s,
    # then the long one alone: 0.5 s left at full speed, 1.5 s.
    times, _ = _finish_times(HostSpec(cores=1), [(0.0, 1.0), (0.0, 0.5)])
    assert times == pytest.approx([1.5, 1.0])
    # Two cores, two jobs: each has its own core; a third makes them share (2/3 of a core each).
    assert _finish_times(HostSpec(cores=2), [(0.0, 1.0), (0.0, 1.0)])[0] == pytest.approx([1.0, 1.0])
    assert _finish_times(HostSpec(cores=2), [(0.0, 1.0)] * 3)[0] == pytest.approx([1.5] * 3)
    # A job is one thread: alone on two cores it still takes its CPU seconds.
    assert _finish_times(HostSpec(cores=2), [(0.0, 1.0)])[0] == pytest.approx([1.0])


def test_background_processes_take_their_share_of_the_cores():
    # 2 cores, 2 other runnable processes: one job runs at 2 / 3 of a core (1 s of CPU in 1.5 s).
    times, host = _finish_times(HostSpec(cores=2, background=2), [(0.0, 1.0)])
    assert times == pytest.approx([1.5])
    stats = host.stats(1.5)
    assert stats["cpu_seconds"] == pytest.approx(1.0)
    assert stats["stretch_seconds"] == pytest.approx(0.5)
    assert stats["mean_load"] == pytest.approx(3.0)


def test_a_late_job_slows_the_running_one_from_when_it_arrives():
    # One core: A (1 s) alone for 0.5 s, then B (0.25 s) arrives: both at half speed; B ends at 1.0, A at 1.25.
    times, _ = _finish_times(HostSpec(cores=1), [(0.0, 1.0), (0.5, 0.25)])
    assert times == pytest.approx([1.25, 1.0])


def test_a_cancelled_job_leaves_the_host_and_the_others_speed_up():
    # One core, two 1 s jobs; the second is cancelled at 0.5 s (each has 0.75 s left): the first ends at 1.25 s.
    times, host = _finish_times(HostSpec(cores=1), [(0.0, 1.0), (0.0, 1.0)], cancel=(1, 0.5))
    assert times[1] is None
    assert times[0] == pytest.approx(1.25)
    assert host.jobs == []


def test_a_woken_sleepers_burst_takes_a_core_of_its_own_up_to_its_credit_and_only_with_the_switch_on():
    # 2 cores, 2 background processes, a busy job (1 s of CPU) and a sleeper's burst of 6 ms at 0.1 s.
    jobs = [(0.0, 1.0), (0.1, 0.006)]
    # Fluid sharing (sleeper off, the default): the burst shares like any job, 2 / 4 of a core: 12 ms.
    off, _ = _finish_times(HostSpec(cores=2, background=2), jobs, woken=(1,))
    assert off[1] == pytest.approx(0.112)
    # sleeper = 4 ms: its first 4 ms at a full core, the last 2 ms back at the fair share (2 / 4): 8 ms in all;
    # meanwhile the busy job and the background share the one core left (1 / 3 of a core, not 2 / 3).
    on, host = _finish_times(HostSpec(cores=2, background=2, sleeper=0.004), jobs, woken=(1,))
    assert on[1] == pytest.approx(0.108)
    assert on[0] > off[0]
    assert host.stats(on[0])["cpu_seconds"] == pytest.approx(1.006)
    # A job not woken is never served as a sleeper's burst.
    assert _finish_times(HostSpec(cores=2, background=2, sleeper=0.004), jobs)[0] == pytest.approx(off)
    # More bursts than cores: they share the cores and the busy job waits (rate 0) until one ends.
    three, _ = _finish_times(HostSpec(cores=2, sleeper=0.004), [(0.0, 0.01), (0.0, 0.003), (0.0, 0.003),
                                                                  (0.0, 0.003)], woken=(1, 2, 3))
    assert three[1:] == pytest.approx([0.0045] * 3)
    with pytest.raises(HostError, match="sleeper"):
        HostSpec(sleeper=-0.001)


def test_a_slowed_agent_computes_at_the_thread_rate_then_sleeps_the_rest():
    host = Host(HostSpec(thread_flops=8e9))
    # An agent slowed 8x (1e9 FLOP/s): 1 s of its work is 1/8 s of CPU and 7/8 s of sleep (client/trainer.py).
    assert host.split(1.0, 1e9) == pytest.approx((0.125, 0.875))
    # A device at or above the thread rate only computes.
    assert host.split(1.0, 16e9) == pytest.approx((1.0, 0.0))


def test_host_specs_parse_and_bad_ones_say_which_part():
    assert parse_host(None) is None and parse_host("none") is None
    assert parse_host("testbed") == HostSpec()
    assert parse_host("testbed:background=6.5,cores=4") == HostSpec(background=6.5, cores=4)
    assert parse_host("background=3") == HostSpec(background=3)
    for bad, part in (("laptop", "expected none, testbed"), ("testbed:speed=2", "'speed=2'"),
                      ("testbed:cores=two", "cores must be a number"), ("testbed:cores=0", "positive"),
                      ("testbed:background=-1", ">= 0")):
        with pytest.raises(HostError, match=part):
            parse_host(bad)


def test_the_testbed_agents_on_the_host_run_at_the_thread_rate_over_their_slowdown():
    from hermes.sim.populations import build_population

    spec = HostSpec(thread_flops=6e9)
    devices = on_host(build_population("hl8", None, 0), "hl8", spec)
    assert [d.flops for d in devices] == pytest.approx([6e9 / (32 / 6), 6e9 / (32 / 6), 6e9 / 8, 6e9])
    generated = build_population("generated", 3, 0)
    assert on_host(generated, "generated", spec) == generated


def _devices() -> list[DeviceProfile]:
    return [DeviceProfile(f"d{i}", "t", 2e8 / s, memory_mb=4096.0, up_mbps=math.inf, down_mbps=math.inf,
                          rtt_s=0.0, availability=ALWAYS_ON) for i, s in enumerate((1.0, 2.0, 4.0, 8.0))]


def _run(tmp_path, name: str, host: HostSpec | None, preset: str = "asp"):
    config = build_config(preset, dataset="digits", model="mlp", seed=0, target_accuracy=0.8, max_seconds=120)
    sim = Simulation(config, _devices(), out=tmp_path / name, transfer=transfer_seconds, cost=CalibratedCost(),
                     population="test", host=host)
    return sim.run()


def test_a_run_on_a_busy_host_is_deterministic_and_its_devices_report_the_stretched_time(tmp_path):
    spec = HostSpec(thread_flops=2e8, background=6.0)
    first, second = _run(tmp_path, "a", spec), _run(tmp_path, "b", spec)
    assert deterministic_view(first) == deterministic_view(second)
    alone = _run(tmp_path, "c", None)
    assert first["host"]["cpu_seconds"] > 0 and first["host"]["mean_load"] >= 6.0
    assert alone["host"] is None
    # The fastest device computes at 2 / (6 + runnable jobs) of a core: the compute seconds it reports per
    # sample are at least 3.5x the unshared device's (2 / 7: it is never alone with the background).
    def per_sample(summary):
        w = summary["workers"][0]
        return w["device"]["compute_seconds"] / w["device"]["samples"]

    assert per_sample(first) >= 3.5 * per_sample(alone)


def test_the_host_model_refuses_the_measured_server_cost(tmp_path):
    config = build_config("asp", dataset="digits", model="mlp", seed=0, max_seconds=1)
    with pytest.raises(SimError, match="--host"):
        Simulation(config, _devices(), out=tmp_path / "m", transfer=transfer_seconds, cost=MeasuredCost(),
                   population="test", host=HostSpec())


def test_a_charged_model_is_counted_as_the_simulator_counts_its_own_and_a_bad_spec_is_one_line():
    from hermes.sim.run import charged_flops

    train, forward = charged_flops("cnn:1x28x28")
    # The model zoo's CNN on MNIST's shape (114,314 parameters, the Hermes paper's size): its forward pass
    # and a training step's forward plus backward, as torch's FlopCounterMode counts them.
    assert forward > 1e6 and 2 * forward < train < 4 * forward
    for bad in ("cnn:axb", "nosuchmodel:1x28x28"):
        with pytest.raises(SimError, match=rf"--charge-model '{bad}': .*expected NAME:CxHxW"):
            charged_flops(bad)


def test_sleeper_auto_takes_the_measured_credit_at_the_hosts_load_when_the_burst_starts(monkeypatch):
    import hermes.sim.host as host_mod

    # Credit 4 ms beside 2 other runnable processes, none beside 6: 2 ms at 4 (linear between).
    monkeypatch.setattr(host_mod, "SLEEPER_CREDIT_S", ((2.0, 0.004), (6.0, 0.0)))
    jobs = [(0.0, 1.0), (0.1, 0.006)]
    # Background 1 and the busy job: 2 others when the burst wakes: its first 4 ms at a full core, the last 2 ms
    # at the fair share (2 / 3 of a core: 3 ms): 7 ms, as a fixed sleeper=0.004 gives.
    auto, _ = _finish_times(HostSpec(cores=2, background=1, sleeper="auto"), jobs, woken=(1,))
    fixed, _ = _finish_times(HostSpec(cores=2, background=1, sleeper=0.004), jobs, woken=(1,))
    assert auto[1] == pytest.approx(0.107) and auto == pytest.approx(fixed)
    # Background 3: 4 others, 2 ms of credit, the last 4 ms at 2 / 5 of a core (10 ms): 12 ms.
    mid, _ = _finish_times(HostSpec(cores=2, background=3, sleeper="auto"), jobs, woken=(1,))
    assert mid[1] == pytest.approx(0.112)
    # Background 5: 6 others, no credit: fluid sharing, 2 / 7 of a core, 21 ms, as with the switch off.
    none, _ = _finish_times(HostSpec(cores=2, background=5, sleeper="auto"), jobs, woken=(1,))
    off, _ = _finish_times(HostSpec(cores=2, background=5), jobs, woken=(1,))
    assert none[1] == pytest.approx(0.121) and none == pytest.approx(off)
    # Parsed from --host; anything else but a number in [0, 1) is refused with the field's name.
    assert parse_host("testbed:background=2,sleeper=auto").sleeper == "auto"
    assert parse_host("testbed:sleeper=0.005").sleeper == 0.005
    for bad in ("testbed:sleeper=auto2", "testbed:sleeper=1.5"):
        with pytest.raises(HostError, match="sleeper"):
            parse_host(bad)


def test_a_run_with_sleeper_auto_is_deterministic_and_its_credit_shortens_the_stretch(tmp_path, monkeypatch):
    import hermes.sim.host as host_mod

    # A credit of 50 ms at every load, so every woken step of the small run is credited in full.
    monkeypatch.setattr(host_mod, "SLEEPER_CREDIT_S", ((0.0, 0.05), (8.0, 0.05)))
    auto = HostSpec(thread_flops=2e8, background=3.0, sleeper="auto")
    first, second = _run(tmp_path, "a", auto), _run(tmp_path, "b", auto)
    assert deterministic_view(first) == deterministic_view(second)
    assert first["host"]["sleeper"] == "auto"
    fluid = _run(tmp_path, "c", replace(auto, sleeper=0.0))
    # The credited bursts ran at a full core where fluid sharing gave them 2 / (3 + jobs): less time stretched
    # a CPU second.
    def stretch(s):
        return s["host"]["stretch_seconds"] / s["host"]["cpu_seconds"]

    assert stretch(first) < stretch(fluid)


def test_the_measured_sleeper_credit_table_is_a_credit_by_competitors():
    from hermes.sim.host import SLEEPER_CREDIT_S

    ks = [k for k, _ in SLEEPER_CREDIT_S]
    assert ks == sorted(ks) and len(set(ks)) == len(ks) and len(ks) >= 5
    # A credit is CPU seconds of one burst: never negative, and below a slice's order (no burst is longer).
    assert all(0.0 <= c < 0.05 for _, c in SLEEPER_CREDIT_S)


def test_the_wakeup_table_interpolates_between_its_rows_and_holds_its_ends_outside_them():
    from hermes.sim.host import interpolate

    table = ((0.0, 0.0, 0.0), (2.0, 0.002, 0.001), (4.0, 0.010, 0.003))
    assert interpolate(table, 1.0, 1) == pytest.approx(0.001)
    assert interpolate(table, 3.0, 2) == pytest.approx(0.002)
    # Outside the measured loads, the nearest measurement (nothing was measured there).
    assert interpolate(table, 6.0, 1) == pytest.approx(0.010)
    assert interpolate(table, -1.0, 2) == 0.0


def test_a_woken_thread_waits_the_measured_latency_at_the_hosts_load_and_takes_no_cpu(monkeypatch):
    import hermes.sim.host as host_mod

    monkeypatch.setattr(host_mod, "WAKEUP_RTT_S", ((0.0, 0.0, 0.0), (4.0, 0.008, 0.004)))
    clock = VirtualClock(start=0.0)
    host = Host(HostSpec(background=2.0))

    async def main():
        # Background 2 and one job running: 3 others, so a round trip waits 6 ms, half of it 3 ms.
        job = asyncio.ensure_future(host.run(1.0))
        await asyncio.sleep(0)
        assert host.wakeup_seconds("rtt") == pytest.approx(0.006)
        t0 = clock.monotonic()
        await host.wake("rtt", 0.5)
        waited = clock.monotonic() - t0
        await job
        return waited

    waited = run_virtual(clock, main)
    assert waited == pytest.approx(0.003)
    assert host.wakeup_seconds_total == pytest.approx(0.003)
    # The wait took no CPU: the job alone got its share (2 cores, 1 + 2 background: 2/3), 1 s in 1.5 s.
    assert host.cpu_seconds == pytest.approx(1.0)
    # Switched off, nobody waits.
    assert Host(HostSpec(background=2.0, wakeups=0)).wakeup_seconds("hop") == 0.0
    with pytest.raises(HostError, match="wakeups"):
        HostSpec(wakeups=0.5)


def test_under_the_host_every_round_trip_waits_for_its_wakeups_and_each_fold_for_its_thread_hop(tmp_path, monkeypatch):
    import hermes.sim.host as host_mod

    monkeypatch.setattr(host_mod, "WAKEUP_RTT_S", ((0.0, 0.004, 0.002), (10.0, 0.004, 0.002)))
    spec = HostSpec(thread_flops=2e8, background=1.0)
    woken = _run(tmp_path, "w", spec)
    still = _run(tmp_path, "s", replace(spec, wakeups=0))
    assert still["host"]["wakeup_seconds"] == 0.0
    # 4 ms a request/reply (2 on each side) and 2 ms a fold, whatever the load in this table.
    requests = sum(v for k, v in woken["messages_by_type"].items() if k not in ("register", "heartbeat", "leave"))
    expected = 0.004 * requests + 0.002 * woken["model_updates"]
    assert woken["host"]["wakeup_seconds"] == pytest.approx(expected, rel=0.05)
    # Waiting between messages, each device pushes less often in the same virtual time.
    def per_second(summary):
        return summary["model_updates"] / summary["virtual_seconds"]

    assert per_second(woken) < per_second(still)


def test_a_slowed_agent_sleeps_after_its_training_but_not_after_its_gates_validation(tmp_path):
    # client/trainer.py: _emulate_slowdown follows each training step; LocalTrainer.evaluate (the gate's
    # validation pass) has none, so on the testbed a slowed agent validates at the thread's rate.
    config = build_config("asp", dataset="digits", model="mlp", seed=0, max_seconds=1)
    sim = Simulation(config, _devices(), out=tmp_path / "v", transfer=transfer_seconds, cost=CalibratedCost(),
                     population="test", host=HostSpec(thread_flops=2e8))
    slowed = sim.devices[3]  # 2e8 / 8 FLOP/s: 1 s of its work is 1/8 s of CPU

    async def main():
        return await slowed.busy(1.0, 4), await slowed.busy(1.0, 1, slowed=False)

    trained, validated = run_virtual(sim.clock, main)
    assert trained == pytest.approx(1.0)
    assert validated == pytest.approx(0.125)


def test_with_sleeper_a_slowed_agents_steps_and_any_agents_first_step_after_a_wait_run_at_a_core_of_their_own(tmp_path):
    # One core and one other runnable process: a plain job runs at half a core. sleeper 0.5 s covers every step.
    config = build_config("asp", dataset="digits", model="mlp", seed=0, max_seconds=1)
    sim = Simulation(config, _devices(), out=tmp_path / "s", transfer=transfer_seconds, cost=CalibratedCost(),
                     population="test", host=HostSpec(cores=1, background=1, thread_flops=2e8, sleeper=0.5))
    fast, slowed = sim.devices[0], sim.devices[3]

    async def main():
        return (await fast.busy(0.4, 2), await fast.busy(0.4, 2, after_wait=False),
                await slowed.busy(1.0, 4), await slowed.busy(1.0, 1, slowed=False, after_wait=False))

    after_wait, busy_on, slowed_steps, validation = run_virtual(sim.clock, main)
    # The unslowed agent: its first step (0.2 s of CPU) at a full core after the reply it waited on, the second at
    # half a core (0.4 s); without a wait before it, both at half a core.
    assert after_wait == pytest.approx(0.6)
    assert busy_on == pytest.approx(0.8)
    # The slowed agent (1/8 of the thread): each of its 4 steps follows a sleep, 1/32 s of CPU at a full core, then
    # 7/32 s asleep: 1 s, as alone; its validation, not after a sleep, at half a core: 2 x 1/8 s.
    assert slowed_steps == pytest.approx(1.0)
    assert validation == pytest.approx(0.25)


def test_a_cycle_in_larger_batches_is_cheaper_per_sample_as_measured():
    host = Host(HostSpec())
    # The FLOPs model is right at the batch THREAD_FLOPS was measured at: 128 samples in 4 steps of 32.
    assert host.cycle_factor(128, 4) == pytest.approx(1.0)
    # The measurement (23:17 UTC): 256 samples in batches of 64 took 15.01 ms against 24.48 ms in batches of 32.
    assert host.cycle_factor(64, 1) == pytest.approx(15.01 / 24.48)
    assert host.cycle_factor(256, 16) == pytest.approx(36.86 / 24.48)
    # Between measured batches, linear; a partial last step counts as a smaller batch.
    assert 15.01 / 24.48 < host.cycle_factor(96, 2) < 1.0
    assert Host(HostSpec(batch_cost=0)).cycle_factor(64, 1) == 1.0
    with pytest.raises(HostError, match="batch_cost"):
        HostSpec(batch_cost=0.5)
