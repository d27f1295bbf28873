"""BSP on a real server: the barrier holds replies, aggregates by samples, and survives leaves."""

from __future__ import annotations

import threading

import pytest
import torch

from hermes.common.wire import ErrorCode, MsgType
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

# Waits that only fail on a hang (issue 32).
HANG_S = 120.0


@pytest.fixture(scope="module")
def bsp_server(server_factory):
    # Plain BSP: these tests hold a round open between pushes; the deadline (1 s floor) is test_trust_screen's.
    return server_factory("--preset", "bsp", "--set", "bsp.deadline=false")


def _push_async(worker, delta, *, base, samples, timeout=HANG_S):
    """Push from a thread; returns (thread, result dict) — the reply lands in result['msg']."""
    result: dict = {}

    def run():
        frames = worker.frames(MsgType.PUSH_UPDATE, delta, model_version=base, shapes=worker.shapes,
                               body={"samples": samples})
        try:
            result["msg"] = worker.server.exchange(frames, timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - surfaced by the test
            result["exc"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, result


def _leave(server, worker):
    r = server.http.post(f"{server.url}/v1/workers/{worker.id}/leave", headers={"X-Hermes-Token": worker.token})
    assert r.status_code == 200, r.text


def test_barrier_waits_for_every_active_worker_and_weights_by_samples(bsp_server):
    a, b = bsp_server.register("bsp-a"), bsp_server.register("bsp-b")
    v0, m0 = a.pull()
    # Honest-sized steps (screening is on), powers of two: the fold below is exact.
    da = torch.full((a.numel,), 2.0 ** -8)
    db = torch.full((a.numel,), -(2.0 ** -9))

    ta, ra = _push_async(a, da, base=v0, samples=32)
    # Received (counted) before b pushes: the fold order below is a's first. That the barrier held is
    # proven by the one version below; no sleep gives the push time to arrive (issue 32).
    wait_for(lambda: bsp_server.workers()[a.id]["pushes"] == 1, HANG_S, "a's push to reach the server")
    assert ta.is_alive(), "a's push was answered before b pushed: the barrier did not hold"
    assert bsp_server.healthz()["model_version"] == v0

    tb, rb = _push_async(b, db, base=v0, samples=96)
    ta.join(timeout=HANG_S)
    tb.join(timeout=HANG_S)
    for r in (ra, rb):
        assert "exc" not in r, r.get("exc")
        msg = r["msg"]
        assert msg.header.type is MsgType.PUSH_REPLY and msg.header.body["status"] == "applied", msg.header.body
        assert msg.header.model_version == v0 + 1

    v1, m1 = a.pull()
    assert v1 == v0 + 1, "one barrier is one version"
    # samples aggregation: 32/128 and 96/128, folded in arrival order (a first).
    expected = m0.clone().add_(da, alpha=0.25).add_(db, alpha=0.75)
    assert torch.equal(m1, expected)
    workers = bsp_server.workers()
    assert workers[a.id]["applied"] == workers[b.id]["applied"] == 1
    _leave(bsp_server, a)
    _leave(bsp_server, b)


def test_leave_releases_the_barrier_and_double_push_is_rejected(bsp_server):
    a, b = bsp_server.register("bsp-c"), bsp_server.register("bsp-d")
    v0, m0 = a.pull()
    d = torch.full((a.numel,), 2.0 ** -9)
    ta, ra = _push_async(a, d, base=v0, samples=10)
    wait_for(lambda: bsp_server.workers()[a.id]["pushes"] == 1, HANG_S, "a's push to reach the server")
    assert ta.is_alive()

    # A second push from a in the same round is refused at once (a held reply stays held).
    again = a.push(d, base_version=v0, samples=10)
    assert again.header.type is MsgType.PUSH_REPLY
    assert again.header.body["status"] == "rejected" and "already" in again.header.body["reason"]
    assert ta.is_alive()

    _leave(bsp_server, b)  # the straggler goes away: the barrier completes without it
    ta.join(timeout=HANG_S)
    assert not ta.is_alive() and "exc" not in ra, ra
    assert ra["msg"].header.body["status"] == "applied"
    v1, m1 = a.pull()
    assert v1 == v0 + 1 and torch.equal(m1, m0 + d)
    rec = bsp_server.workers()[a.id]
    assert (rec["pushes"], rec["applied"], rec["rejected"]) == (2, 1, 1)

    # The worker that left can no longer use the data plane.
    msg = bsp_server.exchange(b.frames(MsgType.PULL_MODEL, body={}))
    assert msg.header.type is MsgType.ERROR and msg.header.body["code"] == ErrorCode.UNAUTHORIZED.value
    _leave(bsp_server, a)
    assert bsp_server.error_count(ErrorCode.INTERNAL.value) == 0
