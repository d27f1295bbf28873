"""How an emulated slower device spends a step: ``--slowdown S`` and its ``--slowdown-mode``.

The testbed runs every emulated device on this machine's shared cores and makes a device S times slower by
sleeping after each step. Two rules for how long:

- ``cpu`` (the default, every measurement before 2026-11-28): sleep (S - 1) times the step's own work, its
  thread CPU time with one intra-op thread (``LocalTrainer._work_seconds``). Time the step waits for a core,
  and the sleep's late wake-up on a busy host, come on top. With four agents, a server and link shims on 2
  cores, an HL2 agent's step at pace 4 took 1.4-1.9x its uncontended cost at the median (hl2-alone on lte, 2026-11-28: fastest agent p5 14.1 ms, p50 20.8 ms a step,
  13.2 ms uncontended), while the fastest device run by itself (``alone``, one process) ran at its nominal
  speed: the emulation charged the cluster for sharing the emulating machine, which real devices do not.
- ``floor``: the device's nominal step is S times the step's uncontended cost, estimated as the least work
  per sample seen over the last ``window`` steps (contention only ever adds to a step's cost), and the step
  lasts that nominal time on the wall clock: it sleeps the nominal time less the wall time it has taken
  (computing, and waiting for a core), less what the previous sleep overslept (a sleeping process woken late
  by a busy host; the credit is at most one nominal step, and only the sleep's own overshoot counts, never
  time spent outside the step). Contention that fits in the nominal step no longer slows the device; a step
  that takes longer than its nominal time does not sleep (the host is then the bottleneck, as in ``cpu``
  mode). ``alone`` (``deploy/ddp_rank.py``) paces the same way, so both sides of the comparison run at their
  profile's speed. Measured first with the step's CPU time in place of its wall time (2026-11-28): the
  fastest agent's median step did not move (23-24 ms against 13.2 ms nominal), since the time lost was
  waiting for a core and waking from the sleep, not CPU time.

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
        self.set_slowdown(slowdown)
        if mode not in SLOWDOWN_MODES:
            raise ValueError(f"slowdown mode must be one of {', '.join(SLOWDOWN_MODES)}, got {mode!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        self.mode: SlowdownMode = mode
        self._per_sample: deque[float] = deque(maxlen=window)
        self._overslept = 0.0

    def set_slowdown(self, slowdown: float) -> None:
        """A device whose speed changes mid-run (``--slowdown-schedule``); the cost estimate is kept."""
        if not math.isfinite(slowdown) or slowdown < 1.0:
            raise ValueError(f"slowdown must be a finite number >= 1, got {slowdown!r}")
        self.slowdown = float(slowdown)

    def sleep_seconds(self, work: float, samples: int, elapsed: float | None = None) -> float:
        """After a step of ``samples`` samples that took ``work`` seconds of its own work (``elapsed`` wall
        seconds so far; ``work`` when not given): how long to sleep (never negative)."""
        if self.slowdown <= 1.0:
            return 0.0
        if self.mode == "cpu" or samples <= 0:
            return max(0.0, work) * (self.slowdown - 1.0)
        self._per_sample.append(max(0.0, work) / samples)
        nominal = self.slowdown * min(self._per_sample) * samples
        spent = max(0.0, work if elapsed is None else elapsed)
        credit, self._overslept = min(self._overslept, nominal), 0.0
        return max(0.0, nominal - spent - credit)

    def slept(self, requested: float, actual: float) -> None:
        """How long the last sleep really took: in ``floor`` mode its overshoot shortens the next step's sleep."""
        if self.mode == "floor":
            self._overslept = max(0.0, actual - requested)
