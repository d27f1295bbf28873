"""Clocks: where time matters it is injected, so tests move it instead of sleeping.

``SystemClock`` is the real one; ``ManualClock`` is advanced by hand. Both
answer the two questions code asks: seconds on a monotonic scale (intervals,
timeouts) and seconds since the epoch (stamps written for people and files).
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def time(self) -> float: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def time(self) -> float:
        return time.time()


SYSTEM_CLOCK = SystemClock()


class ManualClock:
    """A clock that moves only when told to (tests, simulations)."""

    def __init__(self, start: float = 1_000.0, wall: float = 1_700_000_000.0) -> None:
        self._mono = start
        self._offset = wall - start

    def monotonic(self) -> float:
        return self._mono

    def time(self) -> float:
        return self._mono + self._offset

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"a clock does not run backwards ({seconds} s)")
        self._mono += seconds
