"""Aggregation rules: how much each update in a step counts.

Delta rules (``mean``, ``samples``) answer the weights of
``w <- w + sum_k weight_k * delta_k``. The ``loss`` rule (Hermes Alg. 2)
answers the share of a worker's model in a convex blend with the global one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def mean_weights(count: int) -> list[float]:
    """Plain model averaging: every update of the step counts 1/K."""
    if count <= 0:
        raise ValueError("need at least one update")
    return [1.0 / count] * count


def sample_weights(samples: Sequence[int]) -> list[float]:
    """lambda_k = b_k / sum(b) (OmniLearn Eq. 4b, ACSOS Eq. 2-3): bigger batches count more."""
    total = sum(samples)
    if not samples or total <= 0 or any(s < 0 for s in samples):
        raise ValueError(f"sample counts must be non-negative with a positive sum, got {list(samples)}")
    return [s / total for s in samples]


def power_weights(powers: Sequence[float]) -> list[float]:
    """EDP-SGD (DP-SGD paper Sec. 4.2): gradient g_m weighted by normalised compute power CP_m / sum(CP)."""
    total = sum(powers)
    if not powers or any(not math.isfinite(p) or p <= 0 for p in powers):
        raise ValueError(f"compute powers must be finite and positive, got {list(powers)}")
    return [p / total for p in powers]


def batch_scaled_lr(lr: float, batch: int, global_batch: int) -> float:
    """OmniLearn Eq. 5b: eta_k = eta * b_k / sum_i b_i (sum_i b_i = B = K*b).

    Literal: with uniform batches every worker steps at eta / K.
    """
    if lr <= 0 or batch <= 0 or global_batch <= 0:
        raise ValueError(f"lr, batch and global batch must be positive, got {lr}, {batch}, {global_batch}")
    return lr * batch / global_batch


def aggregation_weights(rule: str, samples: Sequence[int]) -> list[float]:
    if rule == "mean":
        return mean_weights(len(samples))
    if rule == "samples":
        return sample_weights(samples)
    raise ValueError(f"unknown aggregation rule {rule!r}; known: mean, samples")


def loss_blend_weight(global_loss: float, candidate_loss: float, *, floor: float = 1e-12) -> float:
    """Share of the worker's model in the new global model (Hermes Eq. 5-6, Alg. 2).

    Eq. 5 weighs by inverse test loss, W_worker = 1/T_w and W_global = 1/T_g;
    Eq. 6 is then the convex combination
        w_new = (W_global * w_global + W_worker * w_worker) / (W_global + W_worker),
    so the worker's share is (1/T_w) / (1/T_w + 1/T_g) = T_g / (T_g + T_w).
    Losses are floored so a perfect (zero-loss) model cannot divide by zero.
    """
    for name, v in (("global_loss", global_loss), ("candidate_loss", candidate_loss)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite, non-negative loss, got {v!r}")
    g, c = max(global_loss, floor), max(candidate_loss, floor)
    return g / (g + c)
