"""The simulated server: the real ``Engine`` on the virtual clock, reached by encoded messages without sockets.

A device's request is encoded as an agent encodes it (``hermes.common.wire.encode``,
signed with its key), so its size is the real encoded size. Its time:

1. the device's uplink (``transfer_seconds``: half its RTT and the bytes at its up rate; with
   ``backlog_share`` one queue a direction for all of the agent's messages), and the server's own link
   (``ServerLink``: one FIFO shared by every device);
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
import time
from collections.abc import Awaitable, Callable, Coroutine, Generator, Mapping
from typing import Any, Literal, Protocol, TypeVar

import torch

from hermes.common.clock import Clock
from hermes.common.wire import Header, Message, MsgType, decode, encode
from hermes.server.engine import Engine
from hermes.server.heartbeat import HeartbeatMonitor
from hermes.sim.devices import DeviceProfile
from hermes.sim.host import Host
from hermes.sim.server_cost import MeasuredCost

T = TypeVar("T")

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


class CpuTimed(Awaitable[T]):
    """Awaits a coroutine and adds up the CPU time of this thread in its own steps (``seconds``), not
    counting what runs while it is suspended (other devices' messages, a barrier's wait)."""

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.seconds = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        value: Any = None
        error: BaseException | None = None
        while True:
            t0 = time.thread_time()
            try:
                yielded = self.coro.send(value) if error is None else self.coro.throw(error)
            except StopIteration as stop:
                self.seconds += time.thread_time() - t0
                return stop.value
            self.seconds += time.thread_time() - t0
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # handed to the coroutine, as asyncio would
                value, error = None, exc


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
    profile: DeviceProfile  # its key and rate for the host's pacers (HostSpec.nominal)


class Driver:
    def __init__(self, engine: Engine, clock: Clock, *, transfer: Transfer, server_link: ServerLinkModel | None,
                 cost: ServerCostModel, heartbeat_timeout: float, host: Host | None = None,
                 backlog_share: float = 0.0) -> None:
        self.engine = engine
        self.clock = clock
        self.transfer = transfer
        self.server_link = server_link
        # backlog_share: a device's link is one queue a direction, and a message waits for this share of the bytes
        # queued there before it (its link's backlog, when its last byte queued is through, by (device,
        # direction)); 1: whole messages first come first served. 0 (the default): each message has the whole link
        # to itself, nothing tracked. The testbed's lte link measured about 0.65 (docs/simulation.md).
        if not 0.0 <= backlog_share <= 1.0:
            raise ValueError(f"backlog_share must be within [0, 1], got {backlog_share}")
        self.backlog_share = backlog_share
        self.link_free: dict[tuple[int, str], float] = {}
        self.cost = cost
        self.params = engine.spec.numel
        # The server's CPU: busy until this (virtual) time.
        self.server_free = 0.0
        self.server_busy_seconds = 0.0
        # Server CPU seconds a push costs on top of its ops: the loss aggregation's scoring of models
        # (sim.server_cost.probe_seconds), set by the Simulation once it has counted the model's FLOPs.
        self.push_extra_seconds = 0.0
        # --host (sim/host.py): the server's operations, evaluations and the agents' message handling are jobs
        # on the shared cores; the server's FIFO then runs one operation at a time, in arrival order.
        self.host = host
        self._server_tail: asyncio.Future[None] | None = None
        self.monitor = HeartbeatMonitor(engine, heartbeat_timeout)
        self.stopped = asyncio.Event()
        engine.on_stop.append(lambda _reason: self.stopped.set())
        # The active workers the cost model is told of, kept from the engine's join and leave facts: asking
        # the registry for them was a pass over every worker per request (4% of a 1,000-device run).
        self.active: set[str] = set(engine.registry.active_ids())
        # Folds not yet charged their thread hop (--host: the testbed server journals each fold through
        # asyncio.to_thread, server/engine/folding.py; the simulated engine has no checkpointer).
        self.unhopped_folds = 0
        engine.telemetry.subscribe(self._membership)

    def _membership(self, fact: str, fields: Mapping[str, Any]) -> None:
        if fact == "update_applied":
            self.unhopped_folds += 1
        elif fact == "join":
            self.active.add(fields["worker"])
        elif fact == "leave":
            self.active.discard(fields["worker"])

    # ---- time ----------------------------------------------------------------

    def now(self) -> float:
        return self.clock.monotonic()

    async def until(self, t: float) -> None:
        delay = t - self.now()
        if delay > 0:
            await asyncio.sleep(delay)

    async def server_turn(self, ops: tuple[str, ...], extra: float = 0.0) -> None:
        """Wait for the server's CPU, then hold it for these operations' cost (and ``extra`` seconds)."""
        workers = len(self.active)
        cost = sum(self.cost.seconds(op, params=self.params, workers=workers) for op in ops) + extra
        if self.host is not None:
            await self.hosted_turn(cost)
            return
        start = max(self.server_free, self.now())
        self.server_free = start + cost
        self.server_busy_seconds += cost
        await self.until(self.server_free)

    async def hosted_turn(self, cost: float) -> None:
        """The server's FIFO on the shared host: wait for the operations before this one, then run on a core."""
        assert self.host is not None
        prev = self._server_tail
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._server_tail = mine
        try:
            if prev is not None and not prev.done():
                await asyncio.shield(prev)
            t0 = self.now()
            await self.host.run(cost)
            self.server_busy_seconds += self.now() - t0
        finally:
            mine.set_result(None)

    async def agent_cpu(self, nbytes: int, per_byte: float, paced: Endpoint | None = None) -> None:
        """An agent's encoding of what it sends, or its decoding of what it got, on the shared host. ``paced``:
        the device whose loop thread does it (its main channel's requests; the prefetcher's and the overlapped
        push's run on threads of their own): under HostSpec.nominal that CPU is slowed like its steps."""
        if self.host is not None:
            t0, cpu = self.now(), nbytes * per_byte
            await self.host.run(cpu)
            if paced is not None:
                pause = self.host.overhead_sleep(paced.profile.device_id, paced.profile.flops, cpu, self.now() - t0)
                if pause > 0:
                    await self.until(self.now() + pause)

    async def measured_turn(self, ops: tuple[str, ...], frames: list[bytes]) -> list[bytes]:
        """--server-cost measured: the message waits for the server's CPU, the engine handles it, and the
        CPU time that took (this thread's, CpuTimed) holds the server before the reply leaves."""
        assert isinstance(self.cost, MeasuredCost)
        while self.server_free > self.now():
            await self.until(self.server_free)
        handled = CpuTimed(self.engine.handle(frames))
        reply = await handled
        self.cost.record(ops[0], handled.seconds)
        workers = len(self.active)
        cost = self.cost.seconds(ops[0], params=self.params, workers=workers)
        self.server_free = max(self.server_free, self.now()) + cost
        self.server_busy_seconds += cost
        await self.until(self.server_free)
        return reply

    async def carry(self, dev: Endpoint, nbytes: int, direction: Literal["up", "down"]) -> None:
        """``nbytes`` over the device's link (transfer_seconds: half the RTT each way) and the server's shared one.

        With ``backlog_share`` the device's link is one queue a direction, for all of the agent's connections (its
        loop's, its prefetcher's, its overlapped push's), as one tbf a direction shapes a testbed agent's veth pair
        (deploy/netlab.py; the relay's RTT/2 comes after the shaping, deploy/links.py): a message waits for that
        share of the bytes queued before it, and its own bytes lengthen the queue. 1 is first come first served
        whole messages; TCP over the testbed's tbf lets a new connection's request past part of a push in flight
        (a share of about 0.65 measured on its lte link, docs/simulation.md)."""
        mbps = dev.up_mbps if direction == "up" else dev.down_mbps
        t0 = start = self.now()
        if self.backlog_share:
            key = (id(dev), direction)
            free = self.link_free.get(key, t0)
            start = t0 + self.backlog_share * max(0.0, free - t0)
            self.link_free[key] = max(free, t0) + self.transfer(nbytes, mbps, 0.0)
        done = start + self.transfer(nbytes, mbps, dev.rtt_s)
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
        sent_at = self.now()
        seq = dev.seqs[channel] = dev.seqs.get(channel, 0) + 1
        header = Header(type=type_, worker=dev.worker_id, session=f"{dev.session}-{channel}", seq=seq,
                        ts=int(self.clock.time() * 1000), model_version=model_version, shapes=shapes, body=body)
        frames = encode(header, payload, key=dev.key)
        size = sum(len(f) for f in frames)
        dev.bytes_sent += size
        paced = dev if channel == "main" else None
        await self.agent_cpu(size, self.host.spec.send_cpu_s_per_byte if self.host else 0.0, paced)
        await self.carry(dev, size, "up")
        if self.host is not None:  # the server's threads wake for it (half a round trip's wake-ups)
            await self.host.wake("rtt", 0.5)
        ops = OPS.get(type_, ("heartbeat",))
        if isinstance(self.cost, MeasuredCost):  # the scoring's CPU time is inside the handling it measures
            reply = await self.measured_turn(ops, frames)
        elif type_ is MsgType.PULL_MODEL and self.pull_waits(dev.worker_id):
            # Held for a training slot (concurrency.hold_pull): checked on arrival, the model encoded when the
            # slot comes (10,000 devices registering at once would otherwise fill the CPU's FIFO with pulls
            # not yet served).
            await self.server_turn(("heartbeat",))
            reply = await self.engine.handle(frames)
            if decode(reply).payload is not None:  # a pull released by the stop gets no model to encode
                await self.server_turn(ops)
        else:
            await self.server_turn(ops, self.push_extra_seconds if type_ is MsgType.PUSH_UPDATE else 0.0)
            reply = await self.engine.handle(frames)
        if self.host is not None and self.unhopped_folds:
            # The fold this request made journals through a thread hop before any reply goes out.
            self.unhopped_folds = 0
            await self.host.wake("hop")
        out = sum(len(f) for f in reply)
        await self.carry(dev, out, "down")
        if self.host is not None:  # the agent's threads wake for the reply
            await self.host.wake("rtt", 0.5)
        await self.agent_cpu(out, self.host.spec.receive_cpu_s_per_byte if self.host else 0.0, paced)
        dev.bytes_received += out
        # As the agent's TrafficCounter: the newest answered request's send time (the server's last_seen).
        dev.answered_at = max(dev.answered_at, sent_at)
        return decode(reply)

    def pull_waits(self, worker_id: str) -> bool:
        """Whether the engine holds this worker's pull for a training slot (engine/admission.py)."""
        admission = self.engine.admission
        return not admission.open and admission.hold_pull and worker_id not in admission.holders

    # ---- evaluation --------------------------------------------------------------

    async def evaluations(self) -> None:
        """The evaluator at its interval in virtual time, synchronously (deterministic)."""
        evaluator = self.engine.evaluator
        interval = self.engine.config.eval_interval_seconds
        while not self.engine.stopping:
            await asyncio.sleep(interval)
            if evaluator.latest is not None and evaluator.latest.version == self.engine.state.version:
                continue
            workers = len(self.active)
            seconds = self.cost.seconds("evaluate", params=self.params, workers=workers)
            if self.host is not None:  # the evaluator's thread, beside the server's operations
                await self.host.run(seconds)
            else:
                await asyncio.sleep(seconds)
            if not self.engine.stopping:
                t0 = time.thread_time()
                evaluator.evaluate_now()
                if isinstance(self.cost, MeasuredCost):
                    # The next evaluation's window (this one's was the last one's, or the calibrated model's).
                    self.cost.record("evaluate", time.thread_time() - t0)

