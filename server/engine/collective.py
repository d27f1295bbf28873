"""Topology 'collective': the server hosts the group's rendezvous and re-forms it when a rank fails."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from hermes.common.clock import Clock
from hermes.common.control_messages import CollectiveRendezvous
from hermes.server.coordinator import Coordinator, GroupTooSmall, RegroupRefused
from hermes.server.engine.ports import RunControl
from hermes.server.engine.telemetry import Telemetry
from hermes.server.registry import Registry, WorkerRecord

if TYPE_CHECKING:
    from hermes.common.policies.topology import CollectiveParams

# Takes a worker out of the run (worker id, reason): the engine's leave, as "lost".
DropWorker = Callable[[str, str], Awaitable[None]]

log = logging.getLogger(__name__)


class Collective:
    def __init__(self, params: CollectiveParams, *, registry: Registry, telemetry: Telemetry, clock: Clock,
                 run: RunControl, drop: DropWorker) -> None:
        self.params = params
        self.registry = registry
        self.telemetry = telemetry
        self.clock = clock
        self.run = run
        # Members a re-formed generation dropped leave the run through it.
        self.drop = drop
        self.coordinator: Coordinator | None = None
        # Set when the generation being formed is ready: the survivors' regroup calls wait on it.
        self.regrouped: dict[int, asyncio.Event] = {}

    def start(self, *, bind_host: str, port: int, advertise_host: str) -> None:
        """Host the collective group's rendezvous store (topology 'collective')."""
        params = self.params
        assert params.world_size is not None  # config validation
        self.coordinator = Coordinator(bind_host=bind_host, port=port, advertise_host=advertise_host,
                                       world_size=params.world_size,
                                       timeout_seconds=params.timeout_seconds,
                                       regroup_seconds=params.regroup_seconds,
                                       min_world_size=params.min_world_size)
        self.telemetry.emit("collective_group", world_size=params.world_size, master_addr=advertise_host,
                            master_port=self.coordinator.port)

    def admit(self, name: str) -> None:
        """A worker registering: its rank in the group (raises GroupFull before anything is recorded)."""
        if self.coordinator is not None:
            self.coordinator.assign(name)

    def rendezvous_for(self, rec: WorkerRecord) -> CollectiveRendezvous | None:
        if self.coordinator is None:
            return None
        return CollectiveRendezvous(**self.coordinator.rendezvous(rec.name))

    def broken_generation_for(self, rec: WorkerRecord) -> int | None:
        return None if self.coordinator is None else self.coordinator.broken_generation(rec.name)

    async def member_gone(self, rec: WorkerRecord) -> None:
        if self.coordinator is not None:
            self.coordinator.mark_dead(rec.name)
            # An open regroup window need not wait for a member known gone.
            await self.maybe_form_generation()

    async def regroup(self, worker_id: str, failed_generation: int) -> dict[str, Any]:
        """A survivor of a broken collective generation: wait for the next one and return its rendezvous.

        Raises RegroupRefused (this worker cannot join) or GroupTooSmall (the
        run is ended: too few survivors).
        """
        coord = self.coordinator
        rec = self.registry.get(worker_id)
        if coord is None or rec is None:
            raise RegroupRefused("this run has no collective group")
        if not self.params.regroup:
            raise RegroupRefused("regrouping is disabled (collective_regroup=false)")
        if self.run.stopping:
            raise RegroupRefused(f"the run is stopping: {self.run.stop_reason}")
        target = coord.arrive(rec.name, failed_generation, self.clock.monotonic())
        self.telemetry.emit("regroup_arrival", worker=worker_id, name=rec.name, failed_generation=failed_generation)
        formed = self.regrouped.setdefault(target, asyncio.Event())
        while not formed.is_set():
            if await self.maybe_form_generation():
                break
            try:
                await asyncio.wait_for(formed.wait(), timeout=max(0.01, coord.seconds_left(self.clock.monotonic())))
            except TimeoutError:
                pass
        if coord.failed is not None:
            raise GroupTooSmall(coord.failed)
        return coord.rendezvous(rec.name)

    async def maybe_form_generation(self) -> bool:
        """Form the next generation if its window is due; True when it did."""
        coord = self.coordinator
        if coord is None or coord.pending is None:
            return False
        alive = frozenset(r.name for r in self.registry.all() if r.state == "active")
        if not coord.due(self.clock.monotonic(), alive):
            return False
        formed = self.regrouped.setdefault(coord.pending.target, asyncio.Event())
        try:
            result = coord.form()
        except GroupTooSmall as exc:
            self.telemetry.emit("collective_failed", reason=str(exc))
            self.run.request_stop(str(exc))
            return True
        finally:
            formed.set()
        gen = result.generation
        self.telemetry.emit("collective_group", world_size=gen.world_size, generation=gen.number,
                         members=list(gen.members), dropped=list(result.dropped),
                         master_addr=coord.advertise_host, master_port=coord.port)
        by_name = {r.name: r for r in self.registry.all()}
        for name in result.dropped:
            rec = by_name.get(name)
            if rec is not None and rec.state == "active":
                # The allocator forgets it, so the survivors' sizes are re-split over n ranks.
                await self.drop(rec.id, f"dropped from the collective group at generation {gen.number}")
        return True
