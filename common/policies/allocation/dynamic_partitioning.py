"""``partition``: dynamic partitioning of each epoch by measured compute power (DP-SGD Algorithm 1).

Every worker runs the same number of synchronised steps per round and each
round's samples are split in proportion to compute power, so over an epoch
worker m trains |D_m| = CP_m / sum(CP) * |D| samples: the epoch's shards are
dealt out disjointly (the shard queue), and the share each worker gets is its
partition. Epoch 0 splits evenly (Alg. 1 line 5); after each epoch
CP_m = |D_m| / X_m (Eq. 2) over the last ``window`` epochs (1: the previous
epoch, fast to adapt; more: resistant to transient changes, Sec. 4.1).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.allocation import CycleObservation, Resize, Workload
from hermes.common.policies.allocation._common import BatchBounds, EpochClock, StepBatches, check_step_batch
from hermes.common.policies.allocation._state import (
    malformed_as_state_error,
    stamp,
    str_ints,
    unstamp,
)
from hermes.common.policies.allocation.rounding import round_preserving_sum
from hermes.common.policies.base import Core, Policy, register

POLICY = "partition"


class PartitionParams(BaseModel):
    """The run config's ``partition`` section (allocation 'partition', DP-SGD / EDP-SGD)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    window: int = Field(default=1, ge=1, description="Epochs of compute-power history per estimate (DP-SGD Sec. 4.1).")


def compute_power(samples: float, seconds: float) -> float:
    """DP-SGD Eq. 2: CP_m = |D_m| / X_m, samples processed per second of compute."""
    if seconds <= 0 or samples <= 0:
        raise ValueError("samples and seconds must be positive")
    return samples / seconds



@register("allocation", "partition", "dynamic-partitioning")
class PartitionAllocator(Policy):
    needs_memory_profile: ClassVar[bool] = True
    sections: ClassVar[tuple[str, ...]] = ("batch_bounds", "partition")
    deals_server_data: ClassVar[bool] = True
    requires: ClassVar[dict[str, str]] = {
        "lockstep": "splits one synchronous round's work among the workers, so every worker must push exactly "
                    "once per round: it needs sync {providers}, not {sync}",
    }

    @classmethod
    def check_params(cls, core: Core, *, batch_bounds: BatchBounds, **sections: Any) -> None:
        check_step_batch(core, batch_bounds, cls.name)


    def __init__(self, *, steps: int, batch_size: int, b_min: int, b_max: int, window: int, epoch_samples: int) -> None:
        self.sizes = StepBatches(steps=steps, batch_size=batch_size, b_min=b_min, b_max=b_max)
        self.window = window
        self.clock = EpochClock(epoch_samples)
        self._epoch_work: dict[str, list[float]] = {}  # worker -> [samples, seconds] this epoch
        self._powers: dict[str, deque[float]] = {}
        self.partitions: list[dict[str, int]] = []  # per finished epoch: worker -> samples per round

    @classmethod
    def build(cls, core: Core, *, batch_bounds: BatchBounds, partition: PartitionParams, epoch_samples: int,
              **params: Any) -> PartitionAllocator:
        bounds = batch_bounds
        return cls(steps=core.local_steps, batch_size=core.batch_size, b_min=bounds.b_min, b_max=bounds.b_max,
                   window=partition.window, epoch_samples=epoch_samples)

    def join(self, worker_id: str, capacity: float | None = None) -> None:
        if worker_id in self._epoch_work:
            return  # registering again: its partition and power history stand
        self.sizes.add(worker_id)
        self._epoch_work[worker_id] = [0.0, 0.0]
        self._powers[worker_id] = deque(maxlen=self.window)

    def forget(self, worker_id: str) -> None:
        self.sizes.remove(worker_id)
        self._epoch_work.pop(worker_id, None)
        self._powers.pop(worker_id, None)

    def observe(self, worker_id: str, cycle: CycleObservation) -> None:
        if worker_id not in self._epoch_work:
            return
        work = self._epoch_work[worker_id]
        work[0] += cycle.dss
        work[1] += cycle.seconds
        if self.clock.add(cycle.dss):
            self._new_epoch()

    def power(self, worker_id: str) -> float | None:
        """The worker's compute power estimate (samples/s) over the window, None before its first epoch."""
        hist = self._powers.get(worker_id)
        return sum(hist) / len(hist) if hist else None

    def _new_epoch(self) -> None:
        for w, (samples, seconds) in self._epoch_work.items():
            if samples > 0 and seconds > 0:
                self._powers[w].append(compute_power(samples, seconds))  # DP-SGD Eq. 2
            self._epoch_work[w] = [0.0, 0.0]
        ws = self.sizes.workers()
        known = [p for w in ws if (p := self.power(w)) is not None]
        if not known:
            return
        # A worker that joined mid-epoch has no estimate yet: it counts as the median worker.
        fill = sorted(known)[len(known) // 2]
        powers = [self.power(w) or fill for w in ws]
        # Alg. 1 lines 8-10, |D_m| = CP_m / sum(CP) * |D|, on one round: its
        # K*b samples per step cut in proportion to CP, whole and within each
        # worker's bounds (what a capped worker cannot take goes to the others).
        caps = [self.sizes.cap(w) for w in ws]
        total = min(len(ws) * self.sizes.batch_size, sum(caps))
        batch_sizes = round_preserving_sum(powers, total, min(self.sizes.b_min, total // len(ws)), caps)
        self.partitions.append(dict(zip(ws, (self.sizes.steps * batch_size for batch_size in batch_sizes))))
        for w, batch_size, p in zip(ws, batch_sizes, powers):
            self.sizes.set(w, batch_size, compute_power=round(p, 3), epoch=self.clock.epoch)

    def workload(self, worker_id: str) -> Workload:
        return self.sizes.workload(worker_id)

    def set_memory_limit(self, worker_id: str, max_dss: int) -> None:
        self.sizes.limit(worker_id, max_dss // self.sizes.steps)

    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None:
        self.sizes.limit(worker_id, max_batch_size)

    def rebalance(self) -> dict[str, Resize]:
        return self.sizes.take_pending()

    def _params(self) -> dict[str, Any]:
        return {**self.sizes.params(), "epoch_samples": self.clock.epoch_samples}

    def state_dict(self) -> dict[str, Any]:
        # The window is not a parameter of the state: a changed one keeps the newest powers that fit.
        return stamp(POLICY, self._params(), batches=self.sizes.state_dict(), clock=self.clock.state_dict(),
                     epoch_work={w: list(v) for w, v in self._epoch_work.items()},
                     powers={w: list(h) for w, h in self._powers.items()},
                     partitions=[dict(p) for p in self.partitions])

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        body = unstamp(POLICY, state, self._params())
        with malformed_as_state_error(POLICY):
            sizes = self.sizes.restored(body["batches"])
            clock = self.clock.restored(body["clock"])
            work = {str(w): [float(v[0]), float(v[1])] for w, v in body["epoch_work"].items()}
            powers = {str(w): deque((float(p) for p in h), maxlen=self.window) for w, h in body["powers"].items()}
            partitions = [str_ints(p) for p in body["partitions"]]
            if not set(sizes.batch_size_of) == set(work) == set(powers):
                raise ValueError("batches, epoch work and powers name different workers")
        self.sizes, self.clock, self._epoch_work, self._powers, self.partitions = sizes, clock, work, powers, partitions
