"""Topology 'collective': the server hosts the group's rendezvous and re-forms it when a rank fails."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from hermes.server.coordinator import Coordinator, GroupTooSmall, RegroupRefused
from hermes.server.registry import WorkerRecord

if TYPE_CHECKING:
    from hermes.server.engine.core import Engine

log = logging.getLogger(__name__)


class Collective:
    def __init__(self, engine: Engine) -> None:
        self.e = engine
        self.coordinator: Coordinator | None = None
        # Set when the generation being formed is ready: the survivors' regroup calls wait on it.
        self.regrouped: dict[int, asyncio.Event] = {}

    def start(self, *, bind_host: str, port: int, advertise_host: str) -> None:
        """Host the collective group's rendezvous store (topology 'collective')."""
        config = self.e.config
        assert config.collective.world_size is not None  # config validation
        self.coordinator = Coordinator(bind_host=bind_host, port=port, advertise_host=advertise_host,
                                       world_size=config.collective.world_size,
                                       timeout_seconds=config.collective.timeout_seconds,
                                       regroup_seconds=config.collective.regroup_seconds,
                                       min_world_size=config.collective.min_world_size)
        self.e.telemetry.emit("collective_group", world_size=config.collective.world_size, master_addr=advertise_host,
                              master_port=self.coordinator.port)

    def rendezvous_for(self, rec: WorkerRecord) -> dict[str, Any] | None:
        return None if self.coordinator is None else self.coordinator.rendezvous(rec.name)

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
        e = self.e
        coord = self.coordinator
        rec = e.registry.get(worker_id)
        if coord is None or rec is None:
            raise RegroupRefused("this run has no collective group")
        if not e.config.collective.regroup:
            raise RegroupRefused("regrouping is disabled (collective_regroup=false)")
        if e.stopping:
            raise RegroupRefused(f"the run is stopping: {e.stop_reason}")
        target = coord.arrive(rec.name, failed_generation, e.clock.monotonic())
        e.telemetry.emit("regroup_arrival", worker=worker_id, name=rec.name, failed_generation=failed_generation)
        formed = self.regrouped.setdefault(target, asyncio.Event())
        while not formed.is_set():
            if await self.maybe_form_generation():
                break
            try:
                await asyncio.wait_for(formed.wait(), timeout=max(0.01, coord.seconds_left(e.clock.monotonic())))
            except TimeoutError:
                pass
        if coord.failed is not None:
            raise GroupTooSmall(coord.failed)
        return coord.rendezvous(rec.name)

    async def maybe_form_generation(self) -> bool:
        """Form the next generation if its window is due; True when it did."""
        e = self.e
        coord = self.coordinator
        if coord is None or coord.pending is None:
            return False
        alive = frozenset(r.name for r in e.registry.all() if r.state == "active")
        if not coord.due(e.clock.monotonic(), alive):
            return False
        formed = self.regrouped.setdefault(coord.pending.target, asyncio.Event())
        try:
            result = coord.form()
        except GroupTooSmall as exc:
            e.telemetry.emit("collective_failed", reason=str(exc))
            e.request_stop(str(exc))
            return True
        finally:
            formed.set()
        gen = result.generation
        e.telemetry.emit("collective_group", world_size=gen.world_size, generation=gen.number,
                         members=list(gen.members), dropped=list(result.dropped),
                         master_addr=coord.advertise_host, master_port=coord.port)
        by_name = {r.name: r for r in e.registry.all()}
        for name in result.dropped:
            rec = by_name.get(name)
            if rec is not None and rec.state == "active":
                # The allocator forgets it, so the survivors' sizes are re-split over n ranks.
                await e.leave(rec.id, f"dropped from the collective group at generation {gen.number}",
                              state="lost")
        return True
