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
- ``nominal`` (the ``hl2-alone`` suite's since 2026-11-28, branch hl2nom7): ``floor`` with one fixed nominal
  cost per sample for every device and for ``alone`` (``--nominal-sample-ms``: ``hermes-bench`` measures the
  task's uncontended train step once per invocation, in a fresh process before any run starts,
  ``deploy/bench/nominal.py``). Under ``floor`` each side paced from its own loop's least cost, which differ
  (``alone``'s ``deploy/ddp_rank.py`` against the agents' ``LocalTrainer``): at pace 6 ``alone`` ran 17.3-18.8
  ms a step against the agents' 14.0-15.9 (docs/compression.md, fifth pass). The mode also slows the agent's
  device CPU outside its training steps (gate validation, the push's encoding, the rebase on a pulled model:
  3-12 ms a cycle on the fastest HL2 agent at pace 4), which a device S times slower pays S times
  (``hermes-sim`` charges it; ``cpu`` and ``floor`` leave it unslowed): that stretch lasts S times its thread
  CPU time on the wall clock, waiting for replies left out (``overhead_seconds``).

Not from a paper: an emulation rule of this testbed, chosen per run (``hermes-testbed --slowdown-mode``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Literal

SlowdownMode = Literal["cpu", "floor", "nominal"]
SLOWDOWN_MODES: tuple[SlowdownMode, ...] = ("cpu", "floor", "nominal")

# Steps over which the least work per sample is taken: long enough that a few quiet steps are in it, short
# enough that a device whose real cost changes (a schedule, a bigger batch) is followed within a cycle or two.
DEFAULT_WINDOW = 64


class StepPacer:
    """Seconds to sleep after one step of an emulated device ``slowdown`` times slower than this host."""

    def __init__(self, slowdown: float, mode: SlowdownMode = "cpu", window: int = DEFAULT_WINDOW,
                 nominal_sample_seconds: float | None = None) -> None:
        self.set_slowdown(slowdown)
        if mode not in SLOWDOWN_MODES:
            raise ValueError(f"slowdown mode must be one of {', '.join(SLOWDOWN_MODES)}, got {mode!r}")
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if mode == "nominal" and not (nominal_sample_seconds is not None and math.isfinite(nominal_sample_seconds)
                                      and nominal_sample_seconds > 0):
            raise ValueError(f"slowdown mode 'nominal' needs a nominal cost per sample > 0 (--nominal-sample-ms), "
                             f"got {nominal_sample_seconds!r}")
        if mode != "nominal" and nominal_sample_seconds is not None:
            raise ValueError(f"a nominal cost per sample is used by slowdown mode 'nominal' only, not {mode!r}")
        self.mode: SlowdownMode = mode
        self.nominal_sample_seconds = nominal_sample_seconds
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
        if self.nominal_sample_seconds is not None:
            per_sample = self.nominal_sample_seconds  # one cost for every device and alone: not its own loop's
        else:
            self._per_sample.append(max(0.0, work) / samples)
            per_sample = min(self._per_sample)
        nominal = self.slowdown * per_sample * samples
        spent = max(0.0, work if elapsed is None else elapsed)
        credit, self._overslept = min(self._overslept, nominal), 0.0
        return max(0.0, nominal - spent - credit)

    def overhead_seconds(self, cpu: float, elapsed: float) -> float:
        """After the device's work outside its steps (``cpu`` thread CPU seconds in ``elapsed`` wall seconds,
        waiting for replies left out): how long to sleep so that it lasts ``slowdown`` times its CPU time.
        ``nominal`` mode only; the other modes leave that work unslowed (0), as every run before them did."""
        if self.mode != "nominal" or self.slowdown <= 1.0:
            return 0.0
        return max(0.0, self.slowdown * max(0.0, cpu) - max(0.0, elapsed))

    def slept(self, requested: float, actual: float) -> None:
        """How long the last sleep really took: in ``floor`` and ``nominal`` modes its overshoot shortens the
        next step's sleep (a step's and the work after it's, added up until the next step spends them)."""
        if self.mode != "cpu":
            self._overslept += max(0.0, actual - requested)
