"""The simulator at scale's features: the fastest device alone (``alone``), the concurrency bound on devices."""

from __future__ import annotations

import dataclasses

from hermes.sim.devices import ALWAYS_ON, IntervalAvailability
from hermes.sim.reference import fastest_alone
from hermes.sim.run import deterministic_view
from tests.unit.sim.test_sim_core import _run, hl8


def test_alone_keeps_the_populations_fastest_device_always_online():
    profiles = [dataclasses.replace(p, availability=IntervalAvailability([(0.0, 1.0)])) for p in hl8(8)]
    [best] = fastest_alone(profiles)
    assert best.device_id == "hl8-0" and best.flops == max(p.flops for p in profiles)
    assert best.availability is ALWAYS_ON


def test_a_run_alone_trains_the_fastest_device_only_and_says_so(tmp_path):
    slow_first = list(reversed(hl8(4)))
    sim, summary = _run(tmp_path, "alone", profiles=slow_first, preset="asp", alone=True)
    assert [d.name for d in sim.devices] == ["hl8-0"]
    assert summary["alone"] is True and summary["devices"] == 1 and len(summary["workers"]) == 1
    assert summary["workers"][0]["device"]["cycles"] > 0
    _, together = _run(tmp_path, "together", profiles=slow_first, preset="asp")
    assert together["alone"] is False and together["devices"] == 4


def test_a_concurrency_bound_keeps_the_others_idle_and_rotates_every_device_through(tmp_path):
    # Eight devices, two slots: every device trains (the slot passes on at each push), never more than two at once.
    sim, summary = _run(tmp_path, "c2", profiles=hl8(8), preset="fedbuff",
                        config={"concurrency.limit": 2, "fedbuff.buffer_size": 2, "target_accuracy": 0.8})
    adm = sim.engine.admission
    assert summary["reached_target"], summary["outcome"]
    assert adm.limit == 2 and adm.peak == 2 and adm.waited > 0 and adm.granted > 8
    assert all(w["device"]["cycles"] > 0 for w in summary["workers"])
    _, again = _run(tmp_path, "c2-again", profiles=hl8(8), preset="fedbuff",
                    config={"concurrency.limit": 2, "fedbuff.buffer_size": 2, "target_accuracy": 0.8})
    assert deterministic_view(summary) == deterministic_view(again)


def _staleness(out) -> list[int]:
    import json

    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    return [t for e in events if e["event"] == "update_applied" for t in e["staleness"]]


def test_a_device_waiting_for_its_first_slot_heartbeats_and_trains_from_the_model_of_its_turn(tmp_path):
    # One slot, K = 1: every device's pull waits for the slot (concurrency.hold_pull), so every update is
    # folded into the model it was trained from; the waits outlast the heartbeat timeout, and nobody is lost
    # (the device beats from its registration on, as the agent's Session does).
    kw = {"profiles": hl8(8, flops=2e9), "preset": "fedbuff", "heartbeat_interval": 0.01, "heartbeat_timeout": 0.04}
    config = {"concurrency.limit": 1, "fedbuff.buffer_size": 1, "max_seconds": 3.0, "target_accuracy": 0.99}
    sim, summary = _run(tmp_path, "held", config=config, **kw)
    assert sim.driver.monitor.lost == 0 and sim.engine.admission.waited > 8
    assert all(w["device"]["registrations"] == 1 and w["device"]["cycles"] > 0 for w in summary["workers"])
    assert max(w["device"]["wait_seconds"] for w in summary["workers"]) > 0.04
    assert set(_staleness(tmp_path / "held")) == {0}
    memory = summary["sim"]["device_memory"]
    assert memory["waiting"]["devices"] + memory["training"]["devices"] == 8
    # Answered at once instead, a device trains its first turn from the model of its registration.
    _, _ = _run(tmp_path, "answered", config={**config, "concurrency.hold_pull": False}, **kw)
    assert max(_staleness(tmp_path / "answered")) > 0


def test_a_device_that_goes_offline_lets_go_of_its_model_version(tmp_path):
    # Back online it registers again and pulls the global model: meanwhile it needs no copy of the old one.
    profiles = hl8(4, flops=2e9)
    profiles[3] = dataclasses.replace(profiles[3], availability=IntervalAvailability([(0.0, 0.5), (100.0, 200.0)]))
    sim, summary = _run(tmp_path, "off", profiles=profiles, preset="fedbuff",
                        config={"max_seconds": 2.0, "target_accuracy": 0.99})
    gone = sim.devices[3]
    assert summary["workers"][3]["device"]["offline"] == 1 and summary["workers"][3]["device"]["cycles"] > 0
    assert gone.version is None and gone.local is None
    assert all(v in sim.versions.refs for v in (d.version for d in sim.devices[:3]))


def test_hermes_turns_last_until_the_gate_pushes_under_a_concurrency_bound(tmp_path):
    # Eight gated devices, two slots. Preset hermes (concurrency.turn_ends push): a gate-skipped cycle keeps the
    # slot, so every turn ends with a push, and more of the turns bring one than when any cycle ends the turn. (Not
    # more of the cycles: those trained while a push travels are not judged either way, and they are cheaper, no
    # validation pass, since 2026-11-28.)
    config = {"concurrency.limit": 2, "max_seconds": 2.0, "target_accuracy": 0.99}
    runs = {}
    for ends in ("push", "cycle"):
        sim, summary = _run(tmp_path, ends, profiles=hl8(8, flops=2e9), preset="hermes",
                            config={**config, "concurrency.turn_ends": ends})
        pushes = sum(w["device"]["pushes"] for w in summary["workers"])
        runs[ends] = (sim.engine.admission.granted, pushes)
    (granted, pushes), (granted_c, pushes_c) = runs["push"], runs["cycle"]
    assert pushes > 0 and pushes_c > 0
    # A turn is granted at a registration's pull or after a push (and a device lost or back: none here).
    assert granted <= pushes + 8, runs
    assert granted_c > pushes_c + 8, runs
    assert pushes / granted > pushes_c / granted_c, runs


def test_admit_fastest_gives_the_slots_to_the_fast_devices(tmp_path):
    # Eight HL8 devices (two each of 1x, 1/2, 1/4, 1/8 the speed), two slots. FIFO rotates every device through;
    # concurrency.admit fastest (Oort's system utility) tries each once within the exploration share, then keeps
    # the slots with the fastest: the fast devices train most of the cycles.
    config = {"concurrency.limit": 2, "fedbuff.buffer_size": 2, "max_seconds": 20.0, "target_accuracy": 0.99}
    share = {}
    for admit in ("fifo", "fastest"):
        sim, summary = _run(tmp_path, admit, profiles=hl8(8), preset="fedbuff",
                            config={**config, "concurrency.admit": admit})
        fastest = max(p.flops for p in hl8(8))
        fast = sum(w["device"]["cycles"] for w in summary["workers"] if w["flops"] == fastest)
        share[admit] = fast / sum(w["device"]["cycles"] for w in summary["workers"])
        if admit == "fastest":
            assert sim.engine.admission.fastest and sim.engine.admission.speeds
    assert share["fastest"] > share["fifo"] + 0.2, share
