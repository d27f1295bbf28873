"""Hermes-edge: train PyTorch models across devices of very different speed.

``from hermes import Task`` is the public entry point for bringing your own
model, data, loss and optimizer; ``hermes.train``, ``hermes.Server`` and
``hermes.Agent`` run a task from Python (hermes.api), ``hermes.simulate`` on the
simulator (hermes.sim). They are imported
lazily so that tools which never train (hermes-deploy) do not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Agent", "Callback", "Result", "RunError", "Server", "Task", "TaskError", "register_policy", "simulate",
           "train"]

_API = frozenset({"Agent", "Callback", "Result", "RunError", "Server", "simulate", "train"})


def __getattr__(name: str) -> Any:
    if name in ("Task", "TaskError"):
        from hermes.common import task

        return getattr(task, name)
    if name == "register_policy":
        from hermes.common.policies import base

        return base.register_policy
    if name in _API:
        from hermes import api

        return getattr(api, name)
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")
