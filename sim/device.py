"""A simulated device's life: register, pull, train cycles, push, go offline and come back.

It follows the agent (client.agent, client.loop, client.topology.PushPull)
step for step and asks the agent's own code for every rule: the cycle's
samples (``session.take_cycle``), the gate and the push's change since the
baseline or the last pull (``topology.judge_cycle``, ``topology.update_of``),
what a push carries (``session.Outbox``), the trainer (``LocalTrainer``).
Only the transport differs: messages go through the driver in virtual time.

Training is real (the task's model, loss and optimizer, one torch step per
batch); its duration is the device's: the cycle's FLOPs over the device's
FLOP/s. One ``LocalTrainer`` serves every device in turn: before a cycle the
device's weights, optimizer state and shuffling stream are swapped in, after
it they are swapped out. What a device keeps between cycles is what its
policy needs: the version it pulled (the weights live once per version in
``VersionStore``), its own weights only while they hold progress the server
has not seen (a gate-skipped cycle, a push answered "unchanged"), its
optimizer's state only when the optimizer keeps one (momentum).

Churn: while a device works (trains, sends, waits for a reply) its
availability may flip to offline; the work in flight is lost then, the
server hears nothing more from it and marks it lost after the heartbeat
timeout (the real ``HeartbeatMonitor``). Back online it registers again,
as an agent does, and catches up with the global model.
"""

from __future__ import annotations

import asyncio
import logging
import math
import zlib
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from fastapi import HTTPException

from hermes.client.local_data import LocalDataError, LocalSet
from hermes.client.loop import cycle_record
from hermes.client.options import AgentOptions
from hermes.client.overlap import rebase
from hermes.client.prefetch import Work
from hermes.client.session import AgentStats, Job, Outbox, take_cycle
from hermes.client.shard_fetch import records_to_tensors
from hermes.client.topology import LossNotFinite, judge_cycle, update_of
from hermes.client.trainer import LocalTrainer
from hermes.common.codec_spec import CodecSpec
from hermes.common.codecs import Compressor
from hermes.common.codecs import decode as decode_codec
from hermes.common.control_messages import Hints
from hermes.common.messages import (
    IN_FLIGHT,
    LOSS_NOT_FINITE,
    MAX_SHARDS_PER_FETCH,
    FetchShard,
    PullModel,
    PushReply,
    Reply,
    ReportStats,
    RequestWork,
    WorkReply,
    parse_reply,
    request_body,
)
from hermes.common.policies.gate import ZScoreGate
from hermes.common.shards import decode_record
from hermes.common.tensors import load_flat
from hermes.common.wire import ErrorCode, Message, MsgType, ProtocolError
from hermes.server.routes import workers as routes
from hermes.sim.events import current_device
from hermes.sim.executor import CycleInputs, CycleOutputs, OptState, load_state, state_of

if TYPE_CHECKING:
    from hermes.sim.run import Simulation

log = logging.getLogger(__name__)

# Data-plane errors after which an agent registers again (client.agent._REJOIN_CODES).
REJOIN_CODES = frozenset({ErrorCode.UNAUTHORIZED, ErrorCode.UNKNOWN_WORKER, ErrorCode.UNAVAILABLE, ErrorCode.REPLAY})
# Cycles in a row whose loss is not finite before a device gives up, as an agent (exit 4).
MAX_NONFINITE: int = AgentOptions.max_nonfinite_cycles
# A registration's request and reply (JSON over HTTP): their size on the wire, for the link's time.
REGISTER_BYTES = (600, 2_000)


class DeviceDataError(Exception):
    """A device's local data cannot be built (the task's local_data failed for it; one line)."""


class Offline(Exception):
    """The device went offline: what it was doing is lost."""


class VersionStore:
    """Model versions pulled by devices, each held once while some device trains from it."""

    def __init__(self) -> None:
        self.flat: dict[int, torch.Tensor] = {}
        self.refs: dict[int, int] = {}
        # The most versions held at once (the summary's account of the devices' model memory).
        self.peak = 0

    def hold(self, version: int, flat: torch.Tensor | None = None) -> torch.Tensor:
        if version not in self.flat:
            assert flat is not None, f"version {version} is not held and was not given"
            self.flat[version] = flat
            self.peak = max(self.peak, len(self.flat))
        self.refs[version] = self.refs.get(version, 0) + 1
        return self.flat[version]

    def release(self, version: int | None) -> None:
        if version is None:
            return
        self.refs[version] -= 1
        if self.refs[version] == 0:
            del self.refs[version], self.flat[version]

    def __getitem__(self, version: int) -> torch.Tensor:
        return self.flat[version]


@dataclass
class Totals(AgentStats):
    """The device's own account: the agent's (client.session.AgentStats, ``started`` 0 on the virtual
    clock), plus what churn cost it."""

    started: float = 0.0
    registrations: int = 0
    offline: int = 0
    lost_cycles: int = 0


class SimDevice:
    def __init__(self, profile: Any, sim: Simulation) -> None:
        self.profile = profile
        self.sim = sim
        self.name: str = profile.device_id
        # Its position in the population: equal-time events run in this order (sim.events.current_device).
        self.index = 0
        self.up_mbps: float = profile.up_mbps
        self.down_mbps: float = profile.down_mbps
        self.rtt_s: float = profile.rtt_s
        self.worker_id = ""
        self.token = ""
        self.key = b""
        self.session = ""
        self.seqs: dict[str, int] = {}
        self.bytes_sent = 0
        self.bytes_received = 0
        self.answered_at = -1e18
        self.totals = Totals()
        self.gate: ZScoreGate | None = sim.config.build_policy("gate")
        # The trainer's shuffling stream, as an agent seeds it (from its worker id, at its first registration).
        self.rng: np.random.Generator | None = None
        self.opt_state: OptState | None = None
        self.global_steps = 0
        # FedAsync's proximal anchor when it is not the pulled version (rebased by an overlapped push).
        self.anchor: torch.Tensor | None = None
        self.version: int | None = None  # the pulled model (the since-pull base), held in the store
        self.baseline: int | None = None  # Hermes Alg. 2's w0: the first registration's model
        self.local: torch.Tensor | None = None  # own weights, only while they differ from ``version``
        self.carry: tuple[torch.Tensor, torch.Tensor] | None = None
        self.validation: tuple[torch.Tensor, torch.Tensor] | None = None
        # Device-local data (Task.local_data, or a split of the train set): built at the first registration.
        self.local_set: LocalSet | None = None
        self.outbox: Outbox | None = None
        self.works: list[Work] = []
        self.prefetch: asyncio.Task[list[Work] | None] | None = None
        self.heartbeat: asyncio.Task[None] | None = None  # this registration's heartbeat (the agent's thread)
        # overlap_push: the push in flight and the weights it carried.
        self.inflight: asyncio.Future[Message] | None = None
        self.inflight_pushed: torch.Tensor | None = None
        # overlap_pull: what is in flight is a pull asked for while the gate held, not a push.
        self.inflight_pull = False
        self.offline_at: float | None = None
        self._job: Job | None = None
        # compression.push: the agent's codec and its error-feedback residual, one per device for its life (the
        # agent builds it once, client.session.Job.from_registration); built at the first push.
        self.push_codec: Compressor | None = None
        self._own = _OwnWeights()
        self.last_report = -1e18
        self.stop_reason = ""
        # The agent process's exit code: 4 when its training diverged (client.cli).
        self.exit_code = 0
        self.nonfinite_in_a_row = 0

    # ---- time and churn ----------------------------------------------------------

    async def until(self, t: float) -> None:
        """Wait until ``t``; Offline when the device leaves before."""
        if self.offline_at is not None and self.offline_at <= t:
            await self.sim.driver.until(self.offline_at)
            raise Offline
        await self.sim.driver.until(t)

    async def busy(self, seconds: float, steps: int, *, slowed: bool = True, after_wait: bool = True,
                   samples: int = 0) -> float:
        """``seconds`` of this device's own work on the simulated host (sim/host.py), in ``steps`` steps, each its CPU
        burst on the shared cores and then its slowdown's sleep, as a testbed agent's; the virtual seconds it took.
        ``slowed=False``: work the testbed agent does not slow as a step (its gate's validation pass,
        ``LocalTrainer.evaluate``, has no ``_emulate_slowdown``): the CPU burst alone, and under
        ``HostSpec.nominal`` the sleep that stretches it to S x pace times its CPU (``Host.overhead_sleep``). A step that follows a block of the thread (the slowdown's
        sleep after each step; ``after_wait``: the reply it waited on before the first) is a woken sleeper's burst
        (HostSpec.sleeper)."""
        host = self.sim.host
        assert host is not None
        t0 = self.sim.driver.now()
        cpu, sleep = host.split(seconds, self.profile.flops)
        if not slowed:
            sleep = 0.0
        step_cpu = cpu / max(1, steps)
        for i in range(max(1, steps) if seconds > 0 else 0):
            t_step = self.sim.driver.now()
            burst = asyncio.ensure_future(host.run(step_cpu, woken=sleep > 0 or (i == 0 and after_wait)))
            if self.offline_at is None:
                await burst
            else:
                done, _ = await asyncio.wait({burst}, timeout=max(0.0, self.offline_at - self.sim.driver.now()))
                if not done:
                    burst.cancel()
                    await asyncio.gather(burst, return_exceptions=True)
                    raise Offline
            # The slowdown's sleep by the testbed's rule (HostSpec.floor / nominal: the agent's StepPacer); work
            # that is no training step is slowed only under nominal (LocalTrainer.pace_overhead).
            if slowed:
                pause = host.step_sleep(self.profile.device_id, self.profile.flops, samples / max(1, steps),
                                        self.sim.driver.now() - t_step, sleep / max(1, steps))
            else:
                pause = host.overhead_sleep(self.profile.device_id, self.profile.flops, step_cpu,
                                            self.sim.driver.now() - t_step)
            await self.until(self.sim.driver.now() + pause)
        return self.sim.driver.now() - t0

    async def request(self, type_: MsgType, body: dict[str, Any], **kw: Any) -> Message:
        """A data-plane request; Offline when the device leaves before the reply is back."""
        t0 = self.sim.driver.now()
        task = asyncio.ensure_future(self.sim.driver.request(self, type_, body, **kw))
        if self.offline_at is None:
            reply = await task
        else:
            done, _ = await asyncio.wait({task}, timeout=max(0.0, self.offline_at - t0))
            if not done:
                # The server still answers it, into the void.
                task.add_done_callback(_retrieve)
                raise Offline
            reply = task.result()
        self.totals.wait_seconds += self.sim.driver.now() - t0
        return reply

    # ---- life ---------------------------------------------------------------------

    async def run(self) -> None:
        current_device.set(self.index)  # this task's context, and every task it starts
        availability = self.profile.availability
        while not self.sim.over:
            now = self.sim.driver.now()
            if not availability.online(now):
                back = availability.next_change(now)
                if back is None:
                    return
                await self.sim.driver.until(back)
                continue
            self.offline_at = availability.next_change(now)
            try:
                await self.register()
                await self.train()
                await self.goodbye()
                return
            except LossNotFinite as exc:
                # The agent gives up (exit 4) after its last report and its leave.
                log.info("%s: %s", self.name, exc)
                self.stop_reason, self.exit_code = str(exc), 4
                await self.goodbye()
                return
            except Offline:
                self.totals.offline += 1
                self.forget_session()
            except ProtocolError as exc:
                if exc.code not in REJOIN_CODES:
                    raise
                log.debug("%s: %s; registering again", self.name, exc)
                self.forget_session()
            finally:
                if self.heartbeat is not None:
                    self.heartbeat.cancel()
                    self.heartbeat = None
                self.abandon_requests()

    def abandon_requests(self) -> None:
        """Requests still out when the device stops or restarts: their replies go nowhere (read, so
        asyncio does not report an exception nobody retrieved, e.g. a prefetch held for a slot)."""
        if self.prefetch is not None:
            self.prefetch.add_done_callback(_retrieve)
            self.prefetch = None
        if self.inflight is not None:
            self.inflight.add_done_callback(_retrieve)
            self.inflight, self.inflight_pushed = None, None

    def forget_session(self) -> None:
        """What a registration held is gone (the agent's process restarts its session)."""
        self.abandon_requests()
        self.works, self.carry = [], None
        if self.local is not None:
            self.totals.lost_cycles += 1
        self.local = None
        # Back, it registers again and pulls the global model: the pulled version is not needed meanwhile
        # (10,000 devices: 984 offline devices held one, 2026-11-27).
        self.sim.versions.release(self.version)
        self.version, self.anchor = None, None

    async def register(self) -> None:
        sim = self.sim
        await self.sim.driver.until(sim.driver.now() + self.link_seconds(REGISTER_BYTES[0], "up"))
        sim.engine.count_message("register")
        if sim.task.local_data is not None and self.local_set is None:
            # As an agent: its own set built before it registers, the gate's part held out (client.agent).
            try:
                self.local_set = LocalSet.build(sim.task, self.name)
            except LocalDataError as exc:
                raise DeviceDataError(str(exc)) from None
            self.local_set.configure(sim.config, gate=self.gate is not None)
        hints = Hints(flops=self.profile.flops, memory_available_bytes=int(self.profile.memory_mb * 2**20)).known()
        rec, _ = sim.engine.register(self.name, threads=1, device="cpu", slowdown=1.0, hints=hints,
                                     local_samples=0 if self.local_set is None else len(self.local_set))
        self.worker_id, self.token, self.key = rec.id, rec.token, rec.key
        self.session, self.seqs = f"s{sim.next_session()}", {}
        # The agent's Session starts its heartbeat before the first pull (client.session.Session): a pull held
        # for a training slot (concurrency.hold_pull) must not look like silence.
        self.heartbeat = asyncio.ensure_future(self.heartbeats(self.session))
        self.totals.registrations += 1
        if self.rng is None:
            self.rng = np.random.default_rng(zlib.crc32(rec.id.encode()))
        # A new registration starts from the global model: moments gathered before are stale.
        self.opt_state = None
        self.outbox = Outbox() if sim.combine else None
        await self.until(sim.driver.now() + self.link_seconds(REGISTER_BYTES[1], "down"))
        await self.pull(force=True)
        if self.baseline is None and self.version is not None:
            self.baseline = self.version
            sim.versions.hold(self.baseline)
        if self.gate is not None and self.validation is None:
            if self.local_set is not None:
                self.validation = self.local_set.validation()
            else:
                self.validation = await self.fetch_validation(sim.engine.membership.validation_shards_for(rec))

    def link_seconds(self, nbytes: int, direction: str) -> float:
        mbps = self.up_mbps if direction == "up" else self.down_mbps
        return self.sim.transfer(nbytes, mbps, self.rtt_s)

    async def heartbeats(self, session: str) -> None:
        """The agent's heartbeat thread: a beat each interval unless the data plane spoke for us."""
        interval = self.sim.heartbeat_interval
        while session == self.session and not self.sim.over:
            await asyncio.sleep(interval)
            now = self.sim.driver.now()
            if self.offline_at is not None and now >= self.offline_at:
                return
            if self.outbox is not None and now - self.answered_at < interval:
                continue
            try:
                routes.heartbeat(self.worker_id, x_hermes_token=self.token, engine=self.sim.engine)
            except HTTPException:
                return  # lost: the next data-plane request says "register again"

    async def goodbye(self) -> None:
        """The agent's last report and its leave (client.agent.Agent.run's finally)."""
        try:
            await self.request(MsgType.REPORT_STATS, request_body(self.stats_body(final=True)))
            await routes.leave(self.worker_id, x_hermes_token=self.token, engine=self.sim.engine)
        except (ProtocolError, HTTPException, Offline) as exc:
            # The agent exits either way; a device that goes offline while saying goodbye is simply gone
            # (1,000 devices under hermes: one that gave up on NaN losses went offline here and the
            # simulation ended in a traceback, 2026-11-27).
            log.debug("%s: goodbye not delivered: %r", self.name, exc)

    # ---- the model -------------------------------------------------------------------

    def weights(self) -> torch.Tensor:
        if self.local is not None:
            return self.local
        assert self.version is not None, "a session pulls the model before its first cycle"
        return self.sim.versions[self.version]

    def swap_in(self) -> None:
        trainer = self.sim.trainer
        load_flat(trainer.model, self.weights())
        load_state(trainer, self.opt_state)
        assert self.rng is not None
        trainer.rng = self.rng

    def swap_out(self) -> None:
        self.opt_state = state_of(self.sim.trainer)

    def cycle_inputs(self, x: torch.Tensor, y: torch.Tensor, work: Work) -> CycleInputs:
        """What the executor trains this cycle from (sim.executor): nothing of the device is shared with it."""
        assert self.rng is not None and self.version is not None
        anchor = None
        if self.sim.proximal:
            anchor = self.anchor if self.anchor is not None else self.sim.versions[self.version]
        return CycleInputs(weights=self.weights(), opt_state=self.opt_state, rng_state=dict(self.rng.bit_generator.state),
                           global_steps=self.global_steps, anchor=anchor, x=x, y=y, lr=work.lr,
                           batch_size=work.batch_size, accumulation=work.accumulation)

    def take_cycle_outputs(self, out: CycleOutputs) -> None:
        assert self.rng is not None
        self.local, self.opt_state, self.global_steps = out.weights, out.opt_state, out.global_steps
        self.rng.bit_generator.state = out.rng_state

    def adopt(self, reply: Message, pushed: torch.Tensor | None = None) -> None:
        """A pulled model (client.session.Session._adopt): the trainer loads it (``pushed``: rebased on it,
        client.overlap.rebase), the device keeps its version and, rebased, its own weights."""
        assert reply.payload is not None
        flat = reply.payload.flat()
        codec = reply.header.body.get("codec")
        if codec is not None:  # compression.pull int8 (client.session.Session._adopt)
            flat = decode_codec(flat, CodecSpec.model_validate(codec), self.sim.engine.spec.shapes)
        elif flat.dtype != torch.float32:
            flat = flat.float()
        target = flat if pushed is None else rebase(flat, self.weights(), pushed)
        if self.opt_state is not None:
            # The trainer decides whether a jump this far resets the optimizer (LocalTrainer.load).
            self.swap_in()
            self.sim.trainer.load(target)
            self.swap_out()
        version = reply.header.model_version
        self.sim.versions.hold(version, flat)
        self.sim.versions.release(self.version)
        self.version, self.local = version, (None if pushed is None else target)
        # The trainer anchors its proximal term at what it loads (LocalTrainer.load).
        self.anchor = None if pushed is None or not self.sim.proximal else target

    async def pull(self, force: bool, pushed: torch.Tensor | None = None) -> None:
        body = request_body(PullModel(if_newer=not force, dtype=self.sim.pull_dtype, codec=self.sim.pull_codec))
        reply = await self.request(MsgType.PULL_MODEL, body, model_version=self.version or 0)
        self.totals.pulls += 1
        if reply.payload is not None:
            self.adopt(reply, pushed)

    async def fetch_validation(self, shards: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate's validation split, fetched as an agent fetches it (decoded once per distinct split)."""
        records = []
        for i in range(0, len(shards), MAX_SHARDS_PER_FETCH):
            ids = shards[i:i + MAX_SHARDS_PER_FETCH]
            reply = await self.request(MsgType.FETCH_SHARD, request_body(FetchShard(shards=ids, split="validation")))
            records.extend(_records(reply, parse_reply(Reply, reply.header.body, "SHARD"), ids))
        cached = self.sim.validation_cache.get(tuple(shards))
        if cached is None:
            samples = records_to_tensors(records)
            cached = samples if samples is not None else (torch.zeros((0,)), torch.zeros((0,)))
            self.sim.validation_cache[tuple(shards)] = cached
        return cached

    # ---- work -----------------------------------------------------------------------

    async def request_work(self) -> list[Work] | None:
        """One REQUEST_WORK (client.prefetch.Prefetcher._run); None: the server says stop."""
        request = RequestWork()
        if self.outbox is not None:
            cycles, stats = self.outbox.take()
            request = RequestWork(inline_shards=True, assignments=self.sim.config.assignments_per_request,
                                  cycles=cycles, stats=stats)
        reply = await self.request(MsgType.REQUEST_WORK, request_body(request), channel="prefetch")
        if parse_reply(Reply, reply.header.body, "WORK").stop:
            return None
        first = WorkReply.from_body(reply.header.body)
        assignments = [first, *(first.then or [])]
        inline: dict[int, Any] = {}
        if first.lengths is not None:
            shards = [s for w in assignments for s in w.shards]
            inline = dict(zip(shards, _records(reply, first, shards)))
        works = []
        # Each Work names its assignment as the agent's prefetcher does (client/prefetch.py): the server's claims
        # floor (server/engine/claims.py) times a cycle from it, and is off for a report that names none.
        for w in assignments:
            if w.data.source == "local":
                # The server sized the cycle; the device draws it from its own set (client.prefetch.Prefetcher._draw).
                assert self.local_set is not None and w.local_samples is not None, "a local run's device holds data"
                x, y = self.local_set.draw(w.local_samples)
                works.append(Work(epoch=w.epoch, shards=(), x=x, y=y, batch_size=w.batch_size, lr=w.lr,
                                  fetched_bytes=0, cycle_samples=w.local_samples, accumulation=w.accumulation,
                                  assignment=w.assignment))
                continue
            if w.shards and not all(s in inline for s in w.shards):
                for i in range(0, len(w.shards), MAX_SHARDS_PER_FETCH):
                    ids = list(w.shards[i:i + MAX_SHARDS_PER_FETCH])
                    r = await self.request(MsgType.FETCH_SHARD, request_body(FetchShard(shards=ids)),
                                           channel="prefetch")
                    inline.update(zip(ids, _records(r, parse_reply(Reply, r.header.body, "SHARD"), ids)))
            samples = records_to_tensors([inline[s] for s in w.shards])
            works.append(Work(epoch=w.epoch, shards=tuple(w.shards), x=None if samples is None else samples[0],
                              y=None if samples is None else samples[1], batch_size=w.batch_size, lr=w.lr,
                              fetched_bytes=0, cycle_samples=w.cycle_samples or None, accumulation=w.accumulation,
                              assignment=w.assignment))
        return works

    async def next_work(self) -> Work | None:
        """The next assignment; the request for the one after goes out at once (the prefetcher's depth 1)."""
        if not self.works:
            task = self.prefetch or asyncio.ensure_future(self.request_work())
            self.prefetch = None
            works = await self._wait(task)
            if works is None:
                return None
            self.works = works
        work = self.works.pop(0)
        if not self.works:
            self.prefetch = asyncio.ensure_future(self.request_work())
        return work

    async def _wait(self, task: asyncio.Future[Any]) -> Any:
        if self.offline_at is None:
            return await task
        done, _ = await asyncio.wait({task}, timeout=max(0.0, self.offline_at - self.sim.driver.now()))
        if not done:
            task.add_done_callback(_retrieve)
            raise Offline
        return task.result()

    # ---- cycles ---------------------------------------------------------------------

    def job(self) -> Job:
        """The agent's job, with this device's gate; without a gate, its trainer is the device's own weights
        (update_of reads them with ``flat()``): loading them into the shared trainer again is not needed."""
        if self._job is None:
            trainer = self.sim.job.trainer if self.gate is not None else cast("LocalTrainer", self._own)
            if self.sim.push_codec_name != "none":
                self.push_codec = self.sim.config.build_policy("compression", self.sim.push_codec_name)
            self._job = replace(self.sim.job, gate=self.gate, trainer=trainer, push_codec=self.push_codec)
        self._own.weights = self.local
        return self._job

    async def train(self) -> None:
        """client.loop.run_cycles with topology.PushPull, in virtual time."""
        sim = self.sim
        st = self.totals
        while not sim.over:
            work = await self.next_work()
            if work is None:
                self.stop_reason = "server asked to stop"
                break
            x, y, self.carry = take_cycle(self.carry, work)
            if len(y) == 0:
                continue
            # Launched when it starts in virtual time, taken when it ends: on Ray the cycles that
            # overlap in virtual time train in parallel (sim.executor).
            pending = sim.executor.submit(self.cycle_inputs(x, y, work))
            # The device's time, not this machine's: the cycle's FLOPs at the device's rate.
            compute = sim.compute_seconds(len(y), self.profile.flops)
            try:
                if sim.host is None:
                    await self.until(sim.driver.now() + compute)
                else:  # the testbed's shared cores (sim/host.py): the time it took is what the agent reports
                    steps = -(-len(y) // max(1, work.batch_size))
                    compute = await self.busy(compute * sim.host.cycle_factor(len(y), steps), steps, samples=len(y))
            except Offline:
                # Trained, then lost: the device's shuffling stream moved on all the same.
                self.take_cycle_outputs(sim.executor.result(pending))
                raise
            out = sim.executor.result(pending)
            self.take_cycle_outputs(out)
            result = replace(out.result, compute_seconds=compute)
            st.cycles += 1
            st.samples += result.samples
            st.compute_seconds += compute
            st.last_loss = result.loss
            if not math.isfinite(result.loss):
                if await self.drop_diverged(work, result):
                    self.stop_reason = "server asked to stop"
                    return
                continue
            self.nonfinite_in_a_row = 0
            if self.inflight is not None:
                if not self.inflight.done():
                    # overlap_push: the last push is not answered yet; this cycle's progress goes with the next.
                    await self.skipped(cycle_record(work, result, pushed=False, decision=IN_FLIGHT))
                    continue
                if await self.settle():
                    self.stop_reason = "server asked to stop"
                    return
            if self.gate is not None:
                await self.validate()
                self.swap_in()  # the gate scores the device's model in the trainer
            job = self.job()
            cycle, decision, _ = judge_cycle(job, self.validation, work, result)
            update = None
            if decision is None or decision.push:
                reference = sim.versions[self.baseline if job.from_baseline else self.version]  # type: ignore[index]
                pushed, delta, update = update_of(job, reference, result, cycle,
                                                  base_version=self.baseline if job.from_baseline else None)
            if self.gate is not None:
                self.swap_out()
            if update is None:
                assert decision is not None
                st.gate_skips += 1
                await self.skipped(cycle)
                if decision.resync:
                    await self.pull(force=True)
                    self.opt_state = None
                    st.resyncs += 1
                elif sim.config.overlap_pull and self.outbox is not None and self.inflight is None:
                    self.send_pull()
                continue
            if self.outbox is not None:
                cycles, stats = self.outbox.take()
                update = update.model_copy(update={"pull": True, "pull_dtype": sim.pull_dtype,
                                                   "cycles": cycles, "stats": stats, "pull_codec": sim.pull_codec})
            overlap = sim.config.overlap_push and self.outbox is not None
            send = sim.driver.request(self, MsgType.PUSH_UPDATE, request_body(update), payload=delta,
                                      model_version=self.version or 0,
                                      shapes=() if update.codec is not None else sim.engine.spec.shapes,
                                      channel="overlap" if overlap else "main")
            if overlap:
                # Sent; the next cycle trains meanwhile (client.overlap.OverlappedPush).
                self.inflight, self.inflight_pushed = asyncio.ensure_future(send), pushed
                await self.report_if_due()
                continue
            if await self.receive(await self._wait(asyncio.ensure_future(send)), None):
                self.stop_reason = "server asked to stop"
                return
            await self.report_if_due()
        if self.inflight is not None:
            # The last push counts; its reply may say stop, the loop is over anyway.
            await self._wait(self.inflight)
            await self.settle()

    async def validate(self) -> None:
        """The time of the gate's pass over the validation split (``judge_cycle``'s ``trainer.evaluate``).

        Only a cycle the gate judges pays it: one that ends with a push in flight is reported ``in-flight``
        unjudged (client.topology.PushPull._exchange), as is a diverged one. On the testbed's `lte` runs a
        hermes agent's in-flight cycles took 0.057 s end to end and its judged ones 0.10-0.11 s (worker-1,
        S = 16, 64 samples, 2026-11-28); charging every cycle the pass made the simulated ones 0.088 s each."""
        sim = self.sim
        assert self.validation is not None, "the gate's validation split is fetched when a session begins"
        seconds = sim.eval_seconds(len(self.validation[1]), self.profile.flops)
        if sim.host is None:
            await self.until(sim.driver.now() + seconds)
        else:  # the validation follows the training: after a sleep only if the agent is slowed
            await self.busy(seconds, 1, slowed=False, after_wait=sim.host.split(1.0, self.profile.flops)[1] > 0)

    async def drop_diverged(self, work: Work, result: Any) -> bool:
        """client.topology.PushPull._drop_diverged: a cycle whose loss is NaN or infinite is not pushed (the
        server refuses such a push), the global model is taken again; MAX_NONFINITE in a row and the device
        gives up (LossNotFinite). True when an overlapped push's reply says stop."""
        st = self.totals
        if self.inflight is not None:
            await self._wait(self.inflight)  # its reply still counts; the model it brings is replaced below
            if await self.settle():
                return True
        self.nonfinite_in_a_row += 1
        st.nonfinite_cycles += 1
        await self.skipped(cycle_record(work, result, pushed=False, decision=LOSS_NOT_FINITE))
        if self.nonfinite_in_a_row >= MAX_NONFINITE:
            raise LossNotFinite(f"the local loss was not finite in {self.nonfinite_in_a_row} cycles in a row (last "
                                f"{result.loss} after {result.steps} steps), each retried from the global model")
        await self.pull(force=True)
        self.local, self.opt_state = None, None
        return False

    def send_pull(self) -> None:
        """overlap_pull (client.topology.PushPull._pull_held): the newer model asked for in the background; the
        unpushed change is the device's weights less the base it trained from, which it is rebased with."""
        body = request_body(PullModel(if_newer=True, dtype=self.sim.pull_dtype, codec=self.sim.pull_codec))
        send = self.sim.driver.request(self, MsgType.PULL_MODEL, body, model_version=self.version or 0,
                                       channel="overlap")
        self.inflight, self.inflight_pushed = asyncio.ensure_future(send), self.sim.versions[self.version]  # type: ignore[index]
        self.inflight_pull = True

    async def settle(self) -> bool:
        """The overlapped push's reply, rebased on; True when it says stop."""
        assert self.inflight is not None
        reply, pushed = self.inflight.result(), self.inflight_pushed
        self.inflight, self.inflight_pushed = None, None
        if self.inflight_pull:
            self.inflight_pull = False
            self.totals.pulls += 1
            if reply.payload is not None:
                self.adopt(reply, pushed)
            return False
        return await self.receive(reply, pushed)

    async def skipped(self, cycle: Any) -> None:
        """A cycle the gate did not push (Agent.note_skipped_cycle)."""
        if self.outbox is not None:
            self.outbox.add_cycle(cycle)
        else:
            await self.request(MsgType.REPORT_STATS, request_body(self.stats_body(cycle=cycle)))

    def receive_now(self, reply: Message, pushed: torch.Tensor | None) -> bool | None:
        """PushPull._receive without its pull: True, stop; False, done; None, a pull is needed."""
        st = self.totals
        st.pushes += 1
        answer = parse_reply(PushReply, reply.header.body, "PUSH_REPLY")
        if answer.status == "applied":
            st.applied += 1
            st.last_refusal = ""
        else:
            # PushPull._receive's account: refused for what it was, or because the run is stopping.
            st.rejected += 1
            reason = answer.reason or ""
            st.refused += answer.status == "rejected" and reason != "run is stopping"
            st.quarantined_refusals += "quarantine" in reason
            st.last_refusal = reason
        if answer.stop:
            return True
        if self.outbox is not None and answer.model == "included" and reply.payload is not None:
            self.adopt(reply, pushed)
            st.pulls += 1
            return False
        if self.outbox is not None and answer.model == "unchanged":
            st.pulls += 1
            return False
        return None

    async def receive(self, reply: Message, pushed: torch.Tensor | None) -> bool:
        """PushPull._receive: count the reply, load the model it brings or pull; True when it says stop."""
        done = self.receive_now(reply, pushed)
        if done is None:
            await self.pull(force=False, pushed=pushed)
            return False
        return done

    def stats_body(self, *, final: bool = False, cycle: Any = None) -> ReportStats:
        st = self.totals
        return ReportStats(samples=st.samples, compute_seconds=st.compute_seconds, wait_seconds=st.wait_seconds,
                           bytes_sent=self.bytes_sent, bytes_received=self.bytes_received, precision=self.sim.precision,
                           final=final, cycle=cycle)

    async def report_if_due(self) -> None:
        now = self.sim.driver.now()
        if now - self.last_report < self.sim.config.stats_interval_seconds:
            return
        self.last_report = now
        if self.outbox is None:
            await self.request(MsgType.REPORT_STATS, request_body(self.stats_body()))
        else:
            self.outbox.set_stats(self.stats_body())


class _OwnWeights:
    """The device's trained weights where update_of asks a trainer for them (``flat()``)."""

    weights: torch.Tensor | None = None

    def flat(self) -> torch.Tensor:
        assert self.weights is not None, "a cycle's weights are kept before its push is made"
        return self.weights


def _records(reply: Message, body: Any, shards: list[int]) -> list[Any]:
    """The shard records a reply carries back to back, cut by its ``lengths``."""
    raw = reply.payload.flat().numpy() if reply.payload is not None else np.zeros(0, np.uint8)
    view = raw.data
    lengths = getattr(body, "lengths", None) or reply.header.body.get("lengths") or [len(raw)]
    out, offset = [], 0
    for shard, length in zip(shards, lengths):
        record = decode_record(view[offset:offset + length])
        if record.shard != shard:
            raise ProtocolError(ErrorCode.MALFORMED, f"asked for shard {shard}, got shard {record.shard}")
        out.append(record)
        offset += length
    return out


def _retrieve(task: asyncio.Future[Any]) -> None:
    """An abandoned request's outcome, read so asyncio does not warn that nobody did."""
    if not task.cancelled():
        task.exception()
