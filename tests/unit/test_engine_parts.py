"""The engine's parts on their own: each built with its collaborators, each saving its own state.

Issue 26: no part takes the whole engine; the run clock is one part whose
``started_at`` a resume writes once; a checkpoint is the parts' state dicts
side by side, with the keys checkpoint.json has always had, so a checkpoint
of an older server still loads.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.task import Task
from hermes.common.wire import MsgType
from hermes.server.checkpoint import Checkpointer
from hermes.server.engine.counters import Counters
from hermes.server.engine.goals import Goals
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.start_gate import StartGate
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry
from tests.unit.test_engine_inprocess import _Agent, _engine, _run

ENGINE_DIR = Path(__file__).resolve().parents[2] / "server" / "engine"

# Engine.state_dict() of the server before issue 26 (a worker "a" given one assignment, one push
# folded, 3 s of training), "config" left out: the keys and shapes checkpoint.json holds.
OLD_LAYOUT = json.loads("""
{"allocator": {"format": 1, "params": {}, "policy": "uniform"}, "best_evaluation": null, "carried_counts": {},
 "downtime_seconds": 1.5, "elapsed_seconds": 3.0, "evaluations": [], "local": {"assigned": 0, "sizes": {}},
 "message_counts": {"push_update": 1, "request_work": 1}, "model": {"name": "Sequential", "numel": 35587},
 "outstanding": {"w0001": [[2, 4, 3, 6, 5, 0, 1, 7]]},
 "queue": {"epoch": 0, "next": 8, "num_shards": 8, "requeued": [], "seed": 0}, "target_reached": null,
 "workers": [{"counters": {"applied": 1, "cycles": 0, "gate_pushes": 0, "gate_skips": 0, "in_flight_cycles": 0,
   "messages": 2, "pulls": 0, "pushes": 1, "rejected": 0, "server_bytes_in": 142800, "server_bytes_out": 508},
   "cycle_log": [], "id": "w0001", "joined_at": 1700000000.0, "name": "a", "workload_history": [[0.0, 128, 32]]}]}
""")


def _telemetry(clock: ManualClock) -> Telemetry:
    return Telemetry(ServerMetrics(), EventLog(None, clock=clock))


def test_no_engine_part_imports_the_engine():
    for path in sorted(ENGINE_DIR.glob("*.py")):
        if path.name in ("core.py", "__init__.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {a.name for a in node.names}
                assert node.module != "hermes.server.engine.core", path.name
                assert not (node.module == "hermes.server.engine" and "Engine" in names), path.name


def test_the_run_clock_counts_training_seconds_on_the_injected_clock():
    clock = ManualClock()
    run = RunClock(clock)
    clock.advance(2.5)
    assert (run.seconds(), run.elapsed()) == (2.5, 2.5)
    assert run.state_dict() == {"elapsed_seconds": 2.5, "downtime_seconds": 0.0}


def test_a_resume_writes_started_at_once_from_the_last_moment_alive():
    clock = ManualClock()
    # Saved at 10 s of training with 1 s of earlier downtime; the journal saw the old server alive at
    # 12 s of training, 4 s of wall time before now.
    state = {"elapsed_seconds": 10.0, "downtime_seconds": 1.0}
    run = RunClock(clock)
    down = run.load_state_dict(state, alive=(12.0, clock.time() - 4.0))
    assert down == 4.0
    assert run.started_at == clock.time() - 12.0 and run.downtime_seconds == 5.0
    # Without a journal's stamp the run goes on from the checkpoint's seconds, no downtime added.
    plain = RunClock(clock)
    assert plain.load_state_dict(state) == 0.0
    assert (plain.seconds(), plain.downtime_seconds) == (10.0, 1.0)


def test_the_start_gate_is_built_with_the_registry_alone():
    clock = ManualClock()
    registry = Registry(8, clock=clock)
    gate = StartGate(2, 60.0, registry=registry, telemetry=_telemetry(clock))
    registry.register("a")
    gate.on_join()
    assert not gate.is_open
    registry.register("b")
    gate.on_join()
    assert gate.is_open and gate.reason == "min_workers"
    resumed = StartGate(3, 60.0, registry=registry, telemetry=_telemetry(clock))
    resumed.start(None, resumed=True)
    assert resumed.reason == "resumed"


def test_goals_return_the_stop_reason_and_record_the_budget():
    clock = ManualClock()
    config = build_config("asp", model="mlp", max_updates=3, max_seconds=30.0)
    goals = Goals(config, Task(model=lambda: None, name="toy"), RunClock(clock), _telemetry(clock))
    assert goals.check_budgets(2, 0.0) is None and goals.outcome(stopping=False) == "running"
    assert goals.check_budgets(3, 0.0) == "max_updates=3 reached at version 3"
    assert goals.budget_reached == "max_updates" and goals.outcome(stopping=True) == "budget_reached"
    assert goals.state_dict() == {"target_reached": None}


def test_counters_save_what_workers_asked_for():
    counters = Counters()
    counters.count_message("push_update")
    counters.count_carried("pull_model", 2)
    counters.served("train", 100)
    restored = Counters()
    restored.load_state_dict(json.loads(json.dumps(counters.state_dict())))
    assert (restored.messages, restored.carried) == ({"push_update": 1}, {"pull_model": 2})
    assert restored.shard_bytes == {"train": 0, "validation": 0}  # this process's sends only


def test_the_checkpoint_is_the_parts_state_dicts_with_the_old_keys():
    clock = ManualClock()
    engine = _engine(clock)
    state = engine.state_dict()
    assert set(state) == set(OLD_LAYOUT) | {"config"}
    parts = [engine.membership, engine.local, engine.evaluator, engine.goals, engine.counters, engine.run_clock]
    keys = [set(p.state_dict()) for p in parts]
    assert sum(len(k) for k in keys) == len(set().union(*keys))  # each key has one owner
    assert set().union(*keys) | {"config", "model"} == set(state)


def test_a_checkpoint_written_before_the_parts_owned_their_state_loads():
    clock = ManualClock()
    engine = _engine(clock)
    down = engine.load_state_dict({**OLD_LAYOUT, "config": engine.config.model_dump()})
    assert down == 0.0
    queue = engine.queue.state()
    # The shards outstanding at the checkpoint go back to the queue.
    assert queue["next"] == 8 and [shard for shard, _ in queue["requeued"]] == [2, 4, 3, 6, 5, 0, 1, 7]
    assert engine.registry.get("w0001").state == "lost" and engine.membership.awaiting_rejoin == {"w0001"}
    assert engine.message_counts == {"push_update": 1, "request_work": 1}
    status = engine.status()
    assert (status["elapsed_seconds"], status["downtime_seconds"]) == (3.0, 1.5)
    assert engine.state_dict()["elapsed_seconds"] == 3.0


def test_a_resume_from_the_journal_counts_the_gap_as_downtime(tmp_path):
    clock = ManualClock()
    engine = _engine(clock)
    ckpt = Checkpointer(engine, tmp_path, interval=3600.0, durable_acks=True)
    ckpt.open(resume=False)
    engine.attach_checkpoints(ckpt)
    agent = _Agent(engine, clock, "a")
    clock.advance(5.0)
    reply = _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=agent.delta(0.1)))
    assert reply.header.body["status"] == "applied"
    ckpt.close()
    clock.advance(20.0)  # the server is down

    fresh = _engine(clock)
    again = Checkpointer(fresh, tmp_path, interval=3600.0, durable_acks=True)
    again.open(resume=True)
    fresh.attach_checkpoints(again)
    again.close()
    status = fresh.status()
    assert status["resumed_from"] == {"checkpoint_version": 0, "replayed_updates": 1, "version": 1,
                                      "downtime_seconds": 20.0}
    assert (status["elapsed_seconds"], status["downtime_seconds"]) == (5.0, 20.0)
    assert fresh.run_clock.started_at == clock.time() - 5.0



def _ev(version: int, accuracy: float) -> Evaluation:
    return Evaluation(version=version, loss=1.0 - accuracy, accuracy=accuracy, samples=10, seconds=0.0, at=0.0,
                      metrics={"accuracy": accuracy})


def test_goals_stop_early_after_patience_evaluations_without_improvement():
    clock = ManualClock()
    config = build_config("asp", model="mlp", early_stop={"patience": 2, "min_delta": 0.01})
    goals = Goals(config, Task(model=lambda: None, name="toy"), RunClock(clock), _telemetry(clock))
    assert goals.check_early_stop(_ev(1, 0.5)) is None
    assert goals.check_early_stop(_ev(2, 0.6)) is None  # better: the count starts again
    assert goals.check_early_stop(_ev(3, 0.605)) is None  # within min_delta: not an improvement (1)
    assert goals.outcome(stopping=False) == "running"
    reason = goals.check_early_stop(_ev(4, 0.55))  # 2 in a row
    assert reason == "early stop: accuracy did not improve on 0.6 (version 2) in 2 evaluations"
    assert goals.outcome(stopping=True) == "early_stopped"
    assert goals.early_stopped == {"metric": "accuracy", "best": 0.6, "best_version": 2, "patience": 2, "version": 4}
    resumed = Goals(config, Task(model=lambda: None, name="toy"), RunClock(clock), _telemetry(clock))
    resumed.load_state_dict(json.loads(json.dumps(goals.state_dict())))
    assert (resumed.best_score, resumed.best_version, resumed.stale_evaluations) == (0.6, 2, 2)


def test_without_patience_goals_never_stop_early():
    clock = ManualClock()
    goals = Goals(build_config("asp", model="mlp"), Task(model=lambda: None, name="toy"), RunClock(clock),
                  _telemetry(clock))
    assert all(goals.check_early_stop(_ev(v, 0.5)) is None for v in range(1, 20))
    assert "early_stop" not in goals.state_dict()
