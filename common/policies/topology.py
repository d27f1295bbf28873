"""Topologies: the parameter server (``ps``) or an all-reduce among the agents (``collective``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, ClassVar

from hermes.common.policies.base import Policy, register

if TYPE_CHECKING:
    from hermes.common.config import RunConfig

log = logging.getLogger(__name__)


class Topology(Policy):
    @classmethod
    def from_config(cls, config: RunConfig, **context: Any) -> type[Topology]:
        return cls


@register("topology", "ps")
class ParameterServer(Topology):
    """The server holds the model and folds pushed updates; workers size their cycles independently."""

    provides: ClassVar[frozenset[str]] = frozenset({"server_model", "independent_steps"})

    @classmethod
    def check_params(cls, config: RunConfig) -> None:
        if config.world_size is not None:
            raise ValueError("world_size applies to topology 'collective' only")


@register("topology", "collective")
class Collective(Topology):
    """Workers all-reduce weighted gradients every step (torch.distributed); the server only coordinates."""

    requires: ClassVar[dict[str, str]] = {
        "lockstep": "all-reduces every step, a barrier by construction: it needs sync {providers}, not {sync}",
    }

    @classmethod
    def check_params(cls, config: RunConfig) -> None:
        if config.world_size is None:
            raise ValueError("topology 'collective' needs world_size: every rank joins the group before the first step")
        if config.collective_min_world_size > config.world_size:
            raise ValueError(f"collective_min_world_size {config.collective_min_world_size} exceeds world_size "
                             f"{config.world_size}: the group would be too small from the start")
