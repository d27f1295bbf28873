"""Hermes-edge: train PyTorch models across devices of very different speed.

``from hermes import Task`` is the public entry point for bringing your own
model, data, loss and optimizer; it is imported lazily so that tools which
never train (hermes-deploy) do not pay for torch.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Task"]


def __getattr__(name: str) -> Any:
    if name == "Task":
        from hermes.common.task import Task

        return Task
    raise AttributeError(f"module 'hermes' has no attribute {name!r}")
