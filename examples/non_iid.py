"""Device-local, non-IID data: each device trains on its own digits of five classes only.

    hermes-testbed --task examples.non_iid:task --clients 4 --profile hl4 --preset hermes --target accuracy=0.85

Target: test accuracy 0.85, reached at HL4 with ``--preset hermes`` and with ``--preset bsp``.

``local_data(worker_name)`` is called on each device and its samples never cross the network:
the server holds no training data (``train_data`` is None) and only evaluates on the global
test set. A device's classes follow from its name: the number it ends with (``worker-3``) or,
for any other name, a stable hash of it; device ``i`` holds classes ``3i, 3i+1, ..., 3i+4``
(mod 10), so the testbed's ``worker-1`` .. ``worker-4`` together cover all ten.
"""

from __future__ import annotations

import hashlib
import re

import numpy as np
import torch
from torch import nn

from hermes import Task

CLASSES_PER_DEVICE = 5


def digits() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """(train, test) of scikit-learn's digits: float32 (N, 64) in [0, 1] and int64 labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        (x / 16.0).astype(np.float32), y.astype(np.int64), test_size=0.2, stratify=y, random_state=0)
    return (x_train, y_train), (x_test, y_test)


TRAIN, TEST = digits()


def device_index(worker_name: str) -> int:
    """The number a name ends with, else a stable hash (Python's hash() differs between processes)."""
    match = re.search(r"(\d+)$", worker_name)
    if match:
        return int(match.group(1))
    return int.from_bytes(hashlib.sha256(worker_name.encode()).digest()[:4], "big")


def device_classes(worker_name: str) -> list[int]:
    first = 3 * device_index(worker_name)
    return sorted((first + j) % 10 for j in range(CLASSES_PER_DEVICE))


def local_data(worker_name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """This device's training samples: those of its classes only."""
    x, y = TRAIN
    keep = np.isin(y, device_classes(worker_name))
    return torch.from_numpy(x[keep]), torch.from_numpy(y[keep])


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))


task = Task(model=model, test_data=TEST, local_data=local_data, name="digits-non-iid")
