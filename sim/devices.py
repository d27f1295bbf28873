"""A simulated device: how fast it trains, how much memory it has, its link, and when it is online.

Everything here is a pure function of its inputs and a seed: the simulator
asks ``online(t)`` and ``next_change(t)`` in any order and gets the same
answers on any machine, whatever its load.

Availability models:

* :data:`ALWAYS_ON`;
* :class:`IntervalAvailability`: online in listed ``[start, end)`` intervals,
  optionally repeating with a period (FedScale replays its
  ``client_behave_trace`` that way, see :mod:`hermes.sim.populations`);
* :class:`TwoStateAvailability`: alternating on and off spells drawn from a
  seeded generator, exponential (:func:`churn`) or resampled from observed
  spell lengths (:class:`EmpiricalSpells`).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Availability(Protocol):
    def online(self, t: float) -> bool: ...

    def next_change(self, t: float) -> float | None:
        """The first time > t where ``online()`` flips; None: never."""
        ...


@dataclass(frozen=True)
class DeviceProfile:
    device_id: str
    family: str
    flops: float  # effective training FLOP/s (the simulator divides the task's FLOPs per sample by it)
    memory_mb: float
    up_mbps: float  # device -> server; math.inf: unshaped
    down_mbps: float  # server -> device; math.inf: unshaped
    rtt_s: float
    availability: Availability


class _AlwaysOn:
    def online(self, t: float) -> bool:
        return True

    def next_change(self, t: float) -> float | None:
        return None

    def __repr__(self) -> str:
        return "ALWAYS_ON"


ALWAYS_ON: Availability = _AlwaysOn()


class AvailabilityError(ValueError):
    """Intervals or spell parameters that cannot describe an availability."""


@dataclass(frozen=True)
class IntervalAvailability:
    """Online in ``[start, end)`` of each interval; with ``period``, the pattern repeats every ``period`` seconds.

    Intervals must be sorted, non-overlapping, non-empty and, with a period,
    lie within ``[0, period]``.
    """

    intervals: tuple[tuple[float, float], ...]
    period: float | None = None
    _edges: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        prev = -math.inf
        for start, end in self.intervals:
            if not (start < end) or start < prev:
                raise AvailabilityError(f"intervals must be sorted, non-empty and disjoint; got {self.intervals}")
            prev = end
        if self.period is not None:
            if not self.period > 0:
                raise AvailabilityError(f"period must be positive, got {self.period}")
            if self.intervals and (self.intervals[0][0] < 0 or self.intervals[-1][1] > self.period):
                raise AvailabilityError(f"intervals must lie within [0, {self.period}] when they repeat")
        # Touching intervals ([0, 5), [5, 9)) are one spell: no flip at 5.
        edges: list[float] = []
        for start, end in self.intervals:
            if edges and edges[-1] == start:
                edges[-1] = end
            else:
                edges += [start, end]
        object.__setattr__(self, "_edges", tuple(edges))

    def _local(self, t: float) -> tuple[float, float]:
        if self.period is None:
            return 0.0, t
        base = math.floor(t / self.period) * self.period
        return base, t - base

    def online(self, t: float) -> bool:
        _, local = self._local(t)
        # Even edge count before t: outside any interval.
        return bisect.bisect_right(self._edges, local) % 2 == 1

    def next_change(self, t: float) -> float | None:
        flips = self._edges
        if self.period is not None and flips and flips[0] == 0.0 and flips[-1] == self.period:
            flips = flips[1:-1]  # online across the wrap: no flip at the period's ends
        if not flips:
            return None
        base, local = self._local(t)
        i = bisect.bisect_right(flips, local)
        if i < len(flips):
            return base + flips[i]
        return None if self.period is None else base + self.period + flips[0]


class SpellSampler(Protocol):
    def on(self, rng: np.random.Generator) -> float: ...

    def off(self, rng: np.random.Generator) -> float: ...


@dataclass(frozen=True)
class ExponentialSpells:
    """On and off spells with exponential lengths (a two-state Markov chain in continuous time)."""

    mean_on_s: float
    mean_off_s: float

    def __post_init__(self) -> None:
        if not (self.mean_on_s > 0 and self.mean_off_s > 0):
            raise AvailabilityError(f"mean spell lengths must be positive, got on={self.mean_on_s}, "
                                    f"off={self.mean_off_s}")

    def on(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean_on_s))

    def off(self, rng: np.random.Generator) -> float:
        return float(rng.exponential(self.mean_off_s))

    @property
    def offline_fraction(self) -> float:
        return self.mean_off_s / (self.mean_on_s + self.mean_off_s)


@dataclass(frozen=True)
class EmpiricalSpells:
    """Spell lengths resampled (with replacement) from observed ones, e.g. a FedScale behaviour trace's."""

    on_s: tuple[float, ...]
    off_s: tuple[float, ...]

    def __post_init__(self) -> None:
        if not self.on_s or not self.off_s or min(self.on_s) <= 0 or min(self.off_s) <= 0:
            raise AvailabilityError("empirical spells need at least one positive on and one positive off length")

    def on(self, rng: np.random.Generator) -> float:
        return self.on_s[int(rng.integers(len(self.on_s)))]

    def off(self, rng: np.random.Generator) -> float:
        return self.off_s[int(rng.integers(len(self.off_s)))]

    @property
    def offline_fraction(self) -> float:
        mean_on, mean_off = float(np.mean(self.on_s)), float(np.mean(self.off_s))
        return mean_off / (mean_on + mean_off)


class TwoStateAvailability:
    """Alternating on/off spells from ``spells``, seeded: the same seed gives the same spells.

    The first state is online with probability ``1 - offline_fraction`` (the
    chain's stationary share), so a population starts with its steady-state
    share offline instead of all devices online at t = 0. Spells are drawn
    lazily as queries reach further in time; queries may come in any order.
    """

    def __init__(self, spells: ExponentialSpells | EmpiricalSpells, seed: int) -> None:
        self.spells = spells
        self._rng = np.random.default_rng(seed)
        self._first_online = bool(self._rng.random() >= spells.offline_fraction)
        self._edges: list[float] = [0.0]  # spell i covers [edges[i], edges[i+1])

    def _extend_past(self, t: float) -> None:
        while self._edges[-1] <= t:
            online = ((len(self._edges) - 1) % 2 == 0) == self._first_online
            length = self.spells.on(self._rng) if online else self.spells.off(self._rng)
            self._edges.append(self._edges[-1] + max(length, 1e-9))

    def online(self, t: float) -> bool:
        if t < 0:
            t = 0.0
        self._extend_past(t)
        spell = bisect.bisect_right(self._edges, t) - 1
        return (spell % 2 == 0) == self._first_online

    def next_change(self, t: float) -> float | None:
        t = max(t, 0.0)
        self._extend_past(t)
        return self._edges[bisect.bisect_right(self._edges, t)]

    def __repr__(self) -> str:
        return f"TwoStateAvailability({self.spells!r})"


def churn(offline_fraction: float, mean_off_s: float, seed: int) -> Availability:
    """Offline about ``offline_fraction`` of the time in exponential spells averaging ``mean_off_s``.

    ``churn(0.2, 60, seed)``: offline a fifth of the time, one-minute outages
    on average, online spells four times as long (0.2 = off / (on + off)).
    """
    if offline_fraction == 0:
        return ALWAYS_ON
    if not 0 < offline_fraction < 1:
        raise AvailabilityError(f"offline fraction must be in [0, 1), got {offline_fraction}")
    mean_on_s = mean_off_s * (1 - offline_fraction) / offline_fraction
    return TwoStateAvailability(ExponentialSpells(mean_on_s, mean_off_s), seed)


def offline_share(availability: Availability, horizon_s: float) -> float:
    """The share of ``[0, horizon_s)`` spent offline, walking the flips (for tests and summaries)."""
    t, off = 0.0, 0.0
    while t < horizon_s:
        nxt = availability.next_change(t)
        end = horizon_s if nxt is None else min(nxt, horizon_s)
        if not availability.online(t):
            off += end - t
        t = end
    return off / horizon_s
