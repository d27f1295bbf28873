"""Collective topology on the server: ranks, group generations and the rendezvous store, nothing else.

torchrun users know the conventions: every worker gets RANK, WORLD_SIZE and
MASTER_ADDR:MASTER_PORT. The master here is the server itself, which hosts
the torch.distributed TCPStore the ranks rendezvous on, so no worker has to
be reachable for the others to find each other; gradients then flow worker
to worker (gloo/nccl), never through the server.

Regrouping follows torchrun's elastic rendezvous: the group has a
*generation*. When a rank dies the survivors report the failed generation
(``arrive``); the first report opens a window of ``regroup_seconds``. It
closes early once every member not known dead has reported; past it, the
server still waits for members it believes alive (they are heartbeating, so
their own collective will fail and they will report, within the group
timeout), but no longer than the group timeout. Then the survivors form
generation g+1 with dense ranks in their old rank order. Each generation
rendezvouses under its own store prefix (``gen{g}/``) on the same TCPStore,
so keys a broken group left behind cannot be read by the next one.

This class is synchronous and takes the time as an argument: the engine
drives it from the event loop, the tests drive it with a fake clock. A lock
guards it because registrations arrive on FastAPI's thread pool while
regroup reports arrive on the event loop.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from hermes.server.registry import RegistryFull

log = logging.getLogger(__name__)


class GroupFull(RegistryFull):
    """Every rank of the collective group is taken."""


class GroupRunning(Exception):
    """A new worker registering after the group re-formed or while it re-forms: refused, not queued."""


class RegroupRefused(Exception):
    """This worker cannot join the next generation (not a member, stale generation, regrouping off)."""


class GroupTooSmall(RegroupRefused):
    """Fewer survivors than collective_min_world_size: the run cannot go on."""


@dataclass(frozen=True)
class Generation:
    number: int
    world_size: int
    members: tuple[str, ...] = ()  # worker names, by rank

    @property
    def store_prefix(self) -> str:
        return f"gen{self.number}/"


@dataclass
class _Pending:
    target: int  # the generation being formed
    deadline: float  # the window: members not reported by then are waited for only while alive
    hard_deadline: float  # nobody is waited for any longer: a live member's collective has failed by then
    arrived: set[str] = field(default_factory=set)


@dataclass(frozen=True)
class Formed:
    generation: Generation
    dropped: tuple[str, ...]  # members of the previous generation left out


class Coordinator:
    def __init__(self, *, bind_host: str, port: int, advertise_host: str, world_size: int, timeout_seconds: float,
                 regroup_seconds: float = 5.0, min_world_size: int = 1):
        self.timeout_seconds = timeout_seconds
        self.regroup_seconds = regroup_seconds
        self.min_world_size = min_world_size
        self.advertise_host = advertise_host
        # The store outlives any one rank's connection; world size None: the
        # ranks count themselves in init_process_group, not the store.
        self.store = dist.TCPStore(bind_host, port, None, True, timeout=timedelta(seconds=timeout_seconds),
                                   wait_for_workers=False)
        self.port = self.store.port
        self.generation = Generation(0, world_size)
        self.dead: set[str] = set()  # members of the current generation known gone
        self.pending: _Pending | None = None
        # Set when the survivors were too few: later reports get the same answer.
        self.failed: str | None = None
        self._lock = threading.RLock()
        log.info("collective rendezvous store on %s:%d for %d ranks", bind_host, self.port, world_size)

    @property
    def world_size(self) -> int:
        return self.generation.world_size

    @property
    def ranks(self) -> dict[str, int]:
        return {name: rank for rank, name in enumerate(self.generation.members)}

    def assign(self, name: str) -> int:
        """The worker's rank: registration order; a worker registering again keeps its rank.

        Only generation 0 admits new workers: a replacement agent cannot join a
        running group (its replica, data position and step count would not match).
        """
        with self._lock:
            gen = self.generation
            if name in gen.members:
                return gen.members.index(name)
            if gen.number > 0 or self.pending is not None:
                raise GroupRunning(f"the collective group is running (generation {gen.number}, "
                                   f"{gen.world_size} ranks) and admits no new or returning workers; "
                                   "start a new run to add agents")
            if len(gen.members) >= gen.world_size:
                raise GroupFull(f"all {gen.world_size} ranks of the collective group are taken")
            self.generation = Generation(0, gen.world_size, gen.members + (name,))
            return len(gen.members)

    def rendezvous(self, name: str) -> dict[str, Any]:
        with self._lock:
            gen = self.generation
            return {"rank": gen.members.index(name), "world_size": gen.world_size, "master_addr": self.advertise_host,
                    "master_port": self.port, "timeout_seconds": self.timeout_seconds,
                    "generation": gen.number, "store_prefix": gen.store_prefix}

    def broken_generation(self, name: str) -> int | None:
        """The generation being replaced, if ``name`` is one of its members that has not reported yet."""
        with self._lock:
            p = self.pending
            if p is None or name in p.arrived or name not in self.generation.members:
                return None
            return self.generation.number

    def mark_dead(self, name: str) -> None:
        """A member left or was marked lost: the open window need not wait for it."""
        with self._lock:
            if name in self.generation.members:
                self.dead.add(name)

    def arrive(self, name: str, failed_generation: int, now: float) -> int:
        """A survivor reports that ``failed_generation`` broke; returns the generation it will join."""
        with self._lock:
            if self.failed is not None:
                raise GroupTooSmall(self.failed)
            gen = self.generation
            if name not in gen.members:
                raise RegroupRefused(f"{name} is not a member of the collective group's generation {gen.number}: "
                                     "the group re-formed without it")
            if failed_generation == gen.number - 1 and self.pending is None:
                return gen.number  # a retried report: this worker is in the generation that formed
            if failed_generation != gen.number:
                raise RegroupRefused(f"{name} reports generation {failed_generation} but the group is at "
                                     f"generation {gen.number}")
            if self.pending is None:
                self.pending = _Pending(gen.number + 1, now + self.regroup_seconds,
                                        now + self.regroup_seconds + self.timeout_seconds)
                log.warning("collective generation %d broke (reported by %s): waiting up to %.1fs for the "
                            "survivors", gen.number, name, self.regroup_seconds)
            self.pending.arrived.add(name)
            self.dead.discard(name)
            return self.pending.target

    def due(self, now: float, alive: frozenset[str] = frozenset()) -> bool:
        """The next generation can form: every member not known dead reported, or the window closed
        and none of the missing ones is ``alive`` (still heartbeating), or the hard deadline passed."""
        with self._lock:
            p = self.pending
            if p is None:
                return False
            missing = set(self.generation.members) - self.dead - p.arrived
            if not missing or now >= p.hard_deadline:
                return True
            return now >= p.deadline and not missing & alive

    def seconds_left(self, now: float) -> float:
        """Until the next moment ``due`` can change by the clock alone."""
        p = self.pending
        if p is None:
            return 0.0
        return max(0.0, (p.deadline if now < p.deadline else p.hard_deadline) - now)

    def form(self) -> Formed:
        """Close the window: the survivors, in their old rank order, become ranks 0..n-1."""
        with self._lock:
            assert self.pending is not None
            old, p = self.generation, self.pending
            survivors = tuple(m for m in old.members if m in p.arrived)
            dropped = tuple(m for m in old.members if m not in p.arrived)
            self.pending = None
            self.dead = set()
            if len(survivors) < self.min_world_size:
                self.failed = (f"the collective group fell to {len(survivors)} rank(s) after generation "
                               f"{old.number} broke, below collective_min_world_size={self.min_world_size}")
                log.error("%s; the run ends", self.failed)
                raise GroupTooSmall(self.failed)
            self.generation = Generation(p.target, len(survivors), survivors)
            log.warning("collective generation %d formed with %d rank(s) %s; dropped %s", p.target, len(survivors),
                        ", ".join(survivors), ", ".join(dropped) or "none")
            return Formed(self.generation, dropped)
