"""Collective topology on the server: ranks and the rendezvous store, nothing else.

torchrun users know the conventions: every worker gets RANK, WORLD_SIZE and
MASTER_ADDR:MASTER_PORT. The master here is the server itself, which hosts
the torch.distributed TCPStore the ranks rendezvous on, so no worker has to
be reachable for the others to find each other; gradients then flow worker
to worker (gloo/nccl), never through the server.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from hermes.server.registry import RegistryFull

log = logging.getLogger(__name__)


class GroupFull(RegistryFull):
    """Every rank of the collective group is taken."""


class Coordinator:
    def __init__(self, *, bind_host: str, port: int, advertise_host: str, world_size: int, timeout_seconds: float):
        self.world_size = world_size
        self.timeout_seconds = timeout_seconds
        self.advertise_host = advertise_host
        # The store outlives any one rank's connection; world size None: the
        # ranks count themselves in init_process_group, not the store.
        self.store = dist.TCPStore(bind_host, port, None, True, timeout=timedelta(seconds=timeout_seconds),
                                   wait_for_workers=False)
        self.port = self.store.port
        self.ranks: dict[str, int] = {}  # worker name -> rank
        log.info("collective rendezvous store on %s:%d for %d ranks", bind_host, self.port, world_size)

    def assign(self, name: str) -> int:
        """The worker's rank: registration order; a worker registering again keeps its rank."""
        if name in self.ranks:
            return self.ranks[name]
        if len(self.ranks) >= self.world_size:
            raise GroupFull(f"all {self.world_size} ranks of the collective group are taken")
        self.ranks[name] = len(self.ranks)
        return self.ranks[name]

    def rendezvous(self, name: str) -> dict[str, Any]:
        return {"rank": self.ranks[name], "world_size": self.world_size, "master_addr": self.advertise_host,
                "master_port": self.port, "timeout_seconds": self.timeout_seconds}
