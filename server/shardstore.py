"""The training set cut into shard records, served by id over the data plane."""

from __future__ import annotations

import threading

from hermes.common.config import RunConfig
from hermes.common.datasets import ArrayDataset, load_dataset, split_validation
from hermes.common.shards import encode_record, shard_bounds


def load_splits(config: RunConfig) -> tuple[ArrayDataset, ArrayDataset, ArrayDataset]:
    """(train, validation, test) exactly as the engine cuts them.

    ``hermes-server shards publish`` uses it too, so a topic published ahead
    of a run holds the very records the server would serve.
    """
    train, test = load_dataset(
        config.dataset,
        root=config.dataset_root,
        seed=config.seed,
        test_fraction=config.test_fraction,
        num_samples=config.num_samples,
    )
    train, validation = split_validation(train, config.validation_fraction, config.seed)
    return train, validation, test


class ShardStore:
    def __init__(self, train: ArrayDataset, shard_size: int) -> None:
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
