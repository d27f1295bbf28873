"""The training set cut into shard records, served by id over the data plane."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from hermes.common.config import RunConfig
from hermes.common.shards import encode_record, shard_bounds
from hermes.common.task import ArrayPairDataset, Task, TaskError, as_dataset
from hermes.common.task_registry import batch_of, resolve_task


class Split(ArrayPairDataset):
    """A split held as arrays: a Dataset of tensor pairs, with the numpy views ShardStore cuts records from."""

    def __init__(self, name: str, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        super().__init__(inputs, targets)
        self.name = name

    @property
    def x(self) -> np.ndarray:
        return self.inputs.numpy()

    @property
    def y(self) -> np.ndarray:
        return self.targets.numpy()


def _held(name: str, data: Any) -> Split:
    ds = as_dataset(data)
    x, y = batch_of(ds, range(len(ds)))
    return Split(getattr(ds, "name", name), x.contiguous(), y.contiguous())


def load_splits(config: RunConfig, task: Task | None = None) -> tuple[Split, Split, Split]:
    """(train, validation, test) of the run's task, exactly as the engine cuts them.

    ``hermes-server shards publish`` uses it too, so a topic published ahead
    of a run holds the very records the server would serve. The validation
    split is the seeded subset ``split_validation`` holds out.
    """
    if task is None:
        task = resolve_task(config.task, config)
    if task.train_data is None or task.test_data is None:
        raise TaskError(f"task {task.name}: the server needs train_data and test_data")
    train, test = _held(task.name, task.train_data), _held(f"{task.name}-test", task.test_data)
    n = len(train)
    n_val = max(1, int(round(n * config.validation_fraction)))
    if n_val >= n:
        raise ValueError(f"validation fraction {config.validation_fraction} leaves no training samples out of {n}")
    # The permutation split_validation draws: the built-in data sets keep their validation split.
    order = np.random.default_rng([config.seed, 0x5A1]).permutation(n)
    val_idx, train_idx = torch.from_numpy(np.sort(order[:n_val])), torch.from_numpy(np.sort(order[n_val:]))
    return (Split(train.name, train.inputs[train_idx], train.targets[train_idx]),
            Split(f"{train.name}-validation", train.inputs[val_idx], train.targets[val_idx]), test)


class ShardStore:
    def __init__(self, train: Split, shard_size: int) -> None:
        self.train = train
        self.bounds = shard_bounds(len(train), shard_size)
        self._records: dict[int, bytes] = {}
        self._lock = threading.Lock()

    @property
    def num_shards(self) -> int:
        return len(self.bounds)

    def samples(self, shard: int) -> int:
        start, stop = self.bounds[shard]
        return stop - start

    def record(self, shard: int) -> bytes:
        """The encoded record of one shard; encoded once, then cached."""
        rec = self._records.get(shard)
        if rec is None:
            start, stop = self.bounds[shard]
            rec = encode_record(self.train.name, shard, self.train.x[start:stop], self.train.y[start:stop])
            with self._lock:
                self._records[shard] = rec
        return rec
