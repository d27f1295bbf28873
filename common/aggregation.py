"""Aggregation rules: how much each update in a step counts.

The server folds updates as ``w <- w + sum_k weight_k * delta_k``; a rule only
answers the weights. Later issues add ``power`` (EDP-SGD) and ``loss``
(Hermes Alg. 2).
"""

from __future__ import annotations

from typing import Sequence


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


def aggregation_weights(rule: str, samples: Sequence[int]) -> list[float]:
    if rule == "mean":
        return mean_weights(len(samples))
    if rule == "samples":
        return sample_weights(samples)
    raise ValueError(f"unknown aggregation rule {rule!r}; known: mean, samples")
