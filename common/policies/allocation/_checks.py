"""Argument checks shared by the Hermes sizing modules (straggler, cost model, dual search)."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np


def is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_pow2(v: int) -> bool:
    return is_int(v) and v >= 1 and (v & (v - 1)) == 0


def check_mbs_range(mbs_min: int, mbs_max: int) -> None:
    for name, v in (("mbs_min", mbs_min), ("mbs_max", mbs_max)):
        if not is_pow2(v):
            raise ValueError(f"{name} must be a power of two, got {v!r}")
    if mbs_max < mbs_min:
        raise ValueError(f"mbs_max must be >= mbs_min ({mbs_min}), got {mbs_max}")


def finite_values(values: Iterable[float], name: str) -> np.ndarray:
    arr = np.asarray(list(values), dtype=float)
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr
