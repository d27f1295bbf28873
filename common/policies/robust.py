"""Byzantine-robust aggregation for the barrier presets (what Flower offers as FedMedian,
FedTrimmedAvg and Krum): one synchronous step's updates combined so that a few poisoned ones
cannot steer it.

- ``median``: Yin et al. 2018, "Byzantine-Robust Distributed Learning: Towards Optimal
  Statistical Rates" (ICML), Definition 1: every coordinate of the step is the median of that
  coordinate over the step's updates (the mean of the two middle values for an even count).
- ``trimmed-mean``: ibid., Definition 2: per coordinate, the largest and the smallest
  beta·K values are dropped and the rest averaged (``robust.trim_fraction`` = beta).
- ``krum``: Blanchard et al. 2017, "Machine Learning with Adversaries: Byzantine Tolerant
  Gradient Descent" (NeurIPS), Sec. 4: score(i) = sum of ||V_i - V_j||^2 over the K - f - 2
  updates j closest to V_i; Krum takes the update with the lowest score. Multi-Krum (ibid.,
  Sec. 5) averages the m lowest-scoring ones (``robust.keep`` = m, ``robust.byzantine`` = f).

Under FedBuff's buffer (issue 29) the step's updates are the K buffered ones, computed from
models up to tau versions old. Staleness and robustness combine the way Kardam (Damaskinos et
al. 2018, "Asynchronous Byzantine Machine Learning", Sec. 3) orders them: each update is first
dampened by its staleness, s(tau) = 1 / sqrt(1 + tau) (FedBuff's own s, Nguyen et al. 2022,
Alg. 1), then the robust rule runs over the dampened rows (``staleness_dampened``); under a
barrier tau = 0 and nothing changes. Zeno++ (Xie et al. 2020) scores each asynchronous update
against a server gradient instead: the server's screening does that for every preset.

Each update is still screened on its own before the step (norm, probe loss, quarantine); these
rules then replace the step's weighted sum, so every worker counts alike (OmniLearn's sample
weights do not apply). Krum's guarantee needs K >= 2f + 3 updates in the step; with fewer the
score uses at least one neighbour and the fold logs that the guarantee does not hold.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.aggregation import AggregationRule, Step, Update, Weighing
from hermes.common.policies.base import Core, register

if TYPE_CHECKING:
    # Imported where a rule runs: the run config imports this module for its params, and a
    # command that only validates a config (or refuses it) should not pay for torch.
    import torch

log = logging.getLogger(__name__)

_NEEDS = {
    "grouped": "combines the updates of one step (robust aggregation: a barrier's round or a FedBuff buffer); "
               "{sync} folds one update at a time, so there is nothing to combine: it needs sync {providers}",
    "server_model": "combines updates on the server; topology 'collective' has no server model",
}


class RobustParams(BaseModel):
    """The run config's ``robust`` section (aggregations 'median', 'trimmed-mean', 'krum')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    trim_fraction: float = Field(
        default=0.25, ge=0.0, lt=0.5, description="trimmed-mean: beta, the share of each coordinate's largest and "
        "smallest values dropped (floor(beta*K) each side; Yin et al. 2018, Def. 2). 0.25 drops one of four.")
    byzantine: int = Field(
        default=1, ge=0, description="krum: f, the Byzantine updates tolerated in a step (each score sums the "
        "K - f - 2 closest others; Blanchard et al. 2017, Sec. 4).")
    keep: int = Field(
        default=1, ge=1, description="krum: m, the lowest-scoring updates averaged: 1 is Krum, more is Multi-Krum.")
    # Blanchard et al. 2017 define Krum for n > 2f + 2 only (Sec. 4); a small cluster would never step.
    krum_few: Literal["fallback", "skip"] = Field(
        default="fallback", description="krum with fewer than 2f + 3 updates in a step: 'fallback' scores each on "
        "max(1, K - f - 2) neighbours and warns once; 'skip' applies no update (the paper's n > 2f + 2).")
    # Yin et al. 2018, Def. 2 take beta*m values off each end, beta*m an integer there.
    trim_rounding: Literal["floor", "ceil"] = Field(
        default="floor", description="trimmed-mean: values dropped per end when beta*K is not an integer: floor "
        "(0.25 of 3 drops none) or ceil (drops one).")


def staleness_dampened(stack: torch.Tensor, staleness: Sequence[int]) -> torch.Tensor:
    """Rows scaled by s(tau) = 1 / sqrt(1 + tau) (FedBuff Alg. 1; Kardam's dampening before the filter)."""
    if not any(staleness):
        return stack
    import torch

    scale = torch.tensor([1.0 / math.sqrt(1.0 + t) for t in staleness], dtype=stack.dtype)
    return stack * scale[:, None]


def coordinate_median(stack: torch.Tensor) -> torch.Tensor:
    """Yin et al. 2018, Def. 1: the coordinate-wise median of K updates (rows of ``stack``)."""
    k = stack.shape[0]
    ordered = stack.sort(dim=0).values
    if k % 2:
        return ordered[k // 2].clone()
    return (ordered[k // 2 - 1] + ordered[k // 2]) / 2


def trimmed_mean(stack: torch.Tensor, beta: float, rounding: str = "floor") -> torch.Tensor:
    """Yin et al. 2018, Def. 2: per coordinate, drop floor (or ceil) of beta*K values at each end, average the rest."""
    k = stack.shape[0]
    cut = math.floor(beta * k) if rounding == "floor" else math.ceil(beta * k)
    if k - 2 * cut < 1:
        raise ValueError(f"trim_fraction {beta} drops all {k} updates")
    if cut == 0:
        return stack.mean(dim=0)
    return stack.sort(dim=0).values[cut:k - cut].mean(dim=0)


def krum_scores(stack: torch.Tensor, byzantine: int) -> list[float]:
    """Blanchard et al. 2017, Sec. 4: each update's summed squared distance to its K - f - 2 closest others."""
    import torch

    k = stack.shape[0]
    if k == 1:
        return [0.0]
    sq = (stack * stack).sum(dim=1, dtype=torch.float64)
    # ||a - b||^2 = ||a||^2 + ||b||^2 - 2 a.b, in fp64 so that close updates are not lost to rounding.
    gram = stack.double() @ stack.double().T
    dist = (sq[:, None] + sq[None, :] - 2 * gram).clamp_min(0.0)
    neighbours = max(1, k - byzantine - 2)
    out = []
    for i in range(k):
        others = torch.cat([dist[i, :i], dist[i, i + 1:]])
        out.append(float(others.sort().values[:neighbours].sum()))
    return out


def krum_select(scores: list[float], keep: int) -> list[int]:
    """Indices of the ``keep`` lowest scores (Krum: 1; Multi-Krum: m), ties to the earlier update."""
    return sorted(range(len(scores)), key=lambda i: (scores[i], i))[:keep]


class RobustRule(AggregationRule):
    """Base of the robust rules: they need a barrier's group of updates and replace its weighted sum.

    Median and trimmed mean combine the step's updates coordinate by coordinate into one delta
    (op "combine"); Krum answers weights that keep the m chosen updates (mean over them) and
    drop the others.
    """

    requires: ClassVar[dict[str, str]] = _NEEDS
    op = "combine"

    def __init__(self, params: RobustParams) -> None:
        self.params = params

    sections: ClassVar[tuple[str, ...]] = ("robust",)

    @classmethod
    def build(cls, core: Core, *, robust: RobustParams, **params: Any) -> RobustRule:
        return cls(robust)

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        """The step's one delta from the updates (rows of ``stack``); Krum selects instead."""
        raise NotImplementedError(f"aggregation {self.name!r} selects updates, it does not combine them")

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        # Every update counts alike; the step itself is combine() of the stack.
        return Weighing([1.0 / len(updates)] * len(updates), {"combined": self.name})


@register("aggregation", "median")
class Median(RobustRule):
    """Coordinate-wise median of the step's updates (Yin et al. 2018, Def. 1)."""

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        return coordinate_median(stack)


@register("aggregation", "trimmed-mean")
class TrimmedMean(RobustRule):
    """Coordinate-wise beta-trimmed mean of the step's updates (Yin et al. 2018, Def. 2)."""

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        return trimmed_mean(stack, self.params.trim_fraction, self.params.trim_rounding)


@register("aggregation", "krum")
class Krum(RobustRule):
    """Krum / Multi-Krum (Blanchard et al. 2017): the mean of the m updates closest to their neighbours."""

    op = "apply"
    needs_update_stack: ClassVar[bool] = True
    _said_small = False

    def select(self, stack: torch.Tensor) -> tuple[list[int], list[float]]:
        """(chosen indices, every update's score)."""
        k, f = stack.shape[0], self.params.byzantine
        if k < 2 * f + 3 and not self._said_small:
            self._said_small = True  # once a run: every step of a small cluster would say it again
            log.warning("krum: %d updates in a step, fewer than 2f + 3 = %d: Krum's Byzantine guarantee does not "
                        "hold for this cluster", k, 2 * f + 3)
        scores = krum_scores(stack, f)
        return krum_select(scores, min(self.params.keep, k)), scores

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        assert stack is not None, "krum selects among the stacked updates"
        k, f = stack.shape[0], self.params.byzantine
        if self.params.krum_few == "skip" and k < 2 * f + 3:
            # Blanchard et al. 2017, Sec. 4: Krum needs n > 2f + 2; this step's updates are not applied.
            return Weighing([0.0] * len(updates), {"krum_skipped": k})
        chosen, scores = self.select(staleness_dampened(stack, [u.staleness for u in updates]))
        # The chosen updates are averaged, each dampened by its staleness (tau = 0 under a barrier).
        weights = [1.0 / len(chosen) / math.sqrt(1.0 + updates[i].staleness) if i in chosen else 0.0
                   for i in range(len(updates))]
        return Weighing(weights, {"krum_scores": [round(s, 6) for s in scores]})
