"""Test loss and the task's metrics of the global model, computed in a background thread.

The evaluator owns its own model replica (built by the task, checked
against the spec) and a fixed held-out subset of the task's test data. It
reads the global model only through ModelState.snapshot (a short copy under
the model lock), so evaluation never blocks the data plane.

Loss and metrics are means over the subset, each batch weighted by its
samples (a metric is ``(output, target) -> float`` on one batch). The best
model is the best by the run's primary metric: the target's metric, else
accuracy when the task has it, else the task's first metric; the task says
whether higher or lower is better.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.task import Direction, Task
from hermes.common.task_registry import batch_of
from hermes.common.tensors import ModelSpec, build_checked, load_flat
from hermes.server.state import ModelState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    version: int
    loss: float
    # The "accuracy" metric when the task has one (the built-in task does), else None.
    accuracy: float | None
    samples: int
    seconds: float
    at: float
    # Every metric of the task, by name.
    metrics: dict[str, float] = field(default_factory=dict)

    def score(self, metric: str) -> float | None:
        """The value of ``metric`` ("loss" or one of the task's) in this evaluation."""
        if metric == "loss":
            return self.loss
        return self.metrics.get(metric, self.accuracy if metric == "accuracy" else None)


@dataclass(frozen=True)
class TargetReached:
    """The evaluation that reached the run's target."""

    version: int
    # The accuracy of that evaluation (None when the task has no accuracy metric).
    accuracy: float | None
    # Training seconds since the run started (Engine.started_at), on the server's clock:
    # the time the server was down between a kill and its --resume is not counted.
    seconds: float
    # Wall-clock time of that evaluation (time.time()), like the status's evaluation "at":
    # a launcher on the same machine measures time to target from its own origin with it.
    at: float
    # Seconds the run's server was down before this evaluation (restarts), so
    # seconds + downtime_seconds is the wall-clock time since the run started.
    downtime_seconds: float = 0.0
    # The target's metric and the value it reached.
    metric: str = "accuracy"
    value: float | None = None

    def public(self) -> dict[str, Any]:
        return {"version": self.version, "accuracy": self.accuracy, "metric": self.metric,
                "value": self.accuracy if self.value is None else self.value,
                "seconds": round(self.seconds, 3), "at": round(self.at, 6),
                "downtime_seconds": round(self.downtime_seconds, 3),
                "wall_seconds": round(self.seconds + self.downtime_seconds, 3)}


class Evaluator:
    def __init__(
        self,
        task: Task,
        spec: ModelSpec,
        state: ModelState,
        test: Any,
        *,
        max_samples: int,
        interval: float,
        seed: int = 0,
        on_result: Callable[[Evaluation], None] | None = None,
        batch_size: int = 512,
        clock: Clock = SYSTEM_CLOCK,
        primary: tuple[str, Direction] = ("accuracy", "max"),
    ) -> None:
        self.clock = clock
        self.task = task
        self.primary, self.direction = primary
        self.state = state
        self.interval = interval
        self.batch_size = batch_size
        self.on_result = on_result
        self.model = build_checked(task.model, spec).eval()
        n = len(test)
        # A fixed seeded subset: evaluations of different versions are comparable.
        idx = np.sort(np.random.default_rng(seed).permutation(n)[: min(n, max_samples)])
        self.x, self.y = batch_of(test, idx.tolist())
        self.latest: Evaluation | None = None
        self.history: list[Evaluation] = []
        # The best model (by the primary metric) evaluated by this process and its weights:
        # under asynchronous updates accuracy swings between evaluations, so
        # the last model is often not the best one the run produced.
        self.best: Evaluation | None = None
        self._best_flat: torch.Tensor | None = None
        self._lock = threading.Lock()  # one evaluation at a time (thread vs evaluate_now)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hermes-evaluator", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if self._stop.is_set():
                break
            if self.latest is None or self.latest.version != self.state.version:
                try:
                    self.evaluate_now()
                except Exception:  # an evaluation bug must not kill the server
                    log.exception("evaluation failed")

    def best_model(self) -> tuple[Evaluation, torch.Tensor] | None:
        """The best evaluation so far and the flat fp32 model it scored (None before any)."""
        with self._lock:
            if self.best is None or self._best_flat is None:
                return None
            return self.best, self._best_flat

    def restore_best(self, ev: Evaluation, flat: torch.Tensor) -> None:
        """The best model of the run before a restart (from its checkpoint)."""
        with self._lock:
            if self._better(ev, self.best):
                self.best, self._best_flat = ev, flat

    def _better(self, ev: Evaluation, than: Evaluation | None) -> bool:
        """Strictly better by the primary metric (a metric the evaluation lacks is never better)."""
        new = ev.score(self.primary)
        if than is None:
            return True
        old = than.score(self.primary)
        if new is None or not np.isfinite(new):
            return False
        if old is None or not np.isfinite(old):
            return True
        return new > old if self.direction == "max" else new < old

    def state_dict(self) -> dict[str, Any]:
        """History and best evaluation for a checkpoint (the best weights are a tensor: ``best_model``)."""
        return {
            "evaluations": [asdict(ev) for ev in self.history],
            # The best model's weights sit beside the model in the tensor file ("best").
            "best_evaluation": None if self.best is None else asdict(self.best),
        }

    def load_state_dict(self, state: Mapping[str, Any], best_flat: torch.Tensor | None) -> None:
        self.history.extend(Evaluation(**ev) for ev in state.get("evaluations", []))
        if self.history:
            self.latest = self.history[-1]
        if state.get("best_evaluation") is not None and best_flat is not None:
            self.restore_best(Evaluation(**state["best_evaluation"]), best_flat)

    @torch.inference_mode()
    def evaluate_now(self) -> Evaluation:
        with self._lock:
            version, flat = self.state.snapshot()
            if self.latest is not None and self.latest.version == version:
                return self.latest
            t0 = time.perf_counter()
            load_flat(self.model, flat)
            fns = self.task.metric_fns
            losses: list[float] = []
            values: dict[str, list[float]] = {name: [] for name in fns}
            sizes: list[int] = []
            for i in range(0, len(self.y), self.batch_size):
                xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
                if self.task.transform is not None:  # the task's evaluation-time transform (train False)
                    xb, yb = self.task.transform(xb, yb, False)
                out = self.model(xb)
                sizes.append(len(yb))
                losses.append(float(self.task.loss(out, yb)))
                for name, fn in fns.items():
                    values[name].append(float(fn(out, yb)))
            metrics = {name: _weighted(v, sizes) for name, v in values.items()}
            result = Evaluation(
                version=version,
                loss=_weighted(losses, sizes),
                accuracy=metrics.get("accuracy"),
                samples=len(self.y),
                seconds=time.perf_counter() - t0,
                at=self.clock.time(),
                metrics=metrics,
            )
            self.latest = result
            self.history.append(result)
            if self._better(result, self.best):
                # Strictly better only: on a tie the earlier version reached it first.
                # ModelState.snapshot hands out a private copy that nobody writes to,
                # so keeping a reference is keeping a copy, at no extra cost.
                self.best, self._best_flat = result, flat
        if self.on_result is not None:
            self.on_result(result)
        return result


def _weighted(values: list[float], sizes: list[int]) -> float:
    """Per-batch means, weighted by batch size; one batch is its own value (no round-off from n * x / n)."""
    if len(values) == 1:
        return values[0]
    return math.fsum(v * n for v, n in zip(values, sizes)) / max(1, sum(sizes))
