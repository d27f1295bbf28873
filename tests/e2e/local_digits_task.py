"""A device-local, non-IID task for the tests: each agent holds 4 of the 10 digit classes.

``worker-K`` (the testbed's names) holds classes 2(K-1) .. 2(K-1)+3 (mod 10)
of the digits training split; the server holds only the test split, which
it evaluates on. No training sample exists on the server at all.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from hermes.common.datasets import load_dataset
from hermes.common.models import build_model
from hermes.common.task import ArrayPairDataset, Task

CLASSES_PER_WORKER = 4


def classes_of(worker_name: str) -> list[int]:
    m = re.search(r"(\d+)$", worker_name)
    k = int(m.group(1)) - 1 if m else zlib.crc32(worker_name.encode())
    return [(2 * k + j) % 10 for j in range(CLASSES_PER_WORKER)]


def local_data(worker_name: str) -> ArrayPairDataset:
    train, _ = load_dataset("digits", seed=0)
    keep = np.isin(train.y, classes_of(worker_name))
    return ArrayPairDataset(train.x[keep], train.y[keep])


def task() -> Task:
    _, test = load_dataset("digits", seed=0)
    return Task(name="local-digits", model=lambda: build_model("cnn", input_shape=(1, 8, 8), num_classes=10),
                test_data=ArrayPairDataset(test.x, test.y), local_data=local_data)
