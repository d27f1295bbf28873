"""The data plane's receive loop under concurrent requests: every request gets its reply.

A ROUTER socket on an event loop is woken through its FD, which signals only a change (a send can consume the
signal of a request that came in meanwhile): the data plane's plain-socket loop (issue 31) checks for a message
after every send and before every wait. Eight agents with a request in flight each, replies and
receives interleaving, must all be answered; a lost wake-up leaves requests unanswered (nobody else sends), and
the agents' timeout fails the test (it did with that loop's FD reader made a no-op). The engine and the real
DataPlane run on an event loop in a thread of this process; the agents are the real DataClient.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from hermes.client.transport import DataClient
from hermes.common.config import build_config
from hermes.common.datasets import ArrayDataset
from hermes.common.models import build_model
from hermes.common.task import Task
from hermes.common.wire import MsgType
from hermes.server.dataplane import DataPlane
from hermes.server.engine import Engine
from hermes.server.engine.screening import ScreeningSettings
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics

HANG_S = 60.0  # a reply that does not come within this is lost (each request takes milliseconds)
AGENTS, ROUNDS = 8, 40


def _split(name: str, n: int, seed: int) -> ArrayDataset:
    rng = np.random.default_rng(seed)
    x = np.ascontiguousarray(rng.standard_normal((n, 8)).astype(np.float32))
    return ArrayDataset(name, x, rng.integers(0, 3, n).astype(np.int64), num_classes=3)


class _Served:
    """The engine behind the real DataPlane on an event loop of its own thread."""

    def __init__(self) -> None:
        config = build_config("asp", model="mlp", shard_size=16, eval_max_samples=32, eval_interval_seconds=3600.0)
        splits = (_split("toy", 128, 0), _split("toy-validation", 64, 1), _split("toy-test", 32, 2))
        self.engine = Engine(config, metrics=ServerMetrics(), events=EventLog(None), max_workers=AGENTS,
                             max_message_bytes=1 << 24, splits=splits, screening=ScreeningSettings(enabled=False),
                             task=Task(model=lambda: build_model("mlp", input_shape=(8,), num_classes=3), name="toy"))
        self.loop = asyncio.new_event_loop()
        self.plane = DataPlane(self.engine, "127.0.0.1", 0)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.port = asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(HANG_S)

    async def _start(self) -> int:
        self.engine.start()
        return await self.plane.start()

    def register(self, name: str) -> DataClient:
        rec, _ = asyncio.run_coroutine_threadsafe(self._register(name), self.loop).result(HANG_S)
        return DataClient(f"tcp://127.0.0.1:{self.port}", rec.id, rec.token, timeout=HANG_S, retries=0)

    async def _register(self, name: str):
        return self.engine.register(name)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.plane.stop(), self.loop).result(HANG_S)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(HANG_S)


def test_concurrent_requests_from_many_agents_are_all_answered() -> None:
    served = _Served()
    clients = [served.register(f"worker-{i}") for i in range(AGENTS)]
    numel = served.engine.spec.numel

    def agent(dc: DataClient) -> tuple[int, int]:
        applied = answered = 0
        version = dc.request(MsgType.PULL_MODEL, {"dtype": "float32"}).header.model_version
        for _ in range(ROUNDS):
            rep = dc.request(MsgType.PUSH_UPDATE, {"samples": 16, "loss": 1.0}, payload=torch.full((numel,), 1e-4),
                             model_version=version, idempotent=False)
            applied += rep.header.body.get("status") == "applied"
            version = rep.header.model_version
            # A small request right behind: its arrival races the reply to another agent's push.
            answered += dc.request(MsgType.PULL_MODEL, {"dtype": "float32", "if_newer": True}).header.seq > 0
        return applied, answered

    try:
        with ThreadPoolExecutor(AGENTS) as pool:
            results = list(pool.map(agent, clients))
    finally:
        for dc in clients:
            dc.close()
        served.close()
    assert results == [(ROUNDS, ROUNDS)] * AGENTS
    assert served.engine.version == AGENTS * ROUNDS
