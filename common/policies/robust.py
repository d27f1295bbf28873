"""Byzantine-robust aggregation (what Flower offers as FedMedian, FedTrimmedAvg and Krum): a step's
updates combined so that a few poisoned ones cannot steer it, under a barrier, over a FedBuff
buffer, or over a staleness window when the sync folds one update at a time (asp, ssp, hermes).

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

Under a sync that folds one update at a time (asp, ssp, hermes; issue 29) there is no group, so
the rule runs over a staleness window (``StalenessWindow``): the latest accepted update of each of
the last ``robust.window`` workers, rows computed from a model more than ``robust.window_age``
versions old dropped. Each arrival folds R(window) once, with the arriving update in it. One row
per worker is Kardam's frequency filter (Damaskinos et al. 2018, Sec. 3: no worker may fill the
filter's window), so one worker, however fast it pushes, is one row: a minority the median outvotes.
With fewer than ``robust.window_min`` (3) rows there is no majority, and the step is clipped to the
smallest row's norm (worker models under fedasync are not clipped: alpha_t bounds the mix).
Each arrival moving the model by R(rows) keeps plain asp's pace: with honest rows alike R is
their mean, and a row stays about one pass of the workers, so every update counts about once in
all (a moving average of the updates, spread over the arrivals that follow it). Staleness: each
row is dampened before the rule, as in the buffer, by min(1, s(tau_j) / s(tau_med)) (``window_staleness``
'relative', default: tau_med the rows' median staleness, so honest windows of equal staleness give
the plain step and an attacker claiming fresh updates cannot shrink the honest rows; 'sqrt' is FedBuff's absolute s, 'none' no dampening), tau_j being how many versions
the model had moved since row j's worker pulled when row j arrived (FedBuff's tau at push time);
a row's ageing in the window afterwards is bounded by the age limit, not dampened (an honest row
would shrink with every later arrival, and asp with it). Under ``fedasync`` (``fedasync.robust``) the rows
are worker models w0 + G_j, the rule's statistic is the model mixed in, and staleness enters
through FedAsync's own alpha_t = alpha s(t - tau) of the arriving update (a model cannot be
scaled toward zero; Xie et al. 2019, Alg. 1).

Each update is still screened on its own before the step (norm, probe loss, quarantine); these
rules then replace the step's weighted sum, so every worker counts alike (OmniLearn's sample
weights do not apply). Krum's guarantee needs K >= 2f + 3 updates in the step; with fewer the
score uses at least one neighbour and the fold logs that the guarantee does not hold.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.aggregation import AggregationRule, Step, Update, Weighing
from hermes.common.policies.base import Core, register

if TYPE_CHECKING:
    # Imported where a rule runs: the run config imports this module for its params, and a
    # command that only validates a config (or refuses it) should not pay for torch.
    import torch

log = logging.getLogger(__name__)

# A sync that groups updates (a barrier's round, FedBuff's buffer) gives the rule its step; any other
# folds one update at a time and the rule runs over a StalenessWindow (issue 29), so only a server
# model is needed.
_NEEDS = {
    "server_model": "combines updates on the server; topology 'collective' has no server model",
}
WindowDampening = Literal["relative", "sqrt", "none"]


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
    # Issue 29: robust rules under a sync that folds one update at a time (asp, ssp, hermes, fedasync).
    window: int = Field(
        default=8, ge=1, description="Without a barrier or buffer: the rule combines, at each arrival, the latest "
        "accepted update of each of up to this many workers, the newest first (one row per worker: Kardam's "
        "frequency filter, Damaskinos et al. 2018, Sec. 3).")
    window_age: int = Field(
        default=32, ge=0, description="Without a barrier or buffer: a row computed from a model more than this "
        "many versions older than the current one leaves the window (the arriving update always counts).")
    window_min: int = Field(
        default=3, ge=1, description="Without a barrier or buffer: with fewer live rows than this, the window's "
        "step is clipped to its smallest row's norm (no honest majority to outvote a poisoned row yet).")
    window_staleness: WindowDampening = Field(
        default="relative", description="Without a barrier or buffer, delta rows dampened before the rule: "
        "'relative' min(1, s(tau_j)/s(tau_med)) with s(tau) = 1/sqrt(1+tau), tau_med the rows' median, 'sqrt' "
        "s(tau_j) (FedBuff Alg. 1), 'none'. Worker models (fedasync.robust) are never scaled: alpha_t does it.")


def staleness_dampened(stack: torch.Tensor, staleness: Sequence[int]) -> torch.Tensor:
    """Rows scaled by s(tau) = 1 / sqrt(1 + tau) (FedBuff Alg. 1; Kardam's dampening before the filter)."""
    if not any(staleness):
        return stack
    import torch

    scale = torch.tensor([1.0 / math.sqrt(1.0 + t) for t in staleness], dtype=stack.dtype)
    return stack * scale[:, None]


def window_dampened(stack: torch.Tensor, staleness: Sequence[int], mode: WindowDampening) -> torch.Tensor:
    """A window's rows dampened by staleness before the rule (Kardam Sec. 3: dampen, then filter).

    'sqrt': s(tau_j) = 1 / sqrt(1 + tau_j) (FedBuff Alg. 1); 'relative': min(1, s(tau_j) / s(tau_med)),
    tau_med the rows' median staleness, so honest windows of equal staleness give the plain step and a
    row staler than most counts less. The median, not the freshest row, is the reference: an attacker
    that always claims the newest version (tau 0) would otherwise shrink every honest row.
    """
    if mode == "none" or not staleness:
        return stack
    if mode == "sqrt":
        return staleness_dampened(stack, staleness)
    import torch

    med = float(torch.tensor(staleness, dtype=torch.float64).median())  # the lower middle value when even
    scale = torch.tensor([min(1.0, math.sqrt((1.0 + med) / (1.0 + t))) for t in staleness], dtype=stack.dtype)
    return stack if bool((scale == 1.0).all()) else stack * scale[:, None]


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
    """Base of the robust rules: they replace a step's weighted sum (a group's, or a StalenessWindow's).

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

    @property
    def window_rule(self) -> RobustRule:
        """The rule a StalenessWindow runs when the sync folds one update at a time (fedasync names one too)."""
        return self

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

    def combine(self, stack: torch.Tensor) -> torch.Tensor:
        """Over a StalenessWindow: the mean of the m chosen rows (Blanchard et al. 2017, Sec. 5; m = 1: Krum)."""
        k, f = stack.shape[0], self.params.byzantine
        if self.params.krum_few == "skip" and k < 2 * f + 3:
            return stack.new_zeros(stack.shape[1])  # Sec. 4's n > 2f + 2 not met: nothing moves
        chosen, _ = self.select(stack)
        return stack[chosen].mean(dim=0)

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


@dataclass(frozen=True)
class WindowRow:
    worker_id: str
    base_version: int  # the version the worker's update was computed from
    staleness: int  # versions the model had moved past base_version when the update arrived
    row: torch.Tensor  # the update, flat fp32


class StalenessWindow:
    """The rows a robust rule combines when the sync folds one update at a time (issue 29).

    The latest accepted update of each of the last ``size`` workers to push (a worker's new update
    replaces its old row: Kardam's frequency filter, Damaskinos et al. 2018, Sec. 3), rows computed
    from a model more than ``max_age`` versions old dropped. ``step`` is the rule over the rows,
    dampened by ``dampening`` (``window_dampened``); the engine folds it once per arrival. The
    window lives in memory: a resumed server starts with an empty one (the journal holds each step).
    """

    def __init__(self, rule: RobustRule, *, size: int, max_age: int, dampening: WindowDampening,
                 least: int = 0) -> None:
        self.rule = rule
        self.least = least
        self.size = size
        self.max_age = max_age
        self.dampening = dampening
        self.rows: dict[str, WindowRow] = {}  # insertion order: the oldest arrival first

    @classmethod
    def of(cls, rule: RobustRule, *, models: bool) -> StalenessWindow:
        """The window of ``rule``'s ``robust`` parameters; worker models (``models``) are never dampened."""
        p = rule.params
        return cls(rule, size=p.window, max_age=p.window_age, dampening="none" if models else p.window_staleness,
                   least=0 if models else p.window_min)

    def add(self, worker_id: str, base_version: int, staleness: int, row: torch.Tensor) -> None:
        self.rows.pop(worker_id, None)
        self.rows[worker_id] = WindowRow(worker_id, base_version, staleness, row)
        while len(self.rows) > self.size:
            del self.rows[next(iter(self.rows))]

    def live(self, version: int) -> list[WindowRow]:
        """The rows still young enough at ``version``; the newest arrival is kept whatever its age."""
        newest = next(reversed(self.rows))
        for w in [w for w, r in self.rows.items() if version - r.base_version > self.max_age and w != newest]:
            del self.rows[w]
        return list(self.rows.values())

    def step(self, version: int) -> tuple[torch.Tensor, dict[str, Any]]:
        """R(rows) at model ``version`` and the facts worth logging beside it (the rows' workers, staleness)."""
        import torch

        rows = self.live(version)
        # Each row's staleness when it arrived (FedBuff's tau at push time): its ageing in the window since is
        # bounded by max_age, not dampened, or every honest row would shrink with each later arrival.
        staleness = [max(0, r.staleness) for r in rows]
        stack = window_dampened(torch.stack([r.row for r in rows]), staleness, self.dampening)
        facts: dict[str, Any] = {"window": [r.worker_id for r in rows], "window_staleness": staleness,
                                 "combined": self.rule.name}
        step = self.rule.combine(stack)
        if len(rows) < self.least:
            # The median of two rows is their mean: no majority yet to outvote a poisoned one (Yin et al. 2018
            # bound the median's error only for an honest majority). Clipped to the smallest row's norm (norm
            # clipping, Sun et al. 2019, with the least row as the bound), a flip counts one honest step at most.
            bound, norm = float(stack.norm(dim=1).min()), float(step.norm())
            if norm > bound:
                step = step * (bound / norm)
                facts["window_clipped"] = round(bound / norm, 6)
        return step, facts
