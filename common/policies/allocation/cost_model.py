"""Per-worker cost model for Hermes' sizing (Sec. IV-A): seconds per mini-batch as a function of MBS.

The paper treats the time per mini-batch K as a constant of the worker
(``constant_k_model``); we fit K(MBS) = a + b * MBS to the worker's own
history (``fit_cost_model``) because on CPUs a bigger batch is not free.
``cost_fit`` in the config switches between the two.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hermes.common.policies.allocation._checks import is_int

# ---------------------------------------------------------------------------
# Cost model


@dataclass(frozen=True)
class CostModel:
    """Seconds per mini-batch K(MBS) = a + b * MBS for one worker.

    The paper's K is constant per mini-batch (b = 0). A fixed per-step cost a
    (launch, optimizer step, Python) plus a per-sample cost b is closer to what
    devices do, and it is what makes a larger MBS cheaper per sample.
    """

    a: float
    b: float

    def __post_init__(self) -> None:
        for name in ("a", "b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")

    def per_batch(self, batch_size: int) -> float:
        if not is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        return self.a + self.b * batch_size

    def cycle_seconds(self, dss: int, batch_size: int) -> float:
        """t = K(MBS) * E * DSS / MBS with E = 1 (Hermes Eq. 3).

        The batch count is ceil(DSS / MBS): a last, partial mini-batch is still one step.
        """
        if not is_int(dss) or dss < 1:
            raise ValueError(f"dss must be an integer >= 1, got {dss!r}")
        return self.per_batch(batch_size) * (-(-dss // batch_size))


def _per_batch_observations(
    observations: Sequence[tuple[int, int, float]], max_history: int
) -> tuple[np.ndarray, np.ndarray]:
    if not is_int(max_history) or max_history < 1:
        raise ValueError(f"max_history must be an integer >= 1, got {max_history!r}")
    obs = list(observations)[-max_history:]
    if not obs:
        raise ValueError("observations must not be empty")
    batch_sizes = np.empty(len(obs))
    y = np.empty(len(obs))
    for i, item in enumerate(obs):
        if len(item) != 3:
            raise ValueError(f"observations[{i}] must be (batch_size, dss, seconds), got {item!r}")
        m, d, s = item
        if not is_int(m) or m < 1:
            raise ValueError(f"observations[{i}] batch_size must be an integer >= 1, got {m!r}")
        if not is_int(d) or d < 1:
            raise ValueError(f"observations[{i}] dss must be an integer >= 1, got {d!r}")
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s) or s <= 0:
            raise ValueError(f"observations[{i}] seconds must be a finite number > 0, got {s!r}")
        batch_sizes[i] = m
        y[i] = s / (-(-d // m))  # per-batch time, inverting Hermes Eq. 3
    return batch_sizes, y


def fit_cost_model(observations: Sequence[tuple[int, int, float]], *, max_history: int = 20) -> CostModel:
    """Least-squares fit of per-batch time y = a + b * MBS (K of Hermes Eq. 3, made MBS-dependent).

    ``observations`` are (batch_size, dss, cycle_seconds), most recent last; only the
    last ``max_history`` are used so the model follows a device whose speed
    changes. Per-batch time is y = seconds / ceil(dss / batch_size).
    """
    batch_sizes, y = _per_batch_observations(observations, max_history)
    if np.unique(batch_sizes).size < 2:
        # One MBS cannot separate the per-step cost a from the per-sample cost b.
        # Assume cost proportional to samples (a = 0): it predicts the same
        # per-sample speed at any MBS, the neutral guess; a constant K instead
        # would claim that doubling MBS halves the cycle time. Once the worker
        # has run at a second MBS the fit separates a and b.
        return CostModel(a=0.0, b=float(np.mean(y) / batch_sizes[0]))
    m_mean, y_mean = float(np.mean(batch_sizes)), float(np.mean(y))
    b = float(np.sum((batch_sizes - m_mean) * (y - y_mean)) / np.sum((batch_sizes - m_mean) ** 2))
    a = y_mean - b * m_mean
    # Negative costs are noise, not physics; refit the other coefficient alone.
    # a < 0 and b < 0 cannot both happen: y_mean = a + b * m_mean > 0.
    if a < 0:
        a, b = 0.0, float(np.sum(batch_sizes * y) / np.sum(batch_sizes * batch_sizes))
    elif b < 0:
        a, b = y_mean, 0.0
    return CostModel(a=max(a, 0.0), b=max(b, 0.0))


def constant_k_model(observations: Sequence[tuple[int, int, float]], *, max_history: int = 20) -> CostModel:
    """The paper's assumption: K is a constant time per mini-batch (Hermes Eq. 3): a = mean(y), b = 0."""
    _, y = _per_batch_observations(observations, max_history)
    return CostModel(a=float(np.mean(y)), b=0.0)


