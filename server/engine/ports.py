"""What the engine's parts see of the engine and of each other: small protocols and shared records.

Each part is built with its collaborators (registry, queue, allocator,
telemetry, clock...); where it needs something of the run itself (is it
stopping? stop it; fold this group) it gets one of these narrow views, which
``Engine`` satisfies. No part imports ``Engine``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from hermes.common.policies.sync import PushInfo
from hermes.common.wire import Payload

if TYPE_CHECKING:
    from hermes.common.config import RunConfig
    from hermes.common.policies.sync import SyncStrategy
    from hermes.server.engine.policies import Contribution, Policies
    from hermes.server.engine.telemetry import Telemetry
    from hermes.server.metrics import ServerMetrics
    from hermes.server.registry import Registry, WorkerRecord
    from hermes.server.state import ModelState


@dataclass
class Held:
    """A push whose reply waits for a barrier (and, buffered, whose update waits to be folded)."""

    info: PushInfo
    payload: Payload | None
    reply: asyncio.Future[None]
    candidate_loss: float | None = None
    # Screening's clip: the update folds at scale x its weight.
    scale: float = 1.0


class RunControl(Protocol):
    """The run's stop, as a part sees it."""

    @property
    def stopping(self) -> bool: ...

    @property
    def stop_reason(self) -> str: ...

    def request_stop(self, reason: str) -> None: ...


class Stepper(RunControl, Protocol):
    """The model step, as the data plane's handlers drive it."""

    @property
    def shutting_down(self) -> bool: ...

    async def push(self, worker: WorkerRecord, base_version: int, samples: int,
                   payload: Payload) -> tuple[str, dict[str, Any]]: ...


class CheckpointView(Protocol):
    """The checkpointer (server/checkpoint.py), as the engine's parts use it."""

    @property
    def last_version(self) -> int | None: ...

    @property
    def resumed_from(self) -> dict[str, Any] | None: ...

    def record_fold(self, version: int, op: str, payloads: Sequence[Payload], weights: Sequence[float]) -> None: ...

    async def save_or_report(self, reason: str) -> int | None: ...


class FoldHost(Protocol):
    """What folding (server/engine/folding.py) needs: the model, the policies, the held replies, the journal."""

    config: RunConfig
    state: ModelState
    policies: Policies
    telemetry: Telemetry
    metrics: ServerMetrics
    registry: Registry
    checkpoints: CheckpointView | None
    held: dict[str, Held]
    buffered: list[Contribution]

    @property
    def strategy(self) -> SyncStrategy: ...

    @property
    def version(self) -> int: ...

    def throughput(self, worker_id: str) -> float | None: ...

    def training_count(self) -> int: ...

    def check_budgets(self) -> None: ...
