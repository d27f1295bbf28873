"""A flood of unauthenticated garbage on the data port cannot starve the control plane."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import httpx
import pytest

pytestmark = pytest.mark.integration

# One process sending garbage as fast as it can, bounded in count and time (it stops by itself).
_FLOODER = textwrap.dedent("""
    import random, sys, time, zmq
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 100000)
    sock.connect(sys.argv[1])
    rng = random.Random(0)
    junk = [b"\\xc1" + rng.randbytes(rng.randrange(0, 200)) for _ in range(256)]
    end, sent = time.monotonic() + float(sys.argv[2]), 0
    while sent < 300_000 and time.monotonic() < end:
        try:
            sock.send(junk[sent % 256], zmq.NOBLOCK)
            sent += 1
        except zmq.Again:
            time.sleep(0.001)
        while sock.poll(0):  # drain what the server answers
            sock.recv_multipart()
    print(sent)
""")


@pytest.fixture(scope="module")
def worker(live_server):
    return live_server.register("honest")


def test_healthz_answers_within_a_second_under_a_garbage_flood(live_server, worker):
    before = live_server.error_count("malformed")
    flooder = subprocess.Popen([sys.executable, "-c", _FLOODER, live_server.data_address, "8"],
                               stdout=subprocess.PIPE, text=True)
    worst, polls = 0.0, 0
    try:
        with httpx.Client(timeout=5.0) as http:
            while flooder.poll() is None:
                t0 = time.monotonic()
                assert http.get(live_server.url + "/healthz").status_code == 200
                worst = max(worst, time.monotonic() - t0)
                polls += 1
                time.sleep(0.05)
        sent = int(flooder.communicate(timeout=10)[0])
    finally:
        if flooder.poll() is None:
            flooder.kill()
    assert sent > 10_000, sent  # a flood, not a trickle
    assert polls >= 20, polls
    assert worst < 1.0, f"/healthz took {worst:.2f}s during a flood of {sent} messages"
    # The server really read the flood (what it had not read when the flooder quit died with its
    # socket): counted, mostly without a reply once the error-reply budget ran out.
    assert live_server.error_count("malformed") - before > 10_000
    assert live_server.counter("hermes_limit_hits_total", limit="error_replies") > 0
    worker.pull()
