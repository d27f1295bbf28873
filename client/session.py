"""One registration of the agent with the server, and what the first one fixes for the run.

A ``Session`` is everything that lives exactly as long as the server
knows this worker under one id: the id and token, the server's clock for
signing, the data-plane client, the heartbeat, the prefetcher, the
collective rendezvous and group, the samples carried to the next cycle and
the model version trained from. When the server forgets the worker (it was
marked lost, or restarted) the agent closes the session and opens a new one.

A ``Job`` is what the first registration tells the agent about the run and
never changes afterwards: the model, the run config, precision, the gate.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import zmq
from torch import nn

from hermes.client.collective import CollectiveGroup
from hermes.client.heartbeat import Heartbeat
from hermes.client.local_data import LocalSet
from hermes.client.overlap import rebase
from hermes.client.precision import PrecisionChoice, pick_precision
from hermes.client.precision import cache_path as precision_cache_path
from hermes.client.prefetch import Prefetcher, Work
from hermes.client.shard_fetch import ShardStats
from hermes.client.trainer import LocalTrainer, resolve_precision
from hermes.client.transport import ControlClient, DataClient, TrafficCounter
from hermes.common.codecs import Compressor
from hermes.common.codecs import decode as decode_codec
from hermes.common.config import RunConfig
from hermes.common.control_messages import CollectiveRendezvous, HeartbeatReply, RegisterResponse
from hermes.common.messages import (
    MAX_CYCLES_PER_MESSAGE,
    CycleReport,
    KafkaRanges,
    PrecisionName,
    PullModel,
    PushReply,
    Reply,
    ReportStats,
    parse_reply,
    request_body,
)
from hermes.common.pace import SlowdownMode
from hermes.common.policies import base as policies
from hermes.common.policies.compression import CodecSpec
from hermes.common.policies.gate import ZScoreGate
from hermes.common.signing import ServerClock
from hermes.common.task import Task
from hermes.common.task_registry import example_batch
from hermes.common.tensors import ModelSpec, build_checked
from hermes.common.wire import MsgType, dtype_from_name

log = logging.getLogger(__name__)

# compression.pull codecs that are pull dtypes on the wire (PullModel.dtype).
_PULL_DTYPES = {"fp16": "float16", "bf16": "bfloat16"}


def pull_encoding(config: RunConfig) -> tuple[str, CodecSpec | None]:
    """compression.pull as a pull asks for it: (PullModel.dtype, PullModel.codec). fp16/bf16 travel as the
    pull dtype, int8 as a codec (the server quantises); the simulator's devices ask the same way."""
    pull = config.pull_codec
    return (_PULL_DTYPES.get(pull, "float32"),
            CodecSpec(name="int8", chunk=config.int8.chunk) if pull == "int8" else None)


def finite_or_none(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


Samples = tuple[torch.Tensor, torch.Tensor]


def take_cycle(carry: Samples | None, work: Work) -> tuple[torch.Tensor, torch.Tensor, Samples | None]:
    """This cycle's samples (the carry first, then the work's) and the new carry (Session.cycle_samples)."""
    parts = [p for p in (carry, (work.x, work.y) if work.x is not None and work.y is not None else None) if p is not None]
    if not parts:
        return torch.zeros((0,)), torch.zeros((0,), dtype=torch.int64), None
    x = torch.cat([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    y = torch.cat([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    n = len(y) if work.cycle_samples is None else min(work.cycle_samples, len(y))
    return x[:n], y[:n], ((x[n:], y[n:]) if n < len(y) else None)


@dataclass
class AgentStats:
    """The agent's own account of its work, reported to the server and returned by ``Agent.run``."""

    started: float
    cycles: int = 0
    samples: int = 0
    compute_seconds: float = 0.0
    wait_seconds: float = 0.0
    pushes: int = 0
    applied: int = 0
    rejected: int = 0
    pulls: int = 0
    last_loss: float = float("nan")
    gate_skips: int = 0
    # zscore.resync_factor: times the local model diverged and the global one was taken again.
    resyncs: int = 0
    # Cycles whose local loss was not finite: dropped, and the global model taken again.
    nonfinite_cycles: int = 0
    # Pushes the server refused for what they were (screening, staleness): not abandoned at a stop.
    refused: int = 0
    # Pushes the server refused because this worker is quarantined, and the last reason it gave.
    quarantined_refusals: int = 0
    last_refusal: str = ""
    # All-reduce bytes of the collective generations already closed.
    collective_bytes: int = 0


@dataclass(frozen=True)
class Job:
    """What the first registration says about the run; fixed for the agent's life."""

    spec: ModelSpec
    config: RunConfig
    precision: str
    wire_dtype: torch.dtype
    trainer: LocalTrainer
    gate: ZScoreGate | None
    # Loss-weighted aggregation (Hermes Alg. 2) takes G = w_local - w0, the
    # change since the initial model; the other rules take the change since
    # the last pulled model.
    from_baseline: bool
    validation_shards: list[int]
    data_source: KafkaRanges
    # How precision was chosen, with the step timings when measured (precision auto).
    precision_choice: PrecisionChoice | None = None
    # The agent's own copy of the task (never sent), and its local data when the task has some.
    task: Task | None = None
    local_data: Any = None
    # compression.push: the codec (with its error-feedback residual) every push of this agent's life goes through.
    push_codec: Compressor | None = None

    def example(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """n (input, target) pairs shaped like the task's data: for the memory probe."""
        assert self.task is not None
        return example_batch(self.task, n, self.local_data)

    @classmethod
    def from_registration(cls, session: Session, device: torch.device,
                          slowdown: float, task: Task, model: nn.Module | None = None,
                          local_data: Any = None, slowdown_mode: SlowdownMode = "cpu",
                          nominal_sample_ms: float | None = None) -> Job:
        """The job of the first registration; ``model`` is the task's model the start-up check built."""
        reg, config, worker_id = session.reg, session.config, session.worker_id
        spec = ModelSpec.from_dict(reg.model_spec)
        built = model
        model = build_checked(task.model if built is None else (lambda: built), spec)

        def example(n: int) -> tuple[torch.Tensor, torch.Tensor]:
            return example_batch(task, n, local_data)

        # Timed on copies of the model before training starts: the model itself is untouched.
        choice = pick_precision(config.precision, model, example, config.batch_size, device, loss=task.loss,
                                optimizer=task.optimizer,
                                cache=precision_cache_path())
        precision = resolve_precision(choice.precision, device)
        trainer = LocalTrainer(
            model, lr=config.lr, momentum=config.momentum,
            weight_decay=config.weight_decay, device=device, precision=precision,
            slowdown=slowdown, seed=zlib.crc32(worker_id.encode()), loss=task.loss, optimizer=task.optimizer,
            reset_jump=config.optimizer_reset_jump, proximal_rho=config.proximal_rho(),
            train_step=task.train_step, transform=task.transform, slowdown_mode=slowdown_mode,
            nominal_sample_seconds=None if nominal_sample_ms is None else nominal_sample_ms / 1000.0,
        )
        gate: ZScoreGate | None = config.build_policy("gate")
        return cls(spec=spec, config=config, precision=precision, wire_dtype=dtype_from_name(config.wire_dtype),
                   trainer=trainer, gate=gate, from_baseline=config.pushes_from_baseline(),
                   validation_shards=list(reg.validation_shards),
                   data_source=reg.source(), precision_choice=choice,
                   task=task, local_data=local_data,
                   push_codec=policies.build("compression", config.compression.push, config.core, config.sections()))


class Outbox:
    """What the agent's next push or work request carries (combine_messages): the gate-skipped
    cycles since its last message and the latest stats, each once. The training loop fills
    it; the loop's push or the prefetcher's work request, whichever goes first, empties it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cycles: list[CycleReport] = []
        self._stats: ReportStats | None = None

    def add_cycle(self, cycle: CycleReport) -> None:
        with self._lock:
            # The server takes MAX_CYCLES_PER_MESSAGE at a time; older ones are dropped (the
            # allocator weighs recent cycles, and a message goes out at least every cycle).
            self._cycles = [*self._cycles[-(MAX_CYCLES_PER_MESSAGE - 1):], cycle]

    def set_stats(self, body: ReportStats) -> None:
        with self._lock:
            self._stats = body

    def take(self) -> tuple[list[CycleReport] | None, ReportStats | None]:
        """The cycles and the stats to send now (None for what is not pending)."""
        with self._lock:
            cycles, stats = self._cycles or None, self._stats
            self._cycles, self._stats = [], None
            return cycles, stats


class Session:
    """One registration: its secrets, connections, heartbeat, prefetcher and collective group."""

    def __init__(self, reg: RegisterResponse, *, quick_control: ControlClient, context: zmq.Context,
                 traffic: TrafficCounter, shard_stats: ShardStats, cancel: threading.Event, request_timeout: float,
                 kafka_bootstrap: str | None, on_lost: Callable[[str], None],
                 previous: Session | None = None, local: LocalSet | None = None) -> None:
        self.reg = reg
        # This registration's run config (the first one's is the Job's).
        self.config = RunConfig(**reg.run_config)
        self.worker_id = reg.worker_id
        self.token = reg.token
        self.address = reg.data_plane
        self.rendezvous: CollectiveRendezvous | None = reg.collective
        self.clock = ServerClock(reg.server_time_ms)
        self.max_message_bytes = reg.max_message_bytes or 2**62
        self._context, self._traffic, self._cancel = context, traffic, cancel
        self._request_timeout = request_timeout
        self.shard_stats = shard_stats
        self.data = self.data_client()
        # Only where the server says it combines (older servers do not send the key) and in the
        # parameter-server topology (a collective rank reports every cycle itself).
        self.combine = ("combine_messages" in self.config.model_fields_set and self.config.combine_messages
                        and not self.rendezvous)
        self.outbox: Outbox | None = Outbox() if self.combine else None
        self.pull_dtype, self.pull_codec = pull_encoding(self.config)
        self.shapes = ModelSpec.from_dict(reg.model_spec).shapes
        self.prefetcher = Prefetcher(self.data_client, stats=shard_stats, kafka_bootstrap=kafka_bootstrap, local=local,
                                     combine=self.combine,
                                     carried=self.outbox.take if self.outbox is not None else None,
                                     assignments=self.config.assignments_per_request)
        if previous is not None:
            # The waits are the agent's, not the registration's: they add up over rejoins.
            self.prefetcher.wait_seconds = previous.prefetcher.wait_seconds
            self.prefetcher.first_wait_seconds = previous.prefetcher.first_wait_seconds
        # The model version this worker trains from, and that model (the pull's base).
        self.version: int = previous.version if previous is not None else 0
        self.base: torch.Tensor | None = previous.base if previous is not None else None
        # Samples of the last assignment beyond its cycle: trained first next cycle. The
        # server's account of them starts over with a new registration, so does ours.
        self.carry: tuple[torch.Tensor, torch.Tensor] | None = None
        # Topology collective: the current generation's group (the heartbeat may abort it).
        self.group: CollectiveGroup | None = None
        self.last_report: float = previous.last_report if previous is not None else 0.0
        self.heartbeat = Heartbeat(quick_control, self.worker_id, self.token,
                                   interval=reg.heartbeat_interval_seconds,
                                   on_lost=on_lost, on_reply=self._heartbeat_reply,
                                   heard_within=self._heard_within if self.combine else None)
        self.heartbeat.start()

    def _heard_within(self, seconds: float) -> bool:
        return time.monotonic() - self._traffic.answered_at < seconds

    def data_client(self) -> DataClient:
        return DataClient(self.address, self.worker_id, self.token, timeout=self._request_timeout,
                          counter=self._traffic, context=self._context, clock=self.clock,
                          max_message_bytes=self.max_message_bytes, cancel=self._cancel)

    def _heartbeat_reply(self, reply: HeartbeatReply) -> None:
        """Heartbeat thread: the server says our collective generation broke (we may be stuck in
        gloo's recv from a dead peer until the group timeout): give up on it now."""
        broken = reply.collective_broken
        group = self.group
        if broken is not None and group is not None and group.rv.generation == broken:
            group.abort(f"the server reports that collective generation {broken} broke")

    def close(self) -> None:
        """Stop the background work; the data client stays open for a last report."""
        self.prefetcher.stop()
        self.heartbeat.stop()

    def cycle_samples(self, work: Work) -> tuple[torch.Tensor, torch.Tensor]:
        """Exactly the samples this cycle asks for: the carry from the last cycle first, then the new shards.

        Shards are whole while workloads are not; what is left over is trained
        next cycle (the server counts it the same way and sends less).
        """
        x, y, self.carry = take_cycle(self.carry, work)
        return x, y

    def pull(self, trainer: LocalTrainer, stats: AgentStats, force: bool, pushed: torch.Tensor | None = None,
             *, base: bool = False) -> None:
        """The global model, loaded into the trainer, when it is newer than ours (always with ``force``);
        ``pushed``: rebased on it instead (overlap_push); ``base``: the server keeps it as this
        worker's base (from-baseline presets, server/engine/bases.py)."""
        t0 = time.perf_counter()
        request = PullModel(if_newer=not (force or base), dtype=self.pull_dtype, base=base, codec=self.pull_codec)
        reply = self.data.request(MsgType.PULL_MODEL, request_body(request), model_version=self.version)
        stats.wait_seconds += time.perf_counter() - t0
        stats.pulls += 1
        if reply.payload is None:
            return  # unchanged: keep training from our own model against the same base
        self._adopt(trainer, reply, pushed)

    def load_model_reply(self, trainer: LocalTrainer, reply: Any, answer: PushReply,
                         pushed: torch.Tensor | None = None, *, local: torch.Tensor | None = None) -> bool:
        """A push reply that answered the pull too (combine_messages); False: it did not, pull. ``local``: the
        local model's flat vector, when the caller has it (``LocalTrainer.load``)."""
        if answer.model == "included" and reply.payload is not None:
            self._adopt(trainer, reply, pushed, local)
            return True
        return answer.model == "unchanged"

    def load_pull_reply(self, trainer: LocalTrainer, reply: Any, pushed: torch.Tensor) -> None:
        """A pull's reply taken later (overlap_pull): rebased on (``pushed``: the base the local model trained
        from) when it brings a newer model."""
        if reply.payload is not None:
            self._adopt(trainer, reply, pushed)

    def _adopt(self, trainer: LocalTrainer, reply: Any, pushed: torch.Tensor | None,
               local: torch.Tensor | None = None) -> None:
        # No copy: the tensor views the received frame, which it keeps alive (torch.frombuffer holds
        # the buffer), and nothing writes to it; deltas are computed as new tensors.
        flat = reply.payload.flat()
        codec = reply.header.body.get("codec")
        if codec is not None:  # compression.pull int8
            flat = decode_codec(flat, CodecSpec.model_validate(codec), self.shapes)
        elif flat.dtype != torch.float32:  # pull_dtype: trained, and measured from, in fp32
            flat = flat.float()
        if pushed is None:
            trainer.load(flat, local=local)
        else:
            trainer.load(rebase(flat, trainer.flat(), pushed))
        self.version, self.base = reply.header.model_version, flat

    def stats_body(self, stats: AgentStats, precision: str, *, final: bool = False,
                   precision_timings: dict[str, float] | None = None, cycle: CycleReport | None = None,
                   memory_profile: list[tuple[int, int]] | None = None) -> ReportStats:
        """The REPORT_STATS body: the agent's running totals (and a cycle, a memory profile)."""
        self.last_report = time.monotonic()
        return ReportStats(
            samples=stats.samples,
            compute_seconds=stats.compute_seconds,
            wait_seconds=stats.wait_seconds + self.prefetcher.wait_seconds,
            prefetch_wait_seconds=self.prefetcher.wait_seconds,
            prefetch_wait_steady_seconds=self.prefetcher.steady_wait_seconds,
            **self.shard_stats.report(),
            bytes_sent=self._traffic.bytes_sent,
            bytes_received=self._traffic.bytes_received,
            precision=precision,
            final=final,
            # Milliseconds per step by precision (precision auto); None when not measured.
            # The keys are precision.candidates(); the model checks them.
            precision_timings_ms=cast("dict[PrecisionName, float]", precision_timings) or None,
            collective_bytes=(stats.collective_bytes + (self.group.reduced_bytes if self.group else 0)
                              if self.rendezvous else None),
            cycle=cycle,
            memory_profile=None if memory_profile is None else [list(p) for p in memory_profile],
        )

    def report(self, stats: AgentStats, precision: str, *, final: bool = False, cycle: CycleReport | None = None,
               memory_profile: list[tuple[int, int]] | None = None,
               precision_timings: dict[str, float] | None = None) -> bool:
        """Send the stats (and a cycle); True when the server's reply says the run is stopping."""
        body = self.stats_body(stats, precision, final=final, precision_timings=precision_timings, cycle=cycle,
                               memory_profile=memory_profile)
        try:
            reply = self.data.request(MsgType.REPORT_STATS, request_body(body), timeout=5.0 if final else None)
            return parse_reply(Reply, reply.header.body, "STATS_ACK").stop
        except Exception as exc:
            if not final:
                raise
            log.info("final stats report not delivered: %s", exc)
        return False
