"""The simulator's core: the virtual loop, and small runs of the real engine on it (digits, 4 devices)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math

import pytest

from hermes.common.config import build_config
from hermes.sim.devices import ALWAYS_ON, DeviceProfile, IntervalAvailability
from hermes.sim.events import Stalled, VirtualClock, run_virtual
from hermes.sim.links import ServerLink, transfer_seconds
from hermes.sim.run import SimError, Simulation, deterministic_view


def hl8(n: int = 4, flops: float = 2e8) -> list[DeviceProfile]:
    """OmniLearn HL8's shape at a small nominal speed: one device 8x slower than the fastest, the others between."""
    slow = [1.0, 2.0, 4.0, 8.0]
    return [DeviceProfile(f"hl8-{i}", "hl8", flops / slow[i % 4], memory_mb=4096.0, up_mbps=1000.0,
                          down_mbps=1000.0, rtt_s=0.0002, availability=ALWAYS_ON) for i in range(n)]


def _config(preset: str = "hermes", **kw):
    kw = {"seed": 0, "target_accuracy": 0.85, "max_seconds": 300, **kw}
    return build_config(preset, dataset="digits", model="mlp", **kw)


def _run(tmp_path, name: str, profiles=None, preset: str = "hermes", **kw):
    sim = Simulation(_config(preset, **kw.pop("config", {})), profiles or hl8(4), out=tmp_path / name,
                     transfer=transfer_seconds, population="hl8", **kw)
    return sim, sim.run()


def test_the_virtual_loop_jumps_to_each_timer_and_runs_thread_work_inline():
    clock = VirtualClock(start=0.0)

    async def main():
        async def at(d):
            await asyncio.sleep(d)
            return clock.monotonic()

        times = await asyncio.gather(*[at(3600.0 * i) for i in range(4)])
        return times, await asyncio.to_thread(lambda: 42)

    assert run_virtual(clock, main) == ([0.0, 3600.0, 7200.0, 10800.0], 42)


def test_a_loop_where_everyone_waits_forever_says_so_instead_of_hanging():
    async def main():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Stalled):
        run_virtual(VirtualClock(), main)


def test_same_seed_same_summary_and_it_has_the_testbed_fields(tmp_path):
    _, first = _run(tmp_path, "a")
    _, second = _run(tmp_path, "b")
    assert deterministic_view(first) == deterministic_view(second)
    for key in ("reached_target", "seconds_to_target", "messages_total", "final_accuracy", "final_metrics",
                "workers", "wall_seconds"):
        assert key in first
    assert first["reached_target"] and first["seconds_to_target"] is not None
    # Virtual seconds: a few seconds of simulated training, whatever the wall time was.
    assert first["seconds_to_target"] < 60.0 and first["engine"] == "sim"
    assert len(first["workers"]) == 4 and all(w["device"]["cycles"] > 0 for w in first["workers"])
    assert 1 <= first["sim"]["peak_versions_held"] <= first["model_updates"] + 1
    events = [json.loads(line) for line in (tmp_path / "a" / "events.jsonl").read_text().splitlines()]
    assert events[0]["event"] == "run_start" and any(e["event"] == "evaluation" for e in events)


def test_another_seed_gives_another_run(tmp_path):
    _, first = _run(tmp_path, "a", preset="asp")
    _, other = _run(tmp_path, "b", preset="asp", config={"seed": 1})
    assert deterministic_view(first) != deterministic_view(other)


def test_an_earlier_runs_results_are_never_overwritten(tmp_path):
    _run(tmp_path, "a", preset="asp")
    with pytest.raises(SimError, match="earlier run"):
        _run(tmp_path, "a", preset="asp")


def test_a_device_that_goes_offline_loses_its_work_and_rejoins(tmp_path):
    profiles = hl8(4)
    # The fastest device leaves for 12 s after 0.5 s: longer than the heartbeat timeout (10 s).
    # Offline from 0.5 s to 12.5 s, online before and after.
    profiles[0] = dataclasses.replace(
        profiles[0], availability=IntervalAvailability(((0.0, 0.5), (12.5, math.inf))))
    _, s = _run(tmp_path, "churn", profiles, preset="asp", config={"target_accuracy": 0.97})
    churned = s["workers"][0]["device"]
    assert (churned["offline"], churned["registrations"]) == (1, 2), s["seconds_to_target"]
    lost = [e for e in map(json.loads, (tmp_path / "churn" / "events.jsonl").read_text().splitlines())
            if e["event"] == "leave" and e["state"] == "lost"]
    assert lost, "the server never noticed the silent device"


def test_a_slow_shared_server_link_delays_the_run(tmp_path):
    _, fast = _run(tmp_path, "fast", preset="asp")
    _, slow = _run(tmp_path, "slow", preset="asp", server_link=ServerLink(2.0, 2.0))
    assert slow["seconds_to_target"] > 2 * fast["seconds_to_target"]


def test_equal_time_events_run_by_device_then_by_the_order_they_were_scheduled():
    from hermes.sim.events import current_device

    clock = VirtualClock(start=0.0)
    ran: list[tuple[int, str]] = []

    async def device(index: int, tag: str) -> None:
        current_device.set(index)
        await asyncio.sleep(1.0)
        ran.append((index, tag))

    async def server() -> None:
        await asyncio.sleep(1.0)
        ran.append((-1, "server"))

    async def main():
        # Scheduled in the order 3, 1, 2, 1, server: run at t = 1 as server, 1, 1, 2, 3.
        tasks = [asyncio.ensure_future(device(i, t)) for i, t in ((3, "a"), (1, "b"), (2, "c"), (1, "d"))]
        await asyncio.sleep(0)  # every device has set its timer
        tasks.append(asyncio.ensure_future(server()))
        await asyncio.gather(*tasks)

    run_virtual(clock, main)
    assert ran == [(-1, "server"), (1, "b"), (1, "d"), (2, "c"), (3, "a")]


def test_devices_train_in_the_precision_the_run_forces_and_in_fp32_for_auto(tmp_path):
    from hermes.sim.executor import sim_precision

    assert sim_precision(_config()) == "fp32"  # auto: a simulated device has no hardware to time
    assert sim_precision(_config(precision="bf16")) == "bf16"
    sim32, fp32 = _run(tmp_path, "fp32", preset="asp", config={"max_updates": 40, "target_accuracy": None})
    sim16, bf16 = _run(tmp_path, "bf16", preset="asp", config={"max_updates": 40, "target_accuracy": None,
                                                                 "precision": "bf16"})
    assert sim32.trainer.precision == "fp32" and sim16.trainer.precision == "bf16"
    assert {w["precision"] for w in fp32["workers"]} == {"fp32"}
    assert {w["precision"] for w in bf16["workers"]} == {"bf16"}
    # bf16 autocast changes the numerics the devices train with (the same virtual schedule, other weights).
    assert fp32["final_loss"] != bf16["final_loss"]
    # and stays deterministic: the same seed in bf16 gives the same run.
    _, again = _run(tmp_path, "bf16-again", preset="asp", config={"max_updates": 40, "target_accuracy": None,
                                                                    "precision": "bf16"})
    assert deterministic_view(again) == deterministic_view(bf16)


@pytest.mark.parametrize("share", [0.0, 1.0, 0.5])
def test_with_a_backlog_share_a_devices_messages_wait_for_its_earlier_ones_and_no_other_devices(tmp_path, share):
    sim = Simulation(_config(), hl8(2), out=tmp_path / "q", transfer=transfer_seconds, population="hl8",
                     backlog_share=share)
    a, b = sim.devices
    done: dict[str, float] = {}

    async def main():
        async def carry(name, dev, nbytes, direction):
            await sim.driver.carry(dev, nbytes, direction)
            done[name] = sim.clock.monotonic()

        # 125,000 bytes are 1 ms at the profile's 1,000 Mbit/s; 125 bytes 1 us; half the 0.2 ms RTT each.
        await asyncio.gather(carry("push", a, 125_000, "up"), carry("request", a, 125, "up"),
                             carry("reply", a, 125, "down"), carry("other", b, 125, "up"))

    run_virtual(sim.clock, main)
    assert done["push"] == pytest.approx(0.0011)
    assert done["other"] == done["reply"] == pytest.approx(0.000101)  # another device, the other direction
    # The request waits for that share of the push's 1 ms still queued (all of it: both start at 0).
    assert done["request"] == pytest.approx(0.000101 + share * 0.001)


def test_a_task_left_pending_when_the_run_ends_is_cancelled_not_destroyed(caplog):
    clock = VirtualClock(start=0.0)
    left: list[asyncio.Task] = []
    ended: list[str] = []

    async def abandoned():
        try:
            await asyncio.sleep(3600.0)
        except asyncio.CancelledError:
            ended.append("cancelled")
            raise

    async def main():
        left.append(asyncio.ensure_future(abandoned()))
        await asyncio.sleep(1.0)
        return "done"

    assert run_virtual(clock, main) == "done"
    assert ended == ["cancelled"] and left[0].cancelled()
    assert "destroyed but it is pending" not in caplog.text
