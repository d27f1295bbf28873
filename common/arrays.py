"""Tensors <-> the numpy arrays shard records carry, for every dtype a record knows.

Records hold numpy arrays because a bare reader (msgpack + numpy) must be
able to decode them; numpy has no bfloat16, so a bfloat16 tensor travels as
its raw 16 bits (uint16) with its real dtype named beside it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from hermes.common.shards import RECORD_DTYPES

_TORCH_BY_NAME: dict[str, torch.dtype] = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
    "int64": torch.int64, "float16": torch.float16, "float32": torch.float32, "float64": torch.float64,
    "bfloat16": torch.bfloat16,
}
if hasattr(torch, "uint16"):  # torch >= 2.3
    _TORCH_BY_NAME.update({"uint16": torch.uint16, "uint32": torch.uint32})
_NAME_BY_TORCH = {v: k for k, v in _TORCH_BY_NAME.items()}


def record_dtype(t: torch.Tensor) -> str:
    """The record dtype name of a tensor; ValueError for one records cannot carry."""
    name = _NAME_BY_TORCH.get(t.dtype)
    if name is None:
        raise ValueError(f"dtype {t.dtype} cannot be carried by shard records "
                         f"(use one of {sorted(RECORD_DTYPES)})")
    return name


def to_array(value: Any) -> tuple[np.ndarray, str]:
    """(numpy array, record dtype name) of a tensor or array-like; bfloat16 as its uint16 bits."""
    if isinstance(value, torch.Tensor):
        name = record_dtype(value)
        t = value.detach().cpu()
        if name == "bfloat16":
            return t.contiguous().view(torch.int16).numpy().view(np.uint16), name
        if name in ("uint16", "uint32"):  # numpy() of these needs a recent torch: go by the signed view
            signed = torch.int16 if name == "uint16" else torch.int32
            return t.contiguous().view(signed).numpy().view(RECORD_DTYPES[name]), name
        return t.numpy(), name
    arr = np.asarray(value)
    if arr.dtype.name not in RECORD_DTYPES or arr.dtype.name == "bfloat16":
        raise ValueError(f"dtype {arr.dtype} cannot be carried by shard records (use one of {sorted(RECORD_DTYPES)})")
    return arr, arr.dtype.name


def to_tensor(arr: np.ndarray, name: str = "") -> torch.Tensor:
    """A tensor sharing ``arr``'s memory, of record dtype ``name`` (default: the array's own)."""
    name = name or arr.dtype.name
    if name == "bfloat16":
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16)
    if name in ("uint16", "uint32"):
        if name not in _TORCH_BY_NAME:  # an old torch without unsigned 16/32-bit tensors: widen
            return torch.from_numpy(arr.astype(np.int64))
        signed = np.int16 if name == "uint16" else np.int32
        return torch.from_numpy(np.ascontiguousarray(arr).view(signed)).view(_TORCH_BY_NAME[name])
    return torch.from_numpy(np.ascontiguousarray(arr))
