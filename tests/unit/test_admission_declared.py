"""concurrency.explore_order "declared": the exploration share tries the untried worker declaring the most compute."""

from __future__ import annotations

import asyncio

import pytest

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.server.engine.admission import Admission
from hermes.server.engine.telemetry import Telemetry
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from tests.unit.test_admission import _cycle
from tests.unit.test_engine_inprocess import _engine, _pending, _run

DECLARED = {"slow": 1e9, "fast": 6e9, "mid": 3e9, "twin": 6e9}


def _admission(limit: int, explore: float, declared: dict[str, float] | None) -> Admission:
    return Admission(limit, Telemetry(ServerMetrics(), EventLog(None)), admit="fastest", explore=explore,
                     declared=None if declared is None else declared.get)


def _order(declared: dict[str, float] | None) -> list[str]:
    """The order in which four untried waiters get a single slot freed four times."""
    adm = _admission(1, 1.0, declared)
    got: list[str] = []

    async def go():
        assert await adm.admit("a")
        waits = {w: asyncio.ensure_future(adm.admit(w)) for w in ("slow", "undeclared", "fast", "mid", "twin")}
        for f in waits.values():
            assert await _pending(f)
        holder = "a"
        for _ in range(5):
            adm.release(holder)
            for _ in range(3):  # the admitted waiter's task resumes
                await asyncio.sleep(0)
            done = [w for w, f in waits.items() if f.done() and w not in got]
            assert len(done) == 1, done
            holder = done[0]
            got.append(holder)

    _run(go())
    return got


def test_declared_order_tries_the_most_capable_untried_worker_first_oldest_of_equals_undeclared_last():
    assert _order(DECLARED) == ["fast", "twin", "mid", "slow", "undeclared"]
    # arrival (the default): the longest-waiting first, whatever they declared
    assert _order(None) == ["slow", "undeclared", "fast", "mid", "twin"]


def test_declared_order_still_keeps_the_exploration_share_and_ranks_tried_workers_by_observed_speed():
    adm = _admission(2, 0.5, DECLARED)  # one slot for untried workers
    _cycle(adm, "k1", 512, 1.0)
    _cycle(adm, "k2", 512, 4.0)

    async def go():
        assert await adm.admit("a") and await adm.admit("b")
        _cycle(adm, "a", 512, 1.0)
        _cycle(adm, "b", 512, 1.0)
        waits = {w: asyncio.ensure_future(adm.admit(w)) for w in ("k2", "slow", "fast", "k1")}
        for f in waits.values():
            assert await _pending(f)
        adm.release("a")  # no untried holder: the untried worker declaring the most
        assert await waits["fast"] and await _pending(waits["slow"])
        adm.release("b")  # fast fills the exploration share: the fastest observed, not a declared one
        assert await waits["k1"] and await _pending(waits["slow"]) and await _pending(waits["k2"])

    _run(go())


def test_the_engine_reads_the_capacity_each_worker_declared_when_asked_for_declared_order():
    clock = ManualClock()
    engine = _engine(clock, preset="fedbuff", **{"concurrency.limit": 1, "concurrency.admit": "fastest",
                                                 "concurrency.explore_order": "declared"})
    rec, _ = engine.register("w", hints={"flops": 2.5e9})
    bare, _ = engine.register("bare")
    assert engine.admission.declared is not None
    assert engine.admission.declared(rec.id) == 2.5e9 and engine.admission.declared(bare.id) is None
    assert engine.admission.declared("never-registered") is None
    assert _engine(clock, preset="fedbuff", **{"concurrency.limit": 1}).admission.declared is None


def test_the_config_takes_explore_order_and_refuses_an_unknown_one():
    assert build_config("fedbuff").concurrency.explore_order == "arrival"
    cfg = build_config("hermes", **{"concurrency.limit": 4, "concurrency.explore_order": "declared"})
    assert cfg.concurrency.explore_order == "declared"
    with pytest.raises(ValueError):
        build_config("hermes", **{"concurrency.limit": 4, "concurrency.explore_order": "fastest"})
