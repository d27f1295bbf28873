"""The agent's heartbeat decides when the server has lost it: on its word (401/404/410) or after a silence."""

from __future__ import annotations

from typing import Any

from hermes.client.heartbeat import Heartbeat
from hermes.client.transport import RemoteError, ServerUnreachable
from hermes.common.clock import ManualClock


class FakeControl:
    timeout = 1.0

    def __init__(self) -> None:
        self.answer: Any = {"status": "ok"}

    def heartbeat(self, worker_id: str, token: str) -> dict[str, Any]:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def _beat(clock: ManualClock) -> tuple[Heartbeat, FakeControl, list[str], list[dict]]:
    control, lost, replies = FakeControl(), [], []
    hb = Heartbeat(control, "w1", "tok", interval=5.0, on_lost=lost.append, on_reply=replies.append,
                   unreachable_after=30.0, clock=clock)
    return hb, control, lost, replies


def test_silence_counts_from_the_last_answer_on_the_injected_clock() -> None:
    clock = ManualClock()
    hb, control, lost, replies = _beat(clock)
    assert hb.beat() and hb.sent == 1 and replies == [{"status": "ok"}]
    control.answer = ServerUnreachable("down")
    clock.advance(29.0)
    assert hb.beat() and lost == []  # not yet 30 s of silence
    clock.advance(2.0)
    assert not hb.beat()
    assert lost == ["server unreachable for 31s"]


def test_an_answer_resets_the_silence() -> None:
    clock = ManualClock()
    hb, control, lost, _ = _beat(clock)
    control.answer = ServerUnreachable("down")
    clock.advance(25.0)
    assert hb.beat()
    control.answer = {"status": "ok"}
    assert hb.beat()
    control.answer = ServerUnreachable("down")
    clock.advance(25.0)
    assert hb.beat() and lost == []


def test_the_server_forgetting_us_is_lost_at_once_other_refusals_are_not() -> None:
    clock = ManualClock()
    hb, control, lost, _ = _beat(clock)
    control.answer = RemoteError("http_429", "slow down")
    assert hb.beat() and lost == []
    control.answer = RemoteError("http_404", "unknown worker")
    assert not hb.beat()
    assert len(lost) == 1 and "no longer knows worker w1" in lost[0]


def test_a_recent_data_plane_answer_stands_in_for_a_beat_and_an_old_one_does_not() -> None:
    clock = ManualClock()
    control, lost, asked = FakeControl(), [], []
    heard = {"recent": True}

    def heard_within(seconds: float) -> bool:
        asked.append(seconds)
        return heard["recent"]

    hb = Heartbeat(control, "w1", "tok", interval=5.0, on_lost=lost.append, clock=clock, heard_within=heard_within)
    # The server is down for the heartbeat, but a data-plane answer within the interval says it heard us.
    control.answer = ServerUnreachable("down")
    clock.advance(40.0)
    assert hb.tick() and (hb.sent, hb.skipped) == (0, 1) and asked == [5.0] and lost == []
    # Nothing answered lately: the beat goes out, and its silence counts from the last answer.
    heard["recent"] = False
    control.answer = {"status": "ok"}
    assert hb.tick() and (hb.sent, hb.skipped) == (1, 1)
    control.answer = ServerUnreachable("down")
    clock.advance(31.0)
    assert not hb.tick() and lost == ["server unreachable for 31s"]


def test_server_monitor_with_timeout_zero_marks_nobody_lost_and_still_ticks(monkeypatch) -> None:
    # --heartbeat-timeout 0 (never lost) used to stop the monitor, whose loop is also the engine's tick:
    # a barrier's deadline (bsp.deadline) then never released a round.
    import asyncio
    from types import SimpleNamespace

    from hermes.server import heartbeat

    periods: list[float] = []
    left: list[str] = []

    class Engine:
        registry = SimpleNamespace(all=lambda: [SimpleNamespace(id="w1", name="silent", state="active", last_seen=0.0)])
        clock = SimpleNamespace(time=lambda: 1e9)
        membership = SimpleNamespace(forget_unreturned=lambda *a: left.append("forgot"))
        ticks = 0

        async def leave(self, worker_id: str, reason: str, *, state: str) -> None:
            left.append(worker_id)

        async def tick(self) -> None:
            self.ticks += 1
            if self.ticks == 2:
                raise asyncio.CancelledError

    async def no_wait(period: float) -> None:
        periods.append(period)

    monkeypatch.setattr(heartbeat.asyncio, "sleep", no_wait)
    engine = Engine()
    monitor = heartbeat.HeartbeatMonitor(engine, 0.0)  # type: ignore[arg-type]

    async def run() -> None:
        monitor.start()
        assert monitor._task is not None
        try:
            await monitor._task
        except asyncio.CancelledError:
            pass

    asyncio.run(run())
    assert engine.ticks == 2 and periods == [1.0, 1.0]
    assert left == [] and monitor.lost == 0
