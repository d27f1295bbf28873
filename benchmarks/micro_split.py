"""Where a compressed push's CPU goes, process by process and thread by thread (issue 31): ``hermes-server``
and its agent against the bare pair of ``micro_bare.py`` (a DEALER and a ROUTER doing the same MAC and the same
decode into a dense tensor), batches alternated.

    python benchmarks/micro_split.py [--codecs topk,powersgd,int8] [--batches 6] [--pushes 100]
                                     [--agent-profile] [--top 25]

Prints, per codec, the median over the batches of the CPU per push of: the agent (this process) and the server,
each split by thread name (``/proc/PID/task/TID/comm``: the server's event loop is ``python``, libzmq's I/O
thread ``ZMQbg/IO/0``, pyzmq's zero-copy collector ``ZMQbg/Reaper`` or ``Thread-N``), and the same for the bare
DEALER (this process) and the bare ROUTER. ``--agent-profile`` adds cProfile's table of the agent's side of our
pushes (thread CPU). A development tool: the comparison with the bare pair is ``hermes-bench micro``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of each thread of ``pid``, summed by thread name (schedstat, nanoseconds)."""
    out: dict[str, float] = defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            fields = (task / "schedstat").read_text().split()
            out[name] += int(fields[0]) / 1e9
            # Timeslices (runs on a CPU after a wake-up or a preemption), / 1e3: a count per push below.
            out[f"{name} slices"] += int(fields[2]) / 1e3
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return out


def per_push(fn: Any, pushes: int, pids: dict[str, int]) -> dict[str, float]:
    """CPU ms per call of ``fn`` of every (process, thread name), over ``pushes`` calls."""
    before = {side: thread_cpu(pid) for side, pid in pids.items()}
    for _ in range(pushes):
        fn()
    out = {}
    for side, pid in pids.items():
        after = thread_cpu(pid)
        for name, t in after.items():
            out[f"{side} {name}"] = (t - before[side].get(name, 0.0)) / pushes * 1e3
        out[f"{side} (all)"] = sum(t - before[side].get(k, 0.0) for k, t in after.items()
                                   if not k.endswith("slices")) / pushes * 1e3
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codecs", default="topk,powersgd")
    p.add_argument("--batches", type=int, default=6)
    p.add_argument("--pushes", type=int, default=100)
    p.add_argument("--agent-profile", action="store_true")
    p.add_argument("--top", type=int, default=25)
    args = p.parse_args(argv)

    import torch
    from bench_foundation import JOIN_TOKEN, MLP_HIDDEN, ServerProcess
    from micro_bare import BareWorkRouter

    from hermes.client.transport import ControlClient, DataClient
    from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec
    from hermes.common.control_messages import RegisterRequest
    from hermes.common.tensors import ModelSpec
    from hermes.common.wire import Header, MsgType, encode

    torch.set_num_threads(1)
    me = os.getpid()
    work = BareWorkRouter()
    server = ServerProcess(MLP_HIDDEN["1M"], ["eval_max_samples=1"], tempfile.mkdtemp(prefix="micro-split-"), 1)
    try:
        reg = ControlClient(server.url, join_token=JOIN_TOKEN).register(RegisterRequest(name="split", threads=1))
        spec = ModelSpec.from_dict(reg.model_spec)
        dc = DataClient(reg.data_plane, reg.worker_id, reg.token, timeout=60.0)
        version = dc.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
        delta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(1)) * 1e-6
        makers = {"topk": lambda: TopKCodec(0.01), "int8": lambda: Int8Codec(1024, True, 0),
                  "powersgd": lambda: PowerSgdCodec(4, 0)}
        for name in args.codecs.split(","):
            enc = makers[name]().encode(delta, spec.shapes)
            body = {"samples": 32, "loss": 1.0, "codec": enc.spec.model_dump(exclude_none=True)}
            bare_spec = {**enc.spec.model_dump(exclude_none=True), "codec": enc.spec.name,
                         "shapes": [list(s) for s in spec.shapes]}
            frames = encode(Header(type=MsgType.PUSH_UPDATE, seq=1, model_version=1), enc.data)[1:]

            def ours(data: torch.Tensor = enc.data, body: dict[str, Any] = body) -> None:
                nonlocal version
                rep = dc.request(MsgType.PUSH_UPDATE, body, payload=data, model_version=version, idempotent=False)
                if rep.header.body.get("status") != "applied":
                    raise RuntimeError(f"push not applied: {rep.header.body}")
                version = rep.header.model_version

            def bare(bs: dict[str, Any] = bare_spec, fr: list[Any] = frames) -> None:
                work.push(bs, fr)

            for _ in range(20):
                ours()
                bare()
            # What the server spends while nobody talks to it (timers, the control plane): charged to pushes
            # in proportion to their wall time.
            idle0 = thread_cpu(server.proc.pid)
            time.sleep(2.0)
            idle1 = thread_cpu(server.proc.pid)
            print(f"server idle: {(sum(idle1.values()) - sum(idle0.values())) / 2.0 * 1e3:.2f} ms CPU a second: "
                  + ", ".join(f"{k} {(idle1[k] - idle0.get(k, 0.0)) / 2.0 * 1e3:.2f}" for k in idle1))
            samples: dict[str, list[float]] = defaultdict(list)
            for _ in range(args.batches):
                for side, fn, pids in (("ours", ours, {"agent": me, "server": server.proc.pid}),
                                       ("bare", bare, {"dealer": me, "router": work.proc.pid})):
                    t0 = time.perf_counter()
                    got = per_push(fn, args.pushes, pids)
                    got["wall"] = (time.perf_counter() - t0) / args.pushes * 1e3
                    for k, v in got.items():
                        samples[f"{side}: {k}"].append(v)
            print(f"\n{name}: CPU ms a push, median of {args.batches} batches of {args.pushes} (load "
                  f"{os.getloadavg()[0]:.1f})")
            for k, v in sorted(samples.items()):
                med = statistics.median(v)
                if med >= 0.005:
                    print(f"  {k:40s} {med:7.3f}  ({min(v):.3f}-{max(v):.3f})")
            if args.agent_profile:
                prof = cProfile.Profile(time.thread_time)
                prof.enable()
                for _ in range(args.pushes):
                    ours()
                prof.disable()
                pstats.Stats(prof).sort_stats("tottime").print_stats(args.top)
        dc.close()
    finally:
        server.close()
        work.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
