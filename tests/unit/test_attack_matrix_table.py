"""benchmarks/attack_matrix.py: the training time read from a run's events, and the table's ratios and rule."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import attack_matrix as am  # noqa: E402


def _events(path: Path, events: list[dict]) -> None:
    path.mkdir(parents=True)
    (path / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))


def test_training_seconds_run_from_the_first_honest_update_to_the_stop(tmp_path):
    _events(tmp_path / "server", [
        {"ts": 100.0, "event": "join", "worker": "w1", "name": "attacker"},
        {"ts": 101.0, "event": "update_applied", "workers": ["w1"]},  # the attacker's idle push: not training
        {"ts": 124.0, "event": "join", "worker": "w2", "name": "honest-0"},
        {"ts": 125.5, "event": "update_applied", "workers": ["w2"]},
        {"ts": 131.0, "event": "update_applied", "workers": ["w1", "w2"]},
        {"ts": 134.0, "event": "stop_requested"},
    ])
    assert am.training_seconds(tmp_path) == {"train_s": 8.5}


def test_training_seconds_are_left_out_for_two_servers_or_an_unfinished_run(tmp_path):
    _events(tmp_path / "first", [{"ts": 1.0, "event": "stop_requested"}])
    _events(tmp_path / "second", [{"ts": 1.0, "event": "stop_requested"}])
    assert am.training_seconds(tmp_path) == {}
    _events(tmp_path / "one" / "server", [{"ts": 1.0, "event": "join", "worker": "w2", "name": "honest-0"},
                                          {"ts": 2.0, "event": "update_applied", "workers": ["w2"]}])
    assert am.training_seconds(tmp_path / "one") == {}


def _row(k: float, seconds: float, train: float, held: bool = True) -> dict:
    return {"suite": "signflip", "preset": "asp", "k": k, "held": held, "seconds_to_target": seconds,
            "train_s": train, "why": "" if held else "not reached", "at": "2026-11-27T22:00:00Z",
            "load_before": [3.0], "load_after": [4.0]}


def test_table_takes_medians_against_k0_and_applies_the_rule_to_every_run():
    rows = [_row(0, s, t) for s, t in ((10, 4), (20, 5), (30, 6))]
    rows += [_row(3, s, t) for s, t in ((14, 6), (30, 8), (31, 9))]  # median 30: 1.5x, met at the bound
    rows += [_row(10, s, t) for s, t in ((10, 4), (31, 5))] + [_row(10, 0, 0, held=False)]
    cells = {c["k"]: c for c in am.table(rows)}
    assert cells[0]["median_s"] == 20 and cells[0]["meets_rule"]
    assert cells[3]["ratio"] == 1.5 and cells[3]["meets_rule"]
    assert cells[3]["train_median_s"] == 8 and cells[3]["train_ratio"] == 8 / 5
    assert cells[10]["held"] == 2 and cells[10]["runs"] == 3 and not cells[10]["meets_rule"]
    assert cells[10]["failures"] == ["not reached"]
