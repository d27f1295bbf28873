"""Bookkeeping shared by the per-step batch policies (static, pcontrol, adaptive, partition)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.allocation import Resize, Workload
from hermes.common.policies.allocation._state import renamed, resize_from_state, resize_state, str_ints
from hermes.common.policies.base import Core


class BatchBounds(BaseModel):
    """The run config's ``batch_bounds`` section, shared by static, pcontrol, partition and the memory model."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    b_min: int = Field(default=4, gt=0, description="Smallest per-step batch (OmniLearn Fig. 11: 4).")
    b_max: int = Field(default=96, gt=0, description="Largest per-step batch (OmniLearn Fig. 11: 96).")
    memory_fraction: float = Field(
        default=0.5, gt=0.0, le=1.0, description="Share of a worker's free memory its per-step batch may plan for "
                                                 "(OmniLearn Eq. 9 b_max).")


class RebalanceParams(BaseModel):
    """The run config's ``rebalance`` section: when the measuring allocators (pcontrol, adaptive, dual-search) may act."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    min_observations: int = Field(
        default=2, ge=1, description="Cycles a worker reports at its current workload before it may be resized.")
    # A worker's first cycles carry one-off costs (allocator warm-up, the first pull).
    warmup_cycles: int = Field(default=1, ge=0, description="A worker's first cycles, kept out of every measurement.")


def check_step_batch(core: Core, bounds: BatchBounds, policy: str) -> None:
    """The per-step batch policies scale the batch of each of cycle_samples // batch_size steps within [b_min, b_max]."""
    if not bounds.b_min <= core.batch_size <= bounds.b_max:
        raise ValueError(f"batch_size={core.batch_size} outside [b_min, b_max]=[{bounds.b_min}, {bounds.b_max}]")
    if core.cycle_samples < core.batch_size:
        raise ValueError(
            f"cycle_samples={core.cycle_samples} < batch_size={core.batch_size}: allocation "
            f"{policy!r} scales the batch of each of cycle_samples // batch_size steps"
        )


class EpochClock:
    """Counts the samples all workers trained; says when another data epoch has gone by.

    OmniLearn, Chao et al. and DP-SGD re-allocate once per epoch; on a parameter
    server the cluster's epoch is the train set's size in trained samples.
    """

    def __init__(self, epoch_samples: int) -> None:
        if epoch_samples < 1:
            raise ValueError(f"epoch_samples must be >= 1, got {epoch_samples}")
        self.epoch_samples = epoch_samples
        self.samples = 0
        self.epoch = 0

    def add(self, samples: int) -> bool:
        self.samples += samples
        epoch = self.samples // self.epoch_samples
        crossed, self.epoch = epoch > self.epoch, epoch
        return crossed

    def resize(self, epoch_samples: int) -> None:
        """A new epoch length (device-local data: the agents' declared sets), the samples so far kept."""
        self.epoch_samples = epoch_samples
        self.epoch = self.samples // epoch_samples

    def state_dict(self) -> dict[str, Any]:
        return {"samples": self.samples, "epoch": self.epoch}

    def restored(self, state: Mapping[str, Any]) -> EpochClock:
        """A clock of this epoch size at the saved count (a new object: a bad state leaves this one alone)."""
        out = EpochClock(self.epoch_samples)
        out.samples, out.epoch = int(state["samples"]), int(state["epoch"])
        return out


@runtime_checkable
class CountsEpochs(Protocol):
    """An allocator that acts once per epoch of samples (pcontrol, adaptive, partition)."""

    clock: EpochClock


class StepBatches:
    """Per-worker batch size (and accumulation count), caps, and resizes not yet reported.

    A worker's workload is ``steps`` optimizer steps of ``batch_size * accumulation``
    samples, in micro-batches of ``batch_size`` (b_k of OmniLearn Eq. 4a-8).
    ``batch_size`` is the run's, every worker's until an allocator sets its own.
    """

    def __init__(self, *, steps: int, batch_size: int, b_min: int, b_max: int) -> None:
        self.steps, self.batch_size, self.b_min, self.b_max = steps, batch_size, b_min, b_max
        self.batch_size_of: dict[str, int] = {}
        self.accumulation: dict[str, int] = {}
        self.caps: dict[str, int] = {}
        self._pending: dict[str, Resize] = {}

    def workers(self) -> list[str]:
        return sorted(self.batch_size_of)

    def cap(self, worker_id: str) -> int:
        return max(self.b_min, min(self.b_max, self.caps.get(worker_id, self.b_max)))

    def add(self, worker_id: str, batch_size: int | None = None, accumulation: int = 1) -> None:
        self.batch_size_of[worker_id] = min(batch_size or self.batch_size, self.cap(worker_id))
        self.accumulation[worker_id] = accumulation

    def remove(self, worker_id: str) -> None:
        for d in (self.batch_size_of, self.accumulation, self.caps, self._pending):
            d.pop(worker_id, None)

    def workload(self, worker_id: str) -> Workload:
        batch_size = self.batch_size_of.get(worker_id, self.batch_size)
        acc = self.accumulation.get(worker_id, 1)
        return Workload(dss=self.steps * batch_size * acc, batch_size=batch_size, accumulation=acc)

    def limit(self, worker_id: str, max_batch_size: int) -> bool:
        """Lower a worker's cap; True when its current batch had to shrink to it."""
        self.caps[worker_id] = min(self.caps.get(worker_id, self.b_max), max(self.b_min, int(max_batch_size)))
        if self.batch_size_of.get(worker_id, 0) > self.cap(worker_id):
            self.set(worker_id, self.cap(worker_id), "memory", cap=self.cap(worker_id))
            return True
        return False

    def set(self, worker_id: str, batch_size: int, kind: str | None = None, accumulation: int | None = None,
            **detail: Any) -> None:
        old = self.workload(worker_id)
        self.batch_size_of[worker_id] = int(batch_size)
        if accumulation is not None:
            self.accumulation[worker_id] = int(accumulation)
        new = self.workload(worker_id)
        if new != old:
            if kind is None:
                kind = "slow" if new.dss < old.dss else "fast"
            self._pending[worker_id] = Resize(new, kind, detail)

    def take_pending(self) -> dict[str, Resize]:
        out, self._pending = self._pending, {}
        return out

    def state_dict(self) -> dict[str, Any]:
        # Resizes not yet taken are kept too: the engine takes them after
        # every call, but a restored allocator must answer exactly as this one.
        return {"batch_size_of": dict(self.batch_size_of), "accumulation": dict(self.accumulation), "caps": dict(self.caps),
                "pending": {w: resize_state(r) for w, r in self._pending.items()}}

    def restored(self, state: Mapping[str, Any]) -> StepBatches:
        """These bounds with the saved batches (a new object: a bad state leaves this one alone)."""
        out = StepBatches(steps=self.steps, batch_size=self.batch_size, b_min=self.b_min, b_max=self.b_max)
        out.batch_size_of = str_ints(renamed(state, "batch_size_of", "batch"))
        out.accumulation = str_ints(state["accumulation"])
        out.caps = str_ints(state["caps"])
        out._pending = {str(w): resize_from_state(r) for w, r in state["pending"].items()}
        if set(out.accumulation) != set(out.batch_size_of):
            raise ValueError("batch and accumulation name different workers")
        return out

    def params(self) -> dict[str, int]:
        """What a saved batch means: steps per cycle, the run's batch size and bounds."""
        return {"steps": self.steps, "batch_size": self.batch_size, "b_min": self.b_min, "b_max": self.b_max}
