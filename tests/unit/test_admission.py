"""concurrency.limit (FedBuff's concurrency C, Nguyen et al. 2022 Alg. 1): at most C workers hold work at once."""

from __future__ import annotations

import asyncio

import pytest

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.wire import ErrorCode, MsgType, ProtocolError
from hermes.server.engine.admission import Admission
from hermes.server.engine.telemetry import Telemetry
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from tests.unit.test_engine_inprocess import _Agent, _engine, _pending, _run


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _admission(limit: int) -> Admission:
    return Admission(limit, Telemetry(ServerMetrics(), EventLog(None)))


def test_at_most_limit_workers_hold_work_and_a_finished_cycle_passes_the_slot_on_in_order():
    adm = _admission(2)

    async def go():
        assert await adm.admit("a") and await adm.admit("b")
        c = asyncio.ensure_future(adm.admit("c"))
        d = asyncio.ensure_future(adm.admit("d"))
        assert await _pending(c) and await _pending(d)
        assert adm.status()["training"] == 2 and adm.status()["waiting"] == 2
        adm.cycle_done("b")  # b's push: its slot goes to the longest waiting, c
        assert await c and await _pending(d)
        assert adm.holders == {"a", "c"}
        b_again = asyncio.ensure_future(adm.admit("b"))  # b waits its turn behind d
        adm.cycle_done("a")
        assert await d and await _pending(b_again)
        adm.release("c")  # c left: its slot goes to b
        assert await b_again
        assert adm.holders == {"b", "d"}

    _run(go())


def test_a_holders_prefetch_is_answered_at_once_while_nobody_waits_and_held_for_its_report_otherwise():
    adm = _admission(1)

    async def go():
        assert await adm.admit("a")
        assert await adm.admit("a")  # nobody waits: the prefetcher's request is answered
        b = asyncio.ensure_future(adm.admit("b"))
        prefetch = asyncio.ensure_future(adm.admit("a"))
        assert await _pending(b) and await _pending(prefetch)
        adm.cycle_done("a")  # a's cycle is in: b trains, a's request waits behind b
        assert await b and await _pending(prefetch)
        adm.cycle_done("b")
        assert await prefetch
        assert adm.holders == {"a"}

    _run(go())


def test_a_heartbeat_ends_the_turn_of_a_holder_whose_skipped_cycle_rides_on_its_held_request():
    adm = _admission(1)

    async def go():
        assert await adm.admit("a")
        b = asyncio.ensure_future(adm.admit("b"))
        held = asyncio.ensure_future(adm.admit("a"))
        assert await _pending(held)
        adm.heartbeat("b")  # a waiting worker's heartbeat changes nothing
        assert await _pending(b)
        adm.heartbeat("a")
        assert await b and await _pending(held)

    _run(go())


def test_a_worker_that_registers_again_or_leaves_while_waiting_is_answered_gone_and_a_stop_answers_everyone():
    adm = _admission(1)

    async def go():
        assert await adm.admit("a")
        b = asyncio.ensure_future(adm.admit("b"))
        c = asyncio.ensure_future(adm.admit("c"))
        assert await _pending(b)
        adm.listener("join", {"worker": "b"})  # b registered again: its old session's request is void
        assert (await b) is False
        adm.open_all("stop")
        assert await c
        assert await adm.admit("z")  # open for good

    _run(go())


def test_limit_zero_admits_everyone():
    adm = _admission(0)
    assert all(_run(adm.admit(w)) for w in "abcdefgh")
    assert adm.holders == set()


def test_the_config_refuses_a_limit_under_a_sync_that_waits_for_every_member():
    assert build_config("fedbuff", **{"concurrency.limit": 100}).concurrency.limit == 100
    assert build_config("hermes", **{"concurrency.limit": 100}).concurrency.limit == 100
    assert build_config("bsp").concurrency.limit == 0
    for preset in ("bsp", "ssp"):
        with pytest.raises(ValueError, match="concurrency.limit keeps workers beyond the limit idle"):
            build_config(preset, **{"concurrency.limit": 10})
    with pytest.raises(ValueError):
        build_config("fedbuff", **{"concurrency.limit": -1})


def test_the_engine_holds_a_work_request_beyond_the_limit_until_a_push_frees_a_slot(clock):
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1, "fedbuff.buffer_size": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        first = await a.request(MsgType.REQUEST_WORK, {})
        assert first.header.type is MsgType.WORK
        waiting = asyncio.ensure_future(b.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(waiting), "b got work while a held the only slot"
        await a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=a.delta(0.0), model_version=0)
        reply = await asyncio.wait_for(waiting, 5)
        assert reply.header.type is MsgType.WORK
        # a asks again: b holds the slot now, so a waits, and b's leave hands the slot back.
        again = asyncio.ensure_future(a.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(again)
        await engine.leave(b.rec.id, "test")
        assert (await asyncio.wait_for(again, 5)).header.type is MsgType.WORK
        assert engine.admission.holders == {a.rec.id}

    _run(go())


def test_a_request_held_for_a_slot_is_answered_with_the_stop(clock):
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        held = asyncio.ensure_future(b.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(held)
        engine.request_stop("operator request")
        return await asyncio.wait_for(held, 5)

    assert _run(go()).header.body["stop"] is True


def test_a_worker_lost_while_it_waits_is_told_to_register_again(clock):
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        held = asyncio.ensure_future(b.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(held)
        await engine.leave(b.rec.id, "silent", state="lost")
        with pytest.raises(ProtocolError) as exc:
            await asyncio.wait_for(held, 5)
        assert exc.value.code is ErrorCode.UNKNOWN_WORKER

    _run(go())
