"""The agent's side of federated evaluation: score the pulled global model on this device's held-out data.

The server asks in an assignment (``WorkReply.federated_round``,
server/engine/federated_eval.py); before training that cycle the agent's
model is the global model it pulled last, so that is what is scored, with
the task's loss and metrics, each a mean over the device's held-out data
weighted by batch size (as the server's central evaluation). The answer
rides on the cycle's report; the data never leaves the device.
"""

from __future__ import annotations

import logging
import math

import torch

from hermes.client.trainer import LocalTrainer
from hermes.common.messages import FederatedReport
from hermes.common.task import Task, as_dataset, dataset_len
from hermes.common.task_registry import batch_of

log = logging.getLogger(__name__)


class DeviceEvaluator:
    """``task.local_eval_data(worker_name)``, loaded once, and the rounds this agent answered."""

    def __init__(self, task: Task, worker_name: str, batch_size: int = 512) -> None:
        assert task.local_eval_data is not None
        data = as_dataset(task.local_eval_data(worker_name))
        self.x, self.y = batch_of(data, range(dataset_len(data)))
        self.task = task
        self.batch_size = batch_size
        self.answered = 0
        log.info("federated evaluation: %d held-out samples from %s.local_eval_data(%r)", len(self.y),
                 task.name or "the task", worker_name)

    def answer(self, round_: int | None, trainer: LocalTrainer, version: int) -> FederatedReport | None:
        """The score for ``round_`` if it is a new one (None: no request, or already answered)."""
        if round_ is None or round_ <= self.answered or len(self.y) == 0:
            return None
        self.answered = round_
        loss, metrics = score(self.task, trainer, self.x, self.y, self.batch_size)
        return FederatedReport(round=round_, version=version, samples=len(self.y), loss=loss, metrics=metrics)


@torch.inference_mode()
def score(task: Task, trainer: LocalTrainer, x: torch.Tensor, y: torch.Tensor,
          batch_size: int) -> tuple[float, dict[str, float]]:
    """Loss and metrics of the trainer's model on (x, y): per-batch values weighted by batch size."""
    model = trainer.model
    was_training = model.training
    model.eval()
    losses: list[tuple[float, int]] = []
    values: dict[str, list[tuple[float, int]]] = {name: [] for name in task.metric_fns}
    try:
        for i in range(0, len(y), batch_size):
            xb, yb = trainer.batch(x[i:i + batch_size], y[i:i + batch_size], train=False)
            out = model(xb).float()
            losses.append((float(task.loss(out, yb)), len(yb)))
            for name, fn in task.metric_fns.items():
                values[name].append((float(fn(out, yb)), len(yb)))
    finally:
        model.train(was_training)
    n = len(y)
    return (math.fsum(v * k for v, k in losses) / n,
            {name: math.fsum(v * k for v, k in pairs) / n for name, pairs in values.items()})
