"""Allocation policies: how much work each worker gets per cycle.

The engine owns the loop; an allocator only answers questions. It is told
who joins and leaves (with the capacity a worker declares) and how long each
finished cycle took, and it answers each worker's ``Workload``: samples per
cycle (DSS), micro-batch size (MBS) and micro-batches accumulated per
optimizer step. ``rebalance`` returns the workers whose workload changed.

Every allocator's state survives a server restart: ``state_dict`` is a plain
JSON-able dict stamped with the policy and the parameters that give its
numbers meaning, and ``load_state_dict`` refuses (``AllocatorStateError``)
a state another policy or other parameters wrote. ``join`` of a worker the
allocator already knows (an agent registering again, after a resume too)
keeps its workload; only ``forget`` (a leave) makes the next join start fresh.

Policies (one module each):
- ``uniform``: everyone gets the run's defaults, whatever its speed.
- ``dual-search``: Hermes' IQR straggler detection + dual binary search.
- ``static``: batches proportional to declared cores/FLOPs (OmniLearn Eq. 4a).
- ``pcontrol``: OmniLearn Eq. 6-8 / ACSOS Eq. 4-5 proportional control.
- ``adaptive``: Chao et al. Eq. 10 accumulation counts.
- ``partition``: DP-SGD Algorithm 1 per-epoch partitions by compute power.

The per-step batch policies keep a run's number of optimizer steps per
cycle, ``local_steps = cycle_samples // batch_size``, for every worker and
scale the step's batch: a worker with batch b trains ``local_steps * b``
samples per cycle, so equal cycle times mean equal step times.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

# The built-in allocation names in the order the docs list them (the registry is the source of truth).
ALLOCATIONS = ("uniform", "dual-search", "static", "pcontrol", "adaptive", "partition")


@dataclass(frozen=True)
class Workload:
    dss: int  # samples per cycle (between two pushes)
    batch_size: int  # micro-batch size
    accumulation: int = 1  # micro-batches per optimizer step

    def __post_init__(self) -> None:
        if self.dss < 1 or self.batch_size < 1 or self.accumulation < 1:
            raise ValueError(f"workload fields must be >= 1, got {self}")

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * self.accumulation


@dataclass(frozen=True)
class CycleObservation:
    """One finished cycle as the agent ran it."""

    dss: int
    batch_size: int
    seconds: float
    accumulation: int = 1

    def seconds_at(self, workload: Workload) -> float | None:
        """This cycle's time as if it had run all of ``workload``; None if it ran another batch.

        Cycles assigned before a resize still arrive after it: those are not
        evidence about the new batch. A cycle cut short (a workload bigger than
        an epoch of data, the end of the data) ran the right batch on fewer
        samples: its time is scaled up, steps taking equal time at equal batch.
        """
        if (self.batch_size, self.accumulation) != (workload.batch_size, workload.accumulation) or self.dss <= 0:
            return None
        return self.seconds * workload.dss / self.dss


@dataclass(frozen=True)
class Resize:
    workload: Workload
    # "slow"/"fast" (the worker's cycle time against the cluster's), or why it
    # moved without a measurement ("membership" for a join/leave).
    kind: str
    detail: dict[str, Any] = field(default_factory=dict)


class AllocatorStateError(ValueError):
    """A checkpointed allocator state this allocator cannot load: another policy's, or a different setup's."""


class Allocator(Protocol):
    def join(self, worker_id: str, capacity: float | None = None) -> None: ...
    def forget(self, worker_id: str) -> None: ...
    def observe(self, worker_id: str, cycle: CycleObservation) -> None: ...
    def workload(self, worker_id: str) -> Workload: ...
    def set_memory_limit(self, worker_id: str, max_dss: int) -> None: ...
    def set_batch_limit(self, worker_id: str, max_batch_size: int) -> None: ...
    def rebalance(self) -> dict[str, Resize]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...


@runtime_checkable
class PowerMeter(Protocol):
    """An allocator that measures each worker's compute power (DP-SGD Eq. 2); EDP-SGD's weights read it."""

    def power(self, worker_id: str) -> float | None: ...


class _CycleSizes(Protocol):
    @property
    def cycle_samples(self) -> int: ...
    @property
    def batch_size(self) -> int: ...


def local_steps(sizes: _CycleSizes) -> int:
    """Optimizer steps per cycle at the run's batch (a ``Core`` or anything with its two sizes)."""
    return max(1, sizes.cycle_samples // sizes.batch_size)
