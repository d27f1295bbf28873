"""How a run ends by itself: a target reached on the test set, a budget spent, or no more progress.

The part records which (``target_reached``, ``budget_reached``,
``early_stopped``) and returns the stop reason; the engine stops the run.
Early stopping counts evaluations in a row whose primary metric did not
beat the best by more than ``early_stop.min_delta``; at ``patience`` the run
stops and its best model becomes the final one (server/engine/reporting.py). A target reached before a
restart is kept in the checkpoint, so the resumed run stops again at once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import asdict
from typing import Any

from hermes.common.config import RunConfig
from hermes.common.task import Direction, Task
from hermes.common.task_registry import effective_target
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation, TargetReached

log = logging.getLogger(__name__)


def primary_metric(config: RunConfig, task: Task) -> tuple[str, Direction]:
    """What "best" means for a run: the target's metric, else accuracy, else the task's first metric.

    A federated target (``federated_accuracy``) names its metric on the central test set here: the
    best model and early stopping follow the central evaluations."""
    target = effective_target(config)
    names = list(task.metric_fns)
    metric = target[0].removeprefix("federated_") if target is not None else (
        "accuracy" if "accuracy" in names or not names else names[0])
    return metric, "min" if metric == "loss" else task.direction(metric)


def _target_text(metric: str, goal: float) -> str:
    return f"target accuracy {goal}" if metric == "accuracy" else f"target {metric}={goal:g}"


class Goals:
    def __init__(self, config: RunConfig, task: Task, run_clock: RunClock, telemetry: Telemetry) -> None:
        self.config = config
        self.task = task
        self.run_clock = run_clock
        self.telemetry = telemetry
        # The budget that stopped the run (max_updates, max_epochs, max_seconds), if one did.
        self.budget_reached: str | None = None
        self.target_reached: TargetReached | None = None
        # Early stopping: the best primary score so far, its version, evaluations since it.
        self.metric, self.direction = primary_metric(config, task)
        self.best_score: float | None = None
        self.best_version: int | None = None
        self.stale_evaluations = 0
        self.early_stopped: dict[str, Any] | None = None

    def check_budgets(self, version: int, epoch_progress: float) -> str | None:
        """The first budget reached (max_updates, max_epochs, max_seconds): the stop reason naming it, else None."""
        c = self.config
        reason = None
        if c.max_updates is not None and version >= c.max_updates:
            reason = f"max_updates={c.max_updates} reached at version {version}"
        elif c.max_epochs is not None and epoch_progress >= c.max_epochs:
            reason = f"max_epochs={c.max_epochs:g} reached at version {version}"
        elif c.max_seconds is not None and self.run_clock.seconds() >= c.max_seconds:
            reason = f"max_seconds={c.max_seconds:g} reached at version {version}"
        if reason is not None:
            self.budget_reached = reason.partition("=")[0]
            self.telemetry.emit("budget_reached", budget=self.budget_reached, reason=reason, version=version)
        return reason

    def check_target(self, ev: Evaluation) -> str | None:
        """The stop reason when ``ev`` reaches the run's target for the first time, else None."""
        target = effective_target(self.config)
        if target is None or self.target_reached is not None:
            return None
        metric, goal = target
        value = ev.score(metric)
        direction = "min" if metric == "loss" else self.task.direction(metric)
        if value is None or not (value >= goal if direction == "max" else value <= goal):
            return None
        clock = self.run_clock
        reached = TargetReached(ev.version, ev.accuracy, ev.at - clock.started_at, ev.at, clock.downtime_seconds,
                                metric=metric, value=value)
        self.target_reached = reached
        self.telemetry.emit("target_reached", target_accuracy=self.config.target_accuracy,
                            target=f"{metric}={goal:g}", **reached.public())
        return f"{_target_text(metric, goal)} reached at version {ev.version}"

    def check_early_stop(self, ev: Evaluation) -> str | None:
        """The stop reason when ``ev`` is the ``early_stop.patience``-th evaluation in a row without improvement."""
        params = self.config.early_stop
        # metric "loss": Hermes Table I's patience, read as Keras' EarlyStopping on the test loss.
        metric, direction = ("loss", "min") if params.metric == "loss" else (self.metric, self.direction)
        value = ev.loss if params.metric == "loss" else ev.score(metric)
        if value is None or not math.isfinite(value):
            return None
        better = self.best_score is None or (
            value > self.best_score + params.min_delta if direction == "max"
            else value < self.best_score - params.min_delta)
        if better:
            self.best_score, self.best_version, self.stale_evaluations = value, ev.version, 0
            return None
        self.stale_evaluations += 1
        if params.patience is None or self.stale_evaluations < params.patience or self.early_stopped is not None:
            return None
        self.early_stopped = {"metric": metric, "best": self.best_score, "best_version": self.best_version,
                              "patience": params.patience, "version": ev.version}
        self.telemetry.emit("early_stopped", **self.early_stopped)
        return (f"early stop: {metric} did not improve on {self.best_score:.4g} (version {self.best_version}) "
                f"in {params.patience} evaluations")

    def outcome(self, stopping: bool) -> str:
        """running, stopped (operator, SIGTERM's shutdown), target_reached, budget_reached or early_stopped
        (the server stopped itself)."""
        if self.target_reached is not None:
            return "target_reached"
        if self.budget_reached is not None:
            return "budget_reached"
        if self.early_stopped is not None:
            return "early_stopped"
        return "stopped" if stopping else "running"

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "target_reached": None if self.target_reached is None else asdict(self.target_reached)}
        if self.config.early_stop.patience is not None:  # checkpoints without early stopping keep their keys
            state["early_stop"] = {"best_score": self.best_score, "best_version": self.best_version,
                                   "stale_evaluations": self.stale_evaluations}
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> str | None:
        """A run that had reached its target before the restart is over: returns the stop reason.

        Unless the resumed run asks for more (a higher target, or none at all:
        the operator resumed it to train on); None then.
        """
        counted = state.get("early_stop") or {}
        self.best_score, self.best_version = counted.get("best_score"), counted.get("best_version")
        self.stale_evaluations = int(counted.get("stale_evaluations", 0))
        reached = state.get("target_reached")
        target = effective_target(self.config)
        before = TargetReached(**reached) if reached is not None else None
        value = None if before is None else (before.accuracy if before.value is None else before.value)
        if target is not None and before is not None and before.metric == target[0] and value is not None:
            met = value >= target[1] if self.task.direction(target[0]) == "max" and target[0] != "loss" \
                else value <= target[1]
        else:
            met = False
        if before is None or target is None or not met:
            if before is not None:
                log.info("the run had reached %s %s before the restart; the resumed run's target is %s, "
                         "so it trains on", before.metric, value, target)
            return None
        self.target_reached = before
        return f"{_target_text(*target)} was reached at version {before.version} before the restart"
