"""Federated evaluation's server part on its own: rounds, requests in assignments, the weighted aggregate."""

from __future__ import annotations

import pytest

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.messages import CycleReport, FederatedReport, WorkReply
from hermes.common.task import Task
from hermes.server.engine.federated_eval import FederatedEval, aggregate
from hermes.server.engine.goals import Goals
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics


def test_aggregate_weighs_each_device_by_its_samples() -> None:
    reports = {"a": {"samples": 1, "loss": 1.0, "metrics": {"accuracy": 1.0, "f1": 0.5}},
               "b": {"samples": 3, "loss": 2.0, "metrics": {"accuracy": 0.0}}}
    assert aggregate(reports) == {"federated_loss": 1.75, "federated_accuracy": 0.25}  # f1: not every device


def _part(every: int, active: list[str], target: str | None = None) -> tuple[FederatedEval, list[str], Telemetry]:
    clock = ManualClock()
    config = build_config("asp", model="mlp", federated_eval={"every": every}, target=target)
    telemetry = Telemetry(ServerMetrics(), EventLog(None, clock=clock))
    goals = Goals(config, Task(model=lambda: None, name="toy"), RunClock(clock), telemetry)
    stops: list[str] = []
    part = FederatedEval(config, telemetry=telemetry, goals=goals, active_ids=lambda: active, stop=stops.append)
    telemetry.subscribe(part.listener)
    return part, stops, telemetry


def _ev(version: int) -> Evaluation:
    return Evaluation(version=version, loss=1.0, accuracy=0.5, samples=1, seconds=0.0, at=0.0, metrics={})


def _work() -> WorkReply:
    return WorkReply(epoch=0, shards=[], batch_size=8, cycle_samples=8, lr=0.1)


def _cycle(telemetry: Telemetry, worker: str, report: FederatedReport) -> None:
    cycle = CycleReport(dss=8, batch_size=8, federated=report).fields()
    telemetry.emit("cycle", worker=worker, elapsed=0.0, **cycle)


def test_a_round_opens_every_n_evaluations_and_closes_when_every_worker_answered() -> None:
    active = ["w1", "w2"]
    part, stops, telemetry = _part(2, active, target="federated_accuracy=0.8")
    part.on_evaluation(_ev(1))
    assert part.stamp("w1", _work()).federated_round is None  # 1 of 2 evaluations: no round yet
    part.on_evaluation(_ev(2))
    assert part.stamp("w1", _work()).federated_round == 1
    _cycle(telemetry, "w1", FederatedReport(round=1, version=2, samples=10, loss=0.5, metrics={"accuracy": 0.9}))
    assert part.latest is None and part.stamp("w1", _work()).federated_round is None  # answered
    _cycle(telemetry, "w2", FederatedReport(round=1, version=3, samples=30, loss=1.0, metrics={"accuracy": 0.7}))
    assert part.latest is not None
    assert part.latest["metrics"] == pytest.approx({"federated_loss": 0.875, "federated_accuracy": 0.75})
    assert part.latest["versions"] == [2, 3] and part.latest["workers"] == ["w1", "w2"] and stops == []
    part.on_evaluation(_ev(3))
    part.on_evaluation(_ev(4))  # round 2; w2 leaves, w1's answer closes it and reaches the target
    active.remove("w2")
    telemetry.emit("leave", worker="w2", reason="done", state="left", requeued_shards=[])
    _cycle(telemetry, "w1", FederatedReport(round=2, version=4, samples=10, loss=0.1, metrics={"accuracy": 0.85}))
    assert part.latest["round"] == 2 and len(part.history) == 2
    assert stops == ["target federated_accuracy=0.8 reached at version 4"]


def test_a_stale_answer_is_ignored() -> None:
    part, _, telemetry = _part(1, ["w1"])
    part.on_evaluation(_ev(1))
    part.on_evaluation(_ev(2))  # round 2 replaces the unanswered round 1
    _cycle(telemetry, "w1", FederatedReport(round=1, version=1, samples=5, loss=1.0))
    assert part.latest is None


def test_a_worker_that_joined_after_the_opening_is_asked_and_waited_for() -> None:
    active = ["w1"]
    part, _, telemetry = _part(1, active)
    part.on_evaluation(_ev(1))
    active.append("w2")  # registered after the round opened
    assert part.stamp("w2", _work()).federated_round == 1
    _cycle(telemetry, "w1", FederatedReport(round=1, version=1, samples=5, loss=1.0))
    assert part.latest is None  # w2 has not answered
    _cycle(telemetry, "w2", FederatedReport(round=1, version=1, samples=5, loss=3.0))
    assert part.latest is not None and part.latest["loss"] == 2.0 and part.latest["workers"] == ["w1", "w2"]
    assert part.stamp("w1", _work()).federated_round is None  # closed: nobody is asked until the next round
