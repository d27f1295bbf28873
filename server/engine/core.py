"""The training engine: owns the model and the step, asks the policies, folds updates.

The data plane hands it decoded-but-untrusted messages (``handlers``); it
consults the sync strategy and the aggregation rule, folds, and wakes held
replies. The other parts, each built here with its collaborators (none sees
the engine, only the narrow views of ``ports``): ``membership`` (who trains,
with how much work), ``collective`` (the all-reduce group's coordinator),
``kafka`` (shard records in a broker), ``run_clock`` (training seconds and
downtime), ``goals`` (target and budgets), ``counters`` (requests by type),
``start_gate`` (min_workers), ``reporting`` (status, summary, the run's end
files), ``telemetry`` (one ``emit`` per fact), ``policies`` (the one
factory). The parts that hold state have ``state_dict``/``load_state_dict``;
a checkpoint is made of theirs. It never touches a socket. Tensor work (checksums, finiteness, axpy,
snapshots) runs in executor threads when it is big, so the event loop keeps
serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from hermes.common.clock import SYSTEM_CLOCK, Clock
from hermes.common.config import RunConfig
from hermes.common.messages import WorkReply
from hermes.common.policies.allocation import Allocator
from hermes.common.policies.sync import Decision, PushInfo, SyncStrategy
from hermes.common.policies.topology import topology_of
from hermes.common.shards import ShardQueue
from hermes.common.task import Direction, Task, dataset_len
from hermes.common.task_registry import batch_of, resolve_task
from hermes.common.tensors import flatten, spec_of
from hermes.common.wire import Header, Payload
from hermes.server.auth import ReplayGuard
from hermes.server.engine import folding
from hermes.server.engine.admission import Admission
from hermes.server.engine.bases import Bases
from hermes.server.engine.claims import Claims
from hermes.server.engine.collective import Collective
from hermes.server.engine.counters import Counters
from hermes.server.engine.federated_eval import FederatedEval
from hermes.server.engine.goals import Goals, primary_metric
from hermes.server.engine.handlers import Handlers
from hermes.server.engine.kafka import KafkaPublisher
from hermes.server.engine.local import LOCAL_DSS_MAX, LocalAccount, local_data_refusal
from hermes.server.engine.membership import TAKEOVER_AFTER, Membership
from hermes.server.engine.policies import Contribution, Policies, build_policies
from hermes.server.engine.ports import CheckpointView, Held
from hermes.server.engine.reporting import Reporting
from hermes.server.engine.run_clock import RunClock
from hermes.server.engine.screening import Screening, ScreeningSettings
from hermes.server.engine.start_gate import StartGate
from hermes.server.engine.telemetry import Telemetry
from hermes.server.evaluator import Evaluation, Evaluator, TargetReached
from hermes.server.events import EventLog
from hermes.server.kafka_publish import KafkaOptions
from hermes.server.lossprobe import LossProbe
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import load_splits, split_stores
from hermes.server.state import ModelState

log = logging.getLogger(__name__)

__all__ = ["Engine", "Held"]


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
        checkpoints: CheckpointView | None = None,
        clock: Clock = SYSTEM_CLOCK,
        screening: ScreeningSettings | None = None,
        takeover_after: float = TAKEOVER_AFTER,
    ) -> None:
        """Everything but the config can be injected (tests); by default the run config builds it."""
        self.config = config
        self.clock = clock
        self.telemetry = Telemetry(metrics, events)
        self.metrics = metrics
        self.events = events
        self.max_message_bytes = max_message_bytes
        # The task (resolved and checked by the app factory, or here from the config).
        self.task = task if task is not None else resolve_task(config.task, config)
        # Device-local data (task.local_data): agents train on their own samples, the server
        # sizes how many per cycle and no shard of training data is ever served.
        self.local_data = self.task.local_data is not None
        if self.local_data and (why := local_data_refusal(config)) is not None:
            raise ValueError(f"preset {config.preset!r} cannot train on device-local data: {why}")
        self.train: Dataset[Any]
        self.validation: Dataset[Any]
        self.test: Dataset[Any]
        self.train, self.validation, self.test = splits if splits is not None else load_splits(config, self.task)
        self.state = state if state is not None else self._initial_state()
        self.spec = self.state.spec
        self.policies = policies if policies is not None else build_policies(
            config, spec=self.spec, state=self.state,
            train_samples=LOCAL_DSS_MAX if self.local_data else dataset_len(self.train), validation=self.validation,
            metrics=metrics, task=self.task)
        self.registry = Registry(max_workers, clock=clock)
        metrics.watch_workers(self.registry.all)
        # Records name their data set: the built-in sets' own names (as before), else the task's.
        self.shards, self.validation_shards = split_stores(self.train, self.validation, self.test, config.shard_size,
                                                           self.task.name or config.dataset)
        # Local data: no shard ids to hand out, but the queue still keeps the epoch account
        # (one "shard" per shard_size samples assigned; see Membership.assign).
        self.queue = ShardQueue(self.shards.num_shards or 1, seed=config.seed)
        self.counters = Counters()
        self.local = LocalAccount(self.policies.allocator)
        self.run_clock = RunClock(clock)
        self.goals = Goals(config, self.task, self.run_clock, self.telemetry)
        self.evaluator = Evaluator(
            self.task, self.spec, self.state, self.test, max_samples=config.eval_max_samples,
            interval=config.eval_interval_seconds, seed=config.seed, on_result=self._evaluated, clock=clock,
            primary=self.primary_metric(),
        )
        self.stopping = False
        self.stop_reason = ""
        # Called with the reason once the run stops (not on SIGTERM's shutdown): --exit-when-done.
        self.on_stop: list[Callable[[str], None]] = []
        self._budget_timer: asyncio.TimerHandle | None = None
        # The loop that owns the held replies: evaluations run in the
        # evaluator's thread and must hand a stop over to it (set in start()).
        self._loop: asyncio.AbstractEventLoop | None = None
        # SIGTERM: unlike a stop, the run goes on after a restart, so agents
        # are told "unavailable" (retry) rather than "stop".
        self.shutting_down = False
        self.replay = ReplayGuard(replay_window_seconds, clock=clock)
        # Set when checkpoints are on (attach_checkpoints; hermes.server.checkpoint): record_fold journals each fold.
        self.checkpoints: CheckpointView | None = None
        self._background: set[asyncio.Task[int | None]] = set()
        self.held: dict[str, Held] = {}
        self.buffered: list[Contribution] = []  # BUFFER_AND_REPLY: acknowledged, folded by the next release
        # One model step at a time; a checkpoint holds it so model, version and queue agree.
        self.step_lock = asyncio.Lock()
        self.start_gate = StartGate(config.min_workers, config.min_workers_timeout_seconds,
                                    registry=self.registry, telemetry=self.telemetry)
        self.kafka = KafkaPublisher(self.shards, self.validation_shards, dataset=config.dataset,
                                    telemetry=self.telemetry, clock=clock)
        self.collective = Collective(config.collective, registry=self.registry, telemetry=self.telemetry, clock=clock,
                                     run=self, drop=self._drop)
        self.membership = Membership(
            config, policies=self.policies, registry=self.registry, queue=self.queue, shards=self.shards,
            validation_shards=self.validation_shards, local=self.local if self.local_data else None,
            kafka=self.kafka, collective=self.collective, replay=self.replay, telemetry=self.telemetry,
            metrics=metrics, run_clock=self.run_clock, run=self, takeover_after=takeover_after)
        screening = screening or ScreeningSettings()
        if screening.enabled and not topology_of(config.topology).screens_pushes:
            log.info("screening off: topology %s folds the group's model copies, not one worker's updates",
                     config.topology)
            screening = screening.model_copy(update={"enabled": False})
        self.screening = Screening(screening, self.state, self.telemetry,
                                   self.policies.aggregation.reference_loss,
                                   blend=self.policies.aggregation.op == "blend", clock=clock,
                                   probe=self._screening_probe(screening))
        # From-baseline presets: the model each worker measures its pushes from (late joiners, rejoins).
        self.bases = Bases(self.state.baseline) if config.pushes_from_baseline() else None
        self.claims = Claims(self.screening.settings, self.telemetry, clock.monotonic,
                             lambda wid: self.policies.allocator.workload(wid).dss)
        self.membership.claims = self.claims
        self.screening.claims_clamped = self.claims.public
        self.screening.claims_windows = self.claims.windows_public
        self.screening.work_scale = self.claims.take_scale
        self.policies.aggregation.power_cap = self.claims.cap_powers
        self.screening.fold_share = self._fold_share
        # concurrency.limit (FedBuff's C): who may hold work at once; joins and leaves free a slot.
        self.admission = Admission(config.concurrency.limit, self.telemetry,
                                   hold_pull=config.concurrency.hold_pull,
                                   skipped_ends_turn=config.concurrency.turn_ends == "cycle",
                                   admit=config.concurrency.admit, explore=config.concurrency.explore,
                                   clock=clock.monotonic, declared=self._declared_capacity
                                   if config.concurrency.explore_order == "declared" else None)
        if not self.admission.open:
            self.telemetry.subscribe(lambda fact, fields: self.on_loop(self.admission.listener, fact, fields))
        self.handlers = Handlers(
            self, state=self.state, registry=self.registry, membership=self.membership, start_gate=self.start_gate,
            shards=self.shards, validation_shards=self.validation_shards, kafka=self.kafka, counters=self.counters,
            replay=self.replay, metrics=metrics, clock=clock, max_message_bytes=max_message_bytes, bases=self.bases,
            admission=self.admission)
        self.reporting = Reporting(
            config, self.task, state=self.state, run_clock=self.run_clock, goals=self.goals,
            evaluator=self.evaluator, registry=self.registry, start_gate=self.start_gate, screening=self.screening,
            counters=self.counters, kafka=self.kafka, telemetry=self.telemetry, run=self,
            epoch_progress=lambda: self.epoch_progress, local_data=self.local_data,
            out_dir=Path(out_dir) if out_dir else None)
        self.federated = FederatedEval(config, telemetry=self.telemetry, goals=self.goals,
                                       active_ids=self.registry.active_ids,
                                       stop=lambda reason: self.on_loop(self.request_stop, reason))
        if self.federated.enabled:
            self.reporting.federated = self.federated
            self.membership.stamp_work = self.federated.stamp
            self.telemetry.subscribe(self.federated.listener)
        if checkpoints is not None:
            self.attach_checkpoints(checkpoints)
        self.metrics.model_version.set(0)

    def _initial_state(self) -> ModelState:
        # Replicas start from identical weights: the server builds the seeded
        # initial model and every agent pulls it before its first step.
        torch.manual_seed(self.config.seed)
        model = self.task.model()
        # A label for people: the built-in model's config name, else the model's class.
        label = self.config.model if self.task.name == "builtin" else type(model).__name__
        sample = batch_of(self.test, [0])[0] if dataset_len(self.test) else torch.empty(0)
        spec = spec_of(model, label, task=self.task.name, input_shape=tuple(sample.shape[1:]))
        return ModelState(spec, flatten(model))

    def primary_metric(self) -> tuple[str, Direction]:
        """What "best" means for this run (goals.primary_metric)."""
        return primary_metric(self.config, self.task)

    def best_flat(self) -> torch.Tensor | None:
        """The best evaluated model's weights (kept beside the model in a checkpoint), None before any."""
        best = self.evaluator.best_model()
        return None if best is None else best[1]

    def attach_checkpoints(self, checkpoints: CheckpointView) -> None:
        """Checkpoints are on (hermes.server.checkpoint): each fold is journaled, status names the last one."""
        self.checkpoints = checkpoints
        self.reporting.checkpoints = checkpoints

    # The policies, by the names the rooms use.
    @property
    def strategy(self) -> SyncStrategy:
        return self.policies.sync

    @property
    def allocator(self) -> Allocator:
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
        return self.run_clock.elapsed()

    # Read-only views of the parts' state, by the names readers outside the engine use.
    @property
    def out_dir(self) -> Path | None:
        return self.reporting.out_dir

    @property
    def started_at(self) -> float:
        return self.run_clock.started_at

    @property
    def downtime_seconds(self) -> float:
        return self.run_clock.downtime_seconds

    @property
    def budget_reached(self) -> str | None:
        return self.goals.budget_reached

    @property
    def target_reached(self) -> TargetReached | None:
        return self.goals.target_reached

    @property
    def resumed_from(self) -> dict[str, Any] | None:
        return None if self.checkpoints is None else self.checkpoints.resumed_from

    @property
    def message_counts(self) -> dict[str, int]:
        return self.counters.messages

    @property
    def carried_counts(self) -> dict[str, int]:
        return self.counters.carried

    @property
    def shard_bytes_served(self) -> dict[str, int]:
        return self.counters.shard_bytes

    def _fold_share(self, worker_id: str) -> float | None:
        """n x the worker's share of the active workers' compute powers (1: a typical worker's fold weight), where the
        rule weighs by them (EDP-SGD); None otherwise or while a power is unknown."""
        agg = self.policies.aggregation
        if not agg.rule.needs_compute_power:
            return None
        ids = self.registry.active_ids()
        if worker_id not in ids:
            return None
        powers = [agg.power(w, self) for w in ids]
        known = [p for p in powers if p is not None and p > 0.0]
        if len(known) != len(powers):
            return None
        return len(known) * known[ids.index(worker_id)] / sum(known)

    def throughput(self, worker_id: str) -> float | None:
        rec = self.registry.get(worker_id)
        return rec.throughput() if rec is not None else None

    def training_count(self) -> int:
        """Workers training at once: those holding a concurrency.limit slot, else every active one."""
        if not self.admission.open:
            return len(self.admission.holders)
        return len(self.registry.active_ids())

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # started outside a loop (tests): stops run inline
            self._loop = None
        self.evaluator.start()
        self.start_gate.start(self._loop, resumed=self.state.version > 0)
        if self.config.max_seconds is not None and self._loop is not None:
            left = self.config.max_seconds - self.run_clock.seconds()
            self._budget_timer = self._loop.call_later(max(0.0, left), self.check_budgets)
        self.telemetry.emit(
            "run_start", config=self.config.model_dump(), model_numel=self.spec.numel, task=self.task.name,
            fingerprint=self.spec.fingerprint,
            train_samples=dataset_len(self.train), test_samples=dataset_len(self.test), shards=self.shards.num_shards,
        )

    def request_stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        self.telemetry.emit("stop_requested", reason=reason)
        self.start_gate.open("stop")  # held work requests are answered: with the stop
        self.admission.open_all("stop")
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

    def _declared_capacity(self, worker_id: str) -> float | None:
        """The compute a worker declared when it registered (concurrency.explore_order "declared")."""
        rec = self.registry.get(worker_id)
        return None if rec is None else rec.declared_capacity

    def _screening_probe(self, settings: ScreeningSettings) -> LossProbe | None:
        """The loss probe screening judges large updates with: the rule's, else one of its own."""
        if not settings.enabled or not (settings.effect or (settings.direction and settings.reference == "descent")):
            return None
        return self.policies.aggregation.probe or LossProbe(
            self.task, self.spec, self.state, self.validation, samples=self.config.loss.eval_samples,
            seed=self.config.seed, metrics=self.metrics)

    def check_budgets(self) -> None:
        """Stop the run at the first budget reached (max_updates, max_epochs, max_seconds)."""
        if self.stopping:
            return
        reason = self.goals.check_budgets(self.state.version, self.epoch_progress)
        if reason is not None:
            self.request_stop(reason)

    def begin_shutdown(self) -> None:
        """The server process is going away (SIGTERM); the run is not over."""
        if self.shutting_down:
            return
        self.shutting_down = True
        self.telemetry.emit("server_shutdown")
        self.start_gate.open("shutdown")
        self.admission.open_all("shutdown")
        for held in self.held.values():
            if not held.reply.done():
                held.reply.set_exception(self.handlers.going_away())
        self.held.clear()

    def shutdown(self) -> dict[str, Any]:
        self.request_stop(self.stop_reason or "shutdown")
        self.evaluator.stop()
        return self.reporting.finish()

    def _evaluated(self, ev: Evaluation) -> None:
        """An evaluation finished (in the evaluator's thread): report it; a target reached stops the run."""
        self.telemetry.emit(
            "evaluation", version=ev.version, accuracy=ev.accuracy, loss=ev.loss, metrics=ev.metrics,
            seconds=round(ev.seconds, 6), elapsed=round(ev.at - self.run_clock.started_at, 3),
        )
        # Not once the run is stopping: the shutdown evaluation must not turn an
        # operator's stop into a reached target after the fact.
        self.federated.on_evaluation(ev)
        if self.stopping or (reason := self.goals.check_target(ev) or self.goals.check_early_stop(ev)) is None:
            return
        self.on_loop(self.request_stop, reason)
        if self.checkpoints is not None:
            # The outcome and the best model are durable at once: a server killed before its
            # shutdown checkpoint resumes as a finished run, not as one that trains on.
            self.on_loop(self._checkpoint_soon, "target reached")

    def _checkpoint_soon(self, reason: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (engine driven by hand in tests): the shutdown checkpoint will do
            return
        assert self.checkpoints is not None
        task = loop.create_task(self.checkpoints.save_or_report(reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

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
        samples = self.claims.samples(worker.id, samples)
        candidate_loss = None
        if self.policies.aggregation.needs_candidate_loss:
            candidate_loss = await self.policies.aggregation.candidate_loss(payload)
        # Screened before the lock: a refusal is a push with nothing to fold,
        # so the strategy still counts it (a barrier is not held by it).
        refusal, scale = await self.screening.screen(worker, payload, candidate_loss,
                                                     staleness=max(0, self.state.version - base_version))
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
                self.buffered.append(Contribution(info, payload, candidate_loss, scale))
            if verdict.decision in (Decision.APPLY, Decision.APPLY_AND_WAIT) and refusal is None:
                await folding.fold(self, [Contribution(info, payload, candidate_loss, scale)])
            # A fold may have stopped the run (a budget): nothing is held for a barrier that will not come.
            if verdict.decision in (Decision.BUFFER, Decision.APPLY_AND_WAIT) and not self.stopping:
                keep = verdict.decision is Decision.BUFFER and refusal is None
                held = Held(info, payload if keep else None, asyncio.get_running_loop().create_future(),
                            candidate_loss, scale)
                self.held[worker.id] = held
            await self.process_releases()
        if held is not None:
            await held.reply
        self.claims.on_reply(worker.id)
        if refusal is not None:
            worker.rejected += 1
            return "rejected", {"reason": refusal, "staleness": info.staleness}
        status = "applied" if not self.stopping or held is None else "abandoned"
        return status, {"staleness": info.staleness}

    async def tick(self) -> None:
        """Time passed (the heartbeat monitor's period): a barrier's deadline may release a round."""
        if self.stopping or not self.strategy.ticks:
            return
        async with self.step_lock:
            self.strategy.on_tick(self.clock.monotonic())
            await self.process_releases()

    async def process_releases(self) -> None:
        """Fold and wake whatever the strategy releases. Caller holds step_lock."""
        await folding.process_releases(self)

    def count_message(self, kind: str) -> None:
        self.counters.count_message(kind)

    def count_carried(self, kind: str, n: int = 1) -> None:
        self.counters.count_carried(kind, n)

    def assign(self, worker: WorkerRecord, keep: int = 2) -> WorkReply:
        return self.membership.assign(worker, keep)

    # ---- checkpoints ----------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The parts' state dicts, side by side (JSON; the model's tensors are written apart).

        Each part owns its top-level keys, the layout checkpoints have always had
        (checkpoint.json), so a checkpoint of an older server loads. Taken under
        step_lock (by the checkpointer), so model, version and queue agree.
        """
        return {
            "config": self.config.model_dump(),
            "model": {"name": self.spec.name, "numel": self.spec.numel},
            **self.membership.state_dict(),  # queue, outstanding, allocator, workers
            **self.local.state_dict(),  # local
            **self.evaluator.state_dict(),  # evaluations, best_evaluation
            **self.goals.state_dict(),  # target_reached
            **self.counters.state_dict(),  # message_counts, carried_counts
            **self.run_clock.state_dict(),  # elapsed_seconds, downtime_seconds
        }

    def load_state_dict(self, state: Mapping[str, Any], *, best_flat: torch.Tensor | None = None,
                        alive: tuple[float, float] | None = None) -> float:
        """Resume the parts from ``state_dict()``; returns the restart's downtime in seconds.

        The model itself is loaded by the checkpointer, which passes the best model's
        weights (``best_flat``) and when the previous server was last known alive
        (``alive``: training seconds and wall-clock time; RunClock.load_state_dict).
        """
        self.membership.load_state_dict(state)
        self.local.load_state_dict(dict(state))
        self.evaluator.load_state_dict(state, best_flat)
        self.counters.load_state_dict(state)
        down = self.run_clock.load_state_dict(state, alive=alive)
        self.metrics.model_version.set(self.state.version)
        # Last: a run whose target was reached before the restart stops again, with every part restored.
        if (reason := self.goals.load_state_dict(state)) is not None:
            self.request_stop(reason)
        return down

    # ---- the public surface of the rooms ---------------------------------------

    async def handle(self, frames: Sequence[Any], header: Header | None = None, size: int | None = None) -> list[Any]:
        """Reply frames for one request; ``header``: its first frame, when the data plane already unpacked it;
        ``size``: its bytes, when the data plane already counted them."""
        return await self.handlers.handle(frames, header, size)

    def register(self, name: str, **info: Any) -> tuple[WorkerRecord, bool]:
        rec, rejoined = self.membership.register(name, **info)
        if self.bases is not None:
            self.bases.drop(rec.id)  # a new registration starts with a new base pull
        self.start_gate.on_join()
        return rec, rejoined

    async def leave(self, worker_id: str, reason: str, *, state: str = "left") -> None:
        if self.bases is not None:
            self.bases.drop(worker_id)
        if await self.membership.leave(worker_id, reason, state=state):
            # A barrier need not wait for it any more.
            async with self.step_lock:
                await self.process_releases()

    async def _drop(self, worker_id: str, reason: str) -> None:
        """A member the collective group dropped: lost to the run."""
        await self.leave(worker_id, reason, state="lost")

    def start_coordinator(self, *, bind_host: str, port: int, advertise_host: str) -> None:
        self.collective.start(bind_host=bind_host, port=port, advertise_host=advertise_host)

    async def regroup(self, worker_id: str, failed_generation: int) -> dict[str, Any]:
        return await self.collective.regroup(worker_id, failed_generation)

    def publish_to_kafka(self, opts: KafkaOptions) -> None:
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
        return self.goals.outcome(self.stopping)

    def status(self) -> dict[str, Any]:
        return self.reporting.status()

    def summary(self) -> dict[str, Any]:
        return self.reporting.summary()
