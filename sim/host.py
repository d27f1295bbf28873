"""The testbed's machine: the server and the agents as processes sharing its cores (``hermes-sim --host``).

On the testbed (``hermes-testbed``) the server and every agent are processes of one machine: 2 vCPUs here,
shared with whatever else runs on it. Measured on it (docs/simulation.md#calibration-against-the-testbed-issue-27):
in asynchronous presets each agent's cycle took 1.25-1.5x its uncontended time and each push or pull waited
15-25 ms for the server, against about 1 ms of the server's own CPU. Neither is a property of a device or of a
policy; it is processor sharing. With ``--host`` the simulation models it:

* every CPU burst is a job on the host: an agent's training (its CPU part), the agent's encoding of a message
  and decoding of a reply, each engine operation of the server (``sim.server_cost``; the server's FIFO
  of operations runs them one at a time) and each evaluation;
* the host serves its runnable jobs by processor sharing (fluid, Kleinrock's PS discipline): with ``n`` of
  them and ``background`` other runnable processes of the machine, each job runs at
  ``min(1, cores / (n + background))`` of a core (a job is one thread: it never gets more than one core);
* a slowed testbed agent (``--slowdown s``) sleeps ``(s - 1)`` times each step's CPU time after the step
  (``client/trainer.py``, ``_emulate_slowdown``): the sleep takes no core. So a device of ``flops`` below the
  host's thread rate computes ``work / thread_flops`` on the host and then sleeps the rest of
  ``work / flops``; a device at or above the thread rate computes ``work / flops`` (never sleeps). Its
  steps alternate as the agent's do (``steps`` chunks a cycle);
* a training step costs a fixed part besides its samples' FLOPs: a testbed agent's cycle in larger batches is
  cheaper per sample, as measured (``BATCH_COST``, ``batch_cost``);
* a thread woken by a message waits for a core first (``wakeups``): processor sharing is fluid, but the
  scheduler is not. A long CPU burst gets its fair share either way (the agents' compute matched), while a
  short one that wakes when every core is taken waits for a running task's slice to end, and on the
  testbed each message wakes a thread in each process it crosses (ZeroMQ's I/O threads, the server's event
  loop, the agent's thread). ``Host.wake`` charges that wait, no CPU: a request/reply round trip waits
  ``WAKEUP_RTT_S`` and a thread hop of the server's event loop (``asyncio.to_thread``) ``WAKEUP_HOP_S``,
  both measured means against the number of other nice-0 runnable processes
  (``benchmarks/sim_host_wakeup.py --burners``), read at the host's ``jobs + background``;
* a slowed agent's step right after its slowdown's sleep runs on a core of its own for up to ``sleeper`` CPU
  seconds (off by default): the kernel (EEVDF, Linux >= 6.6; this machine's is 6.18) keeps a sleeping task's
  lag, so a thread that slept while others ran wakes eligible and preempts them, where fluid sharing gives it
  the same share as the always-busy threads. Measured on the testbed (``lan`` ``hermes-paper``, seed 3,
  2026-11-28): the slowed agents' core share 0.51-0.58 against the unslowed agent's 0.36, a 5.33x agent's
  single 64-sample step 24-26 ms a cycle (what it takes at a full core), 35 ms in the fluid model; seed 4, at
  background 5.81, gave every agent the same share: the credit depends on the load, so it stays off by default.
  Besides the slowed agents' steps, any agent's first step after the reply it waited on is such a burst.
  ``sleeper="auto"`` reads the credit measured beside K competing sessions (``SLEEPER_CREDIT_S``,
  ``benchmarks/sim_host_sleeper.py``): 0.35-1.5 ms at K = 1-8, not the 5 ms fitted to seed 3; with it
  ``hermes-paper``'s cells miss by more than without (docs/simulation.md), so it is off by default too.

* ``floor=1``: the testbed's ``--slowdown-mode floor`` (common/pace.py) instead of the ``cpu`` rule above: a slowed
  agent's step lasts S times its least cost (``FLOOR_STEP_S``) unless its CPU burst on the host takes longer; the
  agent's own ``StepPacer`` decides each sleep (``Host.step_sleep``), as on the testbed.
* ``nominal=MS,pace=P``: the testbed's ``--slowdown-mode nominal`` at ``--pace P`` (common/pace.py) instead: every
  agent, the unslowed one included, paces each step to ``S x P x MS`` a sample (``hermes-bench``'s per-invocation
  probe, ``deploy/bench/nominal.py``; the run's ``results.json`` says it), its own ``StepPacer`` in ``nominal`` mode
  deciding each sleep, and its CPU outside the steps (the gate's validation, a push's encoding and its reply's
  decoding) lasts ``S x P`` times that CPU (``StepPacer.overhead_seconds``, as ``LocalTrainer.pace_overhead``).
  Its bursts still run on the host's cores; with ``thread_flops`` at the probe's rate and no ``background``, a
  step is its nominal time whenever the run's own jobs leave its burst room, which is what the testbed's pace
  is chosen for (docs/simulation.md, the nominal rule).

The constants are this machine's, measured by ``benchmarks/sim_host_calibrate.py`` (one torch thread,
``time.thread_time``): an agent thread's training FLOP/s and an agent's CPU per message. ``background``
is not a constant of the machine but of the moment: the other processes that want a core while the run
runs (the load average, less the testbed's own processes). It is an input, like the link: the calibration
passes the load measured during the testbed runs it compares with.

Deterministic: every time is virtual, jobs finish in time order and, at equal times, in the order they
started.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, fields, replace
from typing import Any

import numpy as np

from hermes.common.pace import StepPacer

# benchmarks/sim_host_calibrate.py on 2026-11-27 19:43 UTC (20 repeats, load average 18.5 before and after:
# CPU seconds of one thread, which other processes' load delays but inflates little): the paper's CNN (hidden
# 320) on mnist1d, 128 samples in batches of 32 in 16.13 ms of CPU, 953,600 training FLOPs a sample.
THREAD_FLOPS = 7.567e9
# The same run: an agent's signed encoding of a 108,618-parameter push (0.14 ms) and its decoding, MAC check
# and load_flat of a model reply of that size (0.30 ms); per byte of payload (a message without one is
# charged nothing: its header's cost is below the model's resolution).
AGENT_SEND_CPU_S_PER_BYTE = 0.000142 / (108_618 * 4)
AGENT_RECEIVE_CPU_S_PER_BYTE = 0.000301 / (108_618 * 4)
# A training step's CPU has a part that does not grow with its batch (the optimizer step, zero_grad, the
# framework's per-call overhead), so a sample costs less in a larger batch: benchmarks/sim_host_calibrate.py on
# 2026-11-27 23:17 UTC (15 repeats, load average 10.3 -> 10.2; docs/bench/sim-calibration-4/host-constants.json):
# 256 samples in batches of 16, 32, 64, 128 took 36.86, 24.48, 15.01, 11.54 ms of thread CPU (a straight line
# through them: 1.82 ms a step + 32.5 us a sample). A sample's cost in a batch of B over its cost in a batch of
# REFERENCE_BATCH (the batch THREAD_FLOPS was measured at), linear between the measured B, the nearest outside.
# The FLOPs model alone makes every batch cost the same per sample; on the testbed a batch of 64 costs 0.61x per
# sample, which the Hermes paper's MBS search finds and uses (docs/simulation.md).
REFERENCE_BATCH = 32
BATCH_COST: tuple[tuple[float, float], ...] = (
    (16.0, 36.86 / 24.48), (32.0, 1.0), (64.0, 15.01 / 24.48), (128.0, 11.54 / 24.48))
# The testbed machine's cores (os.cpu_count() on it: 2 vCPU AMD EPYC).
CORES = 2.0
# benchmarks/sim_host_wakeup.py --burners 0,1,2,3,4,5,6,8 --round-trips 400 (nice 0, under the bench lock,
# 2026-11-27 22:37-22:39 UTC, load average 12.3 -> 18.5 of mostly nice-15 work; docs/bench/sim-calibration-4/):
# the mean wall seconds of a 1-byte ZeroMQ DEALER/ROUTER round trip between two processes (each asleep 5 ms
# between messages, as an agent between its messages) and of an asyncio loop's ``to_thread`` hop, beside K
# nice-0 processes spinning on the 2 cores. Means, not medians: a wake-up finds a core free or waits for a
# slice (bimodal), and a run's time adds the means. (K, round trip s, thread hop s); linear between, the
# nearest row's outside (not measured past 8). Not monotonic in K (5-8 spinners waited less than 3-4; one
# measurement of 400 each: K = 0's mean, 2.0 ms against a 0.4 ms median, is the machine's other load).
WAKEUP_RTT_S: tuple[tuple[float, float, float], ...] = (
    (0.0, 0.00203, 0.00028),
    (1.0, 0.00095, 0.00039),
    (2.0, 0.00524, 0.00030),
    (3.0, 0.00914, 0.00139),
    (4.0, 0.01305, 0.00455),
    (5.0, 0.00504, 0.00169),
    (6.0, 0.00470, 0.00133),
    (8.0, 0.00604, 0.00211),
)
# benchmarks/sim_host_sleeper.py --groups same,own (nice 0, under the bench lock, 2026-11-28 04:08-04:11 UTC,
# load average 5.8 -> 8.6; docs/bench/sim-calibration-6/sleeper-burners.json): beside K nice-0 processes spinning
# each in a session of its own (the testbed starts its server and each agent so: deploy/procs.py, and this
# machine's autogroups share the CPU between sessions), the CPU seconds of a thread's burst after a sleep that
# ran at a full core, the rest at the share the spinners got over the same window: the mean of 30 bursts of
# each kind the model credits (a 5.33x and an 8x agent's 5 ms step after its slowdown's sleep, a 20 ms step
# after a 5 ms wait), averaged over the three. (K, credit s) for HostSpec.sleeper = "auto"; linear between, the
# nearest row's outside. K = 0: a core is free, nothing to preempt (the host's rate is 1 there anyway). One
# measurement; its kinds spread 0-1.9 ms at one K. With the spinners in this session's group (``same``) the
# credit was 0-0.3 ms at K >= 2.
SLEEPER_CREDIT_S: tuple[tuple[float, float], ...] = (
    (0.0, 0.0),
    (1.0, 0.00036),
    (2.0, 0.00035),
    (3.0, 0.00092),
    (4.0, 0.00147),
    (6.0, 0.00115),
    (8.0, 0.00079),
)
# The testbed's ``--slowdown-mode floor`` (common/pace.py, ``HostSpec.floor``): a slowed agent's step lasts S times
# the least thread CPU a sample its pacer has seen over its last 64 steps, times its samples. (B, CPU seconds a
# sample in a step of B samples), the nominal steps the testbed's slowed agents held in this rule's first runs
# (lan hermes-paper seeds 0-2, 2026-11-28 06:48-06:56 UTC; benchmarks/sim_host_floor.py steps): the median held
# step / S over the agent-runs of >= 100 cycles, 67.0 us at B = 32 (five, 59.6-69.3) and 48.4 us at B = 64 (seven,
# 46.2-54.8; 49.0 used, 1.2% above). A 64-step window's least lies above the least of many steps:
# ``benchmarks/sim_host_floor.py measure`` (800 steps a batch, 2026-11-28 07:03 UTC, load 10.3 -> 9.6;
# docs/bench/sim-calibration-7/floor-steps.json) gave 58.6 and 43.1 us (the held steps are 1.14x and 1.12x it),
# and at B = 16 and 128, where no agent ran, 88.8 and 36.1 us: those rows are it times 1.13. Linear between,
# the nearest row's outside.
FLOOR_STEP_S: tuple[tuple[float, float], ...] = (
    (16.0, 0.0001003),
    (32.0, 0.0000670),
    (64.0, 0.0000490),
    (128.0, 0.0000408),
)
# Below this many CPU seconds a job counts as finished (float rounding of the shares; far below any cost).
EPS_S = 1e-12


SLEEPER_AUTO = "auto"


class HostError(ValueError):
    """A ``--host`` spec that does not parse; the message says which part."""


@dataclass(frozen=True)
class HostSpec:
    cores: float = CORES
    background: float = 0.0  # other runnable processes of the machine (load average less the testbed's own)
    thread_flops: float = THREAD_FLOPS
    send_cpu_s_per_byte: float = AGENT_SEND_CPU_S_PER_BYTE
    receive_cpu_s_per_byte: float = AGENT_RECEIVE_CPU_S_PER_BYTE
    # 1: a training sample's cost depends on its batch as measured (BATCH_COST); 0: the FLOPs model alone.
    batch_cost: float = 1.0
    # 1: messages and the server's thread hops wait the measured wake-up latency (WAKEUP_RTT_S); 0: they do
    # not (the fluid model alone, as before 2026-11-27 session 4).
    wakeups: float = 1.0
    # > 0: CPU seconds of a slowed agent's step after its sleep that run at a full core (EEVDF keeps a
    # sleeper's lag); the rest of the step, and every busy thread, share what is left. 0: fluid sharing only.
    # "auto": the measured credit at the host's load when the burst starts (SLEEPER_CREDIT_S).
    sleeper: float | str = 0.0
    # 1: the testbed's ``--slowdown-mode floor`` (common/pace.py): a slowed agent's step lasts S times its least
    # cost (FLOOR_STEP_S) on the virtual clock, paced by the agent's own StepPacer, unless its CPU burst on the
    # host takes longer; 0: the ``cpu`` rule (sleep S - 1 times the step's CPU), as every run before 2026-11-28.
    floor: float = 0.0
    # > 0: the testbed's ``--slowdown-mode nominal`` (common/pace.py) with this nominal cost a sample in ms
    # (``--nominal-sample-ms``): every agent's step lasts S x ``pace`` x it a sample unless its burst takes longer,
    # and its CPU outside steps S x ``pace`` times that CPU. 0: off.
    nominal: float = 0.0
    # The testbed's ``--pace``: every agent slowed alike by it (with ``nominal`` only).
    pace: float = 1.0

    def __post_init__(self) -> None:
        if not self.cores > 0 or not self.thread_flops > 0:
            raise HostError("host cores and thread_flops must be positive")
        if self.background < 0 or self.send_cpu_s_per_byte < 0 or self.receive_cpu_s_per_byte < 0:
            raise HostError("host background and per-byte costs must be >= 0")
        if self.batch_cost not in (0.0, 1.0):
            raise HostError("host batch_cost must be 0 (off) or 1 (the measured costs)")
        if self.wakeups not in (0.0, 1.0):
            raise HostError("host wakeups must be 0 (off) or 1 (the measured latencies)")
        if self.floor not in (0.0, 1.0):
            raise HostError("host floor must be 0 (the cpu slowdown rule) or 1 (--slowdown-mode floor)")
        if not (math.isfinite(self.nominal) and self.nominal >= 0):
            raise HostError("host nominal must be a cost a sample in ms > 0 (--slowdown-mode nominal), or 0 (off)")
        if self.nominal and self.floor:
            raise HostError("host floor and nominal are two slowdown rules: set one")
        if not (math.isfinite(self.pace) and self.pace >= 1.0):
            raise HostError("host pace must be >= 1")
        if self.pace != 1.0 and not self.nominal:
            raise HostError("host pace needs nominal (the testbed's --pace is modelled under --slowdown-mode nominal)")
        if self.sleeper != SLEEPER_AUTO and not (
                isinstance(self.sleeper, (int, float)) and 0.0 <= self.sleeper < 1.0):
            raise HostError(f"host sleeper must be CPU seconds in [0, 1) or {SLEEPER_AUTO!r}")


def parse_host(text: str | None) -> HostSpec | None:
    """``none`` (or empty): no host model; ``testbed``: this machine's constants; ``testbed:background=6,cores=2``
    (or just ``background=6``): with these fields replaced."""
    if text is None or text.strip() in ("", "none"):
        return None
    head, _, rest = text.strip().partition(":")
    if "=" in head:
        head, rest = "testbed", text.strip()
    if head != "testbed":
        raise HostError(f"--host {text!r}: expected none, testbed or testbed:KEY=VALUE,...")
    known = {f.name for f in fields(HostSpec)}
    changes: dict[str, Any] = {}  # float, or SLEEPER_AUTO for sleeper
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in known:
            raise HostError(f"--host {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        if key == "sleeper" and value.strip() == SLEEPER_AUTO:
            changes[key] = SLEEPER_AUTO
            continue
        try:
            changes[key] = float(value)
        except ValueError:
            raise HostError(f"--host {text!r}: {key} must be a number, got {value!r}") from None
    return replace(HostSpec(), **changes)


class _Job:
    __slots__ = ("future", "prio", "remaining", "seq")

    def __init__(self, remaining: float, future: asyncio.Future[None], seq: int, prio: bool = False) -> None:
        self.remaining = remaining
        self.future = future
        self.seq = seq
        self.prio = prio  # a woken sleeper's burst (HostSpec.sleeper): a core of its own while cores last


class Host:
    """Processor sharing of ``spec.cores`` among the runnable jobs and ``spec.background`` other processes."""

    def __init__(self, spec: HostSpec) -> None:
        self.spec = spec
        self.jobs: list[_Job] = []
        self._last = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._seq = 0
        # Totals for the summary: CPU seconds served, and the time integral of runnable jobs (mean = / time).
        self.cpu_seconds = 0.0
        self.runnable_seconds = 0.0
        self.stretch_seconds = 0.0  # wall (virtual) seconds jobs spent beyond their CPU seconds
        self.wakeup_seconds_total = 0.0  # virtual seconds threads waited to be scheduled (wake)
        self._pacers: dict[str, StepPacer] = {}  # HostSpec.floor / nominal: each paced agent's own pacer
        self.overhead_sleep_seconds = 0.0  # HostSpec.nominal: virtual seconds agents slept for their non-step CPU

    def rate(self, n: int | None = None) -> float:
        """The share of a core each of ``n`` runnable jobs gets (Kleinrock's processor sharing, one thread each)."""
        n = len(self.jobs) if n is None else n
        if n == 0:
            return 1.0
        return min(1.0, self.spec.cores / (n + self.spec.background))

    def rates(self) -> tuple[float, float]:
        """(a woken sleeper's burst, any other job): the bursts take a core each while there are cores (they
        share the cores when more), the others and ``background`` share what is left."""
        p = sum(1 for j in self.jobs if j.prio)
        if p == 0:
            return 1.0, self.rate()
        rp = min(1.0, self.spec.cores / p)
        n = len(self.jobs) - p
        left = self.spec.cores - p * rp
        return rp, (min(1.0, left / (n + self.spec.background)) if n and left > 0 else 0.0)

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if dt > 0 and self.jobs:
            rp, r = self.rates()
            for j in self.jobs:
                rj = rp if j.prio else r
                j.remaining -= dt * rj
                self.cpu_seconds += dt * rj
                self.stretch_seconds += dt * (1 - rj)
            self.runnable_seconds += dt * len(self.jobs)
        self._last = max(self._last, now)

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.jobs:
            rp, r = self.rates()
            # A job served at rate 0 (every core to sleepers' bursts) finishes after one of those.
            first = min(max(0.0, j.remaining) / (rp if j.prio else r) for j in self.jobs if (rp if j.prio else r) > 0)
            self._timer = loop.call_at(self._last + first, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        done = [j for j in self.jobs if j.remaining <= EPS_S]
        if not done:  # rounding left a sliver: finish the smallest one being served
            rp, r = self.rates()
            served = [j for j in self.jobs if (rp if j.prio else r) > 0]
            done = [min(served, key=lambda j: (j.remaining, j.seq))]
        self.jobs = [j for j in self.jobs if j not in done]
        for j in sorted(done, key=lambda j: j.seq):
            if not j.future.done():
                j.future.set_result(None)
        self._reschedule(loop)

    async def run(self, cpu_seconds: float, *, woken: bool = False) -> None:
        """Run ``cpu_seconds`` of one thread's work on the host; returns when it is done (virtual time).
        ``woken``: the thread slept before it (a slowed agent's step): its first ``sleeper_credit()`` CPU seconds
        run at a core of their own (``rates``)."""
        if not cpu_seconds > 0:
            return
        credit = self.sleeper_credit() if woken else 0.0
        if credit > 0:
            head = min(cpu_seconds, credit)
            await self._run(head, prio=True)
            await self._run(cpu_seconds - head, prio=False)
            return
        await self._run(cpu_seconds, prio=False)

    async def _run(self, cpu_seconds: float, *, prio: bool) -> None:
        if not cpu_seconds > 0:
            return
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        self._seq += 1
        job = _Job(cpu_seconds, loop.create_future(), self._seq, prio)
        self.jobs.append(job)
        self._reschedule(loop)
        try:
            await job.future
        except asyncio.CancelledError:  # the device went offline mid-burst: its work leaves the host
            if job in self.jobs:
                self._advance(loop.time())
                self.jobs.remove(job)
                self._reschedule(loop)
            raise

    def sleeper_credit(self) -> float:
        """CPU seconds a burst woken now runs at a core of its own: ``spec.sleeper``, or with ``"auto"`` the
        measured credit (SLEEPER_CREDIT_S) at the host's ``jobs + background`` other runnable processes."""
        if self.spec.sleeper == SLEEPER_AUTO:
            return interpolate(SLEEPER_CREDIT_S, len(self.jobs) + self.spec.background, 1)
        return float(self.spec.sleeper)

    def wakeup_seconds(self, what: str) -> float:
        """The mean wait of a thread woken now for a core: ``rtt`` (a message's round trip, its wake-ups on
        both sides) or ``hop`` (the server loop's thread hop), at the host's ``jobs + background`` other
        runnable processes (WAKEUP_RTT_S, interpolated)."""
        if not self.spec.wakeups:
            return 0.0
        column = {"rtt": 1, "hop": 2}[what]
        return interpolate(WAKEUP_RTT_S, len(self.jobs) + self.spec.background, column)

    async def wake(self, what: str, share: float = 1.0) -> None:
        """Wait ``share`` of a woken thread's mean wait for a core (``wakeup_seconds``); it takes no CPU."""
        seconds = share * self.wakeup_seconds(what)
        if seconds > 0:
            self.wakeup_seconds_total += seconds
            await asyncio.sleep(seconds)

    def pacer(self, key: str, flops: float) -> StepPacer:
        """Device ``key``'s own StepPacer (common/pace.py), the testbed agent's class: ``floor`` mode at its
        slowdown, or with ``spec.nominal`` ``nominal`` mode at its slowdown times ``spec.pace``."""
        pacer = self._pacers.get(key)
        if pacer is None:
            slowdown = max(1.0, self.spec.thread_flops / flops)
            if self.spec.nominal:
                pacer = StepPacer(slowdown * self.spec.pace, "nominal",
                                  nominal_sample_seconds=self.spec.nominal / 1000.0)
            else:
                pacer = StepPacer(slowdown, "floor")
            self._pacers[key] = pacer
        return pacer

    def step_sleep(self, key: str, flops: float, samples: float, elapsed: float, sleep: float) -> float:
        """Seconds a device ``key`` at ``flops`` sleeps after a step of ``samples`` samples whose CPU burst took
        ``elapsed`` virtual seconds; ``sleep`` is the ``cpu`` rule's (``split``). With ``spec.floor`` the agent's
        StepPacer (common/pace.py, the same rule the testbed runs) decides from the step's least cost
        (FLOOR_STEP_S, its ``work``) and ``elapsed``; with ``spec.nominal`` it paces every agent's step (the
        unslowed one's too, at ``spec.pace``) to the fixed nominal cost. The simulated sleep wakes on time
        (nothing overslept)."""
        if self.spec.nominal:
            if samples <= 0:  # work the testbed does not pace as a step (overhead_sleep's)
                return 0.0
            return self.pacer(key, flops).sleep_seconds(elapsed, max(1, round(samples)), elapsed)
        if not self.spec.floor or sleep <= 0 or samples <= 0:
            return sleep
        return self.pacer(key, flops).sleep_seconds(nominal_step_seconds(samples), max(1, round(samples)), elapsed)

    def overhead_sleep(self, key: str, flops: float, cpu: float, elapsed: float) -> float:
        """Seconds device ``key`` sleeps after ``cpu`` CPU seconds of its work outside training steps that took
        ``elapsed`` virtual seconds: with ``spec.nominal`` its pacer's ``overhead_seconds`` (the stretch lasts
        S x pace times its CPU, as ``LocalTrainer.pace_overhead``); otherwise 0 (the other rules leave it
        unslowed)."""
        if not self.spec.nominal or cpu <= 0:
            return 0.0
        pause = self.pacer(key, flops).overhead_seconds(cpu, elapsed)
        self.overhead_sleep_seconds += pause
        return pause

    def cycle_factor(self, samples: int, steps: int) -> float:
        """A cycle's time in ``steps`` steps over the FLOPs model's (which is right at REFERENCE_BATCH): a sample's
        cost at the cycle's batch (``samples / steps``) over its cost at REFERENCE_BATCH (BATCH_COST)."""
        if samples <= 0 or steps <= 0 or not self.spec.batch_cost:
            return 1.0
        return interpolate(BATCH_COST, samples / steps, 1)

    def split(self, seconds: float, flops: float) -> tuple[float, float]:
        """``seconds`` of a device's work at ``flops``: (CPU seconds on the host, sleep seconds after).

        A testbed agent slowed by ``s`` computes at the thread's rate and sleeps ``s - 1`` times that
        (client/trainer.py); a device at or above the thread's rate just computes.
        """
        if seconds <= 0:
            return 0.0, 0.0
        cpu = seconds * min(1.0, flops / self.spec.thread_flops)
        return cpu, seconds - cpu

    def stats(self, virtual_seconds: float) -> dict[str, Any]:
        mean = self.runnable_seconds / virtual_seconds if virtual_seconds > 0 else 0.0
        return {"cores": self.spec.cores, "background": self.spec.background,
                "thread_flops": self.spec.thread_flops, "cpu_seconds": round(self.cpu_seconds, 6),
                "mean_runnable_jobs": round(mean, 4), "stretch_seconds": round(self.stretch_seconds, 6),
                "wakeups": self.spec.wakeups, "sleeper": self.spec.sleeper, "floor": self.spec.floor,
                "nominal": self.spec.nominal, "pace": self.spec.pace,
                "overhead_sleep_seconds": round(self.overhead_sleep_seconds, 6), "wakeup_seconds": round(self.wakeup_seconds_total, 6),
                "mean_load": round(mean + self.spec.background, 4) if math.isfinite(mean) else None}


def interpolate(table: tuple[tuple[float, ...], ...], x: float, column: int) -> float:
    """``table[.][column]`` at ``x`` of its first column: linear between rows, the nearest row's outside them."""
    rows = sorted(table)
    return float(np.interp(x, [r[0] for r in rows], [r[column] for r in rows]))


def on_host(profiles: list[Any], population: str, spec: HostSpec) -> list[Any]:
    """The testbed's ``hl*`` agents as the host model runs them: each at the host's thread rate over its slowdown.

    The ``hl*`` populations' default rates (``TESTBED_FAST_FLOPS``) are the unslowed agent's rate as measured
    on the shared machine, contention included; under the host model contention comes from the host, so every
    agent gets the uncontended thread rate (``spec.thread_flops``) over its profile's slowdown. Other
    populations are returned unchanged.
    """
    from hermes.deploy.profiles import worker_profiles

    base = population.partition(":")[0]
    if not (base.startswith("hl") and base[2:].isdigit()):
        return profiles
    slowdowns = [wp.slowdown for wp in worker_profiles(base, len(profiles))]
    return [replace(p, flops=spec.thread_flops / s) for p, s in zip(profiles, slowdowns)]


def nominal_step_seconds(samples: float, table: tuple[tuple[float, float], ...] = FLOOR_STEP_S) -> float:
    """A step of ``samples`` samples at its least CPU cost on this machine (FLOOR_STEP_S): the nominal step of an
    unslowed agent under ``--slowdown-mode floor``, S times it a slowed one's."""
    return samples * interpolate(table, samples, 1) if samples > 0 else 0.0
