"""Device-local data: the agent trains on ``task.local_data(worker_name)``; no sample leaves the device.

The server sizes each cycle exactly as it sizes shard assignments (the dual
search's DSS, the batch policies' b_k), but its WORK reply carries a sample
count (``local_samples``, ``source: "local"``) instead of shard ids. The
agent draws that many samples from its local training set in epoch-wise
permutations (seeded by the run's seed and the worker's name): every local
sample is trained once per local epoch, and a cycle larger than what is
left of an epoch runs on into the next one, as shard assignments do.

With the z-score gate (Hermes) the gate's validation split is held out of
the local set too (``zscore.validation_samples``, at most
``validation_fraction`` of it), so not even the gate's data is fetched.
"""

from __future__ import annotations

import logging
import threading
import zlib
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from hermes.common.datasource import DataError, SampleSource
from hermes.common.task import as_dataset

if TYPE_CHECKING:
    from hermes.common.config import RunConfig
    from hermes.common.task import Task

log = logging.getLogger(__name__)


class LocalDataError(DataError):
    """The task's local_data cannot be built or read (the message names the task, the field and the worker)."""


def build_local(task: Task, worker_name: str) -> SampleSource:
    """``task.local_data(worker_name)`` as a checked SampleSource (its first sample read once)."""
    label = f"task {task.name or '?'}: local_data({worker_name!r})"
    if task.local_data is None:
        raise LocalDataError(f"{label}: the task has no local_data")
    try:
        data = task.local_data(worker_name)
    except Exception as exc:  # the user's code: any failure is a bad task, said in one line
        raise LocalDataError(f"{label} raised {type(exc).__name__}: {exc}") from None
    if data is None:
        raise LocalDataError(f"{label} returned None, not a Dataset or an (inputs, targets) pair")
    try:
        source = SampleSource(as_dataset(data), f"{label}")
        if len(source) == 0:
            raise LocalDataError(f"{label} is empty")
        source.first()
    except DataError as exc:
        raise LocalDataError(str(exc)) from None
    except (ValueError, TypeError) as exc:
        raise LocalDataError(f"{label}: {exc}") from None
    return source


class LocalSet:
    """An agent's local data: a training part drawn in epoch-wise permutations, a held-out gate part."""

    def __init__(self, source: SampleSource, worker_name: str) -> None:
        self.source = source
        self.worker_name = worker_name
        self.train_idx = np.arange(len(source))
        self.validation_idx = np.zeros(0, dtype=np.int64)
        self.seed = 0
        self.epoch = 0
        self._order = np.zeros(0, dtype=np.int64)
        self._next = 0
        self._lock = threading.Lock()
        self.drawn = 0

    @classmethod
    def build(cls, task: Task, worker_name: str) -> LocalSet:
        return cls(build_local(task, worker_name), worker_name)

    def __len__(self) -> int:
        return len(self.source)

    def configure(self, config: RunConfig, *, gate: bool) -> None:
        """Once the run config is known: hold the gate's validation out, seed the permutations."""
        n = len(self.source)
        self.seed = zlib.crc32(f"{config.seed}:{self.worker_name}".encode())
        order = np.random.default_rng([self.seed, 0x10CA1]).permutation(n)
        held = 0
        if gate and n > 1:
            held = min(config.zscore.validation_samples, max(1, int(round(n * config.validation_fraction))), n - 1)
        self.validation_idx = np.sort(order[:held])
        self.train_idx = np.sort(order[held:])
        self.epoch, self._next = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return self.train_idx[np.random.default_rng([self.seed, epoch]).permutation(len(self.train_idx))]

    def validation(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self._rows(self.validation_idx)

    def draw(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next ``count`` training samples of the epoch-wise permutations."""
        if count < 1:
            raise ValueError(f"count must be >= 1, got {count}")
        with self._lock:
            if len(self._order) == 0:
                self._order = self._permutation(0)
            picks: list[np.ndarray] = []
            left = count
            while left > 0:
                if self._next >= len(self._order):
                    self.epoch += 1
                    self._order, self._next = self._permutation(self.epoch), 0
                take = self._order[self._next:self._next + left]
                picks.append(take)
                self._next += len(take)
                left -= len(take)
            self.drawn += count
        return self._rows(np.concatenate(picks) if len(picks) > 1 else picks[0])

    def _rows(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if len(idx) == 0:
            x, y = self.source.first()
            return x.new_zeros((0, *x.shape)), y.new_zeros((0, *y.shape))
        try:
            return self.source.rows(idx)
        except DataError as exc:
            raise LocalDataError(str(exc)) from None

    def describe(self) -> dict[str, Any]:
        return {"samples": len(self.source), "train": len(self.train_idx), "validation": len(self.validation_idx)}
