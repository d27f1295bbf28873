"""Memory model for the per-worker batch bound (OmniLearn Eq. 9, Fig. 6).

Used by the engine for every allocation: a worker's b_max is the largest
batch whose predicted memory fits ``memory_fraction`` of what it reports.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def fit_memory_model(samples: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least-squares fit of memory = m0 + m1 * batch (OmniLearn Eq. 9, Fig. 6).

    Eq. 9: M_total = M_model + M_grad + M_opt + M_act + M_batch. The first
    three do not depend on the batch (m0); M_act and M_batch grow linearly
    with it (Fig. 6a/6b), so their sum is m1 per sample.
    """
    if len({batch_size for batch_size, _ in samples}) < 2:
        raise ValueError("need measurements at two or more distinct batch sizes")
    batch_sizes = np.array([s[0] for s in samples], dtype=float)
    m = np.array([s[1] for s in samples], dtype=float)
    m1, m0 = np.polyfit(batch_sizes, m, 1)
    return float(m0), float(m1)


def max_batch_for_memory(m0: float, m1: float, budget: float) -> int:
    """Largest batch b with m0 + m1*b <= budget (OmniLearn Eq. 9 cap on b_max)."""
    if m1 <= 0:
        raise ValueError(f"per-sample memory m1 must be positive, got {m1}")
    batch_size = math.floor((budget - m0) / m1 + 1e-9)
    if batch_size < 1:
        raise ValueError(f"budget {budget} bytes does not fit one sample (m0={m0:.0f}, m1={m1:.0f})")
    return batch_size


