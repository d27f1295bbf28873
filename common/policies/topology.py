"""Topologies: the parameter server (``ps``) or an all-reduce among the agents (``collective``)."""

from __future__ import annotations

import logging
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from hermes.common.policies.base import Core, Policy, get, register

log = logging.getLogger(__name__)


class CollectiveParams(BaseModel):
    """The run config's ``collective`` section (topology 'collective')."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    world_size: int | None = Field(
        default=None, ge=1, description="Ranks in the group; every rank joins before the first step "
                                        "(required by topology 'collective', refused by 'ps').")
    timeout_seconds: float = Field(default=60.0, gt=0.0, description="How long a collective may wait on a peer before failing.")
    regroup: bool = Field(
        default=True, description="When a rank dies the survivors re-form the group (ranks 0..n-1 of a new "
                                  "generation); false: every rank exits with code 5 (fail fast).")
    # Longer than the slowest rank's step plus the time its all-reduce takes
    # to fail, or a slow survivor is left out.
    regroup_seconds: float = Field(
        default=5.0, gt=0.0, description="How long the server waits for the other survivors after the first "
                                         "reports a failure.")
    # 1: the weighted all-reduce is exact for any group size and the replicas
    # hold the model, so a lone survivor still makes progress.
    min_world_size: int = Field(default=1, ge=1, description="Fewer survivors than this end the run with an error.")


class Topology(Policy):
    # The sync policy the server's own folding runs under, when the topology overrides the run's
    # (collective: the ranks all-reduce among themselves; the server folds rank 0's copies one at a time).
    server_sync: ClassVar[str | None] = None
    # The server hosts the group's rendezvous store and regroups its survivors (server/coordinator.py).
    needs_coordinator: ClassVar[bool] = False
    # The server screens each push as one worker's update (server/engine/screening.py).
    screens_pushes: ClassVar[bool] = True
    sections: ClassVar[tuple[str, ...]] = ("collective",)


@register("topology", "ps")
class ParameterServer(Topology):
    """The server holds the model and folds pushed updates; workers size their cycles independently."""

    provides: ClassVar[frozenset[str]] = frozenset({"server_model", "independent_steps"})

    @classmethod
    def check_params(cls, core: Core, *, collective: CollectiveParams, **sections: object) -> None:
        if collective.world_size is not None:
            raise ValueError("collective.world_size applies to topology 'collective' only")


@register("topology", "collective")
class Collective(Topology):
    """Workers all-reduce weighted gradients every step (torch.distributed); the server only coordinates."""

    server_sync: ClassVar[str | None] = "asp"
    needs_coordinator: ClassVar[bool] = True
    # Rank 0's pushes are copies of the group's all-reduced model, not one worker's update: the server must
    # fold them exactly or its model (evaluated, checkpointed) drifts from the group's for good. Screened,
    # a copy clipped to 0.12 under load left the server's model at 0.39 while the group trained on (2026-11-27).
    screens_pushes: ClassVar[bool] = False

    requires: ClassVar[dict[str, str]] = {
        "lockstep": "all-reduces every step, a barrier by construction: it needs sync {providers}, not {sync}",
    }

    @classmethod
    def check_params(cls, core: Core, *, collective: CollectiveParams, **sections: object) -> None:
        c = collective
        if c.world_size is None:
            raise ValueError("topology 'collective' needs collective.world_size: every rank joins the group before the first step")
        if c.min_world_size > c.world_size:
            # The flat names (still accepted) keep the message that tests and runbooks match.
            raise ValueError(f"collective_min_world_size {c.min_world_size} exceeds world_size "
                             f"{c.world_size} (collective.min_world_size > collective.world_size): the group would be too small from the start")


def topology_of(name: str) -> type[Topology]:
    """The registered topology ``name`` (an alias too): its traits, for code outside the registry."""
    cls = get("topology", name)
    assert issubclass(cls, Topology), cls
    return cls
