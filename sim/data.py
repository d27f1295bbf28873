"""Which samples each simulated device trains on: the server's shards, a split of the train set, or the task's own.

The real system has two data paths, and the simulator takes the same two:

* **shards** (the default, the testbed's): the server holds the train set,
  cut into shards; each WORK reply deals the next shards of one global queue
  to whoever asks (``server.engine.membership``), so over an epoch every
  device sees a slice of the same shuffled set (IID across devices by
  construction). The allocator decides how many samples a cycle has.
* **device-local data** (``Task.local_data``): each agent holds its own set
  (``client.local_data.LocalSet``); the server sizes every cycle exactly as
  it sizes shard assignments (the allocator's DSS, as ``local_samples``) and
  the agent draws that many samples from its own set, epoch by epoch.

A split (``iid`` or ``dirichlet:ALPHA``) is the second path with the train
set partitioned among the devices (``sim.partition``): the split decides
which samples a device holds, the server's allocator still decides how many
it trains per cycle, and each device draws them as an agent with that
``local_data`` would. The server's validation and test splits are cut from
the task's data first, exactly as in a shard-fed run (``load_splits``), so
only the train split is partitioned and the evaluation is the same.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Subset

from hermes.common.datasource import SampleSource
from hermes.common.task import Task, dataset_len
from hermes.sim.partition import dirichlet_split, iid_split

log = logging.getLogger(__name__)

__all__ = ["SHARDS", "DataPlan", "Split", "SplitError", "plan_data", "parse_split"]

# Rows read at a time when a non-array Dataset's labels are collected.
_LABEL_CHUNK = 4096
# Seed stream of the split, apart from the model's and the devices' shuffling (all from the run's seed).
_SPLIT_STREAM = 0x5B117


class SplitError(ValueError):
    """A split that cannot be made (one line: the flag, the value, the remedy)."""


@dataclass(frozen=True)
class Split:
    """``shards`` (the server's queue), ``iid`` or ``dirichlet`` with its alpha."""

    kind: str
    alpha: float | None = None

    def __str__(self) -> str:
        return f"dirichlet:{self.alpha:g}" if self.kind == "dirichlet" else self.kind


SHARDS = Split("shards")


def parse_split(text: str | Split | None) -> Split:
    """``shards`` (default), ``iid`` or ``dirichlet:ALPHA`` (alpha > 0)."""
    if text is None:
        return SHARDS
    if isinstance(text, Split):
        return text
    kind, _, arg = text.strip().partition(":")
    if kind in ("shards", "iid") and not arg:
        return Split(kind)
    if kind == "dirichlet":
        try:
            alpha = float(arg)
        except ValueError:
            raise SplitError(f"split {text!r}: dirichlet needs an alpha, e.g. dirichlet:0.5") from None
        if not alpha > 0 or alpha == float("inf"):
            raise SplitError(f"split {text!r}: alpha must be a positive finite number")
        return Split("dirichlet", alpha)
    raise SplitError(f"split {text!r}: use shards, iid or dirichlet:ALPHA")


@dataclass
class DataPlan:
    """The task the engine and the devices run (with ``local_data`` when the devices hold the data), the
    engine's (train, validation, test) when they were cut here, and what the summary records."""

    task: Task
    splits: tuple[Any, Any, Any] | None
    record: dict[str, Any]
    # Per device name: its samples and label counts (a split's only).
    held: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)


def labels_of(ds: Any) -> np.ndarray:
    """Every sample's target as one integer array (array-backed sets without copying their inputs)."""
    source = SampleSource(ds, "train_data")
    n = len(source)
    ys = [source.rows(np.arange(i, min(n, i + _LABEL_CHUNK)))[1] for i in range(0, n, _LABEL_CHUNK)]
    y = torch.cat(ys) if ys else torch.zeros(0, dtype=torch.int64)
    if y.dim() != 1 or y.dtype.is_floating_point or y.dtype == torch.bool:
        raise SplitError(f"a split by label needs one integer class per sample; the train set's targets are "
                         f"{y.dtype} of shape {tuple(y.shape)} (use --split iid or shards)")
    return y.numpy().astype(np.int64, copy=False)


def plan_data(task: Task, split: Split, names: Sequence[str], *, seed: int, load: Any) -> DataPlan:
    """Where each device's samples come from. ``load()`` gives the engine's (train, validation, test)."""
    if split == SHARDS:
        source = "local" if task.local_data is not None else "server"
        return DataPlan(task, None, {"split": "task local_data" if source == "local" else "shards",
                                     "source": source})
    if task.local_data is not None:
        raise SplitError(f"split {split}: the task has its own local_data, which decides what each device "
                         "holds; leave the split out")
    splits = load()
    train = splits[0]
    n = dataset_len(train)
    stream = int(np.random.SeedSequence([seed, _SPLIT_STREAM]).generate_state(1)[0])
    labels = labels_of(train) if split.kind == "dirichlet" else None
    try:
        if labels is None:
            parts = iid_split(n, len(names), stream)
        else:
            assert split.alpha is not None
            parts = dirichlet_split(labels, len(names), split.alpha, stream)
    except ValueError as exc:
        raise SplitError(f"split {split}: {exc}") from None
    by_name = dict(zip(names, parts, strict=True))

    def local_data(name: str) -> Any:
        # A view of the engine's own train split: array-backed sets are read in place, never copied.
        return Subset(train, by_name[name].tolist())

    held: dict[str, dict[str, Any]] = {}
    for name, idx in by_name.items():
        entry: dict[str, Any] = {"samples": int(len(idx))}
        if labels is not None:
            entry["labels"] = np.bincount(labels[idx], minlength=int(labels.max()) + 1).tolist()
        held[name] = entry
    record = {"split": str(split), "source": "local", "train_samples": n}
    return DataPlan(dataclasses.replace(task, local_data=local_data), splits, record, held)
