"""The server's console: quiet access lines, progress lines, what a barrier waits for."""

from __future__ import annotations

import asyncio
import logging

import pytest

from hermes.common.clock import ManualClock
from hermes.common.wire import MsgType
from hermes.server.console import Progress, QuietAccess, barrier_text, configure_logging, quiet_access_log
from tests.unit.test_engine_inprocess import _Agent, _engine


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _access(method: str, path: str, status: int) -> logging.LogRecord:
    # The shape of uvicorn's access record: (client, method, path, http version, status).
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, '%s - "%s %s HTTP/%s" %d',
                             ("127.0.0.1:5000", method, path, "1.1", status), None)


@pytest.mark.parametrize("method, path, status, kept", [
    ("POST", "/v1/workers/w0001/heartbeat", 200, False),
    ("GET", "/v1/status", 200, False),
    ("GET", "/v1/history?since=3", 200, False),
    ("GET", "/healthz", 200, False),
    ("GET", "/metrics", 200, False),
    ("GET", "/ui/app.js", 200, False),
    # What an operator wants to see: joins, leaves, stops, and every failure, heartbeats included.
    ("POST", "/v1/workers/register", 200, True),
    ("POST", "/v1/workers/w0001/leave", 200, True),
    ("POST", "/v1/stop", 200, True),
    ("POST", "/v1/workers/w0001/heartbeat", 410, True),
    ("GET", "/v1/status", 401, True),
])
def test_quiet_access_drops_only_successful_polls(method, path, status, kept):
    assert QuietAccess().filter(_access(method, path, status)) is kept


def test_quiet_access_log_is_installed_once_and_removed_by_access_log():
    access = logging.getLogger("uvicorn.access")
    try:
        quiet_access_log(True)
        quiet_access_log(True)
        assert sum(isinstance(f, QuietAccess) for f in access.filters) == 1
        quiet_access_log(False)  # --access-log: every line
        assert not any(isinstance(f, QuietAccess) for f in access.filters)
    finally:
        quiet_access_log(False)


def test_configure_logging_leaves_a_configured_root_alone():
    root = logging.getLogger()
    assert root.handlers  # pytest's capture handler
    assert configure_logging("debug") is False


def test_progress_line_names_version_workers_rate_and_the_barrier(clock):
    engine = _engine(clock, preset="bsp")
    a, b, c = (_Agent(engine, clock, n) for n in ("alpha", "bravo", "charlie"))
    progress = Progress(engine, interval=1.0)
    first = progress.line(now=100.0)
    assert first.startswith("progress v0 not evaluated yet | 3/3 workers active")
    assert "samples/s" not in first and "barrier" not in first
    assert barrier_text(engine) is None

    async def go():
        held = [asyncio.ensure_future(w.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=w.delta(1.0)))
                for w in (a, b)]
        for _ in range(100):
            if len(engine.held) == 2:
                break
            await asyncio.sleep(0.01)
        a.rec.samples, b.rec.samples = 300, 100
        line = progress.line(now=102.0)
        await c.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=c.delta(1.0))
        await asyncio.gather(*held)
        return line

    line = asyncio.run(go())
    # Two of three arrived: the barrier waits for charlie, by name; 400 samples in 2 s.
    assert "barrier v0 waiting for charlie (2/3)" in line, line
    assert "200 samples/s" in line, line
    assert barrier_text(engine) is None and engine.state.version == 1
    ev = engine.evaluator.evaluate_now()
    after = progress.line(now=103.0)
    assert after.startswith(f"progress v1 accuracy {ev.accuracy:.4f} loss {ev.loss:.4f} | 3/3 workers active")
    assert "0 samples/s" in after  # nothing trained since the last line
