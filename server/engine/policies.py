"""The policies the engine asks, built once from the run config.

``build_policies`` builds them through the registry (``common/policies``); the
engine only asks the bundle what a policy needs (``needs_candidate_loss``)
and what it answers (``weigh``, ``rate``). The sync strategy, the allocator
and the aggregation rule are the pure policies of ``hermes.common``; ``RuleFold``
gathers, for any rule, the facts it declares it needs that only the server has
(the loss probe's candidate and global losses, compute powers, the stacked
updates) and asks the rule for the weights.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from hermes.common.config import RunConfig
from hermes.common.policies.aggregation import AggregationRule, Step, Update
from hermes.common.policies.allocation import Allocator, PowerMeter
from hermes.common.policies.lr_scaling import LrScaling
from hermes.common.policies.robust import RobustRule, StalenessWindow, staleness_dampened
from hermes.common.policies.sync import PushInfo, SyncStrategy
from hermes.common.policies.topology import Topology
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
    # Screening's clip (issue 29): the update folds at scale x the weight its rule gives it.
    scale: float = 1.0


class FoldContext(Protocol):
    """What a rule may ask of the engine while weighing a group."""

    @property
    def version(self) -> int: ...

    def throughput(self, worker_id: str) -> float | None: ...

    def training_count(self) -> int: ...


def stack_updates(group: Sequence[Contribution]) -> torch.Tensor:
    """The group's deltas as rows of one fp32 matrix (half-precision ones widened)."""
    stack = torch.empty((len(group), group[0].payload.numel), dtype=torch.float32)
    for row, update in zip(stack, group):
        for off, piece in update.payload.fp32_pieces():
            row[off:off + piece.numel()] = piece
        update.payload.release_widened()
    return stack


class RuleFold:
    """The run's aggregation rule with what it needs of the server: the facts it declares, gathered here."""

    def __init__(self, rule: AggregationRule, *, probe: LossProbe | None, metrics: ServerMetrics,
                 power_of: Callable[[str], float | None] | None, window: StalenessWindow | None = None) -> None:
        self.rule = rule
        self.probe = probe
        self.metrics = metrics
        self.power_of = power_of
        # Bounds one round's powers against each other (engine.claims.Claims.cap_powers, issue 29); set by the engine.
        self.power_cap: Callable[[Sequence[str], list[float]], list[float]] | None = None
        # How the model state folds the weights (AggregationRule.op); also the journal's op.
        self.op = rule.op
        # A robust rule under a sync that folds one update at a time runs over this window (issue 29):
        # each fold's step is the rule's statistic of the window's rows (a delta combined, or a model blended).
        self.window = window
        self._window_step: Payload | None = None
        if window is not None and rule.op != "blend":
            self.op = "combine"
        self.needs_candidate_loss = rule.needs_candidate_loss
        # The global model's probe loss, where the rule has a probe (screening bounds first candidates by it).
        self.reference_loss: Callable[[], float] | None = (
            None if probe is None else (lambda: probe.global_loss()[1]))

    async def candidate_loss(self, payload: Payload) -> float | None:
        if self.probe is None:
            return None
        # Scored outside the step lock, so concurrent pushes are scored in parallel and
        # serialised only for the fold. From-baseline candidates depend only on w0 and G;
        # a since-pull candidate is w + delta for the model of the moment, which another
        # fold may move before this one: its weight is then from a slightly older w.
        return await asyncio.to_thread(self.probe.candidate_loss, payload,
                                       from_current=self.rule.candidate_from_current)

    def power(self, worker_id: str, ctx: FoldContext) -> float | None:
        """The allocator's measured compute power (partition), else the worker's throughput."""
        power = self.power_of(worker_id) if self.power_of is not None else None
        return ctx.throughput(worker_id) if power is None else power

    async def weigh(self, group: Sequence[Contribution], ctx: FoldContext) -> tuple[list[float], dict[str, Any]]:
        """The group's weights and the facts worth logging beside them."""
        rule = self.rule
        facts: dict[str, Any] = {}
        if self.window is not None:
            facts = await asyncio.to_thread(self._windowed, group, ctx.version)
            if self.op == "combine":
                return [1.0] * len(group), facts
        global_loss = None
        if self.probe is not None and ctx.version > 0:
            _, global_loss = await asyncio.to_thread(self.probe.global_loss)
        stack = await asyncio.to_thread(stack_updates, group) if rule.needs_update_stack else None
        powers: list[float | None] = [None] * len(group)
        if rule.needs_compute_power:
            powers = [self.power(c.info.worker_id, ctx) for c in group]
            if self.power_cap is not None and all(p is not None for p in powers):
                powers = list(self.power_cap([c.info.worker_id for c in group], [p or 0.0 for p in powers]))
        updates = [Update(samples=c.info.samples, staleness=c.info.staleness, candidate_loss=c.candidate_loss,
                          power=power) for c, power in zip(group, powers)]
        training = ctx.training_count() if rule.needs_training_count else None
        answer = rule.weigh(updates, Step(version=ctx.version, global_loss=global_loss, training=training), stack)
        if answer.share is not None:
            self.metrics.blend_weight.observe(answer.share)
        return answer.weights, {**answer.facts, **facts}

    def _windowed(self, group: Sequence[Contribution], version: int) -> dict[str, Any]:
        """The group's rows into the window, and the window's step for combined() (the caller holds step_lock)."""
        assert self.window is not None
        for c in group:
            self.window.add(c.info.worker_id, c.info.base_version, c.info.staleness, stack_updates([c])[0])
        flat, facts = self.window.step(version)
        self._window_step = Payload(torch.float32, (flat,), group[0].payload.shapes)
        return facts

    def combined(self, group: Sequence[Contribution]) -> Payload:
        """The step as one fp32 delta (op "combine": median / trimmed mean of the group), or the window's step."""
        if self.window is not None:
            step, self._window_step = self._window_step, None
            assert step is not None, "weigh() computes the window's step first"
            return step
        # Under FedBuff's buffer, each row dampened by its staleness first (robust.staleness_dampened).
        flat = self.rule.combine(staleness_dampened(stack_updates(group), [c.info.staleness for c in group]))
        return Payload(torch.float32, (flat,), group[0].payload.shapes)


class LearningRate(Protocol):
    def rate(self, effective_batch_size: int, cluster_batch_size: Callable[[], int]) -> float:
        """The lr for a worker stepping on ``effective_batch_size`` samples.

        ``cluster_batch_size()`` sums the active workers' (B of OmniLearn Eq. 5b).
        """
        ...


@dataclass(frozen=True)
class ScaledRate:
    """The run's lr through its lr-scaling policy (``none``, or OmniLearn Eq. 5b's ``batch-scaled``)."""

    lr: float
    scaling: LrScaling

    def rate(self, effective_batch_size: int, cluster_batch_size: Callable[[], int]) -> float:
        # Summed only for rules that read it: every work request asks for a rate.
        total = cluster_batch_size() if self.scaling.needs_global_batch else effective_batch_size
        return self.scaling.lr(self.lr, effective_batch_size, total)


@dataclass(frozen=True)
class Policies:
    sync: SyncStrategy
    allocator: Allocator
    aggregation: RuleFold
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
    topology = config.policy("topology")
    assert issubclass(topology, Topology)
    sync = config.build_policy("sync", name=topology.server_sync)
    allocator: Allocator = config.build_policy("allocation", dss_max=train_samples, epoch_samples=train_samples)
    rule: AggregationRule = config.build_policy("aggregation")
    probe = None
    if rule.needs_candidate_loss:
        probe = LossProbe(task, spec, state, validation, samples=config.loss.eval_samples, seed=config.seed,
                          metrics=metrics, recalibrate=config.loss.bn_stats == "recalibrate",
                          rotate=config.loss.probe_rotation)
    # Allocators that measure compute power (partition) answer it; the others leave it to throughput.
    power_of = allocator.power if isinstance(allocator, PowerMeter) else None
    # Robust rules group a barrier's round or a buffer; under a sync that folds one update at a time they run
    # over a window of recent updates (fedasync.robust: of worker models, which are blended, not dampened).
    robust = rule if isinstance(rule, RobustRule) else getattr(rule, "window_rule", None)
    window = None
    if isinstance(robust, RobustRule) and "grouped" not in type(sync).provides:
        window = StalenessWindow.of(robust, models=rule.op == "blend")
    aggregation = RuleFold(rule, probe=probe, metrics=metrics, power_of=power_of, window=window)
    return Policies(sync=sync, allocator=allocator, aggregation=aggregation,
                    lr=ScaledRate(config.lr, config.build_policy("lr_scaling")))
