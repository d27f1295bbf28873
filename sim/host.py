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
  steps alternate as the agent's do (``steps`` chunks a cycle).

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

# benchmarks/sim_host_calibrate.py on 2026-11-27 19:43 UTC (20 repeats, load average 18.5 before and after:
# CPU seconds of one thread, which other processes' load delays but inflates little): the paper's CNN (hidden
# 320) on mnist1d, 128 samples in batches of 32 in 16.13 ms of CPU, 953,600 training FLOPs a sample.
THREAD_FLOPS = 7.567e9
# The same run: an agent's signed encoding of a 108,618-parameter push (0.14 ms) and its decoding, MAC check
# and load_flat of a model reply of that size (0.30 ms); per byte of payload (a message without one is
# charged nothing: its header's cost is below the model's resolution).
AGENT_SEND_CPU_S_PER_BYTE = 0.000142 / (108_618 * 4)
AGENT_RECEIVE_CPU_S_PER_BYTE = 0.000301 / (108_618 * 4)
# The testbed machine's cores (os.cpu_count() on it: 2 vCPU AMD EPYC).
CORES = 2.0
# Below this many CPU seconds a job counts as finished (float rounding of the shares; far below any cost).
EPS_S = 1e-12


class HostError(ValueError):
    """A ``--host`` spec that does not parse; the message says which part."""


@dataclass(frozen=True)
class HostSpec:
    cores: float = CORES
    background: float = 0.0  # other runnable processes of the machine (load average less the testbed's own)
    thread_flops: float = THREAD_FLOPS
    send_cpu_s_per_byte: float = AGENT_SEND_CPU_S_PER_BYTE
    receive_cpu_s_per_byte: float = AGENT_RECEIVE_CPU_S_PER_BYTE

    def __post_init__(self) -> None:
        if not self.cores > 0 or not self.thread_flops > 0:
            raise HostError("host cores and thread_flops must be positive")
        if self.background < 0 or self.send_cpu_s_per_byte < 0 or self.receive_cpu_s_per_byte < 0:
            raise HostError("host background and per-byte costs must be >= 0")


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
    changes: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = part.partition("=")
        if not eq or key not in known:
            raise HostError(f"--host {text!r}: {part!r} is not KEY=VALUE with KEY one of {', '.join(sorted(known))}")
        try:
            changes[key] = float(value)
        except ValueError:
            raise HostError(f"--host {text!r}: {key} must be a number, got {value!r}") from None
    return replace(HostSpec(), **changes)


class _Job:
    __slots__ = ("future", "remaining", "seq")

    def __init__(self, remaining: float, future: asyncio.Future[None], seq: int) -> None:
        self.remaining = remaining
        self.future = future
        self.seq = seq


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

    def rate(self, n: int | None = None) -> float:
        """The share of a core each of ``n`` runnable jobs gets (Kleinrock's processor sharing, one thread each)."""
        n = len(self.jobs) if n is None else n
        if n == 0:
            return 1.0
        return min(1.0, self.spec.cores / (n + self.spec.background))

    def _advance(self, now: float) -> None:
        dt = now - self._last
        if dt > 0 and self.jobs:
            r = self.rate()
            for j in self.jobs:
                j.remaining -= dt * r
            n = len(self.jobs)
            self.cpu_seconds += dt * r * n
            self.runnable_seconds += dt * n
            self.stretch_seconds += dt * (1 - r) * n
        self._last = max(self._last, now)

    def _reschedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.jobs:
            first = min(j.remaining for j in self.jobs)
            self._timer = loop.call_at(self._last + max(0.0, first) / self.rate(), self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._advance(loop.time())
        done = [j for j in self.jobs if j.remaining <= EPS_S]
        if not done:  # rounding left a sliver: finish the smallest one
            done = [min(self.jobs, key=lambda j: (j.remaining, j.seq))]
        self.jobs = [j for j in self.jobs if j not in done]
        for j in sorted(done, key=lambda j: j.seq):
            if not j.future.done():
                j.future.set_result(None)
        self._reschedule(loop)

    async def run(self, cpu_seconds: float) -> None:
        """Run ``cpu_seconds`` of one thread's work on the host; returns when it is done (virtual time)."""
        if not cpu_seconds > 0:
            return
        loop = asyncio.get_running_loop()
        self._advance(loop.time())
        self._seq += 1
        job = _Job(cpu_seconds, loop.create_future(), self._seq)
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
                "mean_load": round(mean + self.spec.background, 4) if math.isfinite(mean) else None}


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
