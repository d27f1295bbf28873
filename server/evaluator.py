"""Test loss/accuracy of the global model, computed in a background thread.

The evaluator owns its own model replica and a fixed held-out subset. It
reads the global model only through ModelState.snapshot (a short copy under
the model lock), so evaluation never blocks the data plane.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.datasource import SampleSource
from hermes.common.tensors import ModelSpec, build_from_spec, load_flat
from hermes.server.state import ModelState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Evaluation:
    version: int
    loss: float
    accuracy: float
    samples: int
    seconds: float
    at: float


@dataclass(frozen=True)
class TargetReached:
    """The evaluation that reached the run's target accuracy."""

    version: int
    accuracy: float
    # Since the run started (Engine.started_at), on the server's clock.
    seconds: float
    # Wall-clock time of that evaluation (time.time()), like the status's evaluation "at":
    # a launcher on the same machine measures time to target from its own origin with it.
    at: float

    def public(self) -> dict[str, Any]:
        return {"version": self.version, "accuracy": self.accuracy, "seconds": round(self.seconds, 3),
                "at": round(self.at, 6)}


class Evaluator:
    def __init__(
        self,
        spec: ModelSpec,
        state: ModelState,
        test: Dataset,
        *,
        max_samples: int,
        interval: float,
        seed: int = 0,
        on_result: Callable[[Evaluation], None] | None = None,
        batch_size: int = 512,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.clock = clock
        self.state = state
        self.interval = interval
        self.batch_size = batch_size
        self.on_result = on_result
        self.model = build_from_spec(spec).eval()
        # Any Dataset of (input, target) pairs: only the evaluated samples are read.
        source = SampleSource(test, "test_data")
        n = len(source)
        # A fixed seeded subset: evaluations of different versions are comparable.
        idx = np.sort(np.random.default_rng(seed).permutation(n)[: min(n, max_samples)])
        self.x, self.y = source.rows(idx)
        self.latest: Evaluation | None = None
        self.history: list[Evaluation] = []
        # The most accurate model evaluated by this process and its weights:
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
            if self.best is None or ev.accuracy > self.best.accuracy:
                self.best, self._best_flat = ev, flat

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
            loss_sum, correct = 0.0, 0
            for i in range(0, len(self.y), self.batch_size):
                xb, yb = self.x[i : i + self.batch_size], self.y[i : i + self.batch_size]
                logits = self.model(xb)
                loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
                correct += int((logits.argmax(1) == yb).sum())
            n = max(1, len(self.y))
            result = Evaluation(
                version=version,
                loss=loss_sum / n,
                accuracy=correct / n,
                samples=len(self.y),
                seconds=time.perf_counter() - t0,
                at=self.clock.time(),
            )
            self.latest = result
            self.history.append(result)
            if self.best is None or result.accuracy > self.best.accuracy:
                # Strictly better only: on a tie the earlier version reached it first.
                # ModelState.snapshot hands out a private copy that nobody writes to,
                # so keeping a reference is keeping a copy, at no extra cost.
                self.best, self._best_flat = result, flat
        if self.on_result is not None:
            self.on_result(result)
        return result
