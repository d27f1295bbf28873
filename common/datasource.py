"""Rows of any Dataset of (input, target) pairs as stacked tensors, without holding the set.

Server shards and device-local cycles both read a task's data through
:class:`SampleSource`: ``rows(indices)`` stacks exactly those samples. A
Dataset backed by arrays (the built-in ``ArrayDataset``, ``ArrayPairDataset``,
a two-tensor ``TensorDataset``, or a ``Subset`` of one) is sliced directly
(the digits quickstart's speed); any other is read item by item, so a lazy
1 GB Dataset costs only the rows asked for.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Subset, TensorDataset

from hermes.common.arrays import record_dtype, to_array
from hermes.common.datasets import ArrayDataset
from hermes.common.task import ArrayPairDataset


class DataError(ValueError):
    """A Dataset whose items are not (input, target) pairs of consistent tensors; names the field and index."""


def _array_backed(ds: Any) -> tuple[torch.Tensor, torch.Tensor, np.ndarray | None] | None:
    """(inputs, targets, index map or None) of an array-backed Dataset; None for any other."""
    if isinstance(ds, ArrayDataset):
        return torch.from_numpy(ds.x), torch.from_numpy(ds.y), None
    if isinstance(ds, ArrayPairDataset):
        return ds.inputs, ds.targets, None
    if isinstance(ds, TensorDataset) and len(ds.tensors) == 2:
        return ds.tensors[0], ds.tensors[1], None
    if isinstance(ds, Subset):
        inner = _array_backed(ds.dataset)
        if inner is None:
            return None
        idx = np.asarray(ds.indices, dtype=np.int64)
        return inner[0], inner[1], idx if inner[2] is None else inner[2][idx]
    return None


def _as_tensor(value: Any, where: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    try:
        return torch.as_tensor(np.asarray(value) if not isinstance(value, (int, float, bool)) else value)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise DataError(f"{where}: not a tensor or array ({type(value).__name__}: {exc})") from None


class SampleSource:
    """Stacked rows of a Dataset of (input, target) pairs; ``field`` names it in errors (e.g. ``train_data``)."""

    def __init__(self, dataset: Dataset[Any], field: str = "data") -> None:
        self.dataset = dataset
        self.field = field
        self._arrays = _array_backed(dataset)
        try:
            self.length = len(dataset)  # type: ignore[arg-type]
        except TypeError:
            raise DataError(f"{field}: a map-style Dataset with __len__ is needed, "
                            f"got {type(dataset).__name__}") from None
        self._first: tuple[torch.Tensor, torch.Tensor] | None = None

    def __len__(self) -> int:
        return self.length

    @property
    def array_backed(self) -> bool:
        return self._arrays is not None

    def first(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample 0 (checked): what shapes and dtypes every other sample must have."""
        if self._first is None:
            if self.length == 0:
                raise DataError(f"{self.field}: the Dataset is empty")
            x, y = self.rows(np.arange(1))
            self._first = (x[0], y[0])
        return self._first

    def sample_bytes(self) -> int:
        x, y = self.first()
        return x.element_size() * x.numel() + y.element_size() * y.numel()

    def rows(self, index: np.ndarray | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(inputs, targets) of the samples at ``index`` (positions in this Dataset), stacked."""
        positions = np.arange(self.length)[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        if self._arrays is not None:
            xs, ys, idx = self._arrays
            pick = torch.from_numpy(positions if idx is None else idx[positions])
            return xs[pick], ys[pick]
        return self._stack(positions)

    def _stack(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        for i in positions.tolist():
            where = f"{self.field}[{i}]"
            try:
                item = self.dataset[i]
            except (IndexError, KeyError) as exc:
                raise DataError(f"{where}: {type(exc).__name__}: {exc}") from None
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise DataError(f"{where}: expected an (input, target) pair, got {type(item).__name__}")
            xs.append(_as_tensor(item[0], f"{where} input"))
            ys.append(_as_tensor(item[1], f"{where} target"))
        if not xs:
            raise DataError(f"{self.field}: no samples asked for")
        return self._stacked(xs, "input", positions), self._stacked(ys, "target", positions)

    def _stacked(self, parts: list[torch.Tensor], what: str, positions: np.ndarray) -> torch.Tensor:
        ref = parts[0]
        for i, t in zip(positions.tolist(), parts):
            if t.shape != ref.shape or t.dtype != ref.dtype:
                raise DataError(f"{self.field}[{i}] {what}: {t.dtype} {tuple(t.shape)} differs from "
                                f"{self.field}[{positions[0]}]'s {ref.dtype} {tuple(ref.shape)}")
        return torch.stack([t.detach().cpu() for t in parts])


def rows_as_arrays(x: torch.Tensor, y: torch.Tensor) -> tuple[np.ndarray, str, np.ndarray, str]:
    """(x array, x dtype name, y array, y dtype name) for a shard record."""
    xa, xn = to_array(x)
    ya, yn = to_array(y)
    return xa, xn, ya, yn


def check_dtypes(source: SampleSource) -> None:
    """DataError when the samples hold a dtype shard records cannot carry."""
    x, y = source.first()
    for what, t in (("input", x), ("target", y)):
        try:
            record_dtype(t)
        except ValueError as exc:
            raise DataError(f"{source.field} {what}: {exc}") from None
