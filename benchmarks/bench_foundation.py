"""Foundation benchmark: the server's update path and data plane vs bare baselines.

    python benchmarks/bench_foundation.py [--quick] [--threads N] [--json PATH]

Measured in one run, printed side by side:

A. Update apply, in process. For a 1M- and a 10M-parameter flat model and
   fp32 / fp16 deltas: ``ModelState.apply`` alone, ``validate_update`` +
   ``apply``, and ``decode`` + ``validate_update`` + ``apply`` (the payload
   comes from ``decode(encode(Header(...), delta))``), against a bare
   ``torch.Tensor.add_`` and a bare numpy ``a += b`` of the same size. For
   fp16 the server accumulates into fp32, so the like-for-like bare figure is
   ``w.add_(delta16.float())``; bare fp32 ``add_`` is shown too.

B. Data plane round trips. The real server (``python -m hermes.server.cli``,
   an mlp on digits with ~1M and ~10M parameters) is started as a subprocess;
   one worker registers over HTTP and times ``DataClient.request`` calls: a
   small request (a pull that finds the model unchanged: the fixed cost of
   one request), pushes (ASP applies each one; the next push names the
   version the previous reply carried) and pulls. The baseline is a bare
   pyzmq DEALER talking to a bare ROUTER that sends / receives exactly the
   same frames (same byte counts, same frame split) and does nothing else.
   The bare ROUTER runs in its own process, like the server, so both sides
   pay the same process topology. Server and bare calls alternate, so load
   from other processes hits both alike.

C. Where the time goes: the pieces of those paths timed one by one
   (CRC32C, msgpack header, finiteness check, fp16->fp32 conversion, axpy,
   snapshot copy, a thread hop), plus the blocked variants proposed as fixes,
   so a missed ratio can be read off directly.

The project's goal is to stay within 2x of the bare figures; every ratio is
printed with whether it meets that goal. ``--quick`` shrinks the repeats so
the whole run fits in about a minute; the default takes one to a few minutes.
On a small or busy machine ``--threads 1`` gives steadier figures: torch's
intra-op pool then never waits for a descheduled worker thread.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from hermes.deploy.bench.machine import loadavg, machine_info, print_table
from hermes.deploy.procs import StartupError, free_port, free_ports, start, tail, wait_healthy

GOAL = 2.0
SIZES = {"1M": 1_000_000, "10M": 10_000_000}
# mlp on digits (64 inputs, 10 classes): 64*h1+h1 + h1*h2+h2 + h2*10+10 parameters.
MLP_HIDDEN = {"1M": [1024, 896], "10M": [3120, 3120]}  # 993,930 and 9,971,530 parameters
BARE_HEADER_BYTES = 160  # about what a real msgpack header weighs


# --------------------------------------------------------------------------- timing


def timed_ms(fns: dict[str, Callable[[], Any]], repeats: int, warmup: int = 2) -> dict[str, dict[str, float]]:
    """Median / min / quartiles in ms of each function, run interleaved.

    One repeat runs every function once, in turn, so load from other
    processes hits the server path and its bare baseline alike. A function
    that returns a float reports that many seconds instead of its own wall
    time (to time one part of a sequence).
    """
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    samples: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            got = fn()
            elapsed = time.perf_counter() - t0
            samples[name].append(got if isinstance(got, float) else elapsed)
    out = {}
    for name, xs in samples.items():
        q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
        out[name] = {"median": statistics.median(xs) * 1e3, "min": min(xs) * 1e3,
                     "p25": q[0] * 1e3, "p75": q[2] * 1e3, "n": len(xs)}
    return out


def verdict(ratio: float) -> str:
    return "yes" if ratio <= GOAL else "NO"


def print_cells(title: str, header: list[str], rows: list[list[Any]]) -> None:
    print_table(title, header, [[_fmt(c) for c in r] for r in rows])


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 1000 else f"{v:.0f}"
    return str(v)


# --------------------------------------------------------------------------- machine


# --------------------------------------------------------------------------- A: apply


def flat_spec(n: int):
    from hermes.common.tensors import ModelSpec

    return ModelSpec(name="flat", entries=(("w", (n,)),))


def bench_apply(repeats: int, sizes: tuple[str, ...] = tuple(SIZES)) -> list[dict[str, Any]]:
    import numpy as np
    import torch

    from hermes.common.wire import Header, MsgType, decode, encode
    from hermes.server.state import ModelState, validate_update

    out = []
    gen = torch.Generator().manual_seed(0)
    for size in sizes:
        n = SIZES[size]
        spec = flat_spec(n)
        base32 = torch.randn(n, generator=gen) * 1e-6
        bare32_ms = None
        for dname, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            delta = base32.to(dtype)
            # Signed, as every push is: its decode checks no CRC (the MAC covers the bytes; the MAC
            # itself is timed in the data-plane and codec rows).
            frames = encode(Header(type=MsgType.PUSH_UPDATE, shapes=((n,),)), delta, key=b"k" * 32)
            payload = decode(frames).payload
            state = ModelState(spec, torch.zeros(n))

            def apply_only() -> None:
                state.apply([(payload, 1.0)])

            def validate_apply() -> None:
                validate_update(spec, payload)
                state.apply([(payload, 1.0)])

            def decode_validate_apply() -> None:
                p = decode(frames).payload
                validate_update(spec, p)
                state.apply([(p, 1.0)])

            w = torch.zeros(n)
            if dtype == torch.float32:
                def bare_torch() -> None:
                    w.add_(delta, alpha=1.0)
            else:
                def bare_torch() -> None:
                    w.add_(delta.float(), alpha=1.0)

            def bare_checked() -> None:  # the least a server folding untrusted updates must do
                if not torch.isfinite(delta.sum(dtype=torch.float32)):
                    raise ValueError("non-finite update")
                bare_torch()
            a, b = w.numpy(), delta.numpy()

            def bare_numpy() -> None:
                np.add(a, b, out=a)  # a += b; numpy casts fp16 -> fp32 in its buffered loop

            t = timed_ms({"apply": apply_only, "validate_apply": validate_apply,
                          "decode_validate_apply": decode_validate_apply, "bare_torch": bare_torch,
                          "bare_checked": bare_checked, "bare_numpy": bare_numpy}, repeats)
            r: dict[str, Any] = {"size": size, "numel": n, "dtype": dname, "stats": t}
            r.update({f"{k}_ms": v["median"] for k, v in t.items()})
            if dtype == torch.float32:
                bare32_ms = r["bare_torch_ms"]
            r["bare_torch_fp32_ms"] = bare32_ms
            bare = r["bare_torch_ms"]
            r["ratio_apply"] = r["apply_ms"] / bare
            r["ratio_validate_apply"] = r["validate_apply_ms"] / bare
            r["ratio_decode_validate_apply"] = r["decode_validate_apply_ms"] / bare
            r["ratio_vs_checked"] = r["decode_validate_apply_ms"] / r["bare_checked_ms"]
            out.append(r)
    return out


def print_apply(rows: list[dict[str, Any]]) -> None:
    print_cells(
        "A. Update apply, in process (median ms; ratio = server / bare torch of the same work;"
        " fp16 bare = w.add_(d16.float()))",
        ["model", "delta", "apply", "val+apply", "dec+val+apply", "bare torch", "bare fp32", "bare numpy",
         "x apply", "x val+apply", "x dec+val+apply", "<=2x"],
        [
            [r["size"], r["dtype"], r["apply_ms"], r["validate_apply_ms"], r["decode_validate_apply_ms"],
             r["bare_torch_ms"], r["bare_torch_fp32_ms"], r["bare_numpy_ms"],
             r["ratio_apply"], r["ratio_validate_apply"], r["ratio_decode_validate_apply"],
             verdict(r["ratio_decode_validate_apply"])]
            for r in rows
        ],
    )


# --------------------------------------------------------------------------- B: data plane


# The bare baseline that authenticates its bytes uses the same MAC primitive as the data plane
# (hermes.common.signing: Poly1305 under a one-time key) with a fixed key, and nothing else.
BARE_KEY = b"bare-baseline-key" * 2


def bare_mac(frames: list) -> str:
    from hermes.common.signing import mac_hex, new_nonce

    return mac_hex(BARE_KEY, new_nonce(), b"", frames)


def bare_router_main(port: int) -> None:
    """The baseline peer: replies to every message and does nothing else.

    [b"pull:<nbytes>"] -> a header-sized frame + <nbytes> in <=32 MB frames
    [b"pullA:<nbytes>"] -> the same, the MAC of the model frames computed first
    [b"A...", *frames] -> the MAC of the payload frames computed, then one small ack frame
    anything else      -> one small ack frame
    """
    from hermes.common.wire import MAX_FRAME_BYTES

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    header = b"h" * BARE_HEADER_BYTES
    ack = b"a" * 96
    models: dict[int, list[memoryview]] = {}
    print("ready", flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        ident, first = frames[0], frames[1].bytes if len(frames[1]) < 64 else b""
        if first == b"stop":
            sock.send_multipart([ident, ack])
            break
        if first.startswith((b"pull:", b"pullA:")):
            n = int(first.split(b":")[1])
            if n not in models:
                buf = memoryview(bytearray(n))
                models[n] = [buf[i : i + MAX_FRAME_BYTES] for i in range(0, n, MAX_FRAME_BYTES)]
            if first.startswith(b"pullA:"):
                bare_mac(models[n])
            sock.send_multipart([ident, header, *models[n]], copy=False)
        else:
            if first.startswith(b"A"):
                bare_mac([f.buffer for f in frames[2:]])
            sock.send_multipart([ident, ack], copy=False)
    sock.close(linger=0)
    ctx.term()


class BareRouter:
    def __init__(self) -> None:
        self.port = free_port()
        self.proc: subprocess.Popen[str] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--_bare-router", str(self.port)],
            stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"bare router did not start: {line!r}")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(f"tcp://127.0.0.1:{self.port}")

    def round_trip(self, frames: list, auth: bool = False) -> int:
        """One exchange; with ``auth`` the sender MACs the payload it sends and the receiver
        the payload it gets (pushes: ``frames[1:]``; pulls: the reply's model frames)."""
        if auth:
            bare_mac(frames[1:])
        self.sock.send_multipart(frames, copy=False)
        reply = self.sock.recv_multipart(copy=False)
        if auth and len(reply) > 1:
            bare_mac([f.buffer for f in reply[1:]])
        return sum(len(f) for f in reply)

    def close(self) -> None:
        try:
            self.sock.send_multipart([b"stop"])
            if self.sock.poll(2000):
                self.sock.recv_multipart()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


# The servers this benchmark starts are its own: a fresh join token each run.
JOIN_TOKEN = secrets.token_urlsafe(32)


class ServerProcess:
    """``python -m hermes.server.cli`` with an mlp of the given hidden sizes."""

    def __init__(self, hidden: list[int], extra: list[str], log_dir: str, threads: int | None = None) -> None:
        self.http_port, self.data_port = free_ports(2)
        self.log_path = Path(log_dir) / f"server-{'x'.join(map(str, hidden))}.log"
        cmd = [
            sys.executable, "-m", "hermes.server.cli",
            "--host", "127.0.0.1", "--port", str(self.http_port),
            "--data-host", "127.0.0.1", "--data-port", str(self.data_port), "--advertise-host", "127.0.0.1",
            "--log-level", "warning",
            "--set", "preset=asp", "--set", "model=mlp", "--set", "dataset=digits",
            "--set", "model_kwargs=" + json.dumps({"hidden": hidden}),
            *[a for kv in extra for a in ("--set", kv)],
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERMES_")} | {"HERMES_JOIN_TOKEN": JOIN_TOKEN}
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)  # torch's intra-op pool in the server
        self.proc = start(cmd, log_path=self.log_path, env=env)
        self.url = f"http://127.0.0.1:{self.http_port}"
        try:
            wait_healthy(self.proc, self.url, timeout=120, log_path=self.log_path)
        except StartupError as exc:
            self.close()
            raise RuntimeError(str(exc)) from None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self) -> str:
        return tail(self.log_path)


def bench_dataplane(
    repeats: int, log_dir: str, eval_samples: int, threads: int | None, sizes: tuple[str, ...] = tuple(MLP_HIDDEN),
) -> tuple[list[dict[str, Any]], list[dict]]:
    import torch

    from hermes.client.transport import ControlClient, DataClient
    from hermes.common.control_messages import RegisterRequest
    from hermes.common.wire import Header, MsgType, encode

    rows: list[dict[str, Any]] = []
    server_metrics: list[dict] = []
    bare = BareRouter()
    try:
        for size in sizes:
            hidden = MLP_HIDDEN[size]
            server = ServerProcess(hidden, [f"eval_max_samples={eval_samples}"], log_dir, threads)
            try:
                reg = ControlClient(server.url, join_token=JOIN_TOKEN).register(
                    RegisterRequest(name=f"bench-{size}", threads=1))
                numel = int(reg.model_spec["numel"])
                dc = DataClient(reg.data_plane, reg.worker_id, reg.token, timeout=60.0)
                version = dc.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
                delta32 = torch.randn(numel, generator=torch.Generator().manual_seed(1)) * 1e-6

                def push(delta: torch.Tensor) -> None:
                    nonlocal version
                    rep = dc.request(MsgType.PUSH_UPDATE, {"samples": 32, "loss": 1.0}, payload=delta,
                                     model_version=version, idempotent=False)
                    if rep.header.body.get("status") != "applied":
                        raise RuntimeError(f"push not applied: {rep.header.body}")
                    version = rep.header.model_version

                def pull(dtype: str) -> int:
                    rep = dc.request(MsgType.PULL_MODEL, {"dtype": dtype})
                    assert rep.payload is not None and rep.payload.numel == numel
                    return sum(rep.header.frame_bytes)

                try:
                    # The fixed cost of one request: a pull that finds the model unchanged
                    # (no payload either way) against a bare small round trip.
                    small_req = [b"h" * BARE_HEADER_BYTES]

                    def small() -> None:
                        rep = dc.request(MsgType.PULL_MODEL, {"if_newer": True}, model_version=version)
                        assert rep.payload is None and rep.header.body.get("unchanged") is True

                    t = timed_ms({"server": small, "bare": lambda: bare.round_trip(small_req)}, repeats * 5)
                    rows.append(_pair("small request (pull, unchanged)", size, numel, 0, 0, t))

                    for dname, delta in (("fp32", delta32), ("fp16", delta32.half())):
                        frames = encode(Header(type=MsgType.PUSH_UPDATE, seq=1, model_version=1), delta)
                        auth_frames = [b"A" + bytes(frames[0]), *frames[1:]]
                        t = timed_ms({"server": lambda: push(delta), "bare": lambda: bare.round_trip(frames),
                                      "bare_auth": lambda: bare.round_trip(auth_frames, auth=True)}, repeats)
                        rows.append(_pair(f"push {dname}", size, numel, sum(len(f) for f in frames[1:]),
                                          len(frames) - 1, t))

                    for dname, short in (("float32", "fp32"), ("float16", "fp16")):
                        nbytes = pull(dname)
                        req, req_auth = [f"pull:{nbytes}".encode()], [f"pullA:{nbytes}".encode()]
                        t = timed_ms({"server": lambda: pull(dname), "bare": lambda: bare.round_trip(req),
                                      "bare_auth": lambda: bare.round_trip(req_auth, auth=True)}, repeats)
                        rows.append(_pair(f"pull {short}, cached snapshot", size, numel, nbytes,
                                          len(split_sizes(nbytes)), t))

                    # The agent's cycle: a pull right after a push misses the
                    # per-version snapshot cache. Only the pull is timed.
                    def pull_after_push() -> float:
                        push(delta32)
                        t0 = time.perf_counter()
                        pull("float32")
                        return time.perf_counter() - t0

                    req, req_auth = [f"pull:{numel * 4}".encode()], [f"pullA:{numel * 4}".encode()]
                    t = timed_ms({"server": pull_after_push, "bare": lambda: bare.round_trip(req),
                                  "bare_auth": lambda: bare.round_trip(req_auth, auth=True)}, repeats)
                    rows.append(_pair("pull fp32 right after a push", size, numel, numel * 4,
                                      len(split_sizes(numel * 4)), t))
                finally:
                    dc.close()
                with urllib.request.urlopen(server.url + "/metrics", timeout=5) as r:
                    text = r.read().decode()
                server_metrics.append({"size": size, "apply_seconds": _histogram(text, "apply_seconds")})
            except Exception:
                print(server.log_tail(), file=sys.stderr)
                raise
            finally:
                server.close()
    finally:
        bare.close()
    return rows, server_metrics


def split_sizes(nbytes: int) -> list[int]:
    from hermes.common.wire import MAX_FRAME_BYTES

    return [min(MAX_FRAME_BYTES, nbytes - i) for i in range(0, nbytes, MAX_FRAME_BYTES)]


def _histogram(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or name not in line:
            continue
        key, _, value = line.rpartition(" ")
        if key.endswith("_sum") or key.endswith("_count"):
            out[key.rsplit("_", 1)[1]] = float(value)
    return out


def _pair(op: str, size: str, numel: int, nbytes: int, nframes: int, t: dict[str, dict[str, float]]) -> dict:
    server_ms, bare_ms = t["server"]["median"], t["bare"]["median"]
    ratio = server_ms / bare_ms
    # The bare baseline that also authenticates its bytes (same MAC), where measured.
    bare_auth_ms = t["bare_auth"]["median"] if "bare_auth" in t else None
    return {
        "op": op, "size": size, "numel": numel, "payload_bytes": nbytes, "payload_frames": nframes,
        "server_ms": server_ms, "bare_ms": bare_ms, "ratio": ratio, "stats": t,
        "bare_auth_ms": bare_auth_ms, "ratio_auth": server_ms / bare_auth_ms if bare_auth_ms else None,
        "server_gbps": nbytes / server_ms / 1e6, "bare_gbps": nbytes / bare_ms / 1e6, "meets_goal": ratio <= GOAL,
    }


def print_dataplane(rows: list[dict[str, Any]]) -> None:
    print_cells(
        "B. Data plane round trips (median ms; server = DataClient.request against hermes-server (asp, mlp on"
        " digits), bare = pyzmq DEALER/ROUTER in its own process, same bytes and frames)",
        ["op", "model", "MB", "frames", "server", "bare", "ratio", "<=2x", "server GB/s", "bare GB/s",
         "min ratio"],
        [
            [r["op"], f"{r['size']} ({r['numel']:,})", r["payload_bytes"] / 1e6, r["payload_frames"],
             r["server_ms"], r["bare_ms"], r["ratio"], verdict(r["ratio"]), r["server_gbps"], r["bare_gbps"],
             r["stats"]["server"]["min"] / r["stats"]["bare"]["min"]]
            for r in rows
        ],
    )


# --------------------------------------------------------------------------- C: pieces


def bench_pieces(repeats: int) -> list[dict[str, Any]]:
    """Each piece of the push / pull paths on its own (median ms)."""
    import asyncio

    import torch

    from hermes.common.wire import (
        Header,
        MsgType,
        checksum_of,
        decode,
        encode,
        split_frames,
    )

    out = []
    loop = asyncio.new_event_loop()
    for size, n in SIZES.items():
        w = torch.zeros(n)
        for dname, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
            d = (torch.randn(n) * 1e-6).to(dtype)
            views = split_frames(d)
            frames = encode(Header(type=MsgType.PUSH_UPDATE, shapes=((n,),)), d)
            hdr = frames[0]
            full = Header.unpack(hdr)
            pieces: dict[str, Callable[[], Any]] = {
                "crc32c (one side)": lambda: checksum_of(views),
                "msgpack header pack+unpack": lambda: Header.unpack(full.pack()),
                "decode (hdr+crc+frombuffer)": lambda: decode(frames),
                "finite check: sum(dtype=f32)": lambda: d.sum(dtype=torch.float32),
                "finite check: isfinite().all()": lambda: bool(torch.isfinite(d).all()),
                "axpy as in ModelState.apply": lambda: w.add_(d if dtype == torch.float32 else d.to(torch.float32)),
            }
            if dtype == torch.float32:
                pieces["snapshot copy (fresh alloc)"] = lambda: w.to(torch.float32, copy=True)
                snap = torch.empty(n)
                pieces["snapshot copy_ into a reused buffer"] = lambda: snap.copy_(w)
                pieces["asyncio.to_thread hop"] = lambda: loop.run_until_complete(asyncio.to_thread(int))
            else:
                pieces["fp16->fp32 .to() (fresh alloc)"] = lambda: d.to(torch.float32)
                scratch = torch.empty(1 << 18)

                def blocked_axpy() -> None:  # the proposed fix: cache-sized fp32 scratch, no big alloc
                    k = scratch.numel()
                    for i in range(0, n, k):
                        m = min(k, n - i)
                        s = scratch[:m]
                        s.copy_(d[i : i + m])
                        w[i : i + m].add_(s)

                pieces["blocked fp16 axpy (1 MB scratch)"] = blocked_axpy

                def blocked_check() -> bool:  # the proposed fix for the finite check
                    block = 1 << 20
                    return all(bool(torch.isfinite(d[i : i + block].sum(dtype=torch.float32)))
                               for i in range(0, n, block))

                pieces["finite check, 1M-element blocks"] = blocked_check
            for name, st in timed_ms(pieces, repeats).items():
                out.append({"size": size, "dtype": dname, "piece": name, "ms": st["median"], "min_ms": st["min"]})
    loop.close()
    return out


def print_pieces(rows: list[dict[str, Any]]) -> None:
    keys = list(dict.fromkeys(r["piece"] for r in rows))
    cols = list(dict.fromkeys((r["size"], r["dtype"]) for r in rows))
    table = {(r["piece"], r["size"], r["dtype"]): r["ms"] for r in rows}
    print_cells(
        "C. Where the time goes: the pieces alone (median ms)",
        ["piece", *[f"{s} {d}" for s, d in cols]],
        [[k, *[table.get((k, s, d), "") for s, d in cols]] for k in keys],
    )


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="few repeats: the whole run in about a minute")
    p.add_argument("--json", dest="json_path", help="also write the figures to this JSON file")
    p.add_argument("--skip-dataplane", action="store_true", help="only the in-process parts (A, C)")
    p.add_argument("--eval-samples", type=int, default=1,
                   help="server eval_max_samples during B (default 1: the evaluator, which re-evaluates after "
                        "every apply, barely competes for the CPU; the run default is 2000)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch intra-op threads here and in the server (default: torch's default). "
                        "1 gives steadier figures on a loaded machine")
    p.add_argument("--_bare-router", type=int, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._bare_router:
        bare_router_main(args._bare_router)
        return 0

    t_start = time.perf_counter()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    info = machine_info()
    print("Hermes foundation benchmark" + (" (--quick)" if args.quick else ""))
    print(f"  CPU: {info['cpu_model']} | cpu_count {info['cpu_count']} (usable {info['cpus_usable']})"
          f" | torch threads {info['torch_threads']}")
    print(f"  python {info['python']} | torch {info['torch']} | numpy {info['numpy']} | pyzmq {info['pyzmq']}"
          f" | libzmq {info['libzmq']} | msgpack {info['msgpack']} | crc32c hw {info['crc32c_hardware']}")
    print(f"  {info['platform']} | load average {info['loadavg_at_start']}")
    load = (info["loadavg_at_start"] or [0.0])[0]
    if load > 0.5 * (info["cpus_usable"] or 1):
        print(f"  WARNING: the machine is busy (load {load} on {info['cpus_usable']} CPUs): multi-threaded torch ops"
              " wait for descheduled pool threads and every figure is inflated; --threads 1 is steadier")

    apply_reps, plane_reps, piece_reps = (7, 10, 5) if args.quick else (61, 60, 31)
    results: dict[str, Any] = {"machine": info, "quick": args.quick, "goal_ratio": GOAL}

    results["apply"] = bench_apply(apply_reps)
    print_apply(results["apply"])

    if not args.skip_dataplane:
        with tempfile.TemporaryDirectory(prefix="hermes-bench-") as log_dir:
            results["dataplane"], results["server_metrics"] = bench_dataplane(
                plane_reps, log_dir, args.eval_samples, args.threads)
        print_dataplane(results["dataplane"])
        folds = [f"{m['size']} {1e3 * m['apply_seconds']['sum'] / m['apply_seconds']['count']:.2f} ms"
                 f" over {m['apply_seconds']['count']:.0f}"
                 for m in results["server_metrics"] if m["apply_seconds"].get("count")]
        print("server's own hermes_apply_seconds (the fold in its thread, mean over fp32 and fp16 pushes): "
              + ", ".join(folds))

    results["pieces"] = bench_pieces(piece_reps)
    print_pieces(results["pieces"])

    misses = [f"{r['size']} {r['dtype']} apply" for r in results["apply"] if r["ratio_decode_validate_apply"] > GOAL]
    misses += [f"{r['op']} {r['size']}" for r in results.get("dataplane", []) if not r["meets_goal"]]
    results["misses"] = misses
    results["seconds"] = time.perf_counter() - t_start
    results["loadavg_at_end"] = loadavg()
    print(f"\nload average at the end: {results['loadavg_at_end']}")
    print(f"Goal (within {GOAL:g}x of bare): "
          + ("all met" if not misses else f"missed by {len(misses)}: " + "; ".join(misses)))
    print(f"total {results['seconds']:.1f} s")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(results, indent=2))
        print(f"figures written to {args.json_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
