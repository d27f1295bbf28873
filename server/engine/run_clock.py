"""The run's clock: training seconds since the start, with server restarts counted apart.

One part owns ``started_at``: on a resume it is written once, from the last
moment the previous server was known alive, so ``time() - started_at`` counts
training seconds only and the gap since (downtime) is kept beside it. The
wall clock is injected (``hermes.common.clock``): tests and the simulator
move it by hand.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hermes.common.clock import Clock


class RunClock:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.started_at = clock.time()
        self.downtime_seconds = 0.0

    def seconds(self, now: float | None = None) -> float:
        """Training seconds at ``now`` (default: the clock's now), unrounded."""
        return (self.clock.time() if now is None else now) - self.started_at

    def elapsed(self, now: float | None = None) -> float:
        """Training seconds as events and workload histories stamp them (ms resolution)."""
        return round(self.seconds(now), 3)

    def state_dict(self) -> dict[str, Any]:
        return {"elapsed_seconds": self.seconds(), "downtime_seconds": self.downtime_seconds}

    def load_state_dict(self, state: Mapping[str, Any], *, alive: tuple[float, float] | None = None) -> float:
        """Go on from a checkpoint; returns this restart's downtime in seconds.

        ``alive``: (training seconds, wall-clock time) of the last moment the
        previous server was known alive: its last journaled fold, else its
        checkpoint. Without it the run goes on from the checkpoint's
        training seconds with no downtime added.
        """
        now = self.clock.time()
        elapsed, alive_at = alive if alive is not None else (float(state.get("elapsed_seconds", 0.0)), now)
        down = max(0.0, now - alive_at)
        self.started_at = now - elapsed
        self.downtime_seconds = float(state.get("downtime_seconds", 0.0)) + down
        return down
