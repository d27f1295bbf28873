"""The engine's parts as a checkpoint keeps them, and their restoration on --resume.

JSON only: the model's tensors are written apart by the checkpointer
(server/checkpoint.py), which calls these under the engine's step lock so
model, version and queue agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from hermes.server.engine.core import Engine


def state_dict(e: Engine) -> dict[str, Any]:
    """The engine's parts, as a checkpoint keeps them (JSON; the model's tensors are written apart).

    Taken under step_lock, so model, version and queue agree.
    """
    return {
        "config": e.config.model_dump(),
        "model": {"name": e.spec.name, "numel": e.spec.numel},
        "queue": e.queue.state(),
        **e.local.state_dict(),
        **e.membership.state_dict(),
        "allocator": e.allocator.state_dict(),
        "workers": e.registry.identities(),
        **e.evaluator.state_dict(),
        "target_reached": None if e.target_reached is None else asdict(e.target_reached),
        "message_counts": dict(e.message_counts),
        "carried_counts": dict(e.carried_counts),
        "elapsed_seconds": e.clock.time() - e.started_at,
        "downtime_seconds": e.downtime_seconds,
    }


def load_state_dict(e: Engine, state: Mapping[str, Any], best_flat: torch.Tensor | None = None) -> None:
    """Resume the parts from ``state_dict()`` (the model itself is loaded by the checkpointer)."""
    e.queue.restore(state["queue"])
    e.local.load_state_dict(dict(state))
    e.membership.load_state_dict(state)
    e.registry.restore(state["workers"])
    e.evaluator.load_state_dict(state, best_flat)
    e.reporting.load_target(state.get("target_reached"))
    e.message_counts.update(state.get("message_counts", {}))
    e.carried_counts.update(state.get("carried_counts", {}))
    e.started_at = e.clock.time() - float(state.get("elapsed_seconds", 0.0))
    e.downtime_seconds = float(state.get("downtime_seconds", 0.0))
    e.metrics.model_version.set(e.state.version)
