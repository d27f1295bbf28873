"""The training engine, one room per role (see ``core`` for the map)."""

from hermes.server.engine.core import Engine, Held
from hermes.server.engine.policies import Policies, build_policies

__all__ = ["Engine", "Held", "Policies", "build_policies"]
