"""Heterogeneity profiles for emulated clusters.

OmniLearn Table I allocates CPU cores to 4 BSP workers so that the
heterogeneity level HL = fastest/slowest (OmniLearn Eq. 3) is 1, 2, 4 or 8.
On one machine we emulate a worker with c cores as a worker that is
max(c)/c times slower (the DP paper's delay injection: sleep in proportion to
measured compute time).
"""

from __future__ import annotations

from dataclasses import dataclass

# OmniLearn Table I, BSP rows: cores of nodes #1..#4.
PROFILE_CORES: dict[str, tuple[int, ...]] = {
    "hl1": (12, 12, 12, 12),
    "hl2": (12, 12, 8, 16),
    "hl4": (9, 9, 6, 24),
    "hl8": (6, 6, 4, 32),
}


@dataclass(frozen=True)
class WorkerProfile:
    index: int
    cores: int
    speed: float  # relative to the fastest worker, in (0, 1]
    slowdown: float  # 1 / speed
    threads: int


def heterogeneity_level(cores: tuple[int, ...] | list[float]) -> float:
    """HL = max/min compute capacity (OmniLearn Eq. 3)."""
    return max(cores) / min(cores)


def worker_profiles(profile: str, clients: int, max_threads: int = 1) -> list[WorkerProfile]:
    """Per-worker speed for ``clients`` workers; the 4-node pattern repeats for N != 4.

    Threads scale with cores up to ``max_threads`` (default 1: on a small
    machine the sleep-based slowdown carries the heterogeneity).
    """
    try:
        pattern = PROFILE_CORES[profile]
    except KeyError:
        raise ValueError(f"unknown profile {profile!r}; known: {sorted(PROFILE_CORES)}") from None
    if clients <= 0:
        raise ValueError("clients must be positive")
    cores = [pattern[i % len(pattern)] for i in range(clients)]
    fastest = max(cores)
    return [
        WorkerProfile(
            index=i,
            cores=c,
            speed=c / fastest,
            slowdown=fastest / c,
            threads=max(1, round(max_threads * c / fastest)),
        )
        for i, c in enumerate(cores)
    ]


def parse_speed_schedule(text: str) -> list[tuple[float, str]]:
    """``"0:hl1,30:hl8,60:hl1"`` -> [(0.0, "hl1"), (30.0, "hl8"), (60.0, "hl1")] (OmniLearn's HL steps)."""
    steps = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        at, sep, profile = part.partition(":")
        if not sep:
            raise ValueError(f"speed schedule step {part!r}: expected SECONDS:PROFILE")
        try:
            seconds = float(at)
        except ValueError:
            raise ValueError(f"speed schedule step {part!r}: {at!r} is not a number of seconds") from None
        if profile not in PROFILE_CORES:
            raise ValueError(f"speed schedule step {part!r}: unknown profile {profile!r}")
        steps.append((seconds, profile))
    if not steps:
        raise ValueError("empty speed schedule")
    if [s for s, _ in steps] != sorted(s for s, _ in steps):
        raise ValueError("speed schedule steps must be in increasing time order")
    return steps


def slowdown_schedules(steps: list[tuple[float, str]], clients: int) -> list[list[tuple[float, float]]]:
    """Per-worker [(seconds, slowdown)] from a profile schedule."""
    per_worker: list[list[tuple[float, float]]] = [[] for _ in range(clients)]
    for seconds, profile in steps:
        for wp in worker_profiles(profile, clients):
            per_worker[wp.index].append((seconds, wp.slowdown))
    return per_worker
