"""64 peers each sending maximum-size frames at once: the server's memory stays under a stated bound.

What the server can be made to hold (issue 15, "the per-frame cap does not
bound total memory"):

* libzmq receives every connection's current frame into a buffer of its
  announced size (MAXMSGSIZE refuses bigger ones before allocating): at most
  ``peers × socket_frame_cap`` in progress, filled only as bytes arrive;
* the data plane admits at most ``max_inflight_bytes`` (4 × max_message_bytes)
  of messages into handling at a time; what arrives beyond it is refused
  ``unavailable`` and freed at once, so libzmq's queue drains at the loop's pace.

So peak RSS <= baseline + peers × socket_frame_cap + max_inflight_bytes + slack.
Measured on 2026-11-24 (2 shared cores, 64 peers × 4 frames of 4 MiB, limit
2 MiB, bound 264 MiB): peak +156 to +226 MiB. With the server's event loop held
for 3 s at the first frame of a burst (a patch, 2026-11-27), +263 MiB: libzmq
holds one frame per connection, so the bound is not loose.

Freed memory: frame buffers under glibc's dynamic mmap threshold (up to 32 MiB)
go back to malloc's arenas, not the OS; without the server's trim, +64 to +185
MiB stayed after a burst and a third burst in CI peaked at +354 MiB, over the
bound (2026-11-27): libzmq's part is the +263 above, so the
rest, we take it, was fragmented arenas. The server trims the heap once the
refusals stop (server/heap.py): RSS comes back to +6 MiB after each burst, and
each burst starts from there. ``MALLOC_MMAP_THRESHOLD_=131072`` makes every
frame buffer its own mapping instead (the first test runs the server so).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from hermes.server.dataplane import socket_frame_cap
from tests.conftest import LiveServer, wait_for

pytestmark = pytest.mark.integration

LIMIT = 2 * 1024 * 1024  # --max-message-bytes: small enough for a 2-core CI box
PEERS, FRAMES = 64, 4
MiB = 1024 * 1024
SLACK = 48 * MiB  # interpreter, uvicorn and torch arenas moving under load

# 64 DEALER connections in one process, each sending FRAMES two-frame messages whose payload
# is 2 × LIMIT (the largest frame the socket accepts), named by a registered worker so they
# pass admission; then every reply is collected.
_PEERS = textwrap.dedent("""
    import sys, time, zmq, msgpack
    from hermes.common.signing import new_session, now_ms
    from hermes.common.wire import Header, MsgType
    addr, worker, size, peers, per = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    ctx = zmq.Context(io_threads=2)
    payload = b"\\x00" * size
    socks = []
    for _ in range(peers):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, per + 1)
        s.connect(addr)
        socks.append(s)
    seq = 0
    for _ in range(per):
        for s in socks:
            seq += 1
            h = Header(type=MsgType.PUSH_UPDATE, worker=worker, seq=seq, ts=now_ms(), session=new_session(),
                       model_version=0, body={"samples": 1})
            s.send_multipart([h.pack(), payload], copy=False)
    codes, got, deadline = {}, 0, time.monotonic() + 120
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    while got < peers * per and time.monotonic() < deadline:
        for s, _ in poller.poll(1000):
            while s.poll(0):
                code = msgpack.unpackb(s.recv_multipart()[0], raw=False).get("body", {}).get("code")
                codes[code] = codes.get(code, 0) + 1
                got += 1
    print(got, ",".join(f"{k}={v}" for k, v in sorted(codes.items())))
""")


def _mem(srv: LiveServer) -> dict[str, int]:
    """VmRSS and VmHWM (peak RSS) of the server process, in bytes."""
    out = {}
    with open(f"/proc/{srv.proc.pid}/status") as fh:
        for line in fh:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak(srv: LiveServer) -> None:
    """Start VmHWM afresh (Linux ≥ 4.0), so a peak is this burst's and not an earlier one's."""
    with open(f"/proc/{srv.proc.pid}/clear_refs", "w") as fh:
        fh.write("5")


def _burst(srv: LiveServer, worker_id: str) -> None:
    proc = subprocess.run([sys.executable, "-c", _PEERS, srv.data_address, worker_id, str(2 * LIMIT),
                           str(PEERS), str(FRAMES)], capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got, codes = proc.stdout.split()
    # Every message answered in protocol: too large, or over the in-flight budget (retry later).
    assert int(got) == PEERS * FRAMES, proc.stdout
    assert {c.split("=")[0] for c in codes.split(",")} <= {"too_large", "unavailable"}, codes


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_64_peers_of_maximum_size_frames_stay_under_the_memory_bound(server_factory):
    # No heartbeat timeout: the registered worker only talks between bursts, which under load outlast 30 s.
    srv = server_factory("--max-message-bytes", str(LIMIT), "--heartbeat-timeout", "0",
                         env={"MALLOC_MMAP_THRESHOLD_": "131072"})
    worker = srv.register("mem-bound")
    worker.pull()
    base = _mem(srv)["VmRSS"]
    _reset_peak(srv)
    _burst(srv, worker.id)
    bound = PEERS * socket_frame_cap(LIMIT) + 4 * LIMIT + SLACK
    peak = _mem(srv)["VmHWM"] - base
    assert peak <= bound, f"peak RSS +{peak / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB"
    # Each too-large frame is refused on the loop turn that receives it (issue 31: a request handled at once),
    # so it holds no in-flight bytes once answered; before, an answered request stayed counted until its task's
    # done callback a turn later, and those counts "overran" the 8 MiB budget. A refusal for the budget, if
    # any, is reported; the budget itself, with requests that wait: tests/unit/test_hot_path_equivalence.py.
    if srv.counter("hermes_limit_hits_total", limit="inflight_bytes") > 0:
        assert "in-flight memory budget hit" in srv.log_text()
    # Returned to the OS once the burst is over (frame buffers are their own mappings).
    wait_for(lambda: _mem(srv)["VmRSS"] - base < 32 * MiB, 10, "RSS to come back near its baseline")
    assert srv.healthz()["status"] == "ok"
    worker.pull()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_default_allocator_gets_each_bursts_memory_back(server_factory):
    # glibc's default keeps freed frame buffers in its arenas; the server trims them once a burst
    # is over, so every burst starts from the baseline and none takes the peak past the bound.
    srv = server_factory("--max-message-bytes", str(LIMIT), "--heartbeat-timeout", "0")  # as above
    worker = srv.register("mem-reuse")
    base = _mem(srv)["VmRSS"]
    bound = PEERS * socket_frame_cap(LIMIT) + 4 * LIMIT + SLACK
    for burst in range(1, 4):
        _reset_peak(srv)
        _burst(srv, worker.id)
        peak = _mem(srv)["VmHWM"] - base
        assert peak <= bound, f"burst {burst}: peak RSS +{peak / MiB:.0f} MiB over the bound {bound / MiB:.0f} MiB"
        wait_for(lambda: _mem(srv)["VmRSS"] - base < 32 * MiB, 15, f"RSS back near its baseline after burst {burst}")
    assert "flood over: gave" in srv.log_text()
    assert srv.healthz()["status"] == "ok"
    worker.pull()
