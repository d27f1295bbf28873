"""The training engine: owns the model and the step, asks the policies, folds updates.

The data plane hands it decoded-but-untrusted messages (``handlers``); it
consults the sync strategy and the aggregation rule, folds, and wakes held
replies. The other rooms: ``membership`` (who trains, with how much work),
``collective`` (the all-reduce group's coordinator), ``kafka`` (shard
records in a broker), ``reporting`` (status, summary, the run's end files),
``telemetry`` (one ``emit`` per fact), ``policies`` (the one factory). It
never touches a socket. Tensor work (checksums, finiteness, axpy,
snapshots) runs in executor threads when it is big, so the event loop keeps
serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.config import RunConfig
from hermes.common.messages import WorkReply
from hermes.common.policies.sync import Decision, PushInfo
from hermes.common.shards import ShardQueue
from hermes.common.task import Direction, Task
from hermes.common.task_registry import batch_of, resolve_task
from hermes.common.tensors import flatten, spec_of
from hermes.common.wire import Header, Payload, dtype_from_name
from hermes.server.auth import ReplayGuard
from hermes.server.engine import folding, persist
from hermes.server.engine.collective import Collective
from hermes.server.engine.handlers import Handlers
from hermes.server.engine.kafka import KafkaPublisher
from hermes.server.engine.local import LOCAL_DSS_MAX, LocalAccount, local_data_refusal
from hermes.server.engine.membership import Membership
from hermes.server.engine.offload import offload
from hermes.server.engine.policies import Contribution, Policies, build_policies
from hermes.server.engine.reporting import Reporting
from hermes.server.engine.screening import Screening, ScreeningSettings
from hermes.server.engine.start_gate import StartGate
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation, Evaluator, TargetReached
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import load_splits, split_stores
from hermes.server.state import ModelState

log = logging.getLogger(__name__)


@dataclass
class Held:
    """A push whose reply waits for a barrier (and, buffered, whose update waits to be folded)."""

    info: PushInfo
    payload: Payload | None
    reply: asyncio.Future
    candidate_loss: float | None = None


class Engine:
    def __init__(
        self,
        config: RunConfig,
        *,
        metrics: ServerMetrics,
        events: EventLog,
        max_workers: int,
        max_message_bytes: int,
        out_dir: str | None = None,
        replay_window_seconds: float = 300.0,
        splits: tuple[Any, Any, Any] | None = None,
        task: Task | None = None,
        state: ModelState | None = None,
        policies: Policies | None = None,
        checkpoints: Any = None,
        clock: Clock = SYSTEM_CLOCK,
        screening: ScreeningSettings | None = None,
    ) -> None:
        """Everything but the config can be injected (tests); by default the run config builds it."""
        self.config = config
        self.clock = clock
        self.telemetry = Telemetry(metrics, events)
        self.metrics = metrics
        self.events = events
        self.max_message_bytes = max_message_bytes
        self.out_dir = Path(out_dir) if out_dir else None
        # The task (resolved and checked by the app factory, or here from the config).
        self.task = task if task is not None else resolve_task(config.task, config)
        # Device-local data (task.local_data): agents train on their own samples, the server
        # sizes how many per cycle and no shard of training data is ever served.
        self.local_data = self.task.local_data is not None
        if self.local_data and (why := local_data_refusal(config)) is not None:
            raise ValueError(f"preset {config.preset!r} cannot train on device-local data: {why}")
        self.train, self.validation, self.test = splits if splits is not None else load_splits(config, self.task)
        self.state = state if state is not None else self._initial_state()
        self.spec = self.state.spec
        self.policies = policies if policies is not None else build_policies(
            config, spec=self.spec, state=self.state,
            train_samples=LOCAL_DSS_MAX if self.local_data else len(self.train), validation=self.validation,
            metrics=metrics, task=self.task)
        self.registry = Registry(max_workers, clock=clock)
        metrics.watch_workers(self.registry.all)
        # Records name their data set: the built-in sets' own names (as before), else the task's.
        self.shards, self.validation_shards = split_stores(self.train, self.validation, self.test, config.shard_size,
                                                           self.task.name or config.dataset)
        # Local data: no shard ids to hand out, but the queue still keeps the epoch account
        # (one "shard" per shard_size samples assigned; see Membership.assign).
        self.queue = ShardQueue(self.shards.num_shards or 1, seed=config.seed)
        # Shard record bytes the data plane sent, by split (0 with local data: nothing is served).
        self.shard_bytes_served = {"train": 0, "validation": 0}
        self.local = LocalAccount(self)
        self.evaluator = Evaluator(
            self.task, self.spec, self.state, self.test, max_samples=config.eval_max_samples,
            interval=config.eval_interval_seconds, seed=config.seed, on_result=self._evaluated, clock=clock,
            primary=self.primary_metric(),
        )
        # The run's clock: started_at moves forward by the downtime on a resume, so
        # clock.time() - started_at counts training seconds only (downtime_seconds apart).
        self.started_at = clock.time()
        self.downtime_seconds = 0.0
        self.stopping = False
        self.stop_reason = ""
        # Called with the reason once the run stops (not on SIGTERM's shutdown): --exit-when-done.
        self.on_stop: list[Callable[[str], None]] = []
        self._budget_timer: asyncio.TimerHandle | None = None
        # The budget that stopped the run (max_updates, max_epochs, max_seconds), if one did.
        self.budget_reached: str | None = None
        self.target_reached: TargetReached | None = None
        # The loop that owns the held replies: evaluations run in the
        # evaluator's thread and must hand a stop over to it (set in start()).
        self._loop: asyncio.AbstractEventLoop | None = None
        # SIGTERM: unlike a stop, the run goes on after a restart, so agents
        # are told "unavailable" (retry) rather than "stop".
        self.shutting_down = False
        self.replay = ReplayGuard(replay_window_seconds, clock=clock)
        # Set by the app when checkpoints are on (hermes.server.checkpoint): record_fold journals each fold.
        self.checkpoints: Any = checkpoints
        self.resumed_from: dict[str, Any] | None = None
        self.held: dict[str, Held] = {}
        self.buffered: list[Contribution] = []  # BUFFER_AND_REPLY: acknowledged, folded by the next release
        # Every request a worker sends, by type: the "API calls" of Hermes Table III. Data-plane
        # types (authenticated) and the control plane's (register, heartbeat, leave, regroup).
        self.message_counts: dict[str, int] = {}
        # Requests that did not need sending (combine_messages): what rode on another, by the type it replaced.
        self.carried_counts: dict[str, int] = {}
        # One model step at a time; a checkpoint holds it so model, version and queue agree.
        self.step_lock = asyncio.Lock()
        self.membership = Membership(self)
        self.collective = Collective(self)
        self.kafka = KafkaPublisher(self)
        self.reporting = Reporting(self)
        self.handlers = Handlers(self)
        self.screening = Screening(screening or ScreeningSettings(), self.state, self.telemetry,
                                   self.policies.aggregation.reference_loss,
                                   blend=self.policies.aggregation.op == "blend")
        self.start_gate = StartGate(self)
        self.metrics.model_version.set(0)

    def _initial_state(self) -> ModelState:
        # Replicas start from identical weights: the server builds the seeded
        # initial model and every agent pulls it before its first step.
        torch.manual_seed(self.config.seed)
        model = self.task.model()
        # A label for people: the built-in model's config name, else the model's class.
        label = self.config.model if self.task.name == "builtin" else type(model).__name__
        sample = batch_of(self.test, [0])[0] if len(self.test) else torch.empty(0)
        spec = spec_of(model, label, task=self.task.name, input_shape=tuple(sample.shape[1:]))
        return ModelState(spec, flatten(model))

    def primary_metric(self) -> tuple[str, Direction]:
        """What "best" means for this run (Reporting.primary_metric)."""
        return Reporting.primary_metric(self.config, self.task)

    # The policies, by the names the rooms use.
    @property
    def strategy(self):
        return self.policies.sync

    @property
    def allocator(self):
        return self.policies.allocator

    @property
    def epoch_progress(self) -> float:
        """Epochs of training data handed out so far (fractional): the shard queue's, or the local sets'."""
        return self.local.progress if self.local_data else self.queue.progress

    @property
    def version(self) -> int:
        return self.state.version

    def elapsed(self) -> float:
        """Seconds since the run started, as events and workload histories stamp them."""
        return round(self.clock.time() - self.started_at, 3)

    def throughput(self, worker_id: str) -> float | None:
        rec = self.registry.get(worker_id)
        return rec.throughput() if rec is not None else None

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # started outside a loop (tests): stops run inline
            self._loop = None
        self.evaluator.start()
        self.start_gate.start(self._loop)
        if self.config.max_seconds is not None and self._loop is not None:
            left = self.config.max_seconds - (self.clock.time() - self.started_at)
            self._budget_timer = self._loop.call_later(max(0.0, left), self.check_budgets)
        self.telemetry.emit(
            "run_start", config=self.config.model_dump(), model_numel=self.spec.numel, task=self.task.name,
            fingerprint=self.spec.fingerprint,
            train_samples=len(self.train), test_samples=len(self.test), shards=self.shards.num_shards,
        )

    def request_stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        self.telemetry.emit("stop_requested", reason=reason)
        self.start_gate.open("stop")  # held work requests are answered: with the stop
        if self._budget_timer is not None:
            self._budget_timer.cancel()
        # Nobody waits on a barrier that will never come.
        for held in self.held.values():
            if not held.reply.done():
                held.reply.set_result(None)
        self.held.clear()
        if not self.shutting_down:
            for hook in self.on_stop:
                hook(reason)

    def check_budgets(self) -> None:
        """Stop the run at the first budget reached (max_updates, max_epochs, max_seconds)."""
        self.reporting.check_budgets()

    def begin_shutdown(self) -> None:
        """The server process is going away (SIGTERM); the run is not over."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.telemetry.emit("server_shutdown")
        self.start_gate.open("shutdown")
        for held in self.held.values():
            if not held.reply.done():
                held.reply.set_exception(self.handlers.going_away())
        self.held.clear()

    def shutdown(self) -> dict[str, Any]:
        self.request_stop(self.stop_reason or "shutdown")
        self.evaluator.stop()
        return self.reporting.finish()

    def _evaluated(self, ev: Evaluation) -> None:
        self.reporting.on_evaluation(ev)

    def on_loop(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn`` on the engine's event loop: held replies are futures of that loop."""
        loop = self._loop
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if loop is None or here is loop:
            fn(*args)
            return
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the loop is closed: nothing is held any more
            fn(*args)

    # ---- the step: push, fold, pull, assign ---------------------------------

    async def push(self, worker: WorkerRecord, base_version: int, samples: int,
                   payload: Payload) -> tuple[str, dict[str, Any]]:
        """A validated update: (reply status, reply fields). Waits while a barrier holds it."""
        if self.stopping:
            return "rejected", {"reason": "run is stopping"}
        candidate_loss = None
        if self.policies.aggregation.needs_candidate_loss:
            candidate_loss = await self.policies.aggregation.candidate_loss(payload)
        # Screened before the lock: a refusal is a push with nothing to fold,
        # so the strategy still counts it (a barrier is not held by it).
        refusal = await self.screening.screen(worker, payload, candidate_loss)
        async with self.step_lock:
            if self.stopping:
                # The stop came while this push was being scored or waited for
                # the lock: after a stop nothing is folded, and nothing may be
                # held for a barrier that request_stop has already released.
                return "rejected", {"reason": "run is stopping"}
            info = PushInfo(worker.id, base_version, self.state.version, samples, worker.pushes,
                            at=self.clock.monotonic())
            verdict = self.strategy.on_push(info)
            held: Held | None = None
            if verdict.decision is Decision.REJECT:
                worker.rejected += 1
                self.telemetry.emit("update_rejected", worker=worker.id, base=base_version, reason=verdict.reason)
                return "rejected", {"reason": verdict.reason}
            if verdict.decision in (Decision.BUFFER, Decision.BUFFER_AND_REPLY):
                # Waiting for a release: no fp32 copy of a half-precision update meanwhile
                # (Payload.widened, 2x its bytes); the fold widens it again, for the fold only.
                payload.release_widened()
            if verdict.decision is Decision.BUFFER_AND_REPLY and refusal is None:
                self.buffered.append(Contribution(info, payload, candidate_loss))
            if verdict.decision in (Decision.APPLY, Decision.APPLY_AND_WAIT) and refusal is None:
                await folding.fold(self, [Contribution(info, payload, candidate_loss)])
            # A fold may have stopped the run (a budget): nothing is held for a barrier that will not come.
            if verdict.decision in (Decision.BUFFER, Decision.APPLY_AND_WAIT) and not self.stopping:
                keep = verdict.decision is Decision.BUFFER and refusal is None
                held = Held(info, payload if keep else None, asyncio.get_running_loop().create_future(),
                            candidate_loss)
                self.held[worker.id] = held
            await self.process_releases()
        if held is not None:
            await held.reply
        if refusal is not None:
            worker.rejected += 1
            return "rejected", {"reason": refusal, "staleness": info.staleness}
        status = "applied" if not self.stopping or held is None else "abandoned"
        return status, {"staleness": info.staleness}

    async def process_releases(self) -> None:
        """Fold and wake whatever the strategy releases. Caller holds step_lock."""
        await folding.process_releases(self)

    async def model(self, dtype_name: str):
        """(version, prepared payload) of the current model in ``dtype_name`` (already checked)."""
        dtype = dtype_from_name(dtype_name)
        nbytes = self.spec.numel * torch.empty(0, dtype=dtype).element_size()
        return nbytes, await offload(nbytes, self.state.prepared, dtype)

    def count_message(self, kind: str) -> None:
        self.message_counts[kind] = self.message_counts.get(kind, 0) + 1

    def count_carried(self, kind: str, n: int = 1) -> None:
        self.carried_counts[kind] = self.carried_counts.get(kind, 0) + n

    def assign(self, worker: WorkerRecord, keep: int = 2) -> WorkReply:
        return self.membership.assign(worker, keep)

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The engine's parts, as a checkpoint keeps them (server/engine/persist.py)."""
        return persist.state_dict(self)

    def load_state_dict(self, state: Mapping[str, Any], *, best_flat: torch.Tensor | None = None) -> None:
        """Resume the parts from ``state_dict()`` (the model itself is loaded by the checkpointer)."""
        persist.load_state_dict(self, state, best_flat)

    # ---- the public surface of the rooms ---------------------------------------

    async def handle(self, frames: Sequence[Any], header: Header | None = None) -> list:
        """Reply frames for one request; ``header``: its first frame, when the data plane already unpacked it."""
        return await self.handlers.handle(frames, header)

    def register(self, name: str, **info: Any) -> tuple[WorkerRecord, bool]:
        return self.membership.register(name, **info)

    async def leave(self, worker_id: str, reason: str, *, state: str = "left") -> None:
        await self.membership.leave(worker_id, reason, state=state)

    def start_coordinator(self, *, bind_host: str, port: int, advertise_host: str) -> None:
        self.collective.start(bind_host=bind_host, port=port, advertise_host=advertise_host)

    async def regroup(self, worker_id: str, failed_generation: int) -> dict[str, Any]:
        return await self.collective.regroup(worker_id, failed_generation)

    def publish_to_kafka(self, opts) -> None:
        if self.local_data:
            log.info("device-local data: no shard records to publish to Kafka")
            return
        self.kafka.publish(opts)

    def data_source_for(self, worker: WorkerRecord) -> dict[str, Any]:
        """The register reply's ``data_source``: where this worker's validation shards are read from."""
        if self.local_data:
            return {"source": "local"}
        return self.kafka.ranges("validation", self.membership.validation_shards_for(worker)).model_dump(exclude_none=True)

    @property
    def outcome(self) -> str:
        return self.reporting.outcome()

    def status(self) -> dict[str, Any]:
        return self.reporting.status()

    def summary(self) -> dict[str, Any]:
        return self.reporting.summary()
