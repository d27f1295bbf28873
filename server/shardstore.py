"""The training set cut into shard records, served by id over the data plane (and published to Kafka).

``ShardStore`` takes any map-style Dataset of (input, target) tensor pairs,
of any dtype records carry (``hermes.common.shards.RECORD_DTYPES``). It
encodes a shard when it is first asked for and keeps the encoded records in
an LRU bounded in bytes (``cache_bytes``), so a 1 GB lazy Dataset costs the
server a few shards of memory, not the set; a small array-backed set (the
built-in ones) fits the cache whole and is encoded once, as before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset

from hermes.common.config import RunConfig
from hermes.common.datasets import ArrayDataset, split_validation, validation_indices
from hermes.common.datasource import DataError, SampleSource, check_dtypes, rows_as_arrays
from hermes.common.shards import encode_record, shard_bounds
from hermes.common.task import Task, as_dataset, dataset_len
from hermes.common.task_registry import resolve_task

# Encoded records kept per store. 64 MiB holds every built-in set whole (CIFAR-10's
# 40k training images are 480 MB: those are re-encoded on demand, ~1 ms per shard).
DEFAULT_CACHE_BYTES = 64 * 2**20


class _Empty(Dataset):
    """No samples: the train split of a task whose agents hold the data (``local_data``)."""

    def __len__(self) -> int:
        return 0

    def __getitem__(self, i: int) -> Any:
        raise IndexError(i)


def load_splits(config: RunConfig, task: Task | None = None) -> tuple[Dataset, Dataset, Dataset]:
    """(train, validation, test) exactly as the engine cuts them.

    The task (by default the config's ``task``, resolved): its
    ``train_data`` and ``test_data``; validation is a seeded index subset of
    train (``validation_fraction``, the permutation the built-in sets always
    used) and train the rest, nothing materialised. A
    task whose agents hold the data (``local_data``, no ``train_data``) has
    an empty train split; its validation (the server's loss probe) is then
    held out of ``test_data``, so no test sample steers training.
    ``hermes-server shards publish`` uses it too, so a topic published ahead
    of a run holds the very records the server would serve.
    """
    if task is None:
        task = resolve_task(config.task, config)
    if task.test_data is None:
        raise DataError(f"task {task.name or '?'}: test_data is required (the server evaluates on it)")
    test_ds = as_dataset(task.test_data)
    if task.train_data is None:
        if task.local_data is None:
            raise DataError(f"task {task.name or '?'}: train_data or local_data is required")
        keep, held = validation_indices(dataset_len(test_ds), config.validation_fraction, config.seed)
        return _Empty(), Subset(test_ds, held.tolist()), Subset(test_ds, np.sort(keep).tolist())
    full = as_dataset(task.train_data)
    if isinstance(full, ArrayDataset):
        train, validation = split_validation(full, config.validation_fraction, config.seed)
        return train, validation, test_ds  # type: ignore[return-value]  # ArrayDataset: indexed and sized like one
    train_idx, val_idx = validation_indices(dataset_len(full), config.validation_fraction, config.seed)
    return Subset(full, train_idx.tolist()), Subset(full, val_idx.tolist()), test_ds


def data_name(ds: Any) -> str:
    """A Dataset's ``name`` (a Subset's: its base set's), or ""."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    return str(getattr(ds, "name", "") or "")


def split_stores(train: Dataset, validation: Dataset, test: Dataset, shard_size: int,
                 fallback: str = "task") -> tuple[ShardStore, ShardStore]:
    """The train and validation stores of a run, named as the server names them (Kafka topics
    published ahead of a run by ``hermes-server shards publish`` then match the server's bytes)."""
    label = data_name(train) or data_name(test) or fallback
    return (ShardStore(train, shard_size, name=label),
            ShardStore(validation, shard_size, name=f"{label}-validation"))


class ShardStore:
    """Shard ``i`` of a Dataset as one encoded record; an LRU of ``cache_bytes`` keeps the recent ones."""

    def __init__(self, train: Dataset, shard_size: int, *, name: str = "",
                 cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self.train = train
        self.source = SampleSource(train, "train_data")
        self.name = name or data_name(train) or "task"
        self.bounds = shard_bounds(len(self.source), shard_size) if len(self.source) else []
        if self.bounds:
            check_dtypes(self.source)  # a dtype records cannot carry: refused at start-up, not at the first fetch
        self.cache_bytes = cache_bytes
        self._records: OrderedDict[int, bytes] = OrderedDict()
        self._cached = 0
        self._lock = threading.Lock()
        # Records encoded so far (cache misses): a test sees the LRU at work.
        self.encoded = 0

    @property
    def num_shards(self) -> int:
        return len(self.bounds)

    def samples(self, shard: int) -> int:
        start, stop = self.bounds[shard]
        return stop - start

    def sample_bytes(self) -> int:
        """Bytes of one sample (input + target): the memory cap's unit."""
        return self.source.sample_bytes() if len(self.source) else 0

    def rows(self, shard: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples of one shard as (inputs, targets) tensors (what its record decodes to)."""
        start, stop = self.bounds[shard]
        return self.source.rows(np.arange(start, stop))

    def cached(self, shard: int) -> bytes | None:
        with self._lock:
            rec = self._records.get(shard)
            if rec is not None:
                self._records.move_to_end(shard)
            return rec

    def record(self, shard: int) -> bytes:
        """The encoded record of one shard: from the cache, else read, encoded and cached."""
        rec = self.cached(shard)
        if rec is not None:
            return rec
        xa, xn, ya, yn = rows_as_arrays(*self.rows(shard))
        rec = encode_record(self.name, shard, xa, ya, x_dtype=xn, y_dtype=yn)
        with self._lock:
            self.encoded += 1
            if shard not in self._records:
                self._records[shard] = rec
                self._cached += len(rec)
            # Keep at least the newest record: a shard larger than the budget is still served.
            while self._cached > self.cache_bytes and len(self._records) > 1:
                _, old = self._records.popitem(last=False)
                self._cached -= len(old)
        return rec

    def all_cached(self, shards: list[int]) -> bool:
        with self._lock:
            return all(s in self._records for s in shards)
