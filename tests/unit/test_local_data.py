"""Device-local data: the agent's LocalSet, and the server sizing cycles of samples it never holds.

The engine runs in-process (no socket): agents register with
``local_samples``, ask for work and report cycles; the WORK replies carry a
sample count (``local_samples``, ``source: "local"``) and no shard ids, and
the dual search resizes them exactly as it resizes shard assignments.
"""

from __future__ import annotations

import asyncio
import itertools
import statistics

import numpy as np
import pytest
import torch

from hermes.client.local_data import LocalDataError, LocalSet
from hermes.common.clock import ManualClock
from hermes.common.config import build_config
from hermes.common.models import build_model
from hermes.common.task import ArrayPairDataset, Task
from hermes.common.wire import Header, MsgType, decode, encode
from hermes.server.engine import Engine
from hermes.server.engine.screening import ScreeningSettings
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics


def _pairs(n: int, seed: int = 0, dtype=torch.float32) -> ArrayPairDataset:
    g = torch.Generator().manual_seed(seed)
    return ArrayPairDataset(torch.randn((n, 8), generator=g).to(dtype), torch.randint(0, 3, (n,), generator=g))


def _task(**kw) -> Task:
    return Task(name="local-toy", model=lambda: build_model("mlp", input_shape=(8,), num_classes=3),
                test_data=_pairs(64, 9), local_data=lambda name: _pairs(100, len(name)), **kw)


# ---------------------------------------------------------------------------- the agent's local set


class _Tokens(torch.utils.data.Dataset):
    """Token ids -> next-token targets, generated per index (not array-backed: the item-by-item path)."""

    def __len__(self) -> int:
        return 37

    def __getitem__(self, i: int):
        seq = torch.arange(i, i + 6, dtype=torch.int64) % 11
        return seq[:-1], seq[1:]


def test_draws_cover_every_local_sample_once_per_local_epoch_and_run_on():
    local = LocalSet.build(Task(model=lambda: torch.nn.Linear(1, 1), local_data=lambda _n: _Tokens()), "w-1")
    local.configure(build_config("asp"), gate=False)
    assert len(local.train_idx) == 37 and len(local.validation_idx) == 0
    first = [local.draw(10) for _ in range(3)] + [local.draw(7)]  # exactly one local epoch
    x = torch.cat([f[0] for f in first])
    assert x.dtype == torch.int64 and x.shape == (37, 5)
    # Each sample once: the rows are the 37 distinct sequences.
    assert sorted(int(r[0]) for r in x) == sorted(i % 11 for i in range(37))
    assert local.epoch == 0
    x2, y2 = local.draw(40)  # all of epoch 1 and 3 samples of epoch 2
    assert local.epoch == 2 and len(x2) == 40 and torch.equal(y2[:, :-1], x2[:, 1:])


def test_draws_are_seeded_by_run_seed_and_worker_name():
    def order(name: str, seed: int) -> list[int]:
        local = LocalSet.build(_task(), name)
        local.configure(build_config("asp", seed=seed), gate=False)
        return [float(v) for v in local.draw(30)[0][:, 0]]

    assert order("w-1", 0) == order("w-1", 0)
    assert order("w-1", 0) != order("w-1", 1)
    assert order("w-1", 0) != order("w-2", 0)


def test_the_gate_validation_is_held_out_of_the_local_set():
    local = LocalSet.build(_task(), "w-1")
    config = build_config("hermes")
    local.configure(config, gate=True)
    held = min(config.zscore.validation_samples, round(100 * config.validation_fraction))
    assert len(local.validation_idx) == held and len(local.train_idx) == 100 - held
    assert not set(local.validation_idx.tolist()) & set(local.train_idx.tolist())
    vx, vy = local.validation()
    assert vx.shape == (held, 8) and vy.dtype == torch.int64


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.uint8])
def test_local_samples_keep_their_dtype(dtype):
    local = LocalSet.build(Task(model=lambda: torch.nn.Linear(1, 1), local_data=lambda _n: _pairs(20, 1, dtype)), "a")
    local.configure(build_config("asp"), gate=False)
    assert local.draw(5)[0].dtype == dtype


@pytest.mark.parametrize(("local_data", "match"), [
    (lambda name: 1 / 0, "local_data\\('w-1'\\) raised ZeroDivisionError"),
    (lambda name: None, "returned None"),
    (lambda name: ArrayPairDataset(np.zeros((0, 2)), np.zeros(0)), "is empty"),
    (lambda name: [(torch.zeros(2), torch.tensor(0)), (torch.zeros(3), torch.tensor(1))], None),
])
def test_a_broken_local_data_is_one_line_naming_task_and_worker(local_data, match):
    task = Task(name="bad", model=lambda: torch.nn.Linear(1, 1), local_data=local_data)
    try:
        local = LocalSet.build(task, "w-1")
        local.configure(build_config("asp"), gate=False)
        local.draw(2)
    except LocalDataError as exc:
        text = str(exc)
        assert "\n" not in text and "task bad" in text and "w-1" in text
        if match:
            assert __import__("re").search(match, text), text
        else:  # samples of different shapes, named by index
            assert "differs" in text, text
    else:
        pytest.fail("no LocalDataError")


# ---------------------------------------------------------------------------- the server's sizing


def _engine(clock: ManualClock, preset: str = "hermes", **overrides) -> Engine:
    config = build_config(preset, model="mlp", shard_size=16, eval_max_samples=32, **overrides)
    return Engine(config, metrics=ServerMetrics(), events=EventLog(None, clock=clock), max_workers=8,
                  max_message_bytes=1 << 24, clock=clock, screening=ScreeningSettings(enabled=False), task=_task())


class _Agent:
    _sessions = itertools.count()

    def __init__(self, engine: Engine, clock: ManualClock, name: str, local_samples: int) -> None:
        self.engine, self.clock = engine, clock
        self.rec, _ = engine.register(name, local_samples=local_samples)
        self.session = f"s{next(self._sessions)}"
        self.seq = 0

    async def request(self, type_: MsgType, body: dict):
        self.seq += 1
        header = Header(type=type_, worker=self.rec.id, session=self.session, seq=self.seq,
                        ts=int(self.clock.time() * 1000), model_version=0, body=body)
        return decode(await self.engine.handle(encode(header, None, key=self.rec.key)))


def test_work_replies_carry_a_sample_count_and_no_shards():
    clock = ManualClock()
    engine = _engine(clock)
    agent = _Agent(engine, clock, "w-1", 300)
    reply = asyncio.run(agent.request(MsgType.REQUEST_WORK, {}))
    body = reply.header.body
    wl = engine.allocator.workload(agent.rec.id)
    assert body["source"] == "local" and body["shards"] == []
    assert body["local_samples"] == body["cycle_samples"] == wl.dss and body["batch_size"] == wl.batch_size
    assert engine.status()["shard_bytes"] == 0 and engine.status()["data_location"] == "local"
    assert engine.epoch_progress == pytest.approx(wl.dss / 300)
    # No validation shards either: the gate's split is held out of the agent's own data.
    assert engine.membership.validation_shards_for(agent.rec) == []
    assert engine.data_source_for(agent.rec) == {"source": "local"}


def test_the_dual_search_sizes_local_cycles_until_cycle_times_equalise():
    """HL8's speeds (1, 1/4, 1/5.33, 1/5.33 as slowdowns 1, 8, 5.33, 5.33): each cycle's compute time is
    its samples times the worker's slowdown. The resized local_samples bring the cycle times together."""
    clock = ManualClock()
    engine = _engine(clock)
    slowdowns = {"worker-1": 32 / 6, "worker-2": 32 / 6, "worker-3": 8.0, "worker-4": 1.0}
    agents = {n: _Agent(engine, clock, n, 400) for n in slowdowns}
    per_sample = 0.002

    async def rounds(n: int) -> dict[str, list[float]]:
        times: dict[str, list[float]] = {name: [] for name in agents}
        for _ in range(n):
            for name, agent in agents.items():
                body = (await agent.request(MsgType.REQUEST_WORK, {})).header.body
                assert body["shards"] == [] and body["source"] == "local"
                dss, batch_size = body["local_samples"], body["batch_size"]
                seconds = dss * per_sample * slowdowns[name]
                times[name].append(seconds)
                clock.advance(seconds / 4)
                await agent.request(MsgType.REPORT_STATS, {
                    "samples": dss, "bytes_sent": 0, "bytes_received": 0,
                    "cycle": {"dss": dss, "batch_size": batch_size, "compute_seconds": seconds, "accumulation": 1}})
        return times

    times = asyncio.run(rounds(40))
    last = {name: statistics.median(t[-10:]) for name, t in times.items()}
    ratio = max(last.values()) / statistics.median(last.values())
    first = {name: t[0] for name, t in times.items()}
    assert max(first.values()) / statistics.median(first.values()) > 1.4  # unequal before the search
    assert ratio <= 1.25, (ratio, last)
    assert engine.status()["shard_bytes"] == 0


def test_a_preset_that_partitions_the_server_s_data_is_refused_with_the_reason():
    with pytest.raises(ValueError, match="cannot train on device-local data.*partition"):
        _engine(ManualClock(), "dp-sgd")


@pytest.mark.parametrize("preset", ["hermes", "asp", "bsp", "ssp", "ebsp", "omnilearn-bsp", "omnilearn-asp",
                                    "dynamic-batching", "variable-batching", "task-allocation", "fedasync",
                                    "fedbuff"])
def test_every_other_preset_starts_on_local_data(preset):
    engine = _engine(ManualClock(), preset)
    agent = _Agent(engine, engine.clock, "w-1", 500)
    body = asyncio.run(agent.request(MsgType.REQUEST_WORK, {})).header.body
    assert body["source"] == "local" and body["local_samples"] >= 1


def test_the_local_epoch_account_survives_a_checkpoint():
    clock = ManualClock()
    engine = _engine(clock)
    agent = _Agent(engine, clock, "w-1", 250)
    for _ in range(3):
        asyncio.run(agent.request(MsgType.REQUEST_WORK, {}))
    progress = engine.epoch_progress
    assert progress > 0
    fresh = _engine(clock)
    fresh.load_state_dict(engine.state_dict())
    assert fresh.epoch_progress == pytest.approx(progress) and fresh.local.sizes == {agent.rec.id: 250}


class _StubClient:
    """What the prefetcher's data client answers: WORK bodies as a local-data server sends them."""

    def __init__(self, bodies: list[dict]) -> None:
        self.bodies = bodies
        self.asked: list[MsgType] = []

    def request(self, type_, body, **kw):
        self.asked.append(type_)

        class _Reply:
            header = type("H", (), {"body": self.bodies.pop(0) if self.bodies else {"stop": True}})

        return _Reply()

    def close(self) -> None:
        pass


def _work(n: int) -> dict:
    return {"epoch": 0, "shards": [], "source": "local", "local_samples": n, "cycle_samples": n,
            "batch_size": 8, "accumulation": 1, "lr": 0.1}


def test_the_prefetcher_draws_local_samples_and_fetches_nothing():
    from hermes.client.prefetch import Prefetcher, StopSignal, Work

    local = LocalSet.build(_task(), "w-1")
    local.configure(build_config("asp"), gate=False)
    client = _StubClient([_work(24), _work(40)])
    pre = Prefetcher(lambda: client, local=local)
    pre.start()
    try:
        got = [pre.next() for _ in range(3)]
    finally:
        pre.stop()
    assert [type(g) for g in got] == [Work, Work, StopSignal]
    assert [len(g.y) for g in got[:2]] == [24, 40] and all(g.fetched_bytes == 0 and g.shards == () for g in got[:2])
    assert got[0].x.dtype == torch.float32 and got[0].cycle_samples == 24
    assert MsgType.FETCH_SHARD not in client.asked and pre.stats.report()["shard_bytes"] == {"kafka": 0, "zmq": 0}


def test_a_local_assignment_without_local_data_stops_the_agent_with_the_reason():
    from hermes.client.prefetch import Prefetcher, StopSignal

    pre = Prefetcher(lambda: _StubClient([_work(8)]))
    pre.start()
    try:
        got = pre.next()
    finally:
        pre.stop()
    assert isinstance(got, StopSignal) and isinstance(got.error, LocalDataError)
    assert "no local_data" in str(got.error)
