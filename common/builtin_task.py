"""The built-in models and data sets as one Task: ``--task builtin`` (the default).

It is registered under the ``hermes.tasks`` entry-point group like any
installed task and builds from the run config's ``model``, ``model_kwargs``
and ``dataset`` keys. The model's input shape and class count are known per
data set (``DATASET_SHAPES``), so an agent builds the model without reading
any data; the data itself loads on first use (the server's shards, its
evaluation), never on agents, which may not hold the files (mnist, cifar10).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from hermes.common.datasets import ArrayDataset, load_dataset
from hermes.common.models import build_model
from hermes.common.task import ArrayPairDataset, Task, TaskError

if TYPE_CHECKING:
    from hermes.common.config import RunConfig

# (input shape without the batch dim, classes) of each built-in data set, as load_dataset returns it.
DATASET_SHAPES: dict[str, tuple[tuple[int, ...], int]] = {
    "digits": ((1, 8, 8), 10),
    "mnist1d": ((1, 40), 10),
    "synthetic": ((1, 8, 8), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "synthetic-cifar": ((3, 32, 32), 10),
}


class _Loaded:
    """load_dataset's (train, test), loaded once on first use by whichever split asks first."""

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self._pair: tuple[ArrayDataset, ArrayDataset] | None = None
        self._lock = threading.Lock()

    def get(self) -> tuple[ArrayDataset, ArrayDataset]:
        with self._lock:
            if self._pair is None:
                c = self.config
                self._pair = load_dataset(c.dataset, root=c.dataset_root, seed=c.seed,
                                          test_fraction=c.test_fraction, num_samples=c.num_samples)
            return self._pair


class BuiltinSplit(ArrayPairDataset):
    """One split of a built-in data set: an array-backed Dataset whose arrays load on first use."""

    def __init__(self, loaded: _Loaded, split: str) -> None:  # no super().__init__: nothing is loaded yet
        self._loaded = loaded
        self._split = 0 if split == "train" else 1

    @property
    def array(self) -> ArrayDataset:
        return self._loaded.get()[self._split]

    @property
    def name(self) -> str:
        return self.array.name

    @property
    def inputs(self) -> torch.Tensor:  # type: ignore[override]  # the base assigns it in __init__, which this class skips
        return torch.from_numpy(self.array.x)

    @property
    def targets(self) -> torch.Tensor:  # type: ignore[override]  # the base assigns it in __init__, which this class skips
        return torch.from_numpy(self.array.y)

    def __len__(self) -> int:
        return len(self.array)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        a = self.array
        return torch.from_numpy(a.x[i]), torch.as_tensor(a.y[i])


def builtin(config: RunConfig) -> Task:
    """The run config's built-in model on its built-in data set, with cross-entropy, accuracy and SGD."""
    try:
        shape, classes = DATASET_SHAPES[config.dataset]
    except KeyError:
        raise TaskError(f"task builtin: dataset {config.dataset!r} has no known input shape; "
                        f"known: {sorted(DATASET_SHAPES)}") from None
    loaded = _Loaded(config)

    def model() -> nn.Module:
        return build_model(config.model, input_shape=shape, num_classes=classes, **config.model_kwargs)

    return Task(model=model, train_data=BuiltinSplit(loaded, "train"), test_data=BuiltinSplit(loaded, "test"),
                name="builtin", example=classification_example(shape, classes))


def classification_example(shape: tuple[int, ...], classes: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """``example(n)``: n seeded random inputs of ``shape`` with labels in [0, classes), without reading data."""

    def example(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(0)
        return torch.randn((n, *shape), generator=g), torch.randint(0, classes, (n,), generator=g)

    return example

