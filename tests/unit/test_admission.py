"""concurrency.limit (FedBuff's concurrency C, Nguyen et al. 2022 Alg. 1): at most C workers hold work at once."""

from __future__ import annotations

import asyncio
import statistics

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


def test_at_most_limit_workers_hold_work_and_a_push_passes_the_slot_on_in_order():
    adm = _admission(2)

    async def go():
        assert await adm.admit("a") and await adm.admit("b")
        c = asyncio.ensure_future(adm.admit("c"))
        d = asyncio.ensure_future(adm.admit("d"))
        assert await _pending(c) and await _pending(d)
        assert adm.status()["training"] == 2 and adm.status()["waiting"] == 2
        b_reply = asyncio.ensure_future(adm.next_turn("b"))  # b's push: its slot goes to c, its reply waits
        assert await c and await _pending(d) and await _pending(b_reply)
        assert adm.holders == {"a", "c"}
        a_reply = asyncio.ensure_future(adm.next_turn("a"))
        assert await d and await _pending(b_reply) and await _pending(a_reply)
        adm.release("c")  # c left: its slot goes to the longest waiting, b's reply
        assert await b_reply and await _pending(a_reply)
        assert adm.holders == {"b", "d"} and adm.peak == 2

    _run(go())


def test_a_holder_is_answered_at_once_and_keeps_its_slot_while_nobody_waits():
    adm = _admission(1)

    async def go():
        assert await adm.admit("a")
        assert await adm.admit("a")  # its prefetcher's request
        assert await adm.next_turn("a")  # its push: nobody waits, the reply goes at once
        b = asyncio.ensure_future(adm.admit("b"))
        assert await _pending(b)
        assert await adm.admit("a")  # a holder's request is never held
        reply = asyncio.ensure_future(adm.next_turn("a"))
        assert await b and await _pending(reply)
        assert adm.holders == {"b"}

    _run(go())


def test_a_gate_skipped_cycle_ends_the_turn_and_the_request_that_reported_it_waits():
    adm = _admission(1)

    async def go():
        assert await adm.admit("a")
        b = asyncio.ensure_future(adm.admit("b"))
        assert await _pending(b)
        adm.cycle_done("b")  # not a holder: nothing changes
        assert await _pending(b)
        adm.cycle_done("a")
        assert await b
        again = asyncio.ensure_future(adm.admit("a"))
        assert await _pending(again)

    _run(go())


def test_with_turns_ending_at_a_push_a_gate_skipped_cycle_keeps_the_slot():
    adm = Admission(1, Telemetry(ServerMetrics(), EventLog(None)), skipped_ends_turn=False)

    async def go():
        assert await adm.admit("a")
        b = asyncio.ensure_future(adm.admit("b"))
        adm.cycle_done("a")  # concurrency.turn_ends=push: a skipped cycle is not the end of a's turn
        assert await _pending(b)
        assert await adm.admit("a")  # a's next work request: still a holder
        reply = asyncio.ensure_future(adm.next_turn("a"))  # its push ends the turn
        assert await b and await _pending(reply)

    _run(go())
    assert build_config("fedbuff").concurrency.turn_ends == "cycle"


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
        # a's push is folded (K = 1) and b gets the slot; a's reply waits for a's next turn.
        a_push = asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": 1, "pull": True},
                                                 payload=a.delta(0.5), model_version=0))
        assert (await asyncio.wait_for(waiting, 5)).header.type is MsgType.WORK
        assert await _pending(a_push)
        assert engine.state.version == 1
        # b pushes: its turn ends, a's reply goes out with the model as it is now (version 2).
        b_push = asyncio.ensure_future(b.request(MsgType.PUSH_UPDATE, {"samples": 1, "pull": True},
                                                 payload=b.delta(0.5), model_version=0))
        reply = await asyncio.wait_for(a_push, 5)
        assert reply.header.type is MsgType.PUSH_REPLY and reply.header.model_version == 2
        assert reply.header.body["model"] == "included" and await _pending(b_push)
        await engine.leave(a.rec.id, "test")  # a leaves: b's reply gets the slot
        assert (await asyncio.wait_for(b_push, 5)).header.type is MsgType.PUSH_REPLY
        assert engine.admission.holders == {b.rec.id}

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


def test_a_pull_held_for_a_slot_is_answered_with_the_stop_and_no_model(clock):
    # 100,000 simulated devices: the stop released 80,000 held pulls, and each carried a model nobody would train.
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        held = asyncio.ensure_future(b.request(MsgType.PULL_MODEL, {}))
        assert await _pending(held)
        engine.request_stop("operator request")
        return await asyncio.wait_for(held, 5)

    reply = _run(go())
    assert reply.header.type is MsgType.MODEL and reply.header.body == {"unchanged": True, "stop": True}
    assert reply.payload is None


@pytest.mark.parametrize("waits_with", [MsgType.REQUEST_WORK, MsgType.PULL_MODEL])
def test_a_worker_lost_while_it_waits_is_told_to_register_again(clock, waits_with):
    # A held work request, or a registration's pull held for a slot (concurrency.hold_pull).
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        held = asyncio.ensure_future(b.request(waits_with, {}))
        assert await _pending(held)
        await engine.leave(b.rec.id, "silent", state="lost")
        with pytest.raises(ProtocolError) as exc:
            await asyncio.wait_for(held, 5)
        assert exc.value.code is ErrorCode.UNKNOWN_WORKER

    _run(go())


def test_a_pull_without_a_slot_waits_for_the_turn_and_brings_the_model_current_then(clock):
    # A registration's pull answered at once had a waiting device train its first turn from version 0.
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1, "fedbuff.buffer_size": 1})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        assert (await a.request(MsgType.PULL_MODEL, {})).header.model_version == 0  # a holder: at once
        pull = asyncio.ensure_future(b.request(MsgType.PULL_MODEL, {}))
        assert await _pending(pull), "b got the model while a held the only slot"
        a_push = asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": 1, "pull": True},
                                                 payload=a.delta(0.5), model_version=0))
        got = await asyncio.wait_for(pull, 5)
        assert got.header.type is MsgType.MODEL and got.header.model_version == 1  # the model after a's push
        assert engine.admission.holders == {b.rec.id} and await _pending(a_push)
        assert (await b.request(MsgType.REQUEST_WORK, {})).header.type is MsgType.WORK  # its turn: at once

    _run(go())


def test_without_hold_pull_a_registration_pull_is_answered_at_once(clock):
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1, "concurrency.hold_pull": False})
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        await a.request(MsgType.REQUEST_WORK, {})
        model = await asyncio.wait_for(b.request(MsgType.PULL_MODEL, {}), 5)
        assert model.header.type is MsgType.MODEL and engine.admission.holders == {a.rec.id}

    _run(go())


def _fast_admission(limit: int, explore: float = 0.0) -> Admission:
    return Admission(limit, Telemetry(ServerMetrics(), EventLog(None)), admit="fastest", explore=explore)


def _cycle(adm: Admission, worker: str, dss: int, seconds: float) -> None:
    adm.listener("cycle", {"worker": worker, "dss": dss, "batch_size": 32, "compute_seconds": seconds})


def test_admit_fastest_gives_a_freed_slot_to_the_fastest_waiting_worker_not_the_oldest():
    adm = _fast_admission(1)
    for worker, seconds in (("slow", 8.0), ("mid", 2.0), ("fast", 0.5)):
        _cycle(adm, worker, 512, seconds)
    assert adm.speed("fast") == 1024.0 and adm.speed("slow") == 64.0 and adm.speed("new") is None

    async def go():
        assert await adm.admit("a")
        slow = asyncio.ensure_future(adm.admit("slow"))  # waits first
        mid = asyncio.ensure_future(adm.admit("mid"))
        fast = asyncio.ensure_future(adm.admit("fast"))
        assert await _pending(slow) and await _pending(mid) and await _pending(fast)
        adm.release("a")
        assert await fast and await _pending(slow) and await _pending(mid)
        adm.release("fast")
        assert await mid and await _pending(slow)
        adm.release("mid")
        assert await slow

    _run(go())


def test_admit_fifo_keeps_the_oldest_first_whatever_the_speeds():
    adm = Admission(1, Telemetry(ServerMetrics(), EventLog(None)))
    _cycle(adm, "fast", 512, 0.5)
    _cycle(adm, "slow", 512, 8.0)
    assert adm.speed("fast") is None  # fifo keeps no speeds

    async def go():
        assert await adm.admit("a")
        slow = asyncio.ensure_future(adm.admit("slow"))
        fast = asyncio.ensure_future(adm.admit("fast"))
        assert await _pending(slow) and await _pending(fast)
        adm.release("a")
        assert await slow and await _pending(fast)

    _run(go())


def test_admit_fastest_tries_untried_workers_within_the_exploration_share_and_never_leaves_a_slot_idle():
    adm = _fast_admission(4, explore=0.25)  # one slot for untried workers
    _cycle(adm, "k1", 512, 1.0)
    _cycle(adm, "k2", 512, 4.0)

    async def go():
        for w in ("a", "b", "c", "d"):
            _cycle(adm, w, 512, 1.0)
            assert await adm.admit(w)
        waits = {w: asyncio.ensure_future(adm.admit(w)) for w in ("n1", "k2", "n2", "k1")}
        for f in waits.values():
            assert await _pending(f)
        adm.release("a")  # no untried holder: the oldest untried goes first
        assert await waits["n1"] and adm.holders == {"b", "c", "d", "n1"}
        adm.release("b")  # n1 fills the exploration share: the fastest known
        assert await waits["k1"] and await _pending(waits["n2"]) and await _pending(waits["k2"])
        adm.release("c")
        assert await waits["k2"] and await _pending(waits["n2"])
        adm.release("d")  # only an untried one waits: it takes the slot beyond the share rather than leave it idle
        assert await waits["n2"] and adm.holders == {"n1", "k1", "k2", "n2"}
        # a cycle's median speed over the last 5 reports: one slow outlier does not reorder
        for s in (1.0, 1.0, 9.0):
            _cycle(adm, "k1", 512, s)
        assert adm.speed("k1") == 512.0

    _run(go())


def test_the_config_takes_admit_fastest_and_refuses_an_unknown_order():
    cfg = build_config("fedbuff", **{"concurrency.limit": 5, "concurrency.admit": "fastest",
                                     "concurrency.explore": 0.2})
    assert cfg.concurrency.admit == "fastest" and cfg.concurrency.explore == 0.2
    assert build_config("fedbuff").concurrency.admit == "fifo"
    with pytest.raises(ValueError):
        build_config("fedbuff", **{"concurrency.limit": 5, "concurrency.admit": "random"})


def test_admit_quickest_ranks_by_the_turn_the_server_timed_not_the_compute_claimed(clock):
    # a claims 4 s of compute but its turn, grant to push, took 1 s; b claims 0.5 s but its turn took 4 s (a slow
    # link): "quickest" (Oort's round duration) times a at 512 samples/s and b at 128, where "fastest" would
    # rank b 8x above a.
    adm = Admission(2, Telemetry(ServerMetrics(), EventLog(None)), admit="quickest", explore=0.0,
                    clock=clock.monotonic)

    async def go():
        assert await adm.admit("a") and await adm.admit("b")
        w = asyncio.ensure_future(adm.admit("w"))
        assert await _pending(w)
        clock.advance(1.0)
        _cycle(adm, "a", 512, 4.0)
        # untried b holds the one exploration slot and only untried w waits: a keeps its slot, replied at once
        assert await adm.next_turn("a") and adm.speed("a") == 512.0 and await _pending(w)
        clock.advance(3.0)
        _cycle(adm, "b", 512, 0.5)
        b_reply = asyncio.ensure_future(adm.next_turn("b"))  # no untried holder now: w is due its try
        assert await w and await _pending(b_reply)
        assert adm.speed("b") == 128.0 and adm.holders == {"a", "w"}
        clock.advance(0.5)  # a's turn is timed from its last push (it kept the slot): 256 samples in 3.5 s
        _cycle(adm, "a", 256, 4.0)
        assert await adm.next_turn("a") and await _pending(b_reply)  # a (median 292.6) beats b (128)
        assert adm.speed("a") == statistics.median([512.0, 256 / 3.5])

    _run(go())


def test_admit_fastest_a_pusher_keeps_its_slot_unless_a_faster_worker_waits():
    adm = _fast_admission(1)
    _cycle(adm, "a", 1000, 1.0)
    _cycle(adm, "slow", 100, 1.0)
    _cycle(adm, "quick", 5000, 1.0)

    async def go():
        assert await adm.admit("a")
        slow = asyncio.ensure_future(adm.admit("slow"))
        assert await _pending(slow)
        assert await adm.next_turn("a")  # a is faster than everyone waiting: its reply goes at once
        quick = asyncio.ensure_future(adm.admit("quick"))
        assert await _pending(quick)
        a_reply = asyncio.ensure_future(adm.next_turn("a"))  # quick is faster: the slot goes to it, a waits
        assert await quick and await _pending(a_reply) and await _pending(slow)
        assert adm.holders == {"quick"}

    _run(go())


def test_admit_quickest_without_a_clock_is_refused():
    with pytest.raises(ValueError, match="needs a clock"):
        Admission(2, Telemetry(ServerMetrics(), EventLog(None)), admit="quickest")
