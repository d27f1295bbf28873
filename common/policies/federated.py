"""Asynchronous federated aggregation: FedAsync's staleness-weighted mixing, FedBuff's buffer.

FedAsync (Xie, Koyejo, Gupta, "Asynchronous Federated Optimization", 2019,
arXiv:1903.03934, Alg. 1 and Sec. 5.2): the server mixes each arriving
worker model into the global one as it comes,

    x_t = (1 - alpha_t) x_{t-1} + alpha_t x_new,   alpha_t = alpha * s(t - tau),

where tau is the version the worker trained from and s a staleness function:

- constant: s = 1;
- polynomial: s_a(t - tau) = (t - tau + 1)^(-a);
- hinge: s_{a,b}(t - tau) = 1 if t - tau <= b, else 1 / (a (t - tau - b) + 1).

The paper's runs use alpha in {0.4, 0.6, 0.8, 0.9}, polynomial a = 0.5 and
hinge a = 10, b = 4 (Sec. 6). The worker sends its model as a change since
the first model (x_new = w0 + G), so the engine's ``blend`` step computes the
mixing exactly (the same step as Hermes Alg. 2, with alpha_t in place of the
loss-derived share).

FedBuff (Nguyen, Malik, Zhan, Yousefpour, Rabbat, Malek, Huba, "Federated
Learning with Buffered Asynchronous Aggregation", AISTATS 2022, Alg. 1):
workers train asynchronously and never wait; the server keeps their deltas
Delta_k = x_new,k - x_tau_k in a buffer and, once K have arrived, takes one
step with their (staleness-scaled) mean times a server learning rate:

    x <- x + eta_g * (1/K) * sum_k s(tau_k) Delta_k,   s(tau) = 1 / sqrt(1 + tau),

tau_k being how many server steps the model moved since worker k pulled
(the paper's s; ``staleness_scaling = "none"`` gives s = 1). Sync
``fedbuff`` keeps the buffer (it answers BUFFER_AND_REPLY and releases every
K pushes); aggregation ``fedbuff`` answers the weights eta_g s(tau_k) / K.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.aggregation import AggregationRule, Step, Update, Weighing
from hermes.common.policies.base import Core, get, register
from hermes.common.policies.robust import RobustParams, RobustRule
from hermes.common.policies.staleness import StalenessFunction, staleness_weight
from hermes.common.policies.sync import Decision, PushInfo, Release, SyncStrategy, Verdict

log = logging.getLogger(__name__)

__all__ = ["FedAsync", "FedAsyncParams", "FedBuff", "FedBuffParams", "FedBuffer", "fedbuff_weights",
           "staleness_weight"]

class FedAsyncParams(BaseModel):
    """The run config's ``fedasync`` section (aggregation 'fedasync')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    alpha: float = Field(default=0.6, gt=0.0, le=1.0,
                         description="Mixing weight alpha of a fresh update (FedAsync Alg. 1; the paper runs 0.4-0.9).")
    staleness: StalenessFunction = Field(
        default="polynomial", description="Staleness function s(t - tau): constant (1), polynomial "
                                          "((t - tau + 1)^-a) or hinge (1 up to b, then 1 / (a (t - tau - b) + 1)).")
    a: float = Field(default=0.5, ge=0.0, description="Exponent (polynomial) or slope (hinge) a of s; the paper: "
                                                      "0.5 polynomial, 10 hinge.")
    b: int = Field(default=4, ge=0, description="Hinge b: staleness tolerated at full weight (the paper: 4).")
    # FedAsync Sec. 4, Alg. 1: each worker minimises g_{x_tau}(x) = f(x) + rho/2 ||x - x_tau||^2; Sec. 6 runs the
    # CIFAR-10 CNN with rho = 0.005.
    rho: float = Field(default=0.005, ge=0.0, allow_inf_nan=False,
                       description="rho of the agent's proximal term rho/2 ||x - x_tau||^2, x_tau the model it "
                                   "started from (FedAsync Sec. 4; Sec. 6: 0.005); 0 drops the term.")
    # Alg. 1 numbers the model a mix creates t and stamps a worker's task with the version it got, so an update
    # trained from the newest model has t - tau = 1; counting it 0 gives a fresh update the full alpha.
    staleness_from: Literal[0, 1] = Field(
        default=1, description="t - tau of an update trained from the newest model: 1 (FedAsync Alg. 1's "
                               "numbering: the mix creates version tau + 1) or 0 (a fresh update at full alpha).")
    # Issue 29: FedAsync has no robust rule of its own; this mixes in a robust statistic of recent worker models.
    robust: Literal["none", "median", "trimmed-mean", "krum"] = Field(
        default="none", description="Mix in, instead of the arriving model, this robust rule's statistic of the "
        "latest models of the last robust.window workers (common/policies/robust.py StalenessWindow; "
        "parameters in the robust section); none: FedAsync as the paper runs it.")


@register("aggregation", "fedasync")
class FedAsync(AggregationRule):
    """FedAsync (Xie et al. 2019): each update mixed in with alpha_t = alpha * s(t - tau)."""

    requires: ClassVar[dict[str, str]] = {
        "free_running": "mixes one update at a time into the global model as it arrives (FedAsync Alg. 1); "
                        "it needs sync {providers}, not {sync}",
        "server_model": "mixes models on the server; topology 'collective' has no server model",
    }
    update_from_baseline: ClassVar[bool] = True
    # The blend step is the one Hermes' loss rule uses, with alpha_t in place of the loss share.
    op = "blend"

    def __init__(self, params: FedAsyncParams, robust: RobustParams | None = None) -> None:
        self.params = params
        # fedasync.robust: the rule a StalenessWindow of worker models runs (the engine keeps the window).
        self.window_rule: RobustRule | None = None
        if params.robust != "none":
            rule = get("aggregation", params.robust)
            assert issubclass(rule, RobustRule), rule
            self.window_rule = rule(robust or RobustParams())

    sections: ClassVar[tuple[str, ...]] = ("fedasync", "robust")

    @classmethod
    def build(cls, core: Core, *, fedasync: FedAsyncParams, robust: RobustParams | None = None,
              **params: Any) -> FedAsync:
        return cls(fedasync, robust)

    @classmethod
    def proximal_rho(cls, *args: Any, fedasync: FedAsyncParams, **sections: Any) -> float:
        return fedasync.rho

    def mixing_weight(self, versions_behind: int) -> float:
        """alpha_t = alpha * s(t - tau) for an update trained from a model ``versions_behind`` versions old.

        The paper's t is the version the mix creates and tau the one the
        worker trained from, so a worker that trained from the newest model
        has t - tau = 1, not 0: t - tau = versions_behind + staleness_from (1).
        """
        p = self.params
        weight = p.alpha * staleness_weight(p.staleness, versions_behind + p.staleness_from, p.a, p.b)
        assert 0.0 < weight <= 1.0 and math.isfinite(weight), weight
        return weight

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        (update,) = updates  # the policy requires a one-at-a-time strategy
        weight = self.mixing_weight(update.staleness)
        return Weighing([weight], {"alpha_t": round(weight, 6)})


class FedBuffParams(BaseModel):
    """The run config's ``fedbuff`` section (sync and aggregation 'fedbuff')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    buffer_size: int = Field(default=10, ge=1, description="K: updates buffered per server step (FedBuff Alg. 1; the "
                                                         "paper runs K = 10 with 100-1000 concurrent clients).")
    server_lr: float = Field(default=1.0, gt=0.0, description="Server learning rate eta_g applied to the buffer's "
                                                            "mean delta (FedBuff Alg. 1).")
    staleness_scaling: Literal["sqrt", "none"] = Field(
        default="sqrt", description="Scale each delta by s(tau) = 1 / sqrt(1 + tau) (the paper's) or not (none).")


def fedbuff_weights(staleness: Sequence[int], server_lr: float, scaling: str = "sqrt") -> list[float]:
    """eta_g * s(tau_k) / K for the K buffered deltas of one FedBuff step (Alg. 1)."""
    if not staleness or any(t < 0 for t in staleness):
        raise ValueError(f"need one non-negative staleness per buffered update, got {list(staleness)}")
    k = len(staleness)
    return [server_lr * (1.0 / math.sqrt(1.0 + t) if scaling == "sqrt" else 1.0) / k for t in staleness]


@register("sync", "fedbuff")
class FedBuffer(SyncStrategy):
    """FedBuff's buffer (Alg. 1): every push is kept and acknowledged at once; each K-th releases the step."""

    # "grouped": a release folds the K buffered updates as one step, so robust rules apply (issue 29).
    provides: ClassVar[frozenset[str]] = frozenset({"asynchronous", "buffered", "grouped"})

    def __init__(self, buffer_size: int = 10) -> None:
        super().__init__()
        if buffer_size < 1:
            raise ValueError(f"fedbuff buffer_size must be >= 1, got {buffer_size}")
        self.buffer_size = buffer_size
        self.count = 0

    sections: ClassVar[tuple[str, ...]] = ("fedbuff",)

    @classmethod
    def build(cls, core: Core, *, fedbuff: FedBuffParams, **params: Any) -> SyncStrategy:
        return cls(buffer_size=fedbuff.buffer_size)

    def on_push(self, push: PushInfo) -> Verdict:
        self.count += 1
        return Verdict(Decision.BUFFER_AND_REPLY)

    def take_release(self) -> Release | None:
        if self.count < self.buffer_size:
            return None
        self.count = 0
        return Release(aggregate=(), wake=())


@register("aggregation", "fedbuff")
class FedBuff(AggregationRule):
    """FedBuff (Nguyen et al. 2022): one server step from K buffered deltas, eta_g * s(tau_k) / K each."""

    requires: ClassVar[dict[str, str]] = {
        "buffered": "steps once per K buffered updates (FedBuff Alg. 1); it needs sync {providers}, not {sync}",
    }

    def __init__(self, params: FedBuffParams) -> None:
        self.params = params

    sections: ClassVar[tuple[str, ...]] = ("fedbuff",)

    @classmethod
    def build(cls, core: Core, *, fedbuff: FedBuffParams, **params: Any) -> FedBuff:
        return cls(fedbuff)

    def weights(self, staleness: Sequence[int]) -> list[float]:
        return fedbuff_weights(staleness, self.params.server_lr, self.params.staleness_scaling)

    def weigh(self, updates: Sequence[Update], step: Step, stack: Any = None) -> Weighing:
        # The model moves only at a release, so the staleness at push time is the staleness now.
        return Weighing(self.weights([u.staleness for u in updates]))
