"""The registry's part of a checkpoint: identities and the server's own counts, never secrets."""

from __future__ import annotations

import json

from hermes.server.registry import SERVER_COUNTERS, Registry


def _cycle(dss: int, seconds: float) -> dict:
    return {"dss": dss, "batch_size": 32, "compute_seconds": seconds, "z": 0.5, "pushed": True, "decision": "gate"}


def test_counts_and_logs_survive_a_checkpoint_round_trip():
    reg = Registry(max_workers=8)
    rec, _ = reg.register("edge-1")
    rec.pushes, rec.applied, rec.rejected, rec.pulls, rec.messages = 9, 7, 2, 11, 30
    rec.server_bytes_in, rec.server_bytes_out = 1000, 2000
    rec.record_cycle(1.5, _cycle(128, 0.25))
    rec.record_cycle(2.5, _cycle(96, 0.20))
    rec.workload_history.append((2.0, 96, 24))
    rec.samples = 224  # reported by the agent: comes back with its next report, not from the checkpoint

    saved = json.loads(json.dumps(reg.identities()))
    assert rec.token not in json.dumps(saved)

    fresh = Registry(max_workers=8)
    fresh.restore(saved)
    (back,) = fresh.all()
    assert (back.id, back.name, back.state) == (rec.id, "edge-1", "lost")
    assert {k: getattr(back, k) for k in SERVER_COUNTERS} == {k: getattr(rec, k) for k in SERVER_COUNTERS}
    assert back.cycles == 2 and back.gate_pushes == 2
    assert back.cycle_log == rec.cycle_log and back.workload_history == rec.workload_history
    assert back.throughput() == rec.throughput()
    assert back.samples == 0 and back.token != rec.token

    # Registering again under the name keeps the id and the counts.
    again, rejoined = fresh.register("edge-1")
    assert rejoined and again.id == rec.id and again.pushes == 9 and again.state == "active"


def test_checkpoints_of_older_servers_hold_ids_and_names_only():
    fresh = Registry(max_workers=8)
    fresh.restore([{"id": "w0001", "name": "old", "joined_at": 1.0}])
    (back,) = fresh.all()
    assert (back.id, back.pushes, back.cycle_log, back.workload_history) == ("w0001", 0, [], [])
