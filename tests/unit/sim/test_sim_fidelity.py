"""The simulated device does what the agent does: a diverged cycle is dropped and the global model taken
again, a device that keeps diverging gives up (exit 4); the measured server-cost mode times the engine."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import numpy as np

from hermes.common.config import build_config
from hermes.common.datasets import load_dataset
from hermes.common.task_registry import resolve_task
from hermes.sim.device import Offline
from hermes.sim.devices import ALWAYS_ON, DeviceProfile
from hermes.sim.links import transfer_seconds
from hermes.sim.run import Simulation
from hermes.sim.server_cost import MeasuredCost


def _devices(n: int = 3) -> list[DeviceProfile]:
    return [DeviceProfile(f"d-{i}", "test", 2e8, memory_mb=4096.0, up_mbps=1000.0, down_mbps=1000.0,
                          rtt_s=0.0002, availability=ALWAYS_ON) for i in range(n)]


def test_a_diverged_cycle_is_dropped_and_a_device_that_keeps_diverging_gives_up(tmp_path):
    cfg = build_config("asp", dataset="digits", model="mlp", seed=0, max_updates=60)
    train, _ = load_dataset("digits")
    parts = np.array_split(np.arange(len(train.y)), 3)

    def local_data(name: str):
        k = int(name.split("-")[1])
        x = train.x[parts[k]].copy()
        if k == 0:
            x[:] = np.nan  # every cycle diverges
        elif k == 1:
            x[0] = np.nan  # the cycle that draws this sample diverges, once per local epoch
        return x, train.y[parts[k]]

    task = dataclasses.replace(resolve_task("builtin", cfg), train_data=None, local_data=local_data)
    s = Simulation(cfg, _devices(), out=tmp_path / "nan", task=task, transfer=transfer_seconds).run()
    hopeless, flaky, clean = (w["device"] for w in s["workers"])
    # client/options.py max_nonfinite_cycles (3): dropped twice, pulling again each time, then it gives up.
    assert (hopeless["nonfinite_cycles"], hopeless["pushes"], hopeless["last_loss"]) == (3, 0, None)
    assert hopeless["pulls"] == 1 + 2 and s["workers"][0]["exit_code"] == 4
    assert 1 <= flaky["nonfinite_cycles"] < flaky["cycles"] and flaky["pushes"] > 0
    assert s["workers"][1]["exit_code"] == 0 and clean["nonfinite_cycles"] == 0
    # The server heard of each dropped cycle, and never got a non-finite update.
    assert s["model_updates"] == 60 and s["final_accuracy"] is not None
    events = [json.loads(line) for line in (tmp_path / "nan" / "events.jsonl").read_text().splitlines()]
    assert any(e["event"] == "leave" for e in events)


def test_the_measured_server_cost_is_the_engines_cpu_time(tmp_path):
    cfg = build_config("asp", dataset="digits", model="mlp", seed=0, max_updates=20)
    cost = MeasuredCost()
    sim = Simulation(cfg, _devices(), out=tmp_path / "m", transfer=transfer_seconds, cost=cost)
    s = sim.run()
    # Every engine operation was timed (none fell back to the calibrated model, evaluation aside).
    assert cost.measured > 0 and cost.fallbacks <= 1
    assert s["server_busy_seconds"] > 0 and s["model_updates"] == 20


def test_a_device_that_goes_offline_while_saying_goodbye_just_stops(tmp_path, monkeypatch):
    # 1,000 devices under hermes (2026-11-27): a device that gave up on non-finite losses went offline
    # during its last report, and the Offline it raised ended the whole simulation in a traceback.
    cfg = build_config("asp", dataset="digits", model="mlp", seed=0, max_updates=5)
    sim = Simulation(cfg, _devices(1), out=tmp_path / "bye", transfer=transfer_seconds)
    device = sim.devices[0]

    async def gone(*args: object, **kwargs: object) -> None:
        raise Offline

    monkeypatch.setattr(device, "request", gone)
    asyncio.run(device.goodbye())  # the agent exits either way; nothing escapes


def test_only_the_cycles_the_gate_judges_pay_for_its_validation_pass(tmp_path, monkeypatch):
    # hermes overlaps its pushes: a cycle that ends with a push in flight is reported in-flight, unjudged, and
    # (as the agent's PushPull._exchange) does not evaluate the validation split; on a thin link most cycles do.
    from hermes.sim.device import SimDevice

    validated: dict[str, list[float]] = {}
    real = SimDevice.validate

    async def validate(self):
        t0 = self.sim.driver.now()
        await real(self)
        validated.setdefault(self.worker_id, []).append(self.sim.driver.now() - t0)

    monkeypatch.setattr(SimDevice, "validate", validate)
    cfg = build_config("hermes", dataset="digits", model="mlp", seed=0, max_updates=40)
    slow = [dataclasses.replace(d, up_mbps=2.0, down_mbps=2.0, rtt_s=0.05) for d in _devices()]
    s = Simulation(cfg, slow, out=tmp_path / "gate", transfer=transfer_seconds).run()
    events = [json.loads(line) for line in (tmp_path / "gate" / "events.jsonl").read_text().splitlines()]
    cycles = [e for e in events if e["event"] == "cycle"]
    assert s["config"]["overlap_push"] and any(c["decision"] == "in-flight" for c in cycles)
    for w in s["workers"]:
        device, passes = w["device"], validated[w["id"]]
        in_flight = sum(c["worker"] == w["id"] and c["decision"] == "in-flight" for c in cycles)
        # Judged: each gate skip and each push (the last push's reply may not be in when the run stops).
        assert device["gate_skips"] + device["pushes"] <= len(passes) <= device["gate_skips"] + device["pushes"] + 1
        assert in_flight > 0 and len(passes) <= device["cycles"] - in_flight
        assert all(t > 0 for t in passes)
