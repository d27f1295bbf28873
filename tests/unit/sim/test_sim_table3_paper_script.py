"""benchmarks/sim_table3_paper.py and sim_calibration_events.py: API calls one per purpose; a stopped run's row."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sim_calibration_events as ce  # noqa: E402
import sim_table3_paper as t3  # noqa: E402


def _summary(by_type, carried, samples=2500):
    return {"reached_target": True, "seconds_to_target": 10.0, "virtual_seconds": 11.0, "wall_seconds": 5.0,
            "model_updates": 3, "messages_total": sum(by_type.values()), "messages_by_type": by_type,
            "carried_by_type": carried, "final_accuracy": 0.97,
            "workers": [{"cycles": 2, "wi": 1.0, "samples": samples}]}


def test_api_calls_are_one_per_purpose_without_heartbeats_and_with_what_another_request_carried():
    # A combining preset: 4 work requests whose replies brought the shards, 4 pushes whose replies brought the
    # model, and 9 heartbeats: 8 requests sent (17 with the heartbeats), 16 purposes.
    m = t3.metrics(_summary({"request_work": 4, "push_update": 4, "heartbeat": 9},
                            {"fetch_shard": 4, "pull_model": 4}))
    assert (m["messages"], m["sent"], m["calls"]) == (17, 8, 16)
    # One request per purpose (hermes-paper): what it sends is what it calls.
    m = t3.metrics(_summary({"request_work": 4, "fetch_shard": 4, "pull_model": 4, "push_update": 4}, {}))
    assert m["sent"] == m["calls"] == 16


def test_a_run_the_wall_limit_stopped_is_read_from_its_events_and_says_so(tmp_path, capsys):
    for label, summary in (("bsp", _summary({"request_work": 4, "push_update": 4}, {"pull_model": 4})),):
        (tmp_path / label).mkdir()
        (tmp_path / label / "summary.json").write_text(json.dumps(summary))
    (tmp_path / "asp").mkdir()
    lines = [{"event": "evaluation", "accuracy": 0.3, "elapsed": 20.0}, {"event": "cycle"}, {"event": "cycle"},
             {"event": "update_applied"}, {"event": "evaluation", "accuracy": 0.1, "elapsed": 40.0}]
    (tmp_path / "asp" / "events.jsonl").write_text("\n".join(json.dumps(e) for e in lines) + '\n{"event": "cy')
    assert t3.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    asp = next(line for line in out.splitlines() if line.startswith("| ASP"))
    assert "no (wall limit at 40 virtual s)" in asp and "missed (< 0.25×)" in asp
    bsp = next(line for line in out.splitlines() if line.startswith("| BSP"))
    assert "| 12 | 1.00 |" in bsp  # 8 sent + 4 carried, its own ratio


def test_the_events_summary_gives_each_workers_mbs_shares_and_first_resizes(tmp_path):
    events = [{"event": "run_start", "ts": 100.0},
              {"event": "join", "worker": "w1", "slowdown": 8.0}, {"event": "join", "worker": "w2", "slowdown": 1.0},
              *({"event": "cycle", "worker": "w1", "dss": 64, "batch_size": b, "compute_seconds": 0.05,
                 "decision": "zscore"} for b in (32, 64, 64, 64)),
              {"event": "cycle", "worker": "w2", "dss": 128, "batch_size": 32, "compute_seconds": 0.04,
               "decision": "above_threshold"},
              {"event": "resize", "worker": "w1", "kind": "slow", "dss": 64, "batch_size": 64,
               "predicted_seconds": 0.03, "target_seconds": 0.04},
              {"event": "update_applied"}, {"event": "target_reached", "ts": 130.0}]
    (tmp_path / "events.jsonl").write_text("\n".join(json.dumps(e) for e in events))
    lines = ce.describe(tmp_path, first=2)
    assert "updates 1; target reached: 30.0 s after run_start" in lines
    rows = [line for line in lines if line.startswith("| w") and not line.startswith("| worker")]
    assert rows[0].startswith("| w2 | 1.0 | 1 | 32: 100%")  # the unslowed agent first
    assert "| w1 | 8.0 | 4 | 32: 25%, 64: 75% |" in rows[1] and "slow 64/64 (30 vs 40 ms)" in rows[1]
