"""The policies the engine asks, built once from the run config.

``build_policies`` builds them through the registry (``common/policies``); the
engine only asks the bundle what a policy needs (``needs_candidate_loss``)
and what it answers (``weigh``, ``rate``). The sync strategy and the
allocator are the pure policies of ``hermes.common``; the aggregation rule
and the learning rate are thin adapters here because they need the
server's model state (the loss probe) or the cluster's batches.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hermes.common.aggregation import loss_blend_weight, power_weights
from hermes.common.allocation import Allocator, make_allocator
from hermes.common.config import RunConfig
from hermes.common.policies import base as registry
from hermes.common.policies.aggregation import DeltaRule
from hermes.common.policies.lr_scaling import LrScaling
from hermes.common.policies.robust import Krum, RobustRule
from hermes.common.sync import PushInfo, SyncStrategy
from hermes.common.task import Task
from hermes.common.tensors import ModelSpec
from hermes.common.wire import Payload
from hermes.server.lossprobe import LossProbe
from hermes.server.metrics import ServerMetrics
from hermes.server.state import ModelState

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Contribution:
    """One update of a fold, as an aggregation rule sees it."""

    info: PushInfo
    payload: Payload
    # Loss of w0 + G on the validation subset (rules with needs_candidate_loss only).
    candidate_loss: float | None = None


class FoldContext(Protocol):
    """What a rule may ask of the engine while weighing a group."""

    @property
    def version(self) -> int: ...

    def throughput(self, worker_id: str) -> float | None: ...


class Aggregation(Protocol):
    # The rule scores each update's candidate model before it is folded (Hermes Alg. 2).
    needs_candidate_loss: bool
    # How the model state folds the weights: "apply" (w += sum_k lambda_k G_k), "blend"
    # (w <- (1 - a) w + a (w0 + G), one update; both also the journal's op) or "combine" (the
    # rule's combined() delta is applied with weight 1, journaled as "apply").
    op: str
    # The global model's probe loss, where the rule has a probe (screening bounds first candidates by it).
    reference_loss: Callable[[], float] | None

    async def candidate_loss(self, payload: Payload) -> float | None: ...

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        """The group's weights and the facts worth logging beside them."""
        ...


class _ApplyRule:
    needs_candidate_loss = False
    op = "apply"
    reference_loss: Callable[[], float] | None = None

    async def candidate_loss(self, payload: Payload) -> float | None:
        return None


class SampleWeights(_ApplyRule):
    """A delta rule of the registry: ``mean`` (1/K), ``samples`` (lambda_k = b_k / sum b, OmniLearn Eq. 4b)."""

    def __init__(self, rule: type[DeltaRule]) -> None:
        self.rule = rule

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        return self.rule.weights([c.info.samples for c in group], None), {}


class PowerWeights(_ApplyRule):
    """EDP-SGD Sec. 4.2: each update weighs its worker's normalised compute power."""

    def __init__(self, power_of: Callable[[str], float | None]) -> None:
        self.power_of = power_of

    def power(self, worker_id: str, ctx: FoldContext) -> float:
        power = self.power_of(worker_id)
        if power is None:
            power = ctx.throughput(worker_id)
        return power or 1.0  # before any measurement every worker counts alike (DP-SGD Alg. 1 line 5)

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        return power_weights([self.power(c.info.worker_id, ctx) for c in group]), {}


class LossBlend:
    """Hermes Alg. 2: blend one worker's model in by the inverse losses of both models.

    ``reference`` "baseline" is the paper's: the push is G = w_worker - w0 and the
    model becomes (1 - a) w + a (w0 + G). "pull" (a deviation, ``loss.reference``):
    the push is the worker's change since its last pull and the model becomes
    w + a * delta, a from the same Eq. 5-6 losses with w + delta as the candidate.
    """

    needs_candidate_loss = True

    def __init__(self, probe: LossProbe, metrics: ServerMetrics, reference: str = "baseline",
                 server_lr: float = 1.0, sharpness: float = 1.0) -> None:
        self.probe = probe
        self.sharpness = sharpness
        self.metrics = metrics
        self.server_lr = server_lr
        self.from_current = reference == "pull"
        self.op = "apply" if self.from_current else "blend"
        self.reference_loss: Callable[[], float] | None = lambda: probe.global_loss()[1]

    async def candidate_loss(self, payload: Payload) -> float | None:
        # Scored outside the step lock, so concurrent pushes are scored in parallel and
        # serialised only for the fold. From-baseline candidates depend only on w0 and G;
        # a since-pull candidate is w + delta for the model of the moment, which another
        # fold may move before this one: its weight is then from a slightly older w.
        return await asyncio.to_thread(self.probe.candidate_loss, payload, from_current=self.from_current)

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        (update,) = group  # config validation keeps ``loss`` to one-at-a-time strategies
        assert update.candidate_loss is not None
        extra: dict[str, Any] = {}
        if ctx.version == 0:
            weight = 1.0  # Hermes Alg. 2 initial step: sigma <- G
        else:
            _, global_loss = await asyncio.to_thread(self.probe.global_loss)
            # Screening refuses non-finite candidates; a global model whose loss
            # overflows is worse than any finite candidate, so it takes the step whole.
            weight = (loss_blend_weight(global_loss, update.candidate_loss, sharpness=self.sharpness) if math.isfinite(global_loss)
                      else 1.0)
            extra = {"global_loss": round(global_loss, 6)}
        extra["candidate_loss"] = round(update.candidate_loss, 6)
        self.metrics.blend_weight.observe(weight)
        if self.from_current and ctx.version > 0:
            weight *= self.server_lr  # w <- w + server_lr * a * delta
        return [weight], extra


class StalenessMix:
    """FedAsync (Xie et al. 2019, Alg. 1): x <- (1 - alpha_t) x + alpha_t x_new, alpha_t = alpha * s(t - tau).

    The policy (``common/policies/federated.py``) answers alpha_t from the
    update's staleness; the blend step is the one Hermes' loss rule uses.
    """

    needs_candidate_loss = False
    op = "blend"
    reference_loss: Callable[[], float] | None = None

    def __init__(self, rule: Any) -> None:
        self.rule = rule

    async def candidate_loss(self, payload: Payload) -> float | None:
        return None

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        (update,) = group  # the policy requires a one-at-a-time strategy
        weight = self.rule.mixing_weight(update.info.staleness)
        return [weight], {"alpha_t": round(weight, 6)}


class StalenessWeights(_ApplyRule):
    """FedBuff (Nguyen et al. 2022, Alg. 1): one step from the buffer, eta_g * s(tau_k) / K per delta."""

    def __init__(self, rule: Any) -> None:
        self.rule = rule

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        # The model moves only at a release, so the staleness at push time is the staleness now.
        return self.rule.weights([c.info.staleness for c in group]), {}


def stack_updates(group: Sequence[Contribution]) -> torch.Tensor:
    """The group's deltas as rows of one fp32 matrix (half-precision ones widened)."""
    stack = torch.empty((len(group), group[0].payload.numel), dtype=torch.float32)
    for row, update in zip(stack, group):
        for off, piece in update.payload.fp32_pieces():
            row[off:off + piece.numel()] = piece
        update.payload.release_widened()
    return stack


class RobustStep(_ApplyRule):
    """The robust rules (common/policies/robust.py): median and trimmed mean combine the step's
    updates coordinate by coordinate into one delta (``op`` "combine"); Krum answers weights that
    keep the m chosen updates (mean over them) and drop the others."""

    def __init__(self, rule: RobustRule) -> None:
        self.rule = rule
        self.op = "apply" if isinstance(rule, Krum) else "combine"

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        if not isinstance(self.rule, Krum):
            # Every update counts alike; the step itself is combined() below.
            return [1.0 / len(group)] * len(group), {"combined": self.rule.name}
        stack = await asyncio.to_thread(stack_updates, group)
        chosen, scores = self.rule.select(stack)
        weights = [1.0 / len(chosen) if i in chosen else 0.0 for i in range(len(group))]
        return weights, {"krum_scores": [round(s, 6) for s in scores]}

    def combined(self, group: Sequence[Contribution]) -> Payload:
        """The step as one fp32 delta (median / trimmed mean of the group)."""
        assert not isinstance(self.rule, Krum)
        flat = self.rule.combine(stack_updates(group))
        return Payload(torch.float32, (flat,), group[0].payload.shapes)


class LearningRate(Protocol):
    def rate(self, step_batch: int, cluster_batch: Callable[[], int]) -> float:
        """The lr for a worker stepping on ``step_batch`` samples; ``cluster_batch()`` sums the active workers'."""
        ...


@dataclass(frozen=True)
class ScaledRate:
    """The run's lr through its lr-scaling policy (``none``, or OmniLearn Eq. 5b's ``batch-scaled``)."""

    lr: float
    scaling: LrScaling

    def rate(self, step_batch: int, cluster_batch: Callable[[], int]) -> float:
        # Summed only for rules that read it: every work request asks for a rate.
        total = cluster_batch() if self.scaling.needs_global_batch else step_batch
        return self.scaling.lr(self.lr, step_batch, total)


@dataclass(frozen=True)
class Policies:
    sync: SyncStrategy
    allocator: Allocator
    aggregation: Aggregation
    lr: LearningRate


def build_policies(
    config: RunConfig,
    *,
    spec: ModelSpec,
    state: ModelState,
    train_samples: int,
    validation: Any,
    metrics: ServerMetrics,
    task: Task,
) -> Policies:
    """The run's policies, from the registry; what each needs is read from its declarations."""
    topology = registry.get("topology", config.topology)
    sync = registry.make("sync", config, name=getattr(topology, "server_sync", None))
    allocator = make_allocator(config, dss_max=train_samples, epoch_samples=train_samples)
    rule = registry.get("aggregation", config.aggregation)
    aggregation: Aggregation
    if rule.needs_candidate_loss:
        probe = LossProbe(task, spec, state, validation, samples=config.loss.eval_samples, seed=config.seed,
                          metrics=metrics)
        aggregation = LossBlend(probe, metrics, config.loss.reference, config.loss.server_lr, config.loss.sharpness)
    elif rule.update_from_baseline:
        aggregation = StalenessMix(registry.make("aggregation", config))
    elif rule.weighs_by_staleness:
        aggregation = StalenessWeights(registry.make("aggregation", config))
    elif issubclass(rule, RobustRule):
        aggregation = RobustStep(registry.make("aggregation", config))
    elif rule.needs_compute_power:
        # Allocators that measure compute power (partition) answer it; the others leave it to throughput.
        aggregation = PowerWeights(getattr(allocator, "power", lambda _w: None))
    else:
        assert issubclass(rule, DeltaRule)
        aggregation = SampleWeights(rule)
    return Policies(sync=sync, allocator=allocator, aggregation=aggregation,
                    lr=ScaledRate(config.lr, registry.make("lr_scaling", config)))
