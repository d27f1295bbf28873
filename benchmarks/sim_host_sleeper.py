"""How much of a core a thread that sleeps between CPU bursts gets beside K busy processes (``HostSpec.sleeper``).

    python benchmarks/sim_host_sleeper.py [--burners 0,1,2,3,4,6,8] [--bursts 30] [--groups same,own] [--duty 0.5] [--json FILE]

On the testbed a slowed agent computes a step and then sleeps ``s - 1`` times its CPU (``client/trainer.py``),
and every agent sleeps while it waits on a reply. This machine's kernel (EEVDF, Linux >= 6.6) keeps a sleeping
task's lag, so such a thread wakes eligible and preempts the busy ones; processor sharing (``sim/host.py``)
gives it the same share as they get. This measures the difference, beside K nice-0 processes spinning on the
cores (what the testbed's other agents and the machine's other nice-0 work are), as ``sim_host_wakeup.py``
measured the wake-ups:

* a *burst* spins ``X`` ms of this thread's CPU time (``time.thread_time``) and then sleeps; its wall time ``W``
  is measured (the mean of ``--bursts`` of them: a run adds up means);
* the *busy* reference: the K spinners' own CPU over wall (``/proc/PID/schedstat``) over the same window as
  the bursts, the share ``r`` a thread that never sleeps gets (processor sharing's prediction, measured beside
  the bursts, so the machine's other load moves both: about ``min(1, cores / (K + 1))`` on a quiet machine);
* the *credit*: the CPU seconds of a burst that ran at a full core, the rest at ``r``, that give ``W``:
  ``W = S + (X - S) / r``, so ``S = (X / r - W) / (1 / r - 1)``, clipped to ``[0, X]`` (undefined when
  ``r`` is 1: nothing to preempt; reported as ``None``). ``sim/host.py`` takes ``S`` by K (``SLEEPER_CREDIT_S``)
  for ``--host testbed:sleeper=auto``.

The bursts: the testbed's slowed agents' steps (5 ms of CPU: a 64-sample step at batch 64, sleeping 4.33x or
7x that, as the 5.33x and 8x agents), a longer 20 ms burst after the same 4.33x sleep (is
the credit bounded by the burst or by the kernel?) and a 20 ms burst after a 5 ms sleep (an agent's first step
after the reply it waited on).

This machine schedules with autogroups on (``/proc/sys/kernel/sched_autogroup_enabled`` = 1): the CPU is shared
fairly between sessions first, and a process's nice counts only inside its session. ``--groups same`` puts the
spinners in this session's group (as the testbed's server and agents share ``hermes-bench``'s); ``own`` gives
each a session of its own (as another engineer's work is, whatever its nice).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_host_wakeup import _burn, runnable_by_nice  # noqa: E402

# (name, burst CPU ms, sleep after it in ms): see the module's docstring.
BURSTS: tuple[tuple[str, float, float], ...] = (
    ("5.33x step 64/64", 5.0, 5.0 * 4.333),
    ("8x step 64/64", 5.0, 5.0 * 7.0),
    ("20ms after 4.33x sleep", 20.0, 20.0 * 4.333),
    ("20ms after 5ms wait", 20.0, 5.0),
)


def spin_cpu(seconds: float) -> None:
    c0 = time.thread_time()
    while time.thread_time() - c0 < seconds:
        pass


def busy_share(wall_s: float) -> float:
    c0, t0 = time.thread_time(), time.perf_counter()
    while time.perf_counter() - t0 < wall_s:
        pass
    return (time.thread_time() - c0) / (time.perf_counter() - t0)


def credit(x: float, w: float, r: float) -> float | None:
    """CPU seconds at a full core, the rest at share ``r``, that take ``w`` wall seconds for ``x`` CPU seconds."""
    if r >= 0.95:  # a core free for it: nothing to preempt, and the formula divides noise by ~0
        return None
    s = (x / r - w) / (1 / r - 1)
    return min(x, max(0.0, s))


def runtime_s(pids: list[int]) -> list[float]:
    """Each process's CPU seconds so far (``/proc/PID/schedstat``: nanoseconds on a CPU)."""
    out = []
    for pid in pids:
        try:
            out.append(int(open(f"/proc/{pid}/schedstat").read().split()[0]) / 1e9)
        except (OSError, ValueError, IndexError):
            out.append(float("nan"))
    return out


def measure(bursts: int, busy_s: float, burners: list[int]) -> dict:
    """The bursts, and over the same window the spinners' own share of a core (the busy reference, measured beside
    the bursts so the machine's other load moves both); with no spinners, a busy spin of ``busy_s`` before."""
    out: dict = {"busy_share": busy_share(busy_s), "runnable": [runnable_by_nice()], "bursts": {}}
    for name, x_ms, sleep_ms in BURSTS:
        walls = []
        time.sleep(sleep_ms / 1000)
        c0, t0w = runtime_s(burners), time.perf_counter()
        for _ in range(bursts):
            t0 = time.perf_counter()
            spin_cpu(x_ms / 1000)
            walls.append(time.perf_counter() - t0)
            time.sleep(sleep_ms / 1000)
        c1, wall = runtime_s(burners), time.perf_counter() - t0w
        shares = [(b - a) / wall for a, b in zip(c0, c1)]
        r = statistics.mean(shares) if shares else out["busy_share"]
        out["bursts"][name] = {"cpu_s": x_ms / 1000, "sleep_s": sleep_ms / 1000, "mean_wall_s": statistics.mean(walls),
                               "median_wall_s": statistics.median(walls), "busy_share": r, "spinner_shares": shares,
                               "burst_share": x_ms / 1000 / statistics.mean(walls),
                               "credit_s": credit(x_ms / 1000, statistics.mean(walls), r)}
    out["runnable"].append(runnable_by_nice())
    out["loadavg"] = open("/proc/loadavg").read().split()[:3]
    out["date"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    return out


def _burn_alone(stop_at: float) -> None:
    """A spinner in a session of its own: its own autogroup (``/proc/sys/kernel/sched_autogroup_enabled``), as
    another engineer's process is, where the ones in this session share this session's group."""
    os.setsid()
    _burn(stop_at)


def _burn_intermittent(stop_at: float, duty: float) -> None:
    """A spinner in a session of its own that computes 10 ms of CPU and sleeps, busy ``duty`` of its time when it
    has a core (another engineer's testbed agent or simulation rather than a spinning process)."""
    os.setsid()
    while time.time() < stop_at:
        spin_cpu(0.010)
        time.sleep(0.010 * (1 - duty) / duty)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--burners", default="0,1,2,3,4,6,8", help="comma-separated counts of nice-0 CPU spinners")
    p.add_argument("--bursts", type=int, default=30, help="bursts of each kind per K")
    p.add_argument("--busy-s", type=float, default=0.5, help="wall seconds of the busy spin before (the reference with no spinners)")
    p.add_argument("--groups", default="same,own",
                   help="same: the spinners in this session's autogroup; own: each in a session of its own")
    p.add_argument("--duty", type=float, default=1.0,
                   help="< 1: the K spinners compute 10 ms and sleep (busy this share), each in its own session, "
                        "and one more, always busy in its own session, is the reference share")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    autogroup = open("/proc/sys/kernel/sched_autogroup_enabled").read().strip()
    out: dict = {"cpus": os.cpu_count(), "kernel": os.uname().release, "sched_autogroup_enabled": autogroup}
    for group in a.groups.split(","):
        target = {"same": _burn, "own": _burn_alone}[group]
        ctx = mp.get_context("spawn")
        by: dict = out.setdefault(f"by_burners_{group}" + (f"_duty{a.duty:g}" if a.duty < 1 else ""), {})
        for k in (int(x) for x in a.burners.split(",")):
            if a.duty < 1:
                spin = [ctx.Process(target=_burn_alone, args=(time.time() + 300,), daemon=True)] + [
                    ctx.Process(target=_burn_intermittent, args=(time.time() + 300, a.duty), daemon=True)
                    for _ in range(k)]
            else:
                spin = [ctx.Process(target=target, args=(time.time() + 300,), daemon=True) for _ in range(k)]
            for b in spin:
                b.start()
            time.sleep(0.7)
            try:
                reference = spin[:1] if a.duty < 1 else spin
                r = measure(a.bursts, a.busy_s, [b.pid for b in reference if b.pid is not None])
            finally:
                for b in spin:
                    b.terminate()
                    b.join(5)
            by[str(k)] = r
            print(group, k, json.dumps(
                {n: (round(v["busy_share"], 3), round(v["burst_share"], 3),
                     None if v["credit_s"] is None else round(v["credit_s"] * 1000, 2)) for n, v in r["bursts"].items()}),
                r["loadavg"], flush=True)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
