"""The engine in-process: injected data, model and clock; signed frames in, reply frames out.

No sockets, no subprocess, no dataset download: each test builds an Engine
on a few hundred random samples and drives ``Engine.handle`` the way the
data plane does.
"""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import pytest
import torch

from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.datasets import ArrayDataset
from hermes.common.models import build_model
from hermes.common.task import Task
from hermes.common.wire import ErrorCode, Header, MsgType, ProtocolError, decode, encode
from hermes.server.engine import Engine
from hermes.server.engine.screening import ScreeningSettings
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics

SHARD = 16


def _split(name: str, n: int, seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(rng.standard_normal((n, 8)).astype(np.float32))
    return ArrayDataset(name, x, rng.integers(0, 3, n).astype(np.int64), num_classes=3)


def _engine(clock: ManualClock, *, out_dir: str | None = None, screening: ScreeningSettings | None = None,
            **overrides) -> Engine:
    config = build_config(overrides.pop("preset", "asp"), model="mlp", shard_size=SHARD, eval_max_samples=32,
                          **overrides)
    splits = (_split("toy", 128, 0), _split("toy-validation", 64, 1), _split("toy-test", 32, 2))
    # Screening off: these pushes are synthetic constant deltas that check the
    # fold's arithmetic; the screening's own tests use realistic ones.
    return Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=8,
                  max_message_bytes=1 << 24, splits=splits, clock=clock, out_dir=out_dir,
                  screening=screening or ScreeningSettings(enabled=False),
                  task=Task(model=lambda: build_model("mlp", input_shape=(8,), num_classes=3), name="toy"))


class _Agent:
    """Just enough of an agent: signs requests with the worker's key and reads the reply."""

    _sessions = itertools.count()

    def __init__(self, engine: Engine, clock: ManualClock, name: str) -> None:
        self.engine, self.clock = engine, clock
        self.rec, _ = engine.register(name)
        self.session = f"s{next(self._sessions)}"
        self.seq = 0

    def frames(self, type_: MsgType, body: dict, *, payload: torch.Tensor | None = None,
               model_version: int = 0) -> list:
        self.seq += 1
        header = Header(type=type_, worker=self.rec.id, session=self.session, seq=self.seq,
                        ts=int(self.clock.time() * 1000), model_version=model_version, body=body,
                        shapes=self.engine.spec.shapes if payload is not None else ())
        return encode(header, payload, key=self.rec.key)

    async def request(self, type_: MsgType, body: dict, **kw):
        reply = await self.engine.handle(self.frames(type_, body, **kw))
        return decode(reply)

    def delta(self, value: float) -> torch.Tensor:
        return torch.full((self.engine.spec.numel,), value, dtype=torch.float32)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


def _run(coro):
    return asyncio.run(coro)


def test_push_is_folded_and_pull_serves_the_new_model(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    _, before = engine.state.snapshot()

    async def go():
        reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "loss": 0.5},
                                    payload=agent.delta(0.25))
        assert reply.header.type is MsgType.PUSH_REPLY
        assert reply.header.body["status"] == "applied" and reply.header.body["staleness"] == 0
        pulled = await agent.request(MsgType.PULL_MODEL, {"dtype": "float32"})
        unchanged = await agent.request(MsgType.PULL_MODEL, {"if_newer": True}, model_version=1)
        return pulled, unchanged

    pulled, unchanged = _run(go())
    assert engine.state.version == 1 and agent.rec.applied == 1
    # asp with mean aggregation: one update of weight 1.
    assert torch.allclose(pulled.payload.flat(), before + 0.25)
    assert pulled.header.model_version == 1 and pulled.header.body["unchanged"] is False
    assert unchanged.payload is None and unchanged.header.body["unchanged"] is True
    assert engine.message_counts == {"push_update": 1, "pull_model": 2}


@pytest.mark.parametrize("topology", ["ps", "collective"])
def test_rank_0s_model_copies_are_folded_exactly_under_the_collective_topology(clock, topology):
    # The same pushes: three small ones, then one 6x their norm. Screened as one worker's update (ps) the
    # large one is clipped; under the collective topology it is a copy of the group's model and must land
    # whole, or the server's model parts from the group's for good.
    extra = {"collective": {"world_size": 1}} if topology == "collective" else {}
    engine = _engine(clock, preset="task-allocation", topology=topology,
                     screening=ScreeningSettings(min_history=3), **extra)
    agent = _Agent(engine, clock, "a")
    _, before = engine.state.snapshot()

    async def go():
        for version, value in enumerate([0.01, 0.01, 0.01, 0.06]):
            reply = await agent.request(MsgType.PUSH_UPDATE, {"samples": 4, "loss": 0.5},
                                        payload=agent.delta(value), model_version=version)
            assert reply.header.body["status"] == "applied", reply.header.body

    _run(go())
    _, after = engine.state.snapshot()
    moved = float((after - before).mean())
    assert engine.screening.settings.enabled is (topology == "ps")
    if topology == "collective":
        assert moved == pytest.approx(0.09, rel=1e-5)
    else:
        assert moved < 0.085


def test_request_work_assigns_shards_of_the_workload(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    reply = _run(agent.request(MsgType.REQUEST_WORK, {}))
    assert reply.header.type is MsgType.WORK
    body = reply.header.body
    wl = engine.allocator.workload(agent.rec.id)
    assert (body["batch_size"], body["cycle_samples"], body["accumulation"]) == (wl.batch_size, wl.dss, wl.accumulation)
    assert len(body["shards"]) == math.ceil(wl.dss / SHARD) and body["source"] == "zmq"
    assert body["lr"] == engine.config.lr and body["stop"] is False
    assert engine.membership.outstanding[agent.rec.id] == [tuple(body["shards"])]


def test_bsp_barrier_holds_the_first_reply_until_the_second_push(clock):
    engine = _engine(clock, preset="bsp")
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")
    _, before = engine.state.snapshot()

    async def go():
        first = asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=a.delta(1.0)))
        await asyncio.sleep(0.05)
        assert not first.done(), "the barrier released before the second worker pushed"
        assert engine.state.version == 0 and list(engine.held) == [a.rec.id]
        second = await b.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=b.delta(3.0))
        return await asyncio.wait_for(first, 5), second

    first, second = _run(go())
    assert first.header.body["status"] == second.header.body["status"] == "applied"
    # One step from both updates, mean aggregation: (1 + 3) / 2.
    assert engine.state.version == 1 and not engine.held
    _, after = engine.state.snapshot()
    assert torch.allclose(after, before + 2.0)


@pytest.mark.parametrize("body, field", [
    ({"samples": 0}, "samples"),
    ({"samples": True}, "samples"),
    ({"samples": 2, "loss": math.nan}, "loss"),
    ({"samples": 2, "cycle": {"dss": 0, "mbs": 4}}, "cycle.dss"),
])
def test_a_bad_push_body_is_refused_and_changes_nothing(clock, body, field):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    _, before = engine.state.snapshot()
    with pytest.raises(ProtocolError) as info:
        _run(agent.request(MsgType.PUSH_UPDATE, body, payload=agent.delta(1.0)))
    assert info.value.code is ErrorCode.BAD_REQUEST and repr(field) in str(info.value)
    assert engine.state.version == 0 and agent.rec.pushes == 0 and agent.rec.cycles == 0
    assert torch.equal(engine.state.snapshot()[1], before)


def test_a_refused_stats_report_leaves_the_worker_as_it_was(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    ok = _run(agent.request(MsgType.REPORT_STATS, {"samples": 5, "bytes_sent": 1, "bytes_received": 2,
                                                   "compute_seconds": 1.5}))
    assert ok.header.type is MsgType.STATS_ACK and agent.rec.samples == 5
    with pytest.raises(ProtocolError, match="shard_bytes"):
        _run(agent.request(MsgType.REPORT_STATS, {"samples": 9, "bytes_sent": 1, "bytes_received": 2,
                                                  "shard_bytes": {"s3": 1}}))
    assert agent.rec.samples == 5 and agent.rec.compute_seconds == 1.5


def test_the_injected_clock_stamps_registration_and_heartbeat_silence(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    assert agent.rec.last_seen == clock.time()
    clock.advance(7.5)
    assert engine.status()["elapsed_seconds"] == 7.5
    _run(agent.request(MsgType.REQUEST_WORK, {}))
    assert agent.rec.last_seen == clock.time()


def test_state_dict_round_trips_into_a_fresh_engine(clock):
    engine = _engine(clock)
    agent = _Agent(engine, clock, "a")
    _run(agent.request(MsgType.REQUEST_WORK, {}))
    clock.advance(3.0)
    state = engine.state_dict()
    other = _engine(clock)
    other.load_state_dict(state)
    assert other.queue.state()["epoch"] == engine.queue.state()["epoch"]
    # The restored worker is known (lost until it registers again) and keeps its allocation meanwhile.
    assert other.registry.get(agent.rec.id).state == "lost"
    assert other.membership.awaiting_rejoin == {agent.rec.id}
    assert other.status()["elapsed_seconds"] == 3.0


# ---- run budgets and targets (issue 14) ----------------------------------------


def test_max_updates_stops_the_run_after_that_many_folds_and_says_so(clock):
    engine = _engine(clock, max_updates=2)
    stops: list[str] = []
    engine.on_stop.append(stops.append)
    agent = _Agent(engine, clock, "a")

    async def go():
        return [(await agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=agent.delta(0.1),
                                     model_version=v)).header.body for v in range(3)]

    first, second, third = _run(go())
    assert first["status"] == second["status"] == "applied"
    assert third["status"] == "rejected" and third["reason"] == "run is stopping"
    assert engine.state.version == 2 and engine.stopping
    assert engine.stop_reason == "max_updates=2 reached at version 2" and stops == [engine.stop_reason]
    status = engine.status()
    assert (status["outcome"], status["budget_reached"], status["stop_reason"]) == (
        "budget_reached", "max_updates", engine.stop_reason)


def test_a_budget_reached_inside_a_barrier_releases_every_held_reply(clock):
    engine = _engine(clock, preset="bsp", max_updates=1)
    a, b = _Agent(engine, clock, "a"), _Agent(engine, clock, "b")

    async def go():
        first = asyncio.ensure_future(a.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=a.delta(1.0)))
        await asyncio.sleep(0.05)
        second = await b.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=b.delta(3.0))
        return await asyncio.wait_for(first, 5), second

    first, second = _run(go())
    assert engine.state.version == 1 and engine.stop_reason.startswith("max_updates=1 ")
    assert not engine.held
    assert {first.header.body["status"], second.header.body["status"]} <= {"applied", "abandoned"}


def test_max_seconds_and_max_epochs_stop_at_the_first_reached(clock):
    engine = _engine(clock, max_seconds=30.0, max_epochs=100.0)
    engine.check_budgets()
    assert not engine.stopping
    clock.advance(31.0)
    engine.check_budgets()
    assert engine.stop_reason == "max_seconds=30 reached at version 0" and engine.budget_reached == "max_seconds"

    engine = _engine(clock, max_epochs=0.5)
    agent = _Agent(engine, clock, "a")
    while engine.queue.progress < 0.5:
        _run(agent.request(MsgType.REQUEST_WORK, {}))
    _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=agent.delta(0.1)))
    assert engine.budget_reached == "max_epochs" and engine.stop_reason.startswith("max_epochs=0.5 reached")


def test_a_target_on_a_lower_is_better_metric_stops_the_run(clock):
    from hermes.common.task import accuracy

    def error(output: torch.Tensor, target: torch.Tensor) -> float:
        return 1.0 - accuracy(output, target)

    task = Task(model=lambda: build_model("mlp", input_shape=(8,), num_classes=3), name="toy",
                metrics={"error": error, "accuracy": accuracy})
    engine = _engine(clock, target="error=1.0")
    engine = Engine(engine.config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=8,
                    max_message_bytes=1 << 24, splits=(engine.train, engine.validation, engine.test), clock=clock,
                    task=task)
    assert engine.primary_metric() == ("error", "min")
    ev = engine.evaluator.evaluate_now()
    assert set(ev.metrics) == {"error", "accuracy"} and ev.metrics["error"] <= 1.0
    assert engine.stopping and engine.stop_reason == "target error=1 reached at version 0"
    assert engine.status()["target_reached_at"]["metric"] == "error"
    assert engine.status()["outcome"] == "target_reached"


async def _pending(future: asyncio.Future) -> bool:
    """Whether ``future`` is still waiting once every ready callback of the loop has run."""
    for _ in range(50):
        await asyncio.sleep(0)
    return not future.done()


def test_work_waits_at_the_start_gate_until_min_workers_have_registered(clock):
    engine = _engine(clock, min_workers=2)
    a = _Agent(engine, clock, "a")

    async def go():
        engine.start_gate.start(asyncio.get_running_loop())
        first = asyncio.ensure_future(a.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(first), "work was handed out before min_workers registered"
        assert engine.start_gate.status() == {"open": False, "reason": None, "min_workers": 2, "workers": 1}
        _Agent(engine, clock, "b")
        return await asyncio.wait_for(first, 5)

    reply = _run(go())
    assert reply.header.type is MsgType.WORK and reply.header.body["stop"] is False
    assert engine.start_gate.reason == "min_workers"


@pytest.mark.parametrize("how", ["timeout", "stop"])
def test_the_start_gate_opens_on_its_timeout_and_on_a_stop(clock, how):
    engine = _engine(clock, min_workers=3, min_workers_timeout_seconds=0.05 if how == "timeout" else 60.0)
    a = _Agent(engine, clock, "a")

    async def go():
        engine.start_gate.start(asyncio.get_running_loop())
        held = asyncio.ensure_future(a.request(MsgType.REQUEST_WORK, {}))
        assert await _pending(held)
        if how == "stop":
            engine.request_stop("operator request")
        return await asyncio.wait_for(held, 5)

    reply = _run(go())
    assert engine.start_gate.reason == how
    assert reply.header.body["stop"] is (how == "stop")


def test_patience_stops_a_run_whose_test_loss_stopped_falling(clock):
    # Hermes Table I's patience (early_stop on the loss): each new version is evaluated; zero deltas never lower the loss.
    engine = _engine(clock, **{"early_stop.patience": 3, "early_stop.metric": "loss"})
    agent = _Agent(engine, clock, "a")
    engine.evaluator.evaluate_now()
    for i in range(3):
        assert not engine.stopping, i
        _run(agent.request(MsgType.REQUEST_WORK, {}))
        _run(agent.request(MsgType.PUSH_UPDATE, {"samples": 1}, payload=agent.delta(0.0), model_version=i))
        engine.evaluator.evaluate_now()
    assert engine.stopping and engine.stop_reason.startswith("early stop: loss did not improve")
    assert engine.status()["outcome"] == "early_stopped"
