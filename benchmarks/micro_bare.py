"""The bare counterpart of ``hermes-bench micro``'s compressed rows (issue 31): what a compressed push or an int8
pull must cost at least, written as plainly as torch allows and sharing no code with ``hermes.common.codecs``
(so a change to our codecs cannot move the baseline it is measured against).

The bare pair is a pyzmq DEALER (this process) and ROUTER (its own process, as the server is), moving the same
compressed bytes in the same frames, each end computing the same MAC (Poly1305 under a one-time key) over them:

- a push: the ROUTER authenticates the payload, decodes it to the dense fp32 update (top-k scatter into a kept
  zero vector whose last k elements it zeroes again, as our server does; int8 scale multiply, PowerSGD P Q^T), checks that it is finite (one fp32 sum, the least a server folding untrusted
  updates must do) and adds it to its model, then acks;
- a pull that finds a new model: the ROUTER quantises its model to int8 (nearest, a scale per chunk),
  authenticates the bytes and sends them; the DEALER authenticates what it received.

A push's ack is authenticated too (the ROUTER MACs it, the DEALER computes the MAC of what came), as our signed
reply is. Not done by the bare pair, done by ours: the header's fields, replay and session checks, the body's
schema, the size checks of the codec spec, the update's norm (screening reads it; the bare finite check costs
the same pass), screening, the sync rule, the model's version and snapshot, telemetry, metrics.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import zmq

if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_foundation import BARE_HEADER_BYTES, bare_mac  # noqa: E402

from hermes.deploy.procs import free_port  # noqa: E402


def _matrix(shape: list[int], rank: int) -> tuple[int, int] | None:
    """PowerSGD's matrix view of an entry, None for one sent whole (Vogels et al. 2019, Sec. 3)."""
    if len(shape) < 2:
        return None
    m, n = shape[0], math.prod(shape[1:])
    return None if (m + n) * rank >= m * n else (m, n)


def bare_check(spec: dict[str, Any], buf: Any, delta: Any) -> None:
    """The finite check, one fp32 pass: over a top-k push's k values (the rest are zeros; our server reads its
    norm there too, ``codecs.decode_topk``, since 2026-11-28), over the dense update otherwise."""
    import torch

    if spec["codec"] == "topk":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # a read-only received frame, only read
            checked = torch.frombuffer(buf, dtype=torch.float32, count=spec["k"], offset=4 * spec["k"])
    else:
        checked = delta
    if not torch.isfinite(checked.sum()):
        raise ValueError("non-finite update")


def bare_decode(spec: dict[str, Any], buf: Any, reuse: dict[str, Any] | None = None) -> Any:
    """The dense fp32 update of one compressed payload (``buf``: the received frame's bytes). ``reuse``: top-k
    writes into the zero vector kept there, the last push's elements zeroed again (what our server does,
    ``codecs.DenseScratch``; the caller drops the result before the next push)."""
    import torch

    shapes = spec["shapes"]
    n = sum(math.prod(s) for s in shapes)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # received frames are read-only; never written
        if spec["codec"] == "topk":
            k = spec["k"]
            idx = torch.frombuffer(buf, dtype=torch.int32, count=k)
            if reuse is None:
                out = torch.zeros(n)
            else:
                out = reuse.get("out")
                if out is None or out.numel() != n:
                    out = reuse["out"] = torch.zeros(n)
                else:
                    out[reuse["idx"]] = 0.0
                reuse["idx"] = idx.clone()
            out[idx] = torch.frombuffer(buf, dtype=torch.float32, count=k, offset=4 * k)
            return out
        if spec["codec"] == "int8":
            chunk = spec["chunk"]
            chunks, full = -(-n // chunk), n // chunk
            scale = torch.frombuffer(buf, dtype=torch.float32, count=chunks)
            q = torch.frombuffer(buf, dtype=torch.int8, offset=4 * chunks)
            out = torch.empty(n)
            torch.mul(q[: full * chunk].view(full, chunk), scale[:full, None],
                      out=out[: full * chunk].view(full, chunk))
            if n > full * chunk:
                torch.mul(q[full * chunk :], scale[full], out=out[full * chunk :])
            return out
        rank, out, off, at = spec["rank"], torch.empty(n), 0, 0
        for shape in shapes:
            size, mn = math.prod(shape), _matrix(shape, rank)
            if mn is None:
                out[at : at + size] = torch.frombuffer(buf, dtype=torch.float32, count=size, offset=off)
                off += 4 * size
            else:
                p = torch.frombuffer(buf, dtype=torch.float32, count=mn[0] * rank, offset=off).view(mn[0], rank)
                off += 4 * mn[0] * rank
                q = torch.frombuffer(buf, dtype=torch.float32, count=mn[1] * rank, offset=off).view(mn[1], rank)
                off += 4 * mn[1] * rank
                torch.mm(p, q.T, out=out[at : at + size].view(mn))
            at += size
        return out


def bare_quantise(model: Any, chunk: int) -> Any:
    """The model in int8, round to nearest, max |x| / 127 a chunk: the scales then the codes, one uint8 buffer."""
    import torch

    n = model.numel()
    chunks, full = -(-n // chunk), n // chunk
    data = torch.empty(4 * chunks + n, dtype=torch.uint8)
    scale = data[: 4 * chunks].view(torch.float32)
    body = model[: full * chunk].view(full, chunk)
    torch.maximum(body.amax(dim=1).abs_(), body.amin(dim=1).abs_(), out=scale[:full])
    if n > full * chunk:
        scale[full] = model[full * chunk :].abs().amax()
    scale.div_(127.0).clamp_(min=1e-30)
    y = torch.empty(n)
    torch.div(body, scale[:full, None], out=y[: full * chunk].view(full, chunk))
    if n > full * chunk:
        torch.div(model[full * chunk :], scale[full], out=y[full * chunk :])
    data[4 * chunks :].view(torch.int8).copy_(y.round_().clamp_(-127, 127))
    return data


def router_main(port: int, threads: int = 1) -> None:
    """[b"W" + json spec, *payload] -> MAC, decode, finite check, add; an ack frame and its MAC.
    [b"Q" + json {"chunk", "numel"}] -> quantise the model, MAC, send a header-sized frame and the bytes.
    [b"stop"] -> ack and exit."""
    import torch

    torch.set_num_threads(threads)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(f"tcp://127.0.0.1:{port}")
    header, ack = b"h" * BARE_HEADER_BYTES, b"a" * 96
    model: Any = None
    reuse: dict[str, Any] = {}
    print("ready", flush=True)
    while True:
        frames = sock.recv_multipart(copy=False)
        ident, first = frames[0], frames[1].bytes
        if first == b"stop":
            sock.send_multipart([ident, ack])
            break
        spec = json.loads(first[1:])
        numel = spec.get("numel") or sum(math.prod(s) for s in spec["shapes"])
        if model is None or model.numel() != numel:
            model = torch.zeros(numel)
        if first[:1] == b"W":
            bufs = [f.buffer for f in frames[2:]]
            bare_mac(bufs)
            delta = bare_decode(spec, bufs[0], reuse)
            bare_check(spec, bufs[0], delta)
            model.add_(delta)
            del delta
            # The ack authenticated as ours is (its MAC, the agent checks it): the same MAC both ways.
            sock.send_multipart([ident, ack, bare_mac([ack]).encode()], copy=False)
        else:
            data = bare_quantise(model, spec["chunk"])
            view = memoryview(data.numpy())
            bare_mac([view])
            sock.send_multipart([ident, header, view], copy=False)
    sock.close(linger=0)
    ctx.term()


class BareWorkRouter:
    """The DEALER end, talking to ``router_main`` in a process of its own."""

    def __init__(self, threads: int = 1) -> None:
        self.port = free_port()
        # The server's torch threads and OpenMP wait policy (hermes.server sets PASSIVE unless the user set one):
        # the same tensor work under the same threading on both sides.
        env = {**os.environ, "OMP_NUM_THREADS": str(threads),
               "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self.proc: subprocess.Popen[str] = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--router", str(self.port), str(threads)],
            stdout=subprocess.PIPE, text=True, env=env)
        assert self.proc.stdout is not None  # stdout=PIPE
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise RuntimeError(f"bare work router did not start: {line!r}")
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # Our agent's threshold (client/transport.py SEND_COPY_BELOW, not imported: micro_ab runs this file
        # against older revisions): a top-1% push's 80 KB frame is copied on both sides, not released through
        # pyzmq's garbage thread on one.
        self.sock.copy_threshold = 128 * 1024
        self.sock.connect(f"tcp://127.0.0.1:{self.port}")

    def push(self, spec: dict[str, Any], payload: list[Any]) -> None:
        """One compressed push: MAC here, send; there MAC, decode, check, add; ack."""
        bare_mac(payload)
        self.sock.send_multipart([b"W" + json.dumps(spec).encode(), *payload], copy=False)
        reply = self.sock.recv_multipart(copy=False)
        bare_mac([reply[0].buffer])  # the ack's MAC checked (recomputed; a real check compares it too)

    def pull(self, chunk: int, numel: int) -> int:
        """One int8 pull of a new model: there quantise and MAC; here MAC what came."""
        self.sock.send_multipart([b"Q" + json.dumps({"chunk": chunk, "numel": numel}).encode()])
        reply = self.sock.recv_multipart(copy=False)
        bare_mac([f.buffer for f in reply[1:]])
        return sum(len(f) for f in reply)

    def close(self) -> None:
        try:
            self.sock.send_multipart([b"stop"])
            if self.sock.poll(5000):
                self.sock.recv_multipart()
        finally:
            self.sock.close(linger=0)
            self.ctx.term()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--router"]:
        router_main(int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1)
