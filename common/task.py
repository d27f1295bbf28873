"""The Task: one description of a training job, shared by server and agents.

A task names a model factory, its data, its loss, metrics and optimizer. The
server and every agent load the same task from the same reference
(``--task MODULE:ATTR`` or a name registered under the ``hermes.tasks``
entry-point group); no task code ever crosses the wire. Registration
compares the task's name and a fingerprint of its parameters (names, shapes,
dtypes), so an agent holding a different task is refused before any state
is created.

Data is a map-style ``torch.utils.data.Dataset`` yielding ``(input, target)``
pairs of tensors, or a pair of arrays ``(inputs, targets)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

# (output, target) -> scalar loss tensor
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
# (output, target) -> float, averaged over the test data sample-weighted
MetricFn = Callable[[torch.Tensor, torch.Tensor], float]
OptimizerFn = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
# A Dataset of (input, target) tensor pairs, or (inputs, targets) arrays.
DataLike = Union["torch.utils.data.Dataset[Any]", tuple[Any, Any]]
Direction = Literal["max", "min"]
# (x, y, train) -> (x, y): the agent's per-batch transform (augmentation when train is True).
TransformFn = Callable[[torch.Tensor, torch.Tensor, bool], tuple[torch.Tensor, torch.Tensor]]
# (model, (x, y), optimizer, ctx) -> the step's loss: the user's own optimizer step (client/steps.py StepContext).
TrainStepFn = Callable[[nn.Module, tuple[torch.Tensor, torch.Tensor], torch.optim.Optimizer, Any], Any]


class TaskError(ValueError):
    """A task that cannot be loaded or is malformed; the message names the task and the field."""


def accuracy(output: torch.Tensor, target: torch.Tensor) -> float:
    """Top-1 accuracy of class scores ``output`` (N, C) against labels ``target`` (N,)."""
    # In float64: correct / n exactly as a count would give it (float32 gave 0.30000001 for 3 of 10).
    return float((output.argmax(dim=1) == target).double().mean())


def default_direction(metric: str) -> Direction:
    """Lower is better for losses and errors; higher for everything else (accuracy, r2, f1)."""
    low = metric.lower()
    return "min" if any(k in low for k in ("loss", "error", "mse", "mae", "rmse", "perplexity")) else "max"


@dataclass(frozen=True, kw_only=True)
class Task:
    """A training job: model, data, loss, metrics and optimizer.

    ``metrics`` None means ``{"accuracy": accuracy}`` (classification);
    ``optimizer`` None means SGD with the run config's lr, momentum and
    weight decay. ``directions`` overrides :func:`default_direction` per
    metric. With ``local_data`` each agent trains on
    ``local_data(worker_name)`` and no training sample crosses the network;
    ``train_data`` may then be None. ``example(n)`` gives ``n`` (input, target)
    pairs shaped like the data, for the start-up checks and the agents'
    precision and memory probes where reading real data would be costly or
    impossible (an agent that holds no data); None means the first ``n``
    samples of ``local_data``, ``test_data`` or ``train_data``.

    Hooks for the user's own local training (docs/extending.md): ``train_step``
    replaces the agent's optimizer step (called once per step with that
    step's samples and a context that owns precision, loss scaling, the
    collective's gradient hook and the budgets); ``transform(x, y, train)``
    is applied on the agent to every batch before the model sees it (and,
    with train False, to the batches the agent and the server evaluate on).
    """

    model: Callable[[], nn.Module]
    train_data: DataLike | None = None
    test_data: DataLike | None = None
    loss: LossFn = F.cross_entropy
    metrics: Mapping[str, MetricFn] | None = None
    optimizer: OptimizerFn | None = None
    local_data: Callable[[str], DataLike] | None = None
    name: str = ""
    directions: Mapping[str, Direction] = field(default_factory=dict)
    example: Callable[[int], tuple[torch.Tensor, torch.Tensor]] | None = None
    train_step: TrainStepFn | None = None
    # The device's own held-out data (worker name -> data) for federated evaluation (federated_eval.every).
    local_eval_data: Callable[[str], DataLike] | None = None
    transform: TransformFn | None = None

    @property
    def metric_fns(self) -> Mapping[str, MetricFn]:
        return self.metrics if self.metrics is not None else {"accuracy": accuracy}

    def direction(self, metric: str) -> Direction:
        return self.directions.get(metric, default_direction(metric))


def fingerprint(model: nn.Module) -> str:
    """sha256 over the state_dict's names, shapes and dtypes (not values): equal for the same architecture."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}\n".encode())
    return h.hexdigest()[:16]


class ArrayPairDataset(torch.utils.data.Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """A pair of arrays (numpy or torch) seen as a Dataset of tensor pairs."""

    def __init__(self, inputs: Any, targets: Any) -> None:
        self.inputs = torch.as_tensor(np.asarray(inputs) if not isinstance(inputs, torch.Tensor) else inputs)
        self.targets = torch.as_tensor(np.asarray(targets) if not isinstance(targets, torch.Tensor) else targets)
        if len(self.inputs) != len(self.targets):
            raise ValueError(f"{len(self.inputs)} inputs but {len(self.targets)} targets")

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[i], self.targets[i]


def as_dataset(data: DataLike) -> torch.utils.data.Dataset[Any]:
    """A Dataset from either form a task may give."""
    if isinstance(data, tuple) and len(data) == 2 and not isinstance(data, torch.utils.data.Dataset):
        return ArrayPairDataset(*data)
    return data


def dataset_len(ds: torch.utils.data.Dataset[Any]) -> int:
    """len() of a map-style Dataset: the task contract requires ``__len__``; torch's ``Dataset`` does not declare it."""
    return len(ds)  # type: ignore[arg-type]


def task_names(tasks: Sequence[str]) -> str:
    return ", ".join(sorted(tasks))
