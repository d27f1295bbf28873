"""``adaptive``: self-adaptive task allocation by gradient accumulation (Chao et al. Eq. 10, Algorithm 1).

Every worker uses the run's micro-batch; worker i accumulates w_i
micro-batches into each optimizer step and the cluster aggregates once per
step, so a round's work is sum(w) micro-batches, kept constant (Eq. 4, 16).
Once per data epoch w is re-estimated from the mean time each worker took for
its w_i micro-batches; re-allocation stops once the shares are stable
(``controllers.AdaptiveAccumulation``). A join or leave restarts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, field_validator

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._common import EpochClock, RebalanceParams, StepBatches
from hermes.common.policies.allocation._state import (
    malformed_as_state_error,
    stamp,
    str_ints,
    unstamp,
)
from hermes.common.policies.allocation.rounding import Bound, round_preserving_sum
from hermes.common.policies.base import Core, Policy, register

POLICY = "adaptive"


class AdaptiveParams(BaseModel):
    """The run config's ``adaptive`` section (allocation 'adaptive', Chao et al. Alg. 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    epsilon: float = Field(default=0.05, gt=0.0,
                           description="Stop re-allocating once every share moved less than this (relative) ...")
    patience: int = Field(default=2, ge=1, description="... this many epochs in a row (Chao et al.: stable after 4-5 epochs).")
    ratios: dict[str, float] | None = Field(
        default=None, description="Worker name -> share of each round's micro-batches set by the operator (Chao Sec. "
                                  "III-A); unset: equal shares. A worker not named gets the median share.")
    reallocate: bool = Field(
        default=True, description="Re-estimate the shares each epoch (Chao Alg. 1, Eq. 10); false keeps the "
                                  "operator's ratios for the whole run (Chao's static allocation).")

    @field_validator("ratios")
    @classmethod
    def _positive(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v is not None and (not v or any(not (r > 0 and math.isfinite(r)) for r in v.values())):
            raise ValueError(f"ratios must map worker names to positive finite numbers, got {v!r}")
        return v


def ratio_weights(workers: Sequence[str], ratios: Mapping[str, float]) -> list[float]:
    """Each worker's operator-set ratio (Chao Sec. III-A), the median of the given ratios for a worker not named.

    The counts are then w_i = C * r_i / sum(r) (``round_preserving_sum``), C = K * w0,
    so sum(w) = C and the total batch minibatch * C stays the run's.
    """
    given = sorted(ratios.values())
    fill = given[len(given) // 2]
    return [float(ratios.get(w, fill)) for w in workers]


def task_allocation_targets(current: Sequence[float], compute_times: Sequence[float]) -> list[float]:
    """Chao et al. Eq. 10: w_i' = (w_i / t_i) / sum_j (w_j / t_j) * sum_j w_j (real-valued).

    Equals w_i + u_i with u from the appendix closed form (Eq. 22), v_i ∝ w_i / t_i.
    """
    if len(current) != len(compute_times) or not current:
        raise ValueError("need one compute time per worker")
    if any(t <= 0 for t in compute_times) or any(w <= 0 for w in current):
        raise ValueError("task amounts and compute times must be positive")
    v = [w / t for w, t in zip(current, compute_times)]
    c = sum(current)
    return [vi / sum(v) * c for vi in v]


@dataclass
class AdaptiveAccumulation:
    """Chao et al. Algorithm 1 with its stop rule.

    Each ``update`` (once per epoch) recomputes w by Eq. 10 from the times
    measured at the current w. "Step 2 and step 3 could be cancelled when the
    ratio is not fluctuating": we stop re-allocating once the real-valued
    share w_i'/C changed by less than ``epsilon`` (relative, every worker)
    ``patience`` updates in a row (default: 5%, twice); the paper reports
    stability after 4-5 epochs. After that w stays fixed.
    """

    current: list[int]
    epsilon: float = 0.05
    patience: int = 2
    lower: int = 1
    stopped: bool = False
    _calm: int = 0
    _last_share: list[float] | None = None

    def update(self, compute_times: Sequence[float], *, upper: Bound = None) -> list[int]:
        """``upper``: per-worker caps on w_i (the samples of a cycle must fit in memory)."""
        if self.stopped:
            return list(self.current)
        total = sum(self.current)
        targets = task_allocation_targets(self.current, compute_times)
        share = [t / total for t in targets]
        prev = self._last_share or [w / total for w in self.current]
        change = max(abs(s - p) / p for s, p in zip(share, prev))
        self._last_share = share
        self._calm = self._calm + 1 if change < self.epsilon else 0
        if self._calm >= self.patience:
            self.stopped = True
        self.current = round_preserving_sum(targets, total, self.lower, upper)
        return list(self.current)

    def state_dict(self) -> dict[str, Any]:
        return {"current": list(self.current), "stopped": self.stopped, "calm": self._calm,
                "last_share": None if self._last_share is None else list(self._last_share)}

    @classmethod
    def from_state(cls, state: Mapping[str, Any], *, epsilon: float, patience: int, lower: int = 1
                   ) -> AdaptiveAccumulation:
        share = state["last_share"]
        return cls([int(w) for w in state["current"]], epsilon=epsilon, patience=patience, lower=lower,
                   stopped=bool(state["stopped"]), _calm=int(state["calm"]),
                   _last_share=None if share is None else [float(x) for x in share])



@register("allocation", "adaptive", "task-allocation")
class AdaptiveAllocator(Policy):
    requires: ClassVar[dict[str, str]] = {
        "lockstep": "splits one synchronous round's work among the workers, so every worker must push exactly "
                    "once per round: it needs sync {providers}, not {sync}",
    }
    sections: ClassVar[tuple[str, ...]] = ("adaptive", "rebalance")

    def __init__(self, *, batch_size: int, w0: int, epsilon: float, patience: int, warmup: int, epoch_samples: int,
                 ratios: Mapping[str, float] | None = None, reallocate: bool = True) -> None:
        # One optimizer step per cycle: the cycle is w_i micro-batches of ``batch_size``.
        self.sizes = StepBatches(steps=1, batch_size=batch_size, b_min=batch_size, b_max=batch_size)
        self.w0 = w0
        self.epsilon, self.patience, self.warmup = epsilon, patience, warmup
        self.ratios, self.reallocate = (dict(ratios) if ratios else None), reallocate
        self.clock = EpochClock(epoch_samples)
        self.max_w: dict[str, int] = {}
        self._times: dict[str, list[float]] = {}
        self._seen: dict[str, int] = {}
        self._alg: AdaptiveAccumulation | None = None
        self._epoch_due = False

    @classmethod
    def build(cls, core: Core, *, adaptive: AdaptiveParams, rebalance: RebalanceParams, epoch_samples: int,
              **params: Any) -> AdaptiveAllocator:
        a = adaptive
        return cls(batch_size=core.batch_size, w0=core.local_steps, epsilon=a.epsilon,
                   patience=a.patience, warmup=rebalance.warmup_cycles,
                   epoch_samples=epoch_samples, ratios=a.ratios, reallocate=a.reallocate)

    @property
    def stopped(self) -> bool:
        return self._alg is not None and self._alg.stopped

    def _restart(self) -> None:
        """After a join, leave or memory cap: keep the current shares, rescaled so sum(w) = K*w0 again."""
        ws = self.sizes.workers()
        self._alg = None
        if not ws:
            return
        total = len(ws) * self.w0
        upper = [self.max_w.get(w, total) for w in ws]
        # The operator's ratios, when set, are the basis of every split (Chao Sec. III-A);
        # otherwise the current shares are kept.
        weights = (ratio_weights(ws, self.ratios) if self.ratios
                   else [float(self.sizes.accumulation[w]) for w in ws])
        counts = round_preserving_sum(weights, min(total, sum(upper)), 1, upper)
        for w, wi in zip(ws, counts):
            self.sizes.set(w, self.sizes.batch_size, "membership", accumulation=wi)
            self._times[w] = []
        # Static allocation: an algorithm that has stopped before it started never re-allocates.
        self._alg = AdaptiveAccumulation(counts, epsilon=self.epsilon, patience=self.patience,
                                         stopped=not self.reallocate)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        if worker_id in self._seen:
            return  # registering again: no restart, its count and the stop rule's progress stand
        self.sizes.add(worker_id, accumulation=min(self.w0, self.max_w.get(worker_id, self.w0)))
        self._seen[worker_id] = 0
        self._restart()

    def forget(self, worker_id: str) -> None:
        known = worker_id in self._seen
        self.sizes.remove(worker_id)
        for d in (self.max_w, self._times, self._seen):
            d.pop(worker_id, None)
        if known:  # for a stranger, a restart would throw away the others' measurements for nothing
            self._restart()

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        if worker_id not in self._seen:
            return
        if self.clock.add(cycle.dss):
            self._epoch_due = True
        self._seen[worker_id] += 1
        seconds = cycle.seconds_at(self.sizes.workload(worker_id))
        if self._seen[worker_id] > self.warmup and seconds is not None:
            self._times[worker_id].append(seconds)

    def workload(self, worker_id: str) -> Workload:
        return self.sizes.workload(worker_id)

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        # Accumulation keeps activation memory at one micro-batch; the samples
        # of a cycle still have to fit, which caps w_i.
        self.max_w[worker_id] = max(1, max_dss // self.sizes.batch_size)
        if self.sizes.accumulation.get(worker_id, 0) > self.max_w[worker_id]:
            self.sizes.set(worker_id, self.sizes.batch_size, "memory", accumulation=self.max_w[worker_id])
            self._restart()  # the others take up what the capped worker cannot

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        pass  # the micro-batch is the run's, for every worker

    def rebalance(self) -> dict[str, Resize]:
        ws = self.sizes.workers()
        if self._alg is not None and self._epoch_due and all(self._times.get(w) for w in ws):
            self._epoch_due = False
            if not self._alg.stopped:
                means = [sum(self._times[w]) / len(self._times[w]) for w in ws]
                upper = [self.max_w.get(w, sum(self._alg.current)) for w in ws]
                # Chao et al. Eq. 10 with the stop rule of Algorithm 1.
                new = self._alg.update(means, upper=upper)
                for w, wi, t in zip(ws, new, means):
                    if wi != self.sizes.accumulation[w]:
                        self._times[w] = []
                    self.sizes.set(w, self.sizes.batch_size, accumulation=wi, mean_seconds=round(t, 6),
                               stopped=self._alg.stopped)
        return self.sizes.take_pending()

    def _params(self) -> dict[str, Any]:
        return {"batch_size": self.sizes.batch_size, "w0": self.w0, "epoch_samples": self.clock.epoch_samples}

    def state_dict(self) -> dict[str, Any]:
        return stamp(POLICY, self._params(), batches=self.sizes.state_dict(), clock=self.clock.state_dict(),
                     max_w=dict(self.max_w), times={w: list(t) for w, t in self._times.items()},
                     seen=dict(self._seen), epoch_due=self._epoch_due,
                     algorithm=None if self._alg is None else self._alg.state_dict())

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        body = unstamp(POLICY, state, self._params())
        with malformed_as_state_error(POLICY):
            sizes = self.sizes.restored(body["batches"])
            clock = self.clock.restored(body["clock"])
            max_w, seen = str_ints(body["max_w"]), str_ints(body["seen"])
            times = {str(w): [float(t) for t in ts] for w, ts in body["times"].items()}
            alg = body["algorithm"]
            alg = None if alg is None else AdaptiveAccumulation.from_state(alg, epsilon=self.epsilon,
                                                                           patience=self.patience)
            if not set(sizes.batch_size_of) == set(seen) == set(times):
                raise ValueError("batches, counts and times name different workers")
            if alg is not None and len(alg.current) != len(sizes.batch_size_of):
                raise ValueError("the algorithm's counts do not match the workers")
            epoch_due = bool(body["epoch_due"])
        self.sizes, self.clock, self.max_w, self._times, self._seen = sizes, clock, max_w, times, seen
        self._alg, self._epoch_due = alg, epoch_due
