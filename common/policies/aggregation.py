"""Aggregation rules: how much each update in a step counts.

Delta rules (``mean``, ``samples``) answer the weights of
``w <- w + sum_k weight_k * delta_k``. The ``loss`` rule (Hermes Alg. 2)
answers the share of a worker's model in a convex blend with the global one.
Each rule is a registered policy (``mean``, ``samples``, ``power``, ``loss``)
whose ``weights`` the engine calls for a step's updates; what a rule needs
(a barrier, compute powers, a candidate loss) is declared on its class.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.base import Policy, register
from hermes.common.policies.lr_scaling import batch_scaled_lr

if TYPE_CHECKING:
    from hermes.common.config import RunConfig

log = logging.getLogger(__name__)

__all__ = ["aggregation_weights", "batch_scaled_lr", "loss_blend_weight", "mean_weights", "power_weights",
           "sample_weights", "LossParams"]


class LossParams(BaseModel):
    """The run config's ``loss`` section (aggregation 'loss')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    eval_samples: int = Field(
        default=512, gt=0, description="Validation samples each candidate model is scored on (Hermes Alg. 2).")
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
    if cls is None or not issubclass(cls, DeltaRule) or cls.needs_compute_power or cls.needs_candidate_loss:
        raise ValueError(f"unknown aggregation rule {rule!r}; known: mean, samples")
    return cls.weights(samples, None)


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


class DeltaRule(Policy):
    """An aggregation policy: the weights of one step's updates."""

    # Topology 'collective': each rank's weight in the all-reduced gradient
    # (client/collective.py GradientAllReduce): its samples, 1, or its compute power.
    gradient_weighting: ClassVar[str] = "samples"

    @classmethod
    def from_config(cls, config: RunConfig, **context: Any) -> type[DeltaRule]:
        return cls

    @classmethod
    def weights(cls, samples: Sequence[int], powers: Sequence[float] | None) -> list[float]:
        raise NotImplementedError


@register("aggregation", "mean")
class Mean(DeltaRule):
    """Plain averaging (DP-SGD, ASP, SSP)."""

    gradient_weighting: ClassVar[str] = "mean"

    @classmethod
    def weights(cls, samples: Sequence[int], powers: Sequence[float] | None) -> list[float]:
        return mean_weights(len(samples))


@register("aggregation", "samples")
class Samples(DeltaRule):
    """lambda_k = b_k / sum(b) (OmniLearn Eq. 4b)."""

    @classmethod
    def weights(cls, samples: Sequence[int], powers: Sequence[float] | None) -> list[float]:
        return sample_weights(samples)


@register("aggregation", "power")
class Power(DeltaRule):
    """EDP-SGD (DP paper Sec. 4.2): weights CP_m / sum(CP) from the allocator's measured compute powers."""

    requires: ClassVar[dict[str, str]] = {
        "barrier": "weighs the updates of one synchronous step against each other (EDP-SGD); "
                   "{sync} folds one update at a time, so every weight would be 1",
    }
    needs_compute_power: ClassVar[bool] = True
    gradient_weighting: ClassVar[str] = "power"

    @classmethod
    def weights(cls, samples: Sequence[int], powers: Sequence[float] | None) -> list[float]:
        if powers is None:
            raise ValueError("aggregation 'power' needs one compute power per update")
        return power_weights(powers)


@register("aggregation", "loss", "loss-weighted")
class LossWeighted(DeltaRule):
    """Hermes Alg. 2: each update is blended with the global model by inverse validation loss (Eq. 5-6)."""

    requires: ClassVar[dict[str, str]] = {
        "free_running": "folds one update at a time against the global model (Hermes Alg. 2); "
                        "it needs sync {providers}, not {sync}",
        "server_model": "blends models on the server; topology 'collective' has no server model",
    }
    needs_candidate_loss: ClassVar[bool] = True
    update_from_baseline: ClassVar[bool] = True

    @classmethod
    def pushes_from_baseline(cls, config: RunConfig) -> bool:
        return config.loss.reference == "baseline"

    @classmethod
    def check_params(cls, config: RunConfig) -> None:
        if config.loss.server_lr != 1.0 and config.loss.reference != "pull":
            raise ValueError("loss.server_lr scales since-pull deltas: it needs loss.reference 'pull'")

    @classmethod
    def weights(cls, samples: Sequence[int], powers: Sequence[float] | None) -> list[float]:
        # One update at a time, blended by loss_blend_weight: within the step it counts fully.
        return mean_weights(len(samples))
