"""Where a compressed push's time goes on the server, in process (issue 31): ``Engine.handle`` on signed frames,
no sockets, the micro's 1M-parameter mlp under the asp preset with screening as the server runs it.

    python benchmarks/micro_profile.py [--codec topk|int8|powersgd|fp32] [--pushes 300] [--profile] [--top 30]
                                       [--pull-after] [--served PROFILE_OUT|-] [--rcvhwm N] [--pieces]

Prints the median and the fastest third's median of one push's CPU in this thread (``handle``: decode, MAC,
body, decompression, validation, screening, the fold, the reply); ``--profile`` adds cProfile's tables (thread
CPU) over the pushes; ``--pull-after`` times an int8 pull after each push instead. ``--served`` sends the pushes
through the real ``DataPlane`` in a process of its own and prints its loop thread's CPU a push (``-``: no
profile). A development tool, not a comparison: the comparison with the bare pair is ``hermes-bench micro``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import itertools
import json
import pstats
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_foundation import MLP_HIDDEN  # noqa: E402


def build(codec_name: str, real_clock: bool = False) -> tuple[Any, Any, Any]:
    """An engine as ``hermes-server --set preset=asp --set model=mlp`` builds it, one registered worker, and the
    payload + body of one push in the codec."""
    import torch

    from hermes.common.clock import SYSTEM_CLOCK, ManualClock
    from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec
    from hermes.common.config import build_config
    from hermes.server.engine import Engine
    from hermes.server.engine.screening import ScreeningSettings
    from hermes.server.events import EventLog
    from hermes.server.metrics import ServerMetrics

    clock = SYSTEM_CLOCK if real_clock else ManualClock()
    config = build_config("asp", model="mlp", dataset="digits", model_kwargs={"hidden": MLP_HIDDEN["1M"]},
                          eval_max_samples=1)
    engine = Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=8,
                    max_message_bytes=1 << 26, clock=clock, screening=ScreeningSettings())
    delta = torch.randn(engine.spec.numel, generator=torch.Generator().manual_seed(1)) * 1e-6
    codecs = {"topk": TopKCodec(0.01), "int8": Int8Codec(1024, True, 0), "powersgd": PowerSgdCodec(4, 0)}
    if codec_name == "fp32":
        return engine, delta, {"samples": 32, "loss": 1.0}
    enc = codecs[codec_name].encode(delta, engine.spec.shapes)
    return engine, enc.data, {"samples": 32, "loss": 1.0, "codec": enc.spec.model_dump(exclude_none=True)}


async def run(codec_name: str, pushes: int, profile: bool, top: int, pull_after: bool = False) -> None:
    from hermes.common.wire import Header, MsgType, decode, encode

    engine, data, body = build(codec_name)
    engine.start()
    rec, _ = engine.register("w")
    seq = itertools.count(1)
    times: list[float] = []
    prof = cProfile.Profile(time.thread_time) if profile else None
    for i in range(pushes):
        version = engine.state.version
        header = Header(type=MsgType.PUSH_UPDATE, worker=rec.id, session="s", seq=next(seq), ts=int(engine.clock.time() * 1000),
                        model_version=version, body=body, shapes=(tuple(data.shape),))
        frames = encode(header, data, key=rec.key)
        if pull_after:
            # Only the int8 pull after the push is timed: the quantisation of a new version, framing, MAC.
            await engine.handle(frames)
            frames = encode(Header(type=MsgType.PULL_MODEL, worker=rec.id, session="s", seq=next(seq),
                                   ts=int(engine.clock.time() * 1000), model_version=version,
                                   body={"dtype": "float32", "codec": {"name": "int8", "chunk": 1024}}), None,
                            key=rec.key)
        if prof is not None and i >= 10:
            prof.enable()
        t0 = time.thread_time()
        reply = await engine.handle(frames)
        times.append(time.thread_time() - t0)
        if prof is not None:
            prof.disable()
        if pull_after:
            continue
        status = decode(reply).header.body.get("status")
        if status != "applied":
            raise SystemExit(f"push {i} not applied: {decode(reply).header.body}")
    times = times[10:]
    fast = sorted(times)[: max(1, len(times) // 3)]
    print(f"{codec_name}: {len(times)} pushes in process (Engine.handle, CPU of this thread), median {statistics.median(times) * 1e3:.3f} ms, fastest third's "
          f"median {statistics.median(fast) * 1e3:.3f} ms")
    if prof is not None:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(top)
        pstats.Stats(prof).sort_stats("tottime").print_stats(top)


async def pieces(codec_name: str, repeats: int = 30, calls: int = 20) -> None:
    """Each piece of a push's handling timed alone, hot (thread CPU, the median over ``repeats`` of ``calls``
    calls): what ``handle`` is made of, beside ``handle`` itself."""
    import torch
    import zmq

    from hermes.common.messages import PushUpdate, parse_body
    from hermes.common.wire import Header, MsgType, Payload, decode, encode, verify_mac
    from hermes.server.engine.handlers import _request, decompressed
    from hermes.server.state import validate_update

    engine, data, body = build(codec_name)
    engine.start()
    rec, _ = engine.register("w")
    spec = engine.spec

    def frames_of(seq: int) -> list[Any]:
        h = Header(type=MsgType.PUSH_UPDATE, worker=rec.id, session="s", seq=seq, ts=int(engine.clock.time() * 1000),
                   model_version=engine.state.version, body=body, shapes=(tuple(data.shape),))
        return [zmq.Frame(bytes(f)) for f in encode(h, data, key=rec.key)]

    zf = frames_of(1)
    head = Header.unpack(zf[0].buffer)
    msg = decode(zf, header=head, max_message_bytes=1 << 26)
    codec = parse_body(PushUpdate, head.body).codec
    assert codec is not None and msg.payload is not None
    dense = decompressed(spec, msg.payload, codec)
    _request.set(head)
    fns = {
        "header unpack": lambda: Header.unpack(zf[0].buffer),
        "frame decode": lambda: decode(zf, header=head, max_message_bytes=1 << 26),
        "MAC check": lambda: verify_mac(zf[0], head, zf[1:], rec.key),
        "body schema": lambda: parse_body(PushUpdate, head.body),
        "decompression": lambda: decompressed(spec, msg.payload, codec),
        "torch.zeros": lambda: torch.zeros(spec.numel),
        "validation (norm)": lambda: validate_update(spec, Payload(dense.dtype, dense.chunks, dense.shapes)),
        "signed reply": lambda: engine.handlers.reply(MsgType.PUSH_REPLY, rec, 1, {"status": "applied"}),
        "event line": lambda: engine.telemetry.emit("update_applied", version=1, workers=[rec.id], staleness=[0],
                                                    weights=[1.0]),
        "fold": lambda: engine.state.apply([(dense, 1.0)]),
    }
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.thread_time()
            for _ in range(calls):
                fn()
            samples[name].append((time.thread_time() - t0) / calls * 1e3)
    handles = []
    for i in range(300):
        frames = frames_of(i + 2)
        t0 = time.thread_time()
        await engine.handle(frames)
        handles.append((time.thread_time() - t0) * 1e3)
    for name, v in samples.items():
        print(f"{name:18s} {statistics.median(v):.4f} ms")
    print(f"{'Engine.handle':18s} {statistics.median(handles[20:]):.4f} ms (whole pushes, not hot)")


def plane_main(codec_name: str, out: str, rcvhwm: int | None = None) -> None:
    """The child of ``--served``: the engine behind the real ``DataPlane`` (its asyncio ROUTER loop, admission,
    a task per request, the reply's send) on one thread, under cProfile until the parent says stop. ``rcvhwm``:
    the data plane's ROUTER with this RCVHWM instead of its 1 (an experiment, ``--rcvhwm``)."""
    import zmq

    if rcvhwm is not None:
        # The data plane's socket is a plain zmq.Socket (server/dataplane.py): patched there.
        setsockopt = zmq.Socket.setsockopt

        def patched(self: Any, option: int, value: Any) -> None:
            setsockopt(self, option, rcvhwm if option == zmq.RCVHWM else value)

        zmq.Socket.setsockopt = patched  # type: ignore[method-assign]

    from hermes.server.dataplane import DataPlane

    async def serve() -> None:
        engine, _, _ = build(codec_name, real_clock=True)
        engine.start()
        rec, _ = engine.register("profile")
        plane = DataPlane(engine, "127.0.0.1", 0)
        port = await plane.start()
        print(json.dumps({"port": port, "worker": rec.id, "token": rec.token, "spec": engine.spec.to_dict()}),
              flush=True)
        # The loop thread's CPU, not wall: a loaded machine's waits for a core are not ours.
        prof = cProfile.Profile(time.thread_time) if out != "-" else None
        if prof is not None:
            prof.enable()
        c0, n0 = time.thread_time(), sum(engine.message_counts.values())
        s0 = int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[2])
        w0 = _switches()
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        c1, n1 = time.thread_time(), sum(engine.message_counts.values())
        if prof is not None:
            prof.disable()
            prof.dump_stats(out)
        slices = int(Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").read_text().split()[2]) - s0
        w1 = _switches()
        n = max(1, n1 - n0)
        print(f"data plane loop thread: {(c1 - c0) / n * 1e3:.3f} ms CPU a request, "
              f"{slices / n:.2f} runs on a CPU a request ({n1 - n0} requests)", file=sys.stderr)
        # Voluntary switches are the thread's own waits (a wake-up each); involuntary ones, preemption by load.
        me = threading.get_native_id()
        for tid in sorted(w1):
            vol, invol, cpu = ((a - b) / n for a, b in zip(w1[tid], w0.get(tid, (0, 0, 0))))
            if vol + invol >= 0.05:
                name = "loop" if tid == me else Path(f"/proc/self/task/{tid}/comm").read_text().strip()
                print(f"  thread {name}: {vol:.2f} wake-ups, {invol:.2f} preemptions, {cpu / 1e6:.3f} ms CPU a request",
                      file=sys.stderr)
        await plane.stop()

    import torch

    torch.set_num_threads(1)
    asyncio.run(serve())


def _switches() -> dict[int, tuple[int, int, int]]:
    """Voluntary and involuntary context switches and CPU nanoseconds (schedstat) of each of this process's
    threads."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            fields = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
            cpu_ns = int((task / "schedstat").read_text().split()[0])
            out[int(task.name)] = (int(fields["voluntary_ctxt_switches"]), int(fields["nonvoluntary_ctxt_switches"]),
                                   cpu_ns)
    return out


@contextlib.contextmanager
def plane_client(cmd: list[str], codec_name: str) -> Iterator[tuple[Any, Any, dict[str, Any]]]:
    """A ``plane_main`` child started by ``cmd`` and a ``DataClient`` to it: yields the client, a push of
    ``codec_name`` encoded for the child's model and its body; the child is told to stop on the way out."""
    import subprocess

    import torch

    from hermes.client.transport import DataClient
    from hermes.common.codecs import Int8Codec, PowerSgdCodec, TopKCodec
    from hermes.common.tensors import ModelSpec

    child = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdin is not None and child.stdout is not None
    try:
        info = json.loads(child.stdout.readline())
        spec = ModelSpec.from_dict(info["spec"])
        dc = DataClient(f"tcp://127.0.0.1:{info['port']}", info["worker"], info["token"], timeout=60.0)
        delta = torch.randn(spec.numel, generator=torch.Generator().manual_seed(1)) * 1e-6
        makers = {"topk": lambda: TopKCodec(0.01), "int8": lambda: Int8Codec(1024, True, 0),
                  "powersgd": lambda: PowerSgdCodec(4, 0)}
        enc = makers[codec_name]().encode(delta, spec.shapes)
        body = {"samples": 32, "loss": 1.0, "codec": enc.spec.model_dump(exclude_none=True)}
        try:
            yield dc, enc, body
        finally:
            dc.close()
    finally:
        child.stdin.write("stop\n")
        child.stdin.close()
        child.wait(timeout=60)


def applied_pusher(dc: Any, body: dict[str, Any], payload: Any, version: int = 0) -> Callable[[], None]:
    """A served push that must come back applied, each one sent with the version the last reply gave."""
    from hermes.common.wire import MsgType

    def push() -> None:
        nonlocal version
        rep = dc.request(MsgType.PUSH_UPDATE, body, payload=payload, model_version=version, idempotent=False)
        if rep.header.body.get("status") != "applied":
            raise RuntimeError(f"push not applied: {rep.header.body}")
        version = rep.header.model_version

    return push


def served(codec_name: str, pushes: int, out: str, top: int, rcvhwm: int | None = None) -> None:
    """The same pushes through the real data plane in a process of its own, profiled there (``plane_main``)."""
    from hermes.common.wire import MsgType

    cmd = [sys.executable, __file__, "--plane", codec_name, out, *([] if rcvhwm is None else [str(rcvhwm)])]
    with plane_client(cmd, codec_name) as (dc, enc, body):
        version = 0
        t0 = time.perf_counter()
        for _ in range(pushes):
            rep = dc.request(MsgType.PUSH_UPDATE, body, payload=enc.data, model_version=version, idempotent=False)
            version = rep.header.model_version
        print(f"{pushes} pushes through the data plane: {(time.perf_counter() - t0) / pushes * 1e3:.3f} ms each")
    if out != "-":
        stats = pstats.Stats(out)
        stats.sort_stats("tottime").print_stats(top)
        stats.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--codec", default="topk", choices=("topk", "int8", "powersgd", "fp32"))
    p.add_argument("--pushes", type=int, default=300)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--pull-after", action="store_true", help="time an int8 pull after each push instead")
    p.add_argument("--served", metavar="PROFILE_OUT", default=None,
                   help="profile a real hermes-server (cProfile, written here) instead of the engine in process")
    p.add_argument("--rcvhwm", type=int, default=None,
                   help="with --served: the data plane's RCVHWM instead of 1 (an experiment; 1 bounds memory)")
    p.add_argument("--pieces", action="store_true", help="each piece of a push timed alone, hot, and handle")
    args = p.parse_args(argv)
    if args.pieces:
        import torch

        torch.set_num_threads(1)
        asyncio.run(pieces(args.codec))
        return 0
    if args.served:
        served(args.codec, args.pushes, args.served, args.top, args.rcvhwm)
        return 0
    import torch

    torch.set_num_threads(1)
    asyncio.run(run(args.codec, args.pushes, args.profile, args.top, args.pull_after))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--plane"]:
        plane_main(sys.argv[2], sys.argv[3], int(sys.argv[4]) if len(sys.argv) > 4 else None)
    else:
        sys.exit(main())
