"""The in-memory data set every loader returns, and the steps loaders share to build one.

``datasets.py`` (generated and bundled sets, ``load_dataset``) and
``dataset_files.py`` (sets read from files) both build their ``(train, test)``
pairs here: pixels to floats, a seeded cap on the training split,
standardisation with the training split's statistics only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ArrayDataset", "DatasetCorrupt", "DatasetUnavailable", "cap_training", "make_pair", "standardise",
           "to_unit"]

_EPS = 1e-6


class DatasetUnavailable(Exception):
    """The data set cannot be produced here: files or packages are missing."""


class DatasetCorrupt(DatasetUnavailable):
    """The data set's files exist but are not what they claim to be."""


@dataclass(frozen=True)
class ArrayDataset:
    name: str
    x: np.ndarray
    y: np.ndarray
    num_classes: int

    def __post_init__(self) -> None:
        if self.x.dtype != np.float32 or not self.x.flags.c_contiguous or self.x.ndim < 2:
            raise ValueError(
                f"{self.name}: x must be a C-contiguous float32 array (N, *input_shape), "
                f"got {self.x.dtype} {self.x.shape}"
            )
        if self.y.dtype != np.int64 or self.y.shape != (self.x.shape[0],):
            raise ValueError(
                f"{self.name}: y must be int64 of shape ({self.x.shape[0]},), "
                f"got {self.y.dtype} {self.y.shape}"
            )
        if len(self.y) and (self.y.min() < 0 or self.y.max() >= self.num_classes):
            raise ValueError(f"{self.name}: labels fall outside [0, {self.num_classes})")

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x.shape[1:])

    def __len__(self) -> int:
        return int(self.x.shape[0])

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        """Sample ``i`` as an (input, target) pair of tensors: an ArrayDataset is a map-style Dataset."""
        import torch

        return torch.from_numpy(self.x[i]), torch.tensor(self.y[i])


def standardise(train_x: np.ndarray, test_x: np.ndarray) -> None:
    """Shift and scale both splits in place to zero mean and unit variance per
    channel (axis 1), using the training split's statistics."""
    for c in range(train_x.shape[1]):
        channel = train_x[:, c]
        # One channel at a time with float64 sums: a float64 copy of all of
        # CIFAR-10 would take 1.2 GB, and float32 sums over 50M pixels drift.
        mean = channel.sum(dtype=np.float64) / channel.size
        centred = channel - np.float32(mean)
        np.square(centred, out=centred)
        std = max(math.sqrt(centred.sum(dtype=np.float64) / channel.size), _EPS)
        for x in (train_x, test_x):
            x[:, c] -= np.float32(mean)
            x[:, c] /= np.float32(std)


def to_unit(raw: np.ndarray) -> np.ndarray:
    """uint8 pixels to float32 in [0, 1], with a single float copy."""
    x = raw.astype(np.float32)
    x /= 255.0
    return x


def cap_training(
    x: np.ndarray, y: np.ndarray, limit: int | None, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    if limit is None or limit >= len(y):
        return x, y
    keep = np.sort(np.random.default_rng(seed).choice(len(y), size=limit, replace=False))
    return x[keep], y[keep]


def make_pair(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    num_classes: int,
) -> tuple[ArrayDataset, ArrayDataset]:
    x_train = np.ascontiguousarray(x_train, dtype=np.float32)
    x_test = np.ascontiguousarray(x_test, dtype=np.float32)
    standardise(x_train, x_test)
    return (
        ArrayDataset(name, x_train, np.asarray(y_train, dtype=np.int64), num_classes),
        ArrayDataset(name, x_test, np.asarray(y_test, dtype=np.int64), num_classes),
    )
