"""A simulated cluster around one allocator, fed as the engine feeds it: the allocation tests drive their
policies through it (OmniLearn Table I's HL8 cores as the default speeds)."""

from __future__ import annotations

import math

from hermes.common.config import build_config
from hermes.common.policies.allocation import CycleObservation, Resize, Workload

# OmniLearn Table I, HL8 (BSP): CPU cores of the 4 workers. Speeds are
# proportional to cores, normalised to the fastest: 1000 samples/s for 32 cores.
HL8_CORES = {"w1": 6, "w2": 6, "w3": 4, "w4": 32}
HL8 = {w: 1000.0 * c / 32 for w, c in HL8_CORES.items()}
EPOCH = 2048  # samples per data epoch in these simulations: 4 rounds of 4 workers x 128 samples


class Cluster:
    """Simulated workers around one allocator, fed exactly as ``server/engine.py`` feeds it."""

    def __init__(self, alloc, speeds: dict[str, float] | None = None, *, overhead: float = 0.0,
                 capacities: dict[str, float | None] | None = None) -> None:
        self.alloc = alloc
        self.speed: dict[str, float] = {}
        self.overhead = overhead  # fixed seconds per optimizer step (a per-step cost the law does not model)
        self.round = 0
        self.log: list[tuple[int, str, Resize]] = []  # (round, worker, resize)
        for w, s in (speeds or {}).items():
            self.join(w, s, (capacities or {}).get(w))

    # -- membership, as engine.register / engine.leave --
    def join(self, worker: str, speed: float, capacity: float | None = None) -> dict[str, Resize]:
        self.speed[worker] = speed
        self.alloc.join(worker, capacity)
        return self.rebalance()

    def leave(self, worker: str) -> dict[str, Resize]:
        self.speed.pop(worker)
        self.alloc.forget(worker)
        return self.rebalance()

    def rebalance(self) -> dict[str, Resize]:
        out = self.alloc.rebalance()
        for w, r in out.items():
            assert isinstance(r, Resize)
            # What a Resize announces is what the allocator hands out from now on.
            assert r.workload == self.alloc.workload(w), (w, r)
            self.log.append((self.round, w, r))
        return out

    # -- the data plane --
    def seconds(self, worker: str, wl: Workload) -> float:
        steps = math.ceil(wl.dss / wl.effective_batch_size)
        return wl.dss / self.speed[worker] + self.overhead * steps

    def report(self, worker: str, wl: Workload, seconds: float | None = None) -> dict[str, Resize]:
        secs = self.seconds(worker, wl) if seconds is None else seconds
        self.alloc.observe(worker, CycleObservation(wl.dss, wl.batch_size, secs, wl.accumulation))
        return self.rebalance()

    def run_round(self) -> dict[str, Resize]:
        """Every worker runs one cycle at the workload it holds when the round starts."""
        self.round += 1
        assigned = {w: self.alloc.workload(w) for w in sorted(self.speed)}
        out: dict[str, Resize] = {}
        for w, wl in assigned.items():
            out.update(self.report(w, wl))
        return out

    def run(self, rounds: int) -> None:
        for _ in range(rounds):
            self.run_round()

    # -- what the tests look at --
    def batches(self) -> dict[str, int]:
        return {w: self.alloc.workload(w).effective_batch_size for w in sorted(self.speed)}

    def times(self) -> dict[str, float]:
        return {w: self.seconds(w, self.alloc.workload(w)) for w in sorted(self.speed)}

    def imbalance(self) -> float:
        t = self.times().values()
        return max(t) / min(t)

    def step_rounds(self) -> list[int]:
        return sorted({r for r, _, _ in self.log})


def alloc_for(preset: str, *, epoch_samples: int = EPOCH, **overrides):
    cfg = build_config(preset, **overrides)
    return cfg.build_policy("allocation", dss_max=10_000, epoch_samples=epoch_samples), cfg
