"""What workers asked for: requests by type, the ones another carried, shard bytes served."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class Counters:
    def __init__(self) -> None:
        # Every request a worker sends, by type: the "API calls" of Hermes Table III. Data-plane
        # types (authenticated) and the control plane's (register, heartbeat, leave, regroup).
        self.messages: dict[str, int] = {}
        # Requests that did not need sending (combine_messages): what rode on another, by the type it replaced.
        self.carried: dict[str, int] = {}
        # Shard record bytes the data plane sent, by split (0 with local data: nothing is served).
        self.shard_bytes: dict[str, int] = {"train": 0, "validation": 0}

    def count_message(self, kind: str) -> None:
        self.messages[kind] = self.messages.get(kind, 0) + 1

    def count_carried(self, kind: str, n: int = 1) -> None:
        self.carried[kind] = self.carried.get(kind, 0) + n

    def served(self, split: str, nbytes: int) -> None:
        self.shard_bytes[split] += nbytes

    def state_dict(self) -> dict[str, Any]:
        # Shard bytes are not kept: they count this server process's sends.
        return {"message_counts": dict(self.messages), "carried_counts": dict(self.carried)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.messages.update(state.get("message_counts", {}))
        self.carried.update(state.get("carried_counts", {}))
