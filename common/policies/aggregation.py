"""Aggregation rules: how much each update in a step counts, and how the model folds it.

Each rule is a registered policy and the ONE place its arithmetic lives: it
declares how the server's model state folds its weights (``op``) and what
each update must carry for it to weigh (a candidate loss, a compute power,
the updates themselves), and answers the weights as a pure function of
those facts (``weigh``). The engine (``server/engine/policies.py``) only
gathers the facts the rule declares and applies the step.

Delta rules (``mean``, ``samples``, ``power``, ``fedbuff``) answer the weights of
``w <- w + sum_k weight_k * delta_k`` (op "apply"). ``loss`` (Hermes Alg. 2)
and ``fedasync`` answer a worker's share in a blend with the global model
(op "blend"); the robust rules (``robust.py``) combine or select a barrier's
updates.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.base import Core, Policy, register
from hermes.common.policies.lr_scaling import batch_scaled_lr
from hermes.common.policies.staleness import StalenessFunction, staleness_weight

log = logging.getLogger(__name__)

__all__ = ["AggregationRule", "Step", "Update", "Weighing", "aggregation_weights", "batch_scaled_lr",
           "loss_blend_weight", "mean_weights", "power_weights", "sample_weights", "LossParams"]


class LossParams(BaseModel):
    """The run config's ``loss`` section (aggregation 'loss')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    eval_samples: int = Field(
        default=512, gt=0, description="Validation samples each candidate model is scored on (Hermes Alg. 2).")
    # A deviation (docs/papers.md): Hermes Alg. 2 scores on a fixed validation subset. On 8 fixed samples the
    # global model's loss fell to 0.01 late in training (1,000 devices, docs/simulation.md, "Why hermes is slow
    # late"), so every whole delta scored 3-5x worse and the Eq. 5-6 share collapsed.
    probe_rotation: bool = Field(
        default=False, description="Score each model version on its own eval_samples validation samples, drawn "
        "afresh per version from the whole validation split (deterministic by seed and version), so the fold "
        "cannot come to favour a fixed subset. false: one fixed subset for the run (Hermes Alg. 2).")
    # A deviation (docs/papers.md): a convex blend of two models moves the global model
    # at most as far as one of them, so four workers' blended progress is about one
    # worker's. 'pull' adds each worker's own progress instead (w <- w + a * delta).
    reference: Literal["baseline", "pull"] = Field(
        default="baseline", description="What a push describes and how it is folded: baseline (Hermes Alg. 2: "
        "the worker's model as w0 + G, blended w <- (1-a) w + a (w0 + G)) or pull (the change since the "
        "worker's last pull, added w <- w + a * delta, a from the same Eq. 5-6 losses, the candidate "
        "being w + delta).")
    # Hermes has no server lr; with 'pull' the Eq. 5-6 share (about 0.5 for similar losses)
    # halves every worker's step, which a server lr can give back (FedBuff's eta_g plays this role).
    server_lr: float = Field(
        default=1.0, gt=0.0, le=4.0, description="With loss.reference pull: w <- w + server_lr * a * delta "
        "(1 = the Eq. 5-6 share alone); only 1 with baseline, whose blend is convex.")
    sharpness: float = Field(
        default=1.0, gt=0.0, le=8.0, description="Exponent p on the Eq. 5 inverse losses: the worker's share is "
        "T_g^p / (T_g^p + T_w^p) (1 = Hermes).")
    # A deviation (docs/papers.md): Hermes' convex blend cannot overshoot, but added since-pull
    # deltas can. With C workers training at once each delta is about C versions stale, and C of
    # them at a share of ~0.45 each moved the model ~0.45 C deltas per round: at C = 100 on mnist1d
    # (generated population, 2026-11-27) staleness 60-80, shares 0.3-0.45, loss 2.2 -> 67 in 290
    # versions. Hinge with a = 1 / (b + 1) is s = (b + 1) / (tau + 1) past b, so a round of C pushes
    # moves the model ~0.45 (b + 1) deltas whatever C is (asynchronous SGD's step ~ 1 / delay:
    # Mishchenko et al. 2022; Koloskova et al. 2022), and nothing changes up to b versions stale.
    staleness: StalenessFunction = Field(
        default="constant", description="With loss.reference pull: scale each delta's share by FedAsync's "
        "staleness function s(tau) (Sec. 5.2): constant (1 = Hermes), polynomial ((tau + 1)^-a) or hinge (1 up "
        "to b versions stale, then 1 / (a (tau - b) + 1)).")
    staleness_a: float = Field(default=0.2, gt=0.0, le=16.0, description="a of loss.staleness (polynomial "
                               "exponent, hinge slope; hinge with a = 1 / (b + 1) is min(1, (b + 1) / (tau + 1))).")
    staleness_b: int = Field(default=4, ge=0, le=10_000, description="b of loss.staleness hinge: versions stale "
                             "at full share.")
    # A deviation (docs/papers.md): the same bound on a round's step, from the number of workers training at
    # once instead of each delta's staleness. C devices that start together push deltas 0..C-1 versions
    # stale, so a staleness rule still adds the harmonic sum ~(b+1) ln C shares in that first round (1,000
    # devices, C = 100: loss 2.3 -> 6.2, then stuck at chance); scaled by m / C, every round adds ~m shares.
    # A deviation (docs/compression.md, "BatchNorm statistics"): Hermes folds a model's every float, and
    # BatchNorm's running statistics added at a share stop describing the folded weights: on edge-resnet
    # (lte, 2026-11-28) variance deltas were 338 of a push's norm 339, candidates went negative, and a fold
    # at share 0.18 of a candidate scoring 1.29 took the global model to chance (loss 2.30) for 30 s.
    bn_stats: Literal["fold", "recalibrate"] = Field(
        default="fold", description="BatchNorm running statistics: fold (added with the rest of the delta, "
        "Hermes) or recalibrate (candidates scored with the probe samples' batch statistics; each fold's "
        "statistics measured on the probe samples, SWA's procedure, Izmailov et al. 2018 Sec. 3.2).")
    concurrency_scale: int = Field(
        default=0, ge=0, le=10_000, description="m: with loss.reference pull, each delta's share times "
        "min(1, m / n), n the workers training at once (holding a concurrency.limit slot, else active): a round "
        "of n pushes adds about m shares whatever n; 0: off (Hermes).")


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


def aggregation_weights(rule: str, samples: Sequence[int]) -> list[float]:
    """Weights of a step's updates by the delta rule ``rule`` ("mean" or "samples")."""
    from hermes.common.policies.base import UnknownPolicy, get

    try:
        cls = get("aggregation", rule)
    except UnknownPolicy:
        cls = None
    if cls is None or not issubclass(cls, (Mean, Samples)):
        raise ValueError(f"unknown aggregation rule {rule!r}; known: mean, samples")
    return cls.weights(samples)


def loss_blend_weight(global_loss: float, candidate_loss: float, *, floor: float = 1e-12,
                      sharpness: float = 1.0) -> float:
    """Share of the worker's model in the new global model (Hermes Eq. 5-6, Alg. 2).

    Eq. 5 weighs by inverse test loss, W_worker = 1/T_w and W_global = 1/T_g;
    Eq. 6 is then the convex combination
        w_new = (W_global * w_global + W_worker * w_worker) / (W_global + W_worker),
    so the worker's share is (1/T_w) / (1/T_w + 1/T_g) = T_g / (T_g + T_w).
    Losses are floored so a perfect (zero-loss) model cannot divide by zero.
    ``sharpness`` p (a deviation, docs/papers.md) weighs by 1/T^p instead:
    the share is T_g^p / (T_g^p + T_w^p), and p = 1 is Eq. 6 itself.
    """
    for name, v in (("global_loss", global_loss), ("candidate_loss", candidate_loss)):
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite, non-negative loss, got {v!r}")
    g, c = max(global_loss, floor), max(candidate_loss, floor)
    if sharpness != 1.0:
        # In logs: (c / g) ** p overflows a float for a finite but huge loss ratio.
        z = sharpness * (math.log(c) - math.log(g))
        return 1.0 / (1.0 + math.exp(z)) if z < 700.0 else 0.0
    return g / (g + c)


@dataclass(frozen=True)
class Update:
    """One update of a step, as a rule weighs it: the facts the engine gathered for the rule's declarations."""

    samples: int  # samples the worker trained on for it (b_k of OmniLearn Eq. 4b)
    staleness: int = 0  # server steps since the worker pulled the model it trained from
    power: float | None = None  # the worker's compute power (rules with needs_compute_power)
    candidate_loss: float | None = None  # loss of the candidate model (rules with needs_candidate_loss)


@dataclass(frozen=True)
class Step:
    """The model the step folds into."""

    version: int  # the global model's version before the step (0: nothing folded yet)
    global_loss: float | None = None  # its probe loss (rules with needs_candidate_loss, version > 0)
    training: int | None = None  # workers training at once (rules with needs_training_count)


@dataclass(frozen=True)
class Weighing:
    """A rule's answer: one weight per update and the facts worth logging beside them."""

    weights: list[float]
    facts: dict[str, Any] = field(default_factory=dict)
    # The Eq. 5-6 share before any server lr (the loss rule), for the blend-weight metric.
    share: float | None = None


class AggregationRule(Policy):
    """An aggregation policy: how a step's updates fold into the model, and their weights."""

    # How the model state folds the weights: "apply" (w += sum_k lambda_k G_k), "blend"
    # (w <- (1 - a) w + a (w0 + G), one update; both also the journal's op) or "combine" (the
    # rule's combine() of the stacked updates is applied with weight 1, journaled as "apply").
    op: str = "apply"
    # weigh() needs the step's updates themselves, stacked as rows of one fp32 matrix (Krum).
    needs_update_stack: ClassVar[bool] = False
    # A candidate is scored as the current model plus the delta (True) or as w0 + G (False).
    candidate_from_current: bool = False
    # weigh() needs Step.training, the number of workers training at once.
    needs_training_count: bool = False
    # Topology 'collective': each rank's weight in the all-reduced gradient
    # (client/collective.py GradientAllReduce): its samples, 1, or its compute power.
    gradient_weighting: ClassVar[str] = "samples"

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        """The weights of ``updates`` folded into the model of ``step`` (``stack`` for needs_update_stack)."""
        raise NotImplementedError

    def combine(self, stack: Any) -> Any:
        """The step's one delta from the stacked updates (rules whose op is "combine")."""
        raise NotImplementedError(f"aggregation {self.name!r} weighs updates, it does not combine them")


class DeltaRule(AggregationRule):
    """A rule whose weights come from the updates' sample counts alone (and powers): no state, no parameters."""

    @classmethod
    def weights(cls, samples: Sequence[int]) -> list[float]:
        raise NotImplementedError

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        return Weighing(self.weights([u.samples for u in updates]))

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> DeltaRule:
        return cls()


@register("aggregation", "mean")
class Mean(DeltaRule):
    """Plain averaging (DP-SGD, ASP, SSP)."""

    gradient_weighting: ClassVar[str] = "mean"

    @classmethod
    def weights(cls, samples: Sequence[int]) -> list[float]:
        return mean_weights(len(samples))


@register("aggregation", "samples")
class Samples(DeltaRule):
    """lambda_k = b_k / sum(b) (OmniLearn Eq. 4b)."""

    @classmethod
    def weights(cls, samples: Sequence[int]) -> list[float]:
        return sample_weights(samples)


@register("aggregation", "power")
class Power(AggregationRule):
    """EDP-SGD (DP paper Sec. 4.2): weights CP_m / sum(CP) from the allocator's measured compute powers."""

    requires: ClassVar[dict[str, str]] = {
        "barrier": "weighs the updates of one synchronous step against each other (EDP-SGD); "
                   "{sync} folds one update at a time, so every weight would be 1",
    }
    needs_compute_power: ClassVar[bool] = True
    gradient_weighting: ClassVar[str] = "power"

    @classmethod
    def build(cls, core: Core, *args: Any, **params: Any) -> Power:
        return cls()

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        # Before any measurement every worker counts alike (DP-SGD Alg. 1 line 5).
        return Weighing(power_weights([u.power or 1.0 for u in updates]))


@register("aggregation", "loss", "loss-weighted")
class LossWeighted(AggregationRule):
    """Hermes Alg. 2: blend one worker's model in by the inverse losses of both models (Eq. 5-6).

    ``reference`` "baseline" is the paper's: the push is G = w_worker - w0 and the
    model becomes (1 - a) w + a (w0 + G). "pull" (a deviation, ``loss.reference``):
    the push is the worker's change since its last pull and the model becomes
    w + server_lr * a * delta, a from the same Eq. 5-6 losses with w + delta as the candidate.
    """

    requires: ClassVar[dict[str, str]] = {
        "free_running": "folds one update at a time against the global model (Hermes Alg. 2); "
                        "it needs sync {providers}, not {sync}",
        "server_model": "blends models on the server; topology 'collective' has no server model",
    }
    needs_candidate_loss: ClassVar[bool] = True
    update_from_baseline: ClassVar[bool] = True
    op = "blend"
    sections: ClassVar[tuple[str, ...]] = ("loss",)

    def __init__(self, params: LossParams) -> None:
        self.params = params
        # Instance attributes over the class's: loss.reference decides how a push folds.
        self.candidate_from_current = params.reference == "pull"
        self.needs_training_count = self.candidate_from_current and params.concurrency_scale > 0
        self.op = "apply" if self.candidate_from_current else "blend"

    @classmethod
    def build(cls, core: Core, *, loss: LossParams, **params: Any) -> LossWeighted:
        return cls(loss)

    @classmethod
    def pushes_from_baseline(cls, *, loss: LossParams, **sections: Any) -> bool:
        return loss.reference == "baseline"

    @classmethod
    def check_params(cls, core: Core, *, loss: LossParams, **sections: Any) -> None:
        if loss.server_lr != 1.0 and loss.reference != "pull":
            raise ValueError("loss.server_lr scales since-pull deltas: it needs loss.reference 'pull'")
        if loss.staleness != "constant" and loss.reference != "pull":
            raise ValueError("loss.staleness scales since-pull deltas: it needs loss.reference 'pull'")
        if loss.concurrency_scale and loss.reference != "pull":
            raise ValueError("loss.concurrency_scale scales since-pull deltas: it needs loss.reference 'pull'")

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        (update,) = updates  # config validation keeps ``loss`` to one-at-a-time strategies
        assert update.candidate_loss is not None
        facts: dict[str, Any] = {}
        if step.version == 0:
            weight = 1.0  # Hermes Alg. 2 initial step: sigma <- G
        else:
            assert step.global_loss is not None
            # Screening refuses non-finite candidates; a global model whose loss
            # overflows is worse than any finite candidate, so it takes the step whole.
            weight = (loss_blend_weight(step.global_loss, update.candidate_loss, sharpness=self.params.sharpness)
                      if math.isfinite(step.global_loss) else 1.0)
            facts = {"global_loss": round(step.global_loss, 6)}
        facts["candidate_loss"] = round(update.candidate_loss, 6)
        share = weight
        if self.candidate_from_current and step.version > 0:
            p = self.params
            damping = staleness_weight(p.staleness, update.staleness, p.staleness_a, p.staleness_b)
            if p.staleness != "constant":
                facts["staleness_scale"] = round(damping, 6)
            if p.concurrency_scale and step.training:
                # m / n of the workers training now: n pushes a round add ~m shares (docs/papers.md).
                crowd = min(1.0, p.concurrency_scale / step.training)
                facts["concurrency_scale"] = round(crowd, 6)
                damping *= crowd
            weight *= p.server_lr * damping  # w <- w + server_lr * a * s(tau) * delta
        return Weighing([weight], facts, share=share)
