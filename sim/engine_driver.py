"""The simulated server: the real ``Engine`` on the virtual clock, reached by encoded messages without sockets.

A device's request is encoded as an agent encodes it (``hermes.common.wire.encode``,
signed with its key), so its size is the real encoded size. Its time:

1. the device's uplink (``transfer_seconds``: half its RTT and the bytes at its up rate),
   and the server's own link (``ServerLink``: one FIFO shared by every device);
2. the server's CPU: one FIFO of engine operations, each costing what the cost
   model says (``ServerCost.seconds``); the engine handles the message when its
   turn ends, so a saturated server shows up as queueing;
3. ``Engine.handle`` itself, the data plane's entry point (a barrier may hold a
   push's reply, in virtual time, until the others arrive);
4. the reply back through the server's link and the device's downlink.

Registration and heartbeats are control-plane calls: registration goes through
``Engine.register`` as the HTTP route does, heartbeats through the route
function itself, and the real ``HeartbeatMonitor`` marks silent devices lost.
Evaluation runs synchronously at its interval in virtual time (the evaluator's
thread is stopped before it ever evaluates), after the cost model's seconds.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Literal, Protocol

import torch

from hermes.common.clock import Clock
from hermes.common.wire import Header, Message, MsgType, decode, encode
from hermes.server.engine import Engine
from hermes.server.heartbeat import HeartbeatMonitor

log = logging.getLogger(__name__)

# Engine operations by message type, as the cost model names them (sim.server_cost).
OPS: dict[MsgType, tuple[str, ...]] = {
    MsgType.PUSH_UPDATE: ("push", "fold"),
    MsgType.PULL_MODEL: ("pull",),
    MsgType.REQUEST_WORK: ("assign",),
    MsgType.FETCH_SHARD: ("assign",),
    MsgType.REPORT_STATS: ("heartbeat",),
}


class ServerCostModel(Protocol):
    def seconds(self, op: str, *, params: int, workers: int) -> float: ...


class ServerLinkModel(Protocol):
    def reserve(self, t: float, nbytes: int, direction: Literal["up", "down"]) -> float: ...


Transfer = Callable[[int, float, float], float]


class Endpoint(Protocol):
    """What the driver needs of a device to carry its messages: its link and its secrets."""

    worker_id: str
    key: bytes
    session: str
    seqs: dict[str, int]
    up_mbps: float
    down_mbps: float
    rtt_s: float
    bytes_sent: int
    bytes_received: int
    answered_at: float


class Driver:
    def __init__(self, engine: Engine, clock: Clock, *, transfer: Transfer, server_link: ServerLinkModel | None,
                 cost: ServerCostModel, heartbeat_timeout: float) -> None:
        self.engine = engine
        self.clock = clock
        self.transfer = transfer
        self.server_link = server_link
        self.cost = cost
        self.params = engine.spec.numel
        # The server's CPU: busy until this (virtual) time.
        self.server_free = 0.0
        self.server_busy_seconds = 0.0
        # Server CPU seconds a push costs on top of its ops: the loss aggregation's scoring of models
        # (sim.server_cost.probe_seconds), set by the Simulation once it has counted the model's FLOPs.
        self.push_extra_seconds = 0.0
        self.monitor = HeartbeatMonitor(engine, heartbeat_timeout)
        self.stopped = asyncio.Event()
        engine.on_stop.append(lambda _reason: self.stopped.set())

    # ---- time ----------------------------------------------------------------

    def now(self) -> float:
        return self.clock.monotonic()

    async def until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def server_turn(self, ops: tuple[str, ...], extra: float = 0.0) -> None:
        """Wait for the server's CPU, then hold it for these operations' cost (and ``extra`` seconds)."""
        workers = len(self.engine.registry.active_ids())
        cost = sum(self.cost.seconds(op, params=self.params, workers=workers) for op in ops) + extra
        start = max(self.server_free, self.now())
        self.server_free = start + cost
        self.server_busy_seconds += cost
        await self.until(self.server_free)

    async def carry(self, dev: Endpoint, nbytes: int, direction: Literal["up", "down"]) -> None:
        """``nbytes`` over the device's link (transfer_seconds: half the RTT each way) and the server's shared one."""
        mbps = dev.up_mbps if direction == "up" else dev.down_mbps
        t0 = self.now()
        done = t0 + self.transfer(nbytes, mbps, dev.rtt_s)
        if self.server_link is not None:
            done = max(done, self.server_link.reserve(t0, nbytes, direction))
        await self.until(done)

    # ---- the data plane --------------------------------------------------------

    async def request(self, dev: Endpoint, type_: MsgType, body: dict[str, Any], *,
                      payload: torch.Tensor | None = None, model_version: int = 0,
                      shapes: tuple[Any, ...] = (), channel: str = "main") -> Message:
        """One request from the device to the engine and its reply back (ProtocolError as the data plane's).

        ``channel``: the agent's data-plane client it goes through (its loop's, its prefetcher's, its
        overlapped push's): each is a session of its own, whose requests arrive in order.
        """
        seq = dev.seqs[channel] = dev.seqs.get(channel, 0) + 1
        header = Header(type=type_, worker=dev.worker_id, session=f"{dev.session}-{channel}", seq=seq,
                        ts=int(self.clock.time() * 1000), model_version=model_version, shapes=shapes, body=body)
        frames = encode(header, payload, key=dev.key)
        size = sum(len(f) for f in frames)
        dev.bytes_sent += size
        await self.carry(dev, size, "up")
        await self.server_turn(OPS.get(type_, ("heartbeat",)),
                               self.push_extra_seconds if type_ is MsgType.PUSH_UPDATE else 0.0)
        reply = await self.engine.handle(frames)
        out = sum(len(f) for f in reply)
        await self.carry(dev, out, "down")
        dev.bytes_received += out
        dev.answered_at = self.now()
        return decode(reply)

    # ---- evaluation --------------------------------------------------------------

    async def evaluations(self) -> None:
        """The evaluator at its interval in virtual time, synchronously (deterministic)."""
        evaluator = self.engine.evaluator
        interval = self.engine.config.eval_interval_seconds
        while not self.engine.stopping:
            await asyncio.sleep(interval)
            if evaluator.latest is not None and evaluator.latest.version == self.engine.state.version:
                continue
            workers = len(self.engine.registry.active_ids())
            await asyncio.sleep(self.cost.seconds("evaluate", params=self.params, workers=workers))
            if not self.engine.stopping:
                evaluator.evaluate_now()

