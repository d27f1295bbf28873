"""How long a ZeroMQ round trip between two processes waits for the scheduler on this machine, at its present load.

    python benchmarks/sim_host_wakeup.py [--round-trips 300] [--json FILE]
    python benchmarks/sim_host_wakeup.py --burners 0,1,2,3,4,6,8 [--round-trips 400] [--json FILE]

A DEALER in this process sends a 1-byte message to a ROUTER echo in another process over TCP loopback (the
data plane's sockets), ``--round-trips`` times, one at a time, and takes the median round trip (wall clock: the
scheduler's wake-ups are the point). Beside it, the runnable threads of the machine by nice value (``/proc``),
sampled through the run: inside one session a nice-15 thread weighs 36/1024 of a nice-0 one, but this machine
shares the CPU between sessions first (autogroups: ``sim_host_sleeper.py``), so another session's nice-15 work
competes as a nice-0 process would.

``--burners K,...``: the same, once for each K with K nice-0 processes spinning on the CPU beside it (what the
testbed's computing agents and the machine's other nice-0 work are to its server and agents), and beside the
round trips the loop's thread hop (``await asyncio.to_thread(f)``, as the engine's fold journals through one).
The *mean* is what a run's time adds up (the distribution is bimodal: a wake-up finds a core free or waits
for a slice), so ``sim/host.py`` takes the means over K (``WAKEUP_RTT_S``, ``WAKEUP_HOP_S``).
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import json
import multiprocessing as mp
import os
import statistics
import time

import zmq


def _echo(port: int) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.bind(f"tcp://127.0.0.1:{port}")
    while True:
        frames = s.recv_multipart()
        if frames[-1] == b"stop":
            break
        s.send_multipart(frames)
    s.close(0)
    ctx.term()


def _burn(stop_at: float) -> None:
    while time.time() < stop_at:
        pass


def _hops(n: int) -> list[float]:
    """``n`` thread hops of an asyncio loop (the engine's ``asyncio.to_thread``), asleep 5 ms between them."""
    async def go() -> list[float]:
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            await asyncio.to_thread(int)
            out.append(time.perf_counter() - t0)
            await asyncio.sleep(0.005)
        return out
    return asyncio.run(go())


def runnable_by_nice() -> dict[int, int]:
    by: dict[int, int] = {}
    for st in glob.glob("/proc/[0-9]*/task/[0-9]*/stat"):
        try:
            rest = open(st).read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if rest[0] == "R":
            by[int(rest[16])] = by.get(int(rest[16]), 0) + 1
    return by


def measure(a: argparse.Namespace) -> dict:
    proc = mp.get_context("spawn").Process(target=_echo, args=(a.port,), daemon=True)
    proc.start()
    ctx = zmq.Context()
    s = ctx.socket(zmq.DEALER)
    s.connect(f"tcp://127.0.0.1:{a.port}")
    for _ in range(20):  # warm-up (connection, first wake-ups)
        s.send(b"x")
        s.recv()
    rtts, samples = [], []
    for i in range(a.round_trips):
        if i % 30 == 0:
            samples.append(runnable_by_nice())
        t0 = time.perf_counter()
        s.send(b"x")
        s.recv()
        rtts.append(time.perf_counter() - t0)
        time.sleep(0.005)  # as an agent between messages: asleep, so each round trip wakes both sides
    s.send(b"stop")
    proc.join(5)
    s.close(0)
    ctx.term()
    nice0 = [sum(v for k, v in smp.items() if k <= 0) for smp in samples]
    hops = _hops(a.round_trips)
    return {"round_trips": a.round_trips, "median_rtt_s": statistics.median(rtts), "mean_rtt_s": statistics.mean(rtts),
            "p25_rtt_s": statistics.quantiles(rtts, n=4)[0], "p75_rtt_s": statistics.quantiles(rtts, n=4)[2],
            "mean_hop_s": statistics.mean(hops), "median_hop_s": statistics.median(hops),
            "runnable_nice0_median": statistics.median(nice0), "runnable_samples": samples,
            "loadavg": open("/proc/loadavg").read().split()[:3],
            "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--round-trips", type=int, default=300)
    p.add_argument("--port", type=int, default=47911)
    p.add_argument("--burners", default="", help="comma-separated counts of nice-0 CPU spinners, one measurement each")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if not a.burners:
        out = measure(a)
        print(json.dumps({k: v for k, v in out.items() if k != "runnable_samples"}, indent=2))
    else:
        out = {"cpus": os.cpu_count(), "by_burners": {}}
        for k in (int(x) for x in a.burners.split(",")):
            spin = [mp.get_context("spawn").Process(target=_burn, args=(time.time() + 120,), daemon=True)
                    for _ in range(k)]
            for b in spin:
                b.start()
            time.sleep(0.5)
            try:
                r = measure(argparse.Namespace(**{**vars(a), "port": a.port + k}))
            finally:
                for b in spin:
                    b.terminate()
                    b.join(5)
            out["by_burners"][str(k)] = r
            print(k, json.dumps({x: r[x] for x in ("mean_rtt_s", "median_rtt_s", "p75_rtt_s", "mean_hop_s",
                                                      "median_hop_s", "runnable_nice0_median", "loadavg")}),
                  flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
