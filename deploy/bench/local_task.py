"""The built-in task with its training samples on the devices: ``--set task=hermes.deploy.bench.local_task:task``.

The testbed's agents fetch their training samples from the server over their link (shard records), which a
device training alone never does: on ``constrained`` (2 Mbit/s) the ``hl2-alone`` agents spent more than half
of their time waiting for shard records (docs/compression.md). Edge devices hold their own data, so this task
gives each agent a disjoint, seeded IID part of the built-in train split through ``Task.local_data``, and the
server serves no shard. The parts: the train split without the server's validation samples (its loss
probe's), dealt round-robin after a seeded permutation into ``min_workers`` parts; ``worker-i`` holds part
``(i - 1) mod min_workers`` (other names: a stable hash). ``train_data`` and ``test_data`` stay the built-in
task's, so the ``alone`` baseline (``deploy/ddp_rank.py``) trains on the same samples as before.
"""

from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import numpy as np
import torch

from hermes.common.builtin_task import builtin
from hermes.common.datasets import load_dataset, validation_indices
from hermes.common.task import Task

if TYPE_CHECKING:
    from hermes.common.config import RunConfig


def device_part(worker_name: str, parts: int) -> int:
    """``worker-3`` -> 2 (of ``parts``); any other name: a stable hash (Python's hash() differs by process)."""
    match = re.search(r"(\d+)$", worker_name)
    index = int(match.group(1)) - 1 if match else int.from_bytes(hashlib.sha256(worker_name.encode()).digest()[:4],
                                                                  "big")
    return index % parts


def part_indices(n_train: int, parts: int, part: int, validation_fraction: float, seed: int) -> np.ndarray:
    """The train-split indices one device holds: disjoint across parts, none of the server's validation samples."""
    train_idx, _ = validation_indices(n_train, validation_fraction, seed)
    order = np.random.default_rng([seed, 0x10CA1]).permutation(train_idx)
    return np.sort(order[part::parts])


def task(config: RunConfig) -> Task:
    base = builtin(config)
    parts = max(1, config.min_workers)

    def local_data(worker_name: str) -> tuple[torch.Tensor, torch.Tensor]:
        train, _ = load_dataset(config.dataset, root=config.dataset_root, seed=config.seed,
                                test_fraction=config.test_fraction, num_samples=config.num_samples)
        idx = part_indices(len(train), parts, device_part(worker_name, parts), config.validation_fraction,
                           config.seed)
        return torch.from_numpy(np.ascontiguousarray(train.x[idx])), torch.from_numpy(np.ascontiguousarray(train.y[idx]))

    return Task(model=base.model, train_data=base.train_data, test_data=base.test_data, local_data=local_data,
                name="builtin-local", example=base.example)
