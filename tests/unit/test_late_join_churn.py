"""The churn schedule, the availability model and the journal check of ``hermes-testbed --churn`` (docs/churn.md)."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from hermes.deploy.bench.suites import SuiteError, build_suite, builtin_suite
from hermes.deploy.testbed_chaos import ChurnDriver, ChurnEvent, check_journal, offline_fractions, parse_churn


def test_a_schedule_alternates_the_signals_of_leave_and_names_them_with_kill_and_term():
    events = parse_churn("2:leave@10,join@20,leave@30;1:term@5,join@6;3:leave@12", clients=3, horizon=100)
    assert [(e.at, e.agent, e.action, e.signal) for e in events] == [
        (5.0, 1, "leave", "SIGTERM"), (6.0, 1, "join", ""), (10.0, 2, "leave", "SIGKILL"),
        (12.0, 3, "leave", "SIGTERM"), (20.0, 2, "join", ""), (30.0, 2, "leave", "SIGKILL"),
    ]
    # Past the run's time limit nothing fires.
    assert parse_churn("1:kill@5,join@50", clients=1, horizon=10) == [ChurnEvent(5.0, 1, "leave", "SIGKILL")]


@pytest.mark.parametrize("spec,message", [
    ("5:leave@1", "agent 5 not in 1..3"),
    ("1:join@1", "leave and join in turn"),
    ("1:leave@1,leave@2", "leave and join in turn"),
    ("1:nap@3", "expected leave@T"),
    ("x:leave@1", "expected N:leave@T"),
    ("", "no churn events"),
    ("random:offline=1.5", "0 < offline < 1"),
    ("random:offline=0.2,mean_spell=0", "mean_spell > 0"),
    ("random:often=3", "expected offline=F"),
    ("random:seed=x", "seed must be a number"),
])
def test_a_bad_spec_is_one_clear_line(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_churn(spec, clients=3, horizon=100)


def test_the_random_model_keeps_each_agent_offline_about_the_fraction_asked():
    events = parse_churn("random:offline=0.2,mean_spell=5,seed=3", clients=4, horizon=20_000)
    assert events == sorted(events, key=lambda e: (e.at, e.agent))
    assert {e.signal for e in events if e.action == "leave"} == {"SIGKILL", "SIGTERM"}
    log = [{"action": e.action, "agent": f"worker-{e.agent}", "at": e.at} for e in events]
    fractions = offline_fractions(log, 4, 20_000)
    assert all(0.17 <= f <= 0.23 for f in fractions.values()), fractions
    # Each agent leaves and joins in turn, starting online.
    for agent in range(1, 5):
        actions = [e.action for e in events if e.agent == agent]
        assert actions[::2] == ["leave"] * len(actions[::2]) and set(actions[1::2]) <= {"join"}
    # A seed fixes the plan; adding an agent leaves the others' spells as they were.
    again = parse_churn("random:offline=0.2,mean_spell=5,seed=3", clients=5, horizon=20_000)
    assert [e for e in again if e.agent <= 4] == events


def test_the_driver_fires_what_is_due_in_order_and_logs_the_version():
    calls: list[tuple] = []
    driver = ChurnDriver(parse_churn("1:kill@1,join@3;2:term@2", clients=2, horizon=10),
                         stop=lambda agent, sig: calls.append(("stop", agent, sig)) or agent == 1,
                         start=lambda agent: calls.append(("start", agent)), version=lambda: 7)
    assert driver.tick(0.5) == []
    fired = driver.tick(2.5)
    assert [(e["action"], e["agent"], e["signal"], e["was_running"]) for e in fired] == [
        ("leave", "worker-1", "SIGKILL", True), ("leave", "worker-2", "SIGTERM", False)]
    driver.tick(3.0)
    assert calls == [("stop", 1, "SIGKILL"), ("stop", 2, "SIGTERM"), ("start", 1)]
    assert not driver.pending and all(e["version"] == 7 for e in driver.log)


def _journal(path: Path, versions: list[int], numel: int = 3) -> None:
    with open(path, "wb") as fh:
        for v in versions:
            head = json.dumps({"version": v, "op": "apply", "weights": [1.0],
                               "deltas": [{"dtype": "float32", "numel": numel}]}).encode()
            fh.write(struct.pack("<I", len(head)) + head + b"\0" * (4 * numel) + struct.pack("<I", 0))
        fh.write(b"\x07\0")  # a torn record: never acknowledged, not counted


def _run(tmp_path: Path, folds: list[list[str]], checkpoint: int, journaled: list[int]) -> Path:
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"event": "update_applied", "version": i + 1, "workers": w}) + "\n"
                              for i, w in enumerate(folds)) + "not json\n")
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    (ckpt / "checkpoint.json").write_text(json.dumps({"version": checkpoint}))
    _journal(ckpt / f"journal-{checkpoint}.log", journaled)
    return ckpt


def test_the_journal_check_passes_a_run_that_lost_nothing(tmp_path):
    ckpt = _run(tmp_path, [["a"], ["a", "b"], ["b"]], checkpoint=1, journaled=[2, 3])
    out = check_journal(tmp_path / "events.jsonl", ckpt, 3, [{"applied": 2}, {"applied": 2}])
    assert out["ok"], out
    assert (out["folds"], out["contributions"], out["checkpoint_version"], out["journal_records"]) == (3, 4, 1, 2)


@pytest.mark.parametrize("final,applied,journaled,problem", [
    (4, 4, [2, 3], "folds are not versions 1..4"),  # an acknowledged version without its fold
    (3, 3, [2, 3], "applied counts add up to 3"),
    (3, 4, [2], "checkpoint 1 + 1 journaled != final version 3"),  # an acknowledged fold missing from the journal
    (3, 4, [3, 2], "not versions 2.. in order"),
])
def test_the_journal_check_names_what_was_lost(tmp_path, final, applied, journaled, problem):
    ckpt = _run(tmp_path, [["a"], ["a", "b"], ["b"]], checkpoint=1, journaled=journaled)
    out = check_journal(tmp_path / "events.jsonl", ckpt, final, [{"applied": applied}])
    assert not out["ok"] and any(problem in p for p in out["problems"]), out


def test_a_suite_takes_a_churn_spec_and_refuses_a_bad_one():
    suite = builtin_suite("churn")
    assert suite.churn and suite.clients == 8 and suite.profiles == ("hl8",)
    assert len(suite.variants) == 16 and suite.variants[-1].label == "alone"  # 15 presets and the device alone
    with pytest.raises(SuiteError, match="churn"):
        build_suite({"name": "x", "presets": ["bsp"], "churn": "random:offline=2"})
    assert build_suite({"name": "x", "presets": ["bsp"]}).churn is None
