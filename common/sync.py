"""Sync strategies: when does a pushed update reach the global model?

A strategy never touches a socket or a tensor. The engine tells it about
joins, leaves and pushes; it answers with a Decision per push and, when a
barrier or a staleness bound lets held workers go, a Release. That shape fits
the gated async (``hermes``), bounded-staleness (``ssp``) and elastic-barrier
(``ebsp``) strategies other issues add:

- APPLY: fold the update in now and reply now (ASP, Hermes).
- APPLY_AND_WAIT: fold it in now, hold the reply until released (SSP).
- BUFFER: keep the update, hold the reply; a Release names which buffered
  updates are aggregated together and whose replies go out (BSP, EBSP).
- REJECT: drop the update (too stale), reply now.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Callable


class Decision(str, enum.Enum):
    APPLY = "apply"
    APPLY_AND_WAIT = "apply_and_wait"
    BUFFER = "buffer"
    REJECT = "reject"


@dataclass(frozen=True)
class PushInfo:
    worker_id: str
    base_version: int
    current_version: int
    samples: int
    # The worker's clock: how many pushes it has made, this one included.
    iteration: int

    @property
    def staleness(self) -> int:
        return self.current_version - self.base_version


@dataclass(frozen=True)
class Verdict:
    decision: Decision
    reason: str = ""


@dataclass(frozen=True)
class Release:
    """Buffered updates to aggregate as one step, and held replies to send."""

    aggregate: tuple[str, ...]
    wake: tuple[str, ...]


class SyncStrategy(ABC):
    name: str = ""

    def __init__(self) -> None:
        self.active: set[str] = set()

    def on_join(self, worker_id: str) -> None:
        self.active.add(worker_id)

    def on_leave(self, worker_id: str) -> None:
        self.active.discard(worker_id)

    @abstractmethod
    def on_push(self, push: PushInfo) -> Verdict: ...

    def take_release(self) -> Release | None:
        """A release that is due now, if any. Called after every event."""
        return None


class AsyncStrategy(SyncStrategy):
    """ASP: every update is applied on arrival; optionally bounded staleness."""

    name = "asp"

    def __init__(self, max_staleness: int | None = None) -> None:
        super().__init__()
        self.max_staleness = max_staleness

    def on_push(self, push: PushInfo) -> Verdict:
        if self.max_staleness is not None and push.staleness > self.max_staleness:
            return Verdict(Decision.REJECT, f"staleness {push.staleness} > max_staleness {self.max_staleness}")
        return Verdict(Decision.APPLY)


class GatedAsyncStrategy(AsyncStrategy):
    """Hermes: asynchronous, every push applied. The gating happens at the
    agent (HermesGUP, Hermes Alg. 1): a push only arrives when the worker's
    validation loss improved significantly, so the server never drops one."""

    name = "hermes"

    def __init__(self) -> None:
        super().__init__(max_staleness=None)


class BarrierStrategy(SyncStrategy):
    """BSP: one update per active worker per round, aggregated at the barrier.

    A worker that leaves mid-round no longer holds the barrier; its buffered
    update, if any, still counts (it was computed from the round's model).
    """

    name = "bsp"

    def __init__(self) -> None:
        super().__init__()
        self.arrived: list[str] = []

    def on_push(self, push: PushInfo) -> Verdict:
        if push.worker_id in self.arrived:
            # The agent protocol is one outstanding push per worker; a second
            # one in the same round means a confused or malicious peer.
            return Verdict(Decision.REJECT, "already pushed in this round")
        self.arrived.append(push.worker_id)
        return Verdict(Decision.BUFFER)

    def take_release(self) -> Release | None:
        if not self.arrived or not self.active.issubset(self.arrived):
            return None
        group = tuple(self.arrived)
        self.arrived = []
        return Release(aggregate=group, wake=group)


SYNC_STRATEGIES: dict[str, Callable[..., SyncStrategy]] = {
    "asp": AsyncStrategy,
    "bsp": BarrierStrategy,
    "hermes": GatedAsyncStrategy,
}


def make_strategy(name: str, **params) -> SyncStrategy:
    try:
        factory = SYNC_STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown sync strategy {name!r}; known: {sorted(SYNC_STRATEGIES)}") from None
    return factory(**params)
