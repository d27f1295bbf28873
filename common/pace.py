"""How an emulated slower device spends a step: ``--slowdown S`` and its ``--slowdown-mode``.

The testbed runs every emulated device on this machine's shared cores and makes a device S times slower by
sleeping after each step. Two rules for how long:

- ``cpu`` (the default, every measurement before 2026-11-28): sleep (S - 1) times the step's own work, its
  thread CPU time with one intra-op thread (``LocalTrainer._work_seconds``). Work that co-located processes
  inflate (cache and SMT contention, and the descheduling the wall clock would count) is multiplied by S too.
  With four agents, a server and link shims on 2 cores, an HL2 agent's step at pace 4 took 1.5-1.9x its
  uncontended cost at the median (hl2-alone on lte, 2026-11-28: fastest agent p5 14.1 ms, p50 20.8 ms a step,
  13.2 ms uncontended), while the fastest device run by itself (``alone``, one process) ran at its nominal
  speed: the emulation charged the cluster for sharing the emulating machine, which real devices do not.
- ``floor``: the device's nominal step is S times the step's uncontended cost, estimated as the least work
  per sample seen over the last ``window`` steps (contention only ever adds to a step's cost), and the step
  sleeps its nominal time less its work. Work that contention inflated no longer slows the device beyond its
  nominal time; a step whose work exceeds its nominal time does not sleep at all (the host is then the
  bottleneck, as in ``cpu`` mode). Time the step spent descheduled (wall less CPU time) is added once in both
  modes. ``alone`` (``deploy/ddp_rank.py``) paces the same way, so both
  sides of the comparison run at their profile's speed.

Not from a paper: an emulation rule of this testbed, chosen per run (``hermes-testbed --slowdown-mode``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

SlowdownMode = Literal["cpu", "floor"]
SLOWDOWN_MODES: tuple[SlowdownMode, ...] = ("cpu", "floor")

# Steps over which the least work per sample is taken: long enough that a few quiet steps are in it, short
# enough that a device whose real cost changes (a schedule, a bigger batch) is followed within a cycle or two.
DEFAULT_WINDOW = 64


class StepPacer:
    """Seconds to sleep after one step of an emulated device ``slowdown`` times slower than this host."""

    def __init__(self, slowdown: float, mode: SlowdownMode = "cpu", window: int = DEFAULT_WINDOW) -> None:
        if not math.isfinite(slowdown) or slowdown < 1.0:
            raise ValueError(f"slowdown must be a finite number >= 1, got {slowdown!r}")
        if mode not in SLOWDOWN_MODES:
            raise ValueError(f"slowdown mode must be one of {', '.join(SLOWDOWN_MODES)}, got {mode!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.slowdown = float(slowdown)
        self.mode: SlowdownMode = mode
        self._per_sample: deque[float] = deque(maxlen=window)

    def set_slowdown(self, slowdown: float) -> None:
        """A device whose speed changes mid-run (``--slowdown-schedule``); the cost estimate is kept."""
        if not math.isfinite(slowdown) or slowdown < 1.0:
            raise ValueError(f"slowdown must be a finite number >= 1, got {slowdown!r}")
        self.slowdown = float(slowdown)

    def sleep_seconds(self, work: float, samples: int) -> float:
        """After a step of ``samples`` samples that took ``work`` seconds of its own work: how long to sleep
        (never negative)."""
        if self.slowdown <= 1.0:
            return 0.0
        if self.mode == "cpu" or samples <= 0:
            return max(0.0, work) * (self.slowdown - 1.0)
        self._per_sample.append(max(0.0, work) / samples)
        nominal = self.slowdown * min(self._per_sample) * samples
        return max(0.0, nominal - max(0.0, work))
