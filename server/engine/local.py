"""Device-local data on the server: sizing cycles of samples the server never holds.

With ``task.local_data`` every agent trains on its own data. The server
sizes each cycle as it sizes shard assignments (the allocator's workload:
the dual search's DSS, the batch policies' b_k), but the WORK reply carries
the sample count (``local_samples``) with ``source: "local"`` and no shard
ids. The cluster's epoch is the sum of the local sets the agents declared at
registration (``local_samples``); allocators that re-allocate once per epoch
count against it. Policies that deal the server's train set out among the
workers cannot run this way and are refused at start-up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hermes.common.policies.allocation._common import CountsEpochs

if TYPE_CHECKING:
    from hermes.common.config import RunConfig
    from hermes.common.policies.allocation import Allocator

# The allocators' cap on one cycle's samples (dss_max; a shard-fed run's is the train set) and
# their epoch until the first agent declares its local set (the clocks refuse 0).
LOCAL_DSS_MAX = 1 << 20


def local_data_refusal(config: RunConfig) -> str | None:
    """Why this run config cannot train on device-local data, or None when it can."""
    if config.policy("allocation").deals_server_data:
        return (f"allocation {config.allocation!r} (presets dp-sgd, edp-sgd) deals each epoch of the server's "
                f"train set out among the workers by compute power, and with local_data the server holds "
                f"no train set to partition")
    return None


class LocalAccount:
    """Samples handed out as local cycles, and the cluster's epoch (the declared local sets)."""

    def __init__(self, allocator: Allocator) -> None:
        self.allocator = allocator
        self.assigned = 0
        self.sizes: dict[str, int] = {}

    @property
    def epoch_samples(self) -> int:
        return sum(self.sizes.values())

    def declare(self, worker_id: str, samples: int) -> None:
        """A worker's local set size (at registration): the epoch the allocators count grows."""
        self.sizes[worker_id] = samples
        allocator = self.allocator
        if isinstance(allocator, CountsEpochs) and self.epoch_samples:
            allocator.clock.resize(self.epoch_samples)

    def take(self, samples: int) -> int:
        """Hand out ``samples`` (one cycle); returns the epoch it starts in."""
        epoch = self.epoch
        self.assigned += samples
        return epoch

    @property
    def epoch(self) -> int:
        total = self.epoch_samples
        return self.assigned // total if total else 0

    @property
    def progress(self) -> float:
        total = self.epoch_samples
        return self.assigned / total if total else 0.0

    def state_dict(self) -> dict[str, Any]:
        return {"local": {"assigned": self.assigned, "sizes": dict(self.sizes)}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state.get("local") or {}
        self.assigned = int(saved.get("assigned", 0))
        self.sizes = {str(k): int(v) for k, v in (saved.get("sizes") or {}).items()}
