"""The evaluator keeps the most accurate model it evaluated, not just the last one."""

from __future__ import annotations

import numpy as np
import torch

from hermes.common.datasets import ArrayDataset
from hermes.common.models import build_model
from hermes.common.task import Task
from hermes.common.tensors import spec_of
from hermes.server.evaluator import Evaluator
from hermes.server.state import ModelState

# Six samples of class 0, three of class 1, one of class 2: a model that
# always answers k scores the share of k.
LABELS = np.array([0] * 6 + [1] * 3 + [2], dtype=np.int64)
SHARE = {0: 0.6, 1: 0.3, 2: 0.1}


def _setup() -> tuple[ModelState, Evaluator]:
    model = build_model("mlp", input_shape=(4,), num_classes=3)
    spec = spec_of(model, "mlp", task="t")
    test = ArrayDataset("t", np.random.default_rng(0).normal(size=(10, 4)).astype(np.float32), LABELS, 3)
    state = ModelState(spec, torch.zeros(spec.numel))
    task = Task(model=lambda: build_model("mlp", input_shape=(4,), num_classes=3), name="t")
    return state, Evaluator(task, spec, state, test, max_samples=100, interval=1.0)


def _always(state: ModelState, k: int, version: int) -> torch.Tensor:
    """Zero weights and an output bias that picks class k (the last 3 entries are that bias)."""
    flat = torch.zeros(state.numel)
    flat[-3 + k] = 1.0
    state.load(flat, version)
    return flat


def test_best_is_the_most_accurate_evaluation_and_its_weights():
    state, ev = _setup()
    assert ev.best is None and ev.best_model() is None
    seen = {}
    for version, k in [(1, 1), (2, 0), (3, 2), (4, 0)]:
        seen[version] = _always(state, k, version)
        result = ev.evaluate_now()
        assert (result.version, result.accuracy) == (version, SHARE[k])
    best, flat = ev.best_model()
    # Version 4 ties version 2: the earlier one reached that accuracy first.
    assert (best.version, best.accuracy) == (2, 0.6)
    assert torch.equal(flat, seen[2])
    # The last evaluation stays what it was: the best is reported beside it.
    assert (ev.latest.version, ev.latest.accuracy) == (4, 0.6)
    # Later changes to the global model do not reach the kept copy.
    _always(state, 2, 5)
    ev.evaluate_now()
    assert torch.equal(ev.best_model()[1], seen[2]) and ev.latest.accuracy == 0.1
