"""The training engine: owns the loop state, asks the policies, folds updates.

The data plane hands it decoded-but-untrusted messages; it authenticates,
validates, consults the sync strategy and the aggregation rule, and returns
reply frames. It never touches a socket. Tensor work (checksums, finiteness,
axpy, snapshots) runs in executor threads so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hermes.common.aggregation import (
    aggregation_weights,
    batch_scaled_lr,
    loss_blend_weight,
    power_weights,
)
from hermes.common.allocation import CycleObservation, Resize, Workload, make_allocator
from hermes.common.config import RunConfig
from hermes.common.controllers import fit_memory_model, max_batch_for_memory
from hermes.common.models import build_model
from hermes.common.shards import Assignment, ShardQueue, shards_for
from hermes.common.sync import Decision, PushInfo, make_strategy
from hermes.common.tensors import flatten, spec_of
from hermes.common.wire import (
    ErrorCode,
    Header,
    Message,
    MsgType,
    Payload,
    ProtocolError,
    decode,
    dtype_from_name,
    encode,
    verify_mac,
)
from hermes.server.auth import ReplayGuard
from hermes.server.checkpoint import write_tensors
from hermes.server.coordinator import Coordinator, GroupTooSmall, RegroupRefused
from hermes.server.evaluator import Evaluation, Evaluator, TargetReached
from hermes.server.events import EventLog
from hermes.server.kafka_publish import KafkaOptions, publish_stores
from hermes.server.lossprobe import LossProbe
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import ShardStore, load_splits
from hermes.server.state import ModelState, validate_update

log = logging.getLogger(__name__)

MAX_SHARDS_PER_FETCH = 256
BEST_MODEL_FILE = "model-best.safetensors"

# Tensor work on payloads up to this size runs on the event loop itself: a
# thread hop costs ~0.35 ms each way here, more than checksumming, checking
# and folding 8 MB (measured: 3 hops were a third of a 1M-parameter push).
# Bigger payloads go to a worker thread so the loop keeps serving.
_INLINE_BYTES = 8 * 1024 * 1024


async def _offload(nbytes: int, fn, *args, **kwargs):
    if nbytes <= _INLINE_BYTES:
        return fn(*args, **kwargs)
    return await asyncio.to_thread(fn, *args, **kwargs)


def _payload_bytes(payload: Payload | None) -> int:
    return 0 if payload is None else sum(c.numel() * c.element_size() for c in payload.chunks)


@dataclass
class _Held:
    info: PushInfo
    payload: Payload | None
    reply: asyncio.Future
    candidate_loss: float | None = None


@dataclass(frozen=True)
class _Update:
    info: PushInfo
    payload: Payload
    # Loss of w0 + G on the validation subset (``loss`` aggregation only).
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
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.events = events
        self.max_message_bytes = max_message_bytes
        self.out_dir = Path(out_dir) if out_dir else None
        self.train, self.validation, self.test = load_splits(config)
        # Replicas start from identical weights: the server builds the seeded
        # initial model and every agent pulls it before its first step.
        torch.manual_seed(config.seed)
        model = build_model(
            config.model, input_shape=self.train.input_shape, num_classes=self.train.num_classes, **config.model_kwargs
        )
        self.spec = spec_of(model, config.model, self.train.input_shape, self.train.num_classes, **config.model_kwargs)
        self.state = ModelState(self.spec, flatten(model))
        del model
        # Collective: the ranks all-reduce among themselves; the server only
        # folds the copies rank 0 sends for evaluation, one at a time (asp).
        self.strategy = (make_strategy("asp") if config.topology == "collective"
                         else make_strategy(config.sync, **self._strategy_params()))
        self.coordinator: Coordinator | None = None
        self.registry = Registry(max_workers)
        self.shards = ShardStore(self.train, config.shard_size)
        self.validation_shards = ShardStore(self.validation, config.shard_size)
        self.queue = ShardQueue(self.shards.num_shards, seed=config.seed)
        # Set by publish_to_kafka when a broker is configured: shard records
        # then travel through Kafka and the ZeroMQ data plane is the fallback.
        self.kafka: dict[str, Any] | None = None
        self._kafka_opts: KafkaOptions | None = None
        self._republishing = threading.Lock()
        self._last_publish = 0.0
        self.allocator = make_allocator(config, dss_max=len(self.train), epoch_samples=len(self.train))
        # Workers a resumed checkpoint's allocator state still counts, until they register again.
        self._awaiting_rejoin: set[str] = set()
        self._awaiting_since = 0.0
        self.probe = (
            LossProbe(self.spec, self.state, self.validation, samples=config.loss.eval_samples,
                      seed=config.seed, metrics=metrics)
            if config.aggregation == "loss" else None
        )
        self.evaluator = Evaluator(
            self.spec,
            self.state,
            self.test,
            max_samples=config.eval_max_samples,
            interval=config.eval_interval_seconds,
            seed=config.seed,
            on_result=self._on_evaluation,
        )
        self.started_at = time.time()
        self.stopping = False
        self.stop_reason = ""
        self.target_reached: TargetReached | None = None
        self._background: set[asyncio.Task] = set()
        # The loop that owns the held replies: evaluations run in the
        # evaluator's thread and must hand a stop over to it (set in start()).
        self._loop: asyncio.AbstractEventLoop | None = None
        # SIGTERM: unlike a stop, the run goes on after a restart, so agents
        # are told "unavailable" (retry) rather than "stop".
        self.shutting_down = False
        self.replay = ReplayGuard(replay_window_seconds)
        # Set by the app when checkpoints are on (hermes.server.checkpoint).
        self.checkpoints: Any = None
        self.resumed_from: dict[str, int] | None = None
        # The last assignments handed to each worker (the one it trains and the
        # one it prefetched): requeued if the worker is lost.
        self._outstanding: dict[str, list[tuple[int, ...]]] = {}
        self._held: dict[str, _Held] = {}
        # Authenticated data-plane requests by type: the "API calls" of Hermes Table III.
        self.message_counts: dict[str, int] = {}
        self._step = asyncio.Lock()
        self.metrics.model_version.set(0)

    def _strategy_params(self) -> dict[str, Any]:
        if self.config.sync == "asp":
            return {"max_staleness": self.config.asp.max_staleness}
        if self.config.sync == "ssp":
            return {"staleness": self.config.ssp.staleness}
        if self.config.sync == "ebsp":
            return {"lookahead": self.config.ebsp.lookahead, "history": self.config.ebsp.history}
        return {}

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> None:
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:  # started outside a loop (tests): stops run inline
            self._loop = None
        self.evaluator.start()
        self.events.emit(
            "run_start", config=self.config.model_dump(), model_numel=self.spec.numel,
            train_samples=len(self.train), test_samples=len(self.test), shards=self.shards.num_shards,
        )

    def request_stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        log.info("stop requested: %s", reason)
        self.events.emit("stop_requested", reason=reason)
        # Nobody waits on a barrier that will never come.
        for held in self._held.values():
            if not held.reply.done():
                held.reply.set_result(None)
        self._held.clear()

    def begin_shutdown(self) -> None:
        """The server process is going away (SIGTERM); the run is not over."""
        if self.shutting_down:
            return
        self.shutting_down = True
        log.info("server shutting down; agents will reconnect to a restarted server")
        self.events.emit("server_shutdown")
        for held in self._held.values():
            if not held.reply.done():
                held.reply.set_exception(_going_away())
        self._held.clear()

    def shutdown(self) -> dict[str, Any]:
        self.request_stop(self.stop_reason or "shutdown")
        self.evaluator.stop()
        # The current model, whatever it scores: the best one is reported beside it, not instead.
        final = self.evaluator.evaluate_now()
        summary = self.summary()
        self.events.emit("run_end", version=self.state.version, accuracy=final.accuracy, loss=final.loss,
                         best_version=summary["best_version"], best_accuracy=summary["best_accuracy"])
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            summary["best_model_file"] = self._write_best_model()
            tmp = self.out_dir / "server_summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(self.out_dir / "server_summary.json")
        self.events.close()
        return summary

    def _write_best_model(self) -> str | None:
        """OUT/model-best.safetensors: the best evaluated model, in the checkpoints' tensor layout.

        Returns the file name, or None before any evaluation.
        """
        assert self.out_dir is not None
        best = self.evaluator.best_model()
        if best is None:
            return None
        ev, flat = best
        path = self.out_dir / BEST_MODEL_FILE
        try:
            write_tensors(path, {"model": flat}, {
                "version": str(ev.version), "accuracy": repr(ev.accuracy), "loss": repr(ev.loss),
                "evaluated_samples": str(ev.samples),
                # Enough to rebuild the network: build_from_spec(ModelSpec.from_dict(...)) + load_flat.
                "spec": json.dumps(self.spec.to_dict(), separators=(",", ":")),
            })
        except OSError as exc:  # a full disk must not cost the summary
            log.error("writing the best model to %s failed: %s", path, exc)
            return None
        log.info("best model (version %d, accuracy %.4f) written to %s", ev.version, ev.accuracy, path)
        return path.name

    def _on_evaluation(self, ev: Evaluation) -> None:
        self.metrics.test_accuracy.set(ev.accuracy)
        self.metrics.test_loss.set(ev.loss)
        self.metrics.evaluated_version.set(ev.version)
        self.metrics.eval_seconds.observe(ev.seconds)
        self.events.emit(
            "evaluation", version=ev.version, accuracy=ev.accuracy, loss=ev.loss,
            seconds=round(ev.seconds, 6), elapsed=round(ev.at - self.started_at, 3),
        )
        target = self.config.target_accuracy
        # Not once the run is stopping: the shutdown evaluation must not turn an
        # operator's stop into a reached target after the fact.
        if target is None or ev.accuracy < target or self.target_reached is not None or self.stopping:
            return
        reached = TargetReached(ev.version, ev.accuracy, ev.at - self.started_at, ev.at)
        self.target_reached = reached
        log.info("target accuracy %s reached: %.4f at model version %d, %.1fs after the start; stopping the run",
                 target, ev.accuracy, ev.version, reached.seconds)
        self.events.emit("target_reached", target_accuracy=target, **reached.public())
        self._on_loop(self.request_stop, f"target accuracy {target} reached at version {ev.version}")
        if self.checkpoints is not None:
            # The outcome and the best model are durable at once: a server killed before its
            # shutdown checkpoint resumes as a finished run, not as one that trains on.
            self._on_loop(self._checkpoint_soon, "target reached")

    def _checkpoint_soon(self, reason: str) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (engine driven by hand in tests): the shutdown checkpoint will do
            return
        task = loop.create_task(self.checkpoints.save_or_report(reason))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _on_loop(self, fn: Callable[..., object], *args: Any) -> None:
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

    # ---- control plane ----------------------------------------------------

    def start_coordinator(self, *, bind_host: str, port: int, advertise_host: str) -> None:
        """Host the collective group's rendezvous store (topology 'collective')."""
        assert self.config.collective.world_size is not None  # config validation
        self.coordinator = Coordinator(bind_host=bind_host, port=port, advertise_host=advertise_host,
                                       world_size=self.config.collective.world_size,
                                       timeout_seconds=self.config.collective.timeout_seconds,
                                       regroup_seconds=self.config.collective.regroup_seconds,
                                       min_world_size=self.config.collective.min_world_size)
        # Set when the generation being formed is ready: the survivors' regroup calls wait on it.
        self._regrouped: dict[int, asyncio.Event] = {}
        self.events.emit("collective_group", world_size=self.config.collective.world_size, master_addr=advertise_host,
                         master_port=self.coordinator.port)

    def collective_for(self, rec: WorkerRecord) -> dict[str, Any] | None:
        return None if self.coordinator is None else self.coordinator.rendezvous(rec.name)

    def broken_generation_for(self, rec: WorkerRecord) -> int | None:
        return None if self.coordinator is None else self.coordinator.broken_generation(rec.name)

    async def regroup(self, worker_id: str, failed_generation: int) -> dict[str, Any]:
        """A survivor of a broken collective generation: wait for the next one and return its rendezvous.

        Raises RegroupRefused (this worker cannot join) or GroupTooSmall (the
        run is ended: too few survivors).
        """
        coord = self.coordinator
        rec = self.registry.get(worker_id)
        if coord is None or rec is None:
            raise RegroupRefused("this run has no collective group")
        if not self.config.collective.regroup:
            raise RegroupRefused("regrouping is disabled (collective_regroup=false)")
        if self.stopping:
            raise RegroupRefused(f"the run is stopping: {self.stop_reason}")
        target = coord.arrive(rec.name, failed_generation, time.monotonic())
        self.events.emit("regroup_arrival", worker=worker_id, name=rec.name, failed_generation=failed_generation)
        formed = self._regrouped.setdefault(target, asyncio.Event())
        while not formed.is_set():
            if await self._maybe_form_generation():
                break
            try:
                await asyncio.wait_for(formed.wait(), timeout=max(0.01, coord.seconds_left(time.monotonic())))
            except TimeoutError:
                pass
        if coord.failed is not None:
            raise GroupTooSmall(coord.failed)
        return coord.rendezvous(rec.name)

    async def _maybe_form_generation(self) -> bool:
        """Form the next generation if its window is due; True when it did."""
        coord = self.coordinator
        if coord is None or coord.pending is None:
            return False
        alive = frozenset(r.name for r in self.registry.all() if r.state == "active")
        if not coord.due(time.monotonic(), alive):
            return False
        formed = self._regrouped.setdefault(coord.pending.target, asyncio.Event())
        try:
            result = coord.form()
        except GroupTooSmall as exc:
            self.events.emit("collective_failed", reason=str(exc))
            self.request_stop(str(exc))
            return True
        finally:
            formed.set()
        gen = result.generation
        self.events.emit("collective_group", world_size=gen.world_size, generation=gen.number,
                         members=list(gen.members), dropped=list(result.dropped),
                         master_addr=coord.advertise_host, master_port=coord.port)
        by_name = {r.name: r for r in self.registry.all()}
        for name in result.dropped:
            rec = by_name.get(name)
            if rec is not None and rec.state == "active":
                # The allocator forgets it, so the survivors' sizes are re-split over n ranks.
                await self.leave(rec.id, f"dropped from the collective group at generation {gen.number}",
                                 state="lost")
        return True

    def register(self, name: str, **info: Any) -> tuple[WorkerRecord, bool]:
        if self.coordinator is not None:
            self.coordinator.assign(name)  # GroupFull before anything is recorded
        rec, rejoined = self.registry.register(name, **info)
        self._awaiting_rejoin.discard(rec.id)
        # A new secret: sessions signed with the old one are gone, and a previous
        # incarnation's unfinished shards will not be finished by it.
        self.replay.forget(rec.id)
        self._requeue_outstanding(rec.id)
        self.strategy.on_join(rec.id)
        self.allocator.join(rec.id, rec.declared_capacity)
        self._apply_memory_limits(rec)
        elapsed = round(time.time() - self.started_at, 3)
        self._record_workload(rec, elapsed, self.allocator.workload(rec.id))
        self._refresh_worker_gauge()
        self.events.emit("join", worker=rec.id, name=name, rejoined=rejoined, **info)
        # Policies that split a fixed total (static, the global batch) move the others too.
        self._apply_resizes(self.allocator.rebalance(), elapsed)
        log.info("worker %s (%s) %s", rec.id, name, "rejoined" if rejoined else "joined")
        return rec, rejoined

    def expect_rejoin(self, worker_ids: Iterable[str]) -> None:
        """Workers whose allocation a resumed checkpoint restored: they hold it until they register again."""
        self._awaiting_rejoin = set(worker_ids)
        self._awaiting_since = time.time()

    def forget_unreturned(self, timeout: float, now: float | None = None) -> list[str]:
        """Restored workers not registered again ``timeout`` seconds after the resume: the allocator forgets them.

        Until then they count as members (an agent reconnecting to the
        restarted server keeps its workload); a worker that never comes back
        would otherwise hold the policies that wait for every member's
        measurements, and its share of a global batch, for good.
        """
        now = time.time() if now is None else now
        if not self._awaiting_rejoin or now - self._awaiting_since <= timeout:
            return []
        gone, self._awaiting_rejoin = sorted(self._awaiting_rejoin), set()
        for wid in gone:
            self.allocator.forget(wid)
        self._apply_resizes(self.allocator.rebalance(), round(now - self.started_at, 3))
        log.info("%d worker(s) of the resumed checkpoint did not register again within %.1fs; "
                 "the allocator forgot them: %s", len(gone), timeout, ", ".join(gone))
        self.events.emit("restored_workers_forgotten", workers=gone)
        return gone

    async def leave(self, worker_id: str, reason: str, *, state: str = "left") -> None:
        """The worker said goodbye (``left``) or went silent (``lost``)."""
        rec = self.registry.get(worker_id)
        if rec is None or rec.state != "active":
            return
        rec.state = state
        if self.coordinator is not None:
            self.coordinator.mark_dead(rec.name)
            # An open regroup window need not wait for a member known gone.
            await self._maybe_form_generation()
        requeued = self._requeue_outstanding(worker_id)
        self.strategy.on_leave(worker_id)
        # Its cycle times no longer describe the cluster the median is taken over.
        self.allocator.forget(worker_id)
        self._apply_resizes(self.allocator.rebalance(), round(time.time() - self.started_at, 3))
        self._refresh_worker_gauge()
        self.events.emit("leave", worker=worker_id, reason=reason, state=state, requeued_shards=requeued)
        log.info("worker %s %s: %s", worker_id, state, reason)
        async with self._step:
            await self._process_releases()

    def _note_assignment(self, worker_id: str, shards: tuple[int, ...]) -> None:
        recent = self._outstanding.setdefault(worker_id, [])
        recent.append(shards)
        # Requesting assignment k means k-2 is trained (one trains, one is prefetched).
        del recent[:-2]

    def _requeue_outstanding(self, worker_id: str) -> list[int]:
        """A departed worker's unfinished shards go back to the front of the queue."""
        shards = [s for a in self._outstanding.pop(worker_id, []) for s in a]
        if shards:
            self.queue.requeue(shards)
        return shards

    def _observe_cycle(self, worker: WorkerRecord, cycle: dict[str, Any]) -> None:
        """Record one local training cycle; feed the allocator; resize stragglers."""
        elapsed = round(time.time() - self.started_at, 3)
        worker.record_cycle(elapsed, cycle)
        wid = worker.id
        self.metrics.worker_cycles.labels(worker=wid).set(worker.cycles)
        self.metrics.worker_cycle_seconds.labels(worker=wid).set(cycle["compute_seconds"])
        self.metrics.worker_wi.labels(worker=wid).set(worker.worker_independence)
        if cycle["decision"] != "always":
            self.metrics.gate_decisions.labels(worker=wid, decision="push" if cycle["pushed"] else "skip").inc()
            if cycle["z"] is not None:
                self.metrics.gate_zscore.labels(worker=wid).set(cycle["z"])
        self.events.emit("cycle", worker=wid, elapsed=elapsed, **cycle)
        self.allocator.observe(wid, CycleObservation(cycle["dss"], cycle["mbs"], cycle["compute_seconds"],
                                                     cycle["accumulation"]))
        self._apply_resizes(self.allocator.rebalance(), elapsed)

    def _apply_memory_limits(self, rec: WorkerRecord) -> None:
        """Caps from the memory a worker declared at registration."""
        memory = rec.hints.get("memory_available_bytes")
        if not isinstance(memory, int) or memory <= 0:
            return
        # A quarter of the device's free memory for the samples of one
        # cycle (two buffers with prefetching): the DSS cap of Hermes Sec. IV-A.
        per_sample = self.train.x[0].nbytes + self.train.y[0].nbytes
        self.allocator.set_memory_limit(rec.id, max(self.config.shard_size, memory // (8 * per_sample)))
        profile = rec.hints.get("memory_profile")
        if not profile:
            return
        try:
            # OmniLearn Eq. 9: training memory is m0 + m1*b, fitted on the worker's own measurements.
            m0, m1 = fit_memory_model([(int(b), float(m)) for b, m in profile])
            b_max = max_batch_for_memory(m0, m1, memory * self.config.batch_bounds.memory_fraction)
        except (TypeError, ValueError) as exc:
            log.warning("worker %s: unusable memory profile %r: %s", rec.id, profile, exc)
            self.events.emit("memory_profile_rejected", worker=rec.id, error=str(exc)[:200])
            return
        self.allocator.set_batch_limit(rec.id, b_max)
        self.events.emit("memory_model", worker=rec.id, m0=round(m0), m1=round(m1, 3), b_max=b_max,
                         budget=int(memory * self.config.batch_bounds.memory_fraction))

    def _record_workload(self, rec: WorkerRecord, elapsed: float, wl: Workload) -> None:
        rec.workload_history.append((elapsed, wl.dss, wl.mbs))
        rec.accumulation = wl.accumulation
        self.metrics.worker_dss.labels(worker=rec.id).set(wl.dss)
        self.metrics.worker_mbs.labels(worker=rec.id).set(wl.mbs)

    def _apply_resizes(self, resizes: dict[str, Resize], elapsed: float) -> None:
        if self.stopping:
            return  # at shutdown everyone leaves: there is no work left to re-split
        for resized_id, resize in resizes.items():
            rec = self.registry.get(resized_id)
            if rec is None or rec.state != "active":
                continue
            wl = resize.workload
            if rec.workload_history and rec.workload_history[-1][1:] == (wl.dss, wl.mbs) \
                    and rec.accumulation == wl.accumulation:
                continue  # e.g. a joining worker, recorded at registration
            self._record_workload(rec, elapsed, wl)
            self.metrics.stragglers.labels(worker=resized_id, kind=resize.kind).inc()
            log.info("worker %s resized (%s): dss=%d mbs=%d accumulation=%d %s", resized_id, resize.kind,
                     wl.dss, wl.mbs, wl.accumulation, resize.detail)
            self.events.emit("resize", worker=resized_id, kind=resize.kind, dss=wl.dss, mbs=wl.mbs,
                             accumulation=wl.accumulation, **resize.detail)

    def publish_to_kafka(self, opts: KafkaOptions) -> None:
        """Write both splits into Kafka (blocking: run it in a thread before serving)."""
        try:
            import kafka  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the kafka extra is missing
            raise RuntimeError(
                f"the Kafka data plane needs kafka-python: pip install 'hermes-edge[kafka]' ({exc})"
            ) from None
        published = publish_stores(self.shards, self.validation_shards, dataset=self.config.dataset, opts=opts)
        self._kafka_opts = opts
        self._last_publish = time.monotonic()
        self.kafka = {
            "bootstrap": opts.bootstrap,
            "train": published["train"].layout,
            "validation": published["validation"].layout,
            "reused": {k: v.reused for k, v in published.items()},
            "publish_seconds": round(sum(v.seconds for v in published.values()), 6),
        }
        self.events.emit(
            "shards_published", bootstrap=opts.bootstrap, publish_seconds=self.kafka["publish_seconds"],
            **{split: v.layout.describe() | {"reused": v.reused} for split, v in published.items()},
        )

    def republish_kafka(self, reason: str, *, min_interval: float = 2.0) -> bool:
        """Publish the shards again in a background thread, e.g. after an agent found them gone
        (a broker that keeps data in memory restarted). The layout is deterministic, so every
        shard returns to the offset already assigned: agents read from Kafka again as soon as
        it is back, and the data plane serves meanwhile. False when not started (no Kafka,
        already running, or the last publish was less than ``min_interval`` seconds ago)."""
        if self._kafka_opts is None or time.monotonic() - self._last_publish < min_interval:
            return False
        if not self._republishing.acquire(blocking=False):
            return False

        def run() -> None:
            t0 = time.perf_counter()
            try:
                published = publish_stores(self.shards, self.validation_shards, dataset=self.config.dataset,
                                           opts=self._kafka_opts)
                same = all(published[k].layout == self.kafka[k] for k in ("train", "validation"))
                self.events.emit("shards_republished", reason=reason, seconds=round(time.perf_counter() - t0, 6),
                                 same_layout=same, reused={k: v.reused for k, v in published.items()})
                log.info("shard records republished to %s (%s)", self._kafka_opts.bootstrap, reason)
            except Exception as exc:  # the broker may still be down; the next report tries again
                log.warning("republishing shard records to %s failed: %s", self._kafka_opts.bootstrap, exc)
                self.events.emit("shards_republish_failed", reason=reason, error=str(exc)[:500])
            finally:
                self._last_publish = time.monotonic()
                self._republishing.release()

        threading.Thread(target=run, name="hermes-kafka-republish", daemon=True).start()
        return True

    def data_plane_info(self) -> dict[str, Any]:
        if self.kafka is None:
            return {"source": "zmq"}
        return {
            "source": "kafka", "bootstrap": self.kafka["bootstrap"],
            "publish_seconds": self.kafka["publish_seconds"], "reused": self.kafka["reused"],
            "topics": {split: self.kafka[split].describe() for split in ("train", "validation")},
        }

    def _kafka_fields(self, split: str, shards: Sequence[int]) -> dict[str, Any]:
        """What a reader needs to fetch these shards from Kafka ({"source": "zmq"} without a broker)."""
        if self.kafka is None:
            return {"source": "zmq"}
        layout = self.kafka[split]
        return {
            "source": "kafka", "bootstrap": self.kafka["bootstrap"], "topic": layout.topic,
            "partitions": layout.partitions, "ranges": layout.ranges_for(shards),
            "max_record_bytes": layout.max_record_bytes,
        }

    def data_source_for(self, worker: WorkerRecord) -> dict[str, Any]:
        """The register reply's ``data_source``: where this worker's validation shards are read from."""
        return self._kafka_fields("validation", self.validation_shards_for(worker))

    def validation_shards_for(self, worker: WorkerRecord) -> list[int]:
        """A fixed local validation split per worker (its gate's data), spread over the validation set."""
        n = self.validation_shards.num_shards
        k = min(n, shards_for(self.config.zscore.validation_samples, self.config.shard_size))
        start = (int(worker.id.lstrip("w") or 0) * k) % n
        return [(start + i) % n for i in range(k)]

    def _refresh_worker_gauge(self) -> None:
        workers = self.registry.all()
        for state in ("active", "left", "lost"):
            self.metrics.workers.labels(state=state).set(sum(1 for w in workers if w.state == state))

    @property
    def outcome(self) -> str:
        """running, stopped (operator, SIGTERM's shutdown) or target_reached (the server stopped itself)."""
        if self.target_reached is not None:
            return "target_reached"
        return "stopped" if self.stopping else "running"

    def status(self) -> dict[str, Any]:
        ev = self.evaluator.latest
        best = self.evaluator.best
        return {
            "preset": self.config.preset,
            "sync": self.config.sync,
            "model_version": self.state.version,
            "elapsed_seconds": round(time.time() - self.started_at, 3),
            "epoch_progress": round(self.queue.progress, 4),
            "evaluation": None if ev is None else {
                "version": ev.version, "accuracy": ev.accuracy, "loss": ev.loss, "at": ev.at,
            },
            "workers_active": len(self.registry.active_ids()),
            "heterogeneity": self.registry.heterogeneity(),
            "workloads": {
                r.id: {"name": r.name, "dss": r.workload_history[-1][1], "mbs": r.workload_history[-1][2],
                       "accumulation": r.accumulation}
                for r in self.registry.all() if r.state == "active" and r.workload_history
            },
            "workers_total": len(self.registry.all()),
            "stopping": self.stopping,
            "stop_reason": self.stop_reason,
            "outcome": self.outcome,
            "target_accuracy": self.config.target_accuracy,
            "target_reached_at": None if self.target_reached is None else self.target_reached.public(),
            "best_accuracy": None if best is None else best.accuracy,
            "best_version": None if best is None else best.version,
            "resumed_from": self.resumed_from,
            "last_checkpoint_version": None if self.checkpoints is None else self.checkpoints.last_version,
        }

    def summary(self) -> dict[str, Any]:
        ev = self.evaluator.latest
        return {
            **self.status(),
            # Over every worker of the run: at shutdown the active ones have left.
            "heterogeneity": self.registry.heterogeneity(active_only=False),
            "config": self.config.model_dump(),
            "model": self.spec.to_dict() | {"entries": len(self.spec.entries)},
            "model_updates": self.state.version,
            "messages_total": sum(self.message_counts.values()),
            "messages_by_type": dict(self.message_counts),
            "bytes_received_total": sum(w.server_bytes_in for w in self.registry.all()),
            "bytes_sent_total": sum(w.server_bytes_out for w in self.registry.all()),
            "final_accuracy": None if ev is None else ev.accuracy,
            "final_loss": None if ev is None else ev.loss,
            "evaluations": [
                {"version": e.version, "accuracy": e.accuracy, "loss": e.loss,
                 "elapsed": round(e.at - self.started_at, 3), "seconds": round(e.seconds, 6)}
                for e in self.evaluator.history
            ],
            "workers": [w.public() for w in self.registry.all()],
            "data_plane": self.data_plane_info(),
        }

    # ---- data plane ---------------------------------------------------------

    async def handle(self, frames: Sequence[Any]) -> list:
        """Reply frames for one request; raises ProtocolError for bad input."""
        size = sum(len(f.buffer) if hasattr(f, "buffer") else len(f) for f in frames)
        self.metrics.bytes_in.inc(size)
        if self.shutting_down:
            raise _going_away()
        msg = await _offload(size, decode, frames, max_message_bytes=self.max_message_bytes)
        h = msg.header
        if h.type not in _HANDLERS:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"{h.type.value} is a reply type, not a request")
        worker = self.registry.lookup(h.worker)
        # Signature first: nothing unauthenticated may move the replay counters.
        if not await _offload(size, verify_mac, frames[0], h, frames[1:], worker.key):
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"bad signature from worker {h.worker!r}")
        self.replay.check(h)
        if worker.state != "active":
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"worker {worker.id} is {worker.state}; register again")
        worker.last_seen = time.time()
        _request.set(h)
        worker.server_bytes_in += size
        worker.messages += 1
        self.message_counts[h.type.value] = self.message_counts.get(h.type.value, 0) + 1
        self.metrics.messages.labels(type=h.type.value).inc()
        reply = await _HANDLERS[h.type](self, worker, msg)
        out = sum(len(f) for f in reply)
        worker.server_bytes_out += out
        self.metrics.bytes_out.inc(out)
        return reply

    def _reply(self, type_: MsgType, worker: WorkerRecord, seq: int, body: dict, payload=None) -> list:
        body = {**body, "stop": self.stopping}
        header = Header(type=type_, worker=worker.id, seq=seq, model_version=self.state.version, body=body,
                        session=_request.get().session)
        return encode(header, payload, key=worker.key)

    async def _on_push(self, worker: WorkerRecord, msg: Message) -> list:
        h = msg.header
        # >= 1: with aggregation "samples" a group whose counts sum to 0 has no
        # weights (ValueError inside _fold), which left BSP peers held forever.
        samples = _int_field(h.body, "samples", minimum=1)
        loss = h.body.get("loss")
        if loss is not None and (not isinstance(loss, (int, float)) or isinstance(loss, bool) or not math.isfinite(loss)):
            raise ProtocolError(ErrorCode.BAD_REQUEST, "loss must be a finite number")
        if h.model_version < 0 or h.model_version > self.state.version:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"base model_version {h.model_version} not in [0, {self.state.version}]"
            )
        cycle = _cycle_fields(h.body.get("cycle"))
        await _offload(_payload_bytes(msg.payload), validate_update, self.spec, msg.payload)
        worker.pushes += 1
        if cycle is not None:
            self._observe_cycle(worker, cycle)
        if self.stopping:
            return self._reply(MsgType.PUSH_REPLY, worker, h.seq, {"status": "rejected", "reason": "run is stopping"})
        candidate_loss = None
        if self.probe is not None:
            # Scored outside the step lock: it depends only on w0 and G, so
            # concurrent pushes are scored in parallel and serialised only
            # for the blend itself.
            candidate_loss = await asyncio.to_thread(self.probe.candidate_loss, msg.payload)
        async with self._step:
            if self.stopping:
                # The stop came while this push was being scored or waited for
                # the lock: after a stop nothing is folded, and nothing may be
                # held for a barrier that request_stop has already released.
                return self._reply(MsgType.PUSH_REPLY, worker, h.seq,
                                   {"status": "rejected", "reason": "run is stopping"})
            info = PushInfo(worker.id, h.model_version, self.state.version, samples, worker.pushes,
                            at=time.monotonic())
            verdict = self.strategy.on_push(info)
            held: _Held | None = None
            if verdict.decision is Decision.REJECT:
                worker.rejected += 1
                self.metrics.updates.labels(outcome="rejected").inc()
                self.events.emit("update_rejected", worker=worker.id, base=h.model_version, reason=verdict.reason)
                return self._reply(
                    MsgType.PUSH_REPLY, worker, h.seq, {"status": "rejected", "reason": verdict.reason}
                )
            if verdict.decision in (Decision.APPLY, Decision.APPLY_AND_WAIT):
                await self._fold([_Update(info, msg.payload, candidate_loss)])
            if verdict.decision in (Decision.BUFFER, Decision.APPLY_AND_WAIT):
                held = _Held(info, msg.payload if verdict.decision is Decision.BUFFER else None,
                             asyncio.get_running_loop().create_future(), candidate_loss)
                self._held[worker.id] = held
            await self._process_releases()
        if held is not None:
            await held.reply
        status = "applied" if not self.stopping or held is None else "abandoned"
        return self._reply(MsgType.PUSH_REPLY, worker, h.seq, {"status": status, "staleness": info.staleness})

    async def _fold(self, group: list[_Update]) -> None:
        """One model step from a group of updates. Caller holds _step."""
        t0 = time.perf_counter()
        extra: dict[str, Any] = {}
        if self.probe is not None:
            (update,) = group  # config validation keeps ``loss`` to one-at-a-time strategies
            if self.state.version == 0:
                weight = 1.0  # Hermes Alg. 2 initial step: sigma <- G
            else:
                _, global_loss = await asyncio.to_thread(self.probe.global_loss)
                weight = loss_blend_weight(global_loss, update.candidate_loss)
                extra = {"global_loss": round(global_loss, 6)}
            extra["candidate_loss"] = round(update.candidate_loss, 6)
            self.metrics.blend_weight.observe(weight)
            weights = [weight]
            version = await asyncio.to_thread(self.state.blend, update.payload, weight)
        elif self.config.aggregation == "power":
            # EDP-SGD Sec. 4.2: each update weighs its worker's normalised compute power.
            weights = power_weights([self._compute_power(u.info.worker_id) for u in group])
            version = await _offload(
                sum(_payload_bytes(u.payload) for u in group),
                self.state.apply, [(u.payload, w) for u, w in zip(group, weights)],
            )
        else:
            weights = aggregation_weights(self.config.aggregation, [u.info.samples for u in group])
            version = await _offload(
                sum(_payload_bytes(u.payload) for u in group),
                self.state.apply, [(u.payload, w) for u, w in zip(group, weights)],
            )
        if self.checkpoints is not None:
            # Journaled before any reply goes out: what is acknowledged survives a crash.
            await asyncio.to_thread(self.checkpoints.record_fold, version, "blend" if self.probe else "apply",
                                    [u.payload for u in group], weights)
        self.metrics.apply_seconds.observe(time.perf_counter() - t0)
        self.metrics.model_version.set(version)
        for u in group:
            rec = self.registry.get(u.info.worker_id)
            if rec is not None:
                rec.applied += 1
            # Staleness against the model the update was folded into.
            self.metrics.staleness.observe(version - 1 - u.info.base_version)
            self.metrics.updates.labels(outcome="applied").inc()
        self.events.emit(
            "update_applied", version=version, workers=[u.info.worker_id for u in group],
            staleness=[version - 1 - u.info.base_version for u in group], weights=[round(w, 6) for w in weights],
            **extra,
        )

    async def _process_releases(self) -> None:
        """Fold and wake whatever the strategy releases. Caller holds _step."""
        while (release := self.strategy.take_release()) is not None:
            group = [
                _Update(h.info, h.payload, h.candidate_loss)
                for w in release.aggregate
                if (h := self._held.get(w)) is not None and h.payload is not None
            ]
            try:
                if group:
                    await self._fold(group)
            finally:
                # Even if folding failed, nobody may stay held for a step that is gone.
                for w in release.wake:
                    held = self._held.pop(w, None)
                    if held is not None and not held.reply.done():
                        held.reply.set_result(None)

    async def _on_pull(self, worker: WorkerRecord, msg: Message) -> list:
        h = msg.header
        worker.pulls += 1
        if h.body.get("if_newer") and h.model_version == self.state.version:
            return self._reply(MsgType.MODEL, worker, h.seq, {"unchanged": True})
        dtype_name = h.body.get("dtype", "float32")
        if dtype_name not in ("float32", "float16", "bfloat16"):
            raise ProtocolError(ErrorCode.BAD_DTYPE, f"models are served as float32/float16/bfloat16, not {dtype_name!r}")
        dtype = dtype_from_name(dtype_name)
        nbytes = self.spec.numel * torch.empty(0, dtype=dtype).element_size()
        version, flat = await _offload(nbytes, self.state.prepared, dtype)
        header = Header(
            type=MsgType.MODEL, worker=worker.id, seq=h.seq, model_version=version, session=h.session,
            shapes=self.spec.shapes, body={"unchanged": False, "stop": self.stopping},
        )
        return await _offload(nbytes, encode, header, flat, key=worker.key)

    def _compute_power(self, worker_id: str) -> float:
        power = getattr(self.allocator, "power", lambda _w: None)(worker_id)
        if power is None:
            rec = self.registry.get(worker_id)
            power = rec.throughput() if rec is not None else None
        return power or 1.0  # before any measurement every worker counts alike (DP-SGD Alg. 1 line 5)

    def _learning_rate(self, mbs: int) -> float:
        if self.config.lr_scaling != "batch-scaled":
            return self.config.lr
        # OmniLearn Eq. 5b: eta_k = eta * b_k / sum_i b_i over the active workers.
        total = sum(self.allocator.workload(w).step_batch for w in self.registry.active_ids())
        return batch_scaled_lr(self.config.lr, mbs, max(total, mbs))

    async def _on_request_work(self, worker: WorkerRecord, msg: Message) -> list:
        wl = self.allocator.workload(worker.id)
        # Whole shards, while a workload is any number of samples: the agent
        # trains exactly ``cycle_samples`` and carries the rest into its next
        # cycle. The server keeps the same account (the credit), so it hands
        # out only what the carry does not cover and no sample is skipped.
        need = wl.dss - worker.sample_credit
        if need > 0:
            assignment = self.queue.take(shards_for(need, self.config.shard_size))
        else:
            assignment = Assignment(epoch=self.queue.epoch, shards=())
        given = sum(self.shards.samples(s) for s in assignment.shards)
        # Never negative: short of data the agent trains what it has and carries nothing.
        worker.sample_credit = max(0, worker.sample_credit + given - wl.dss)
        self._note_assignment(worker.id, assignment.shards)
        body = {
            "epoch": assignment.epoch,
            "shards": list(assignment.shards),
            "batch_size": wl.mbs,
            "cycle_samples": wl.dss,
            "accumulation": wl.accumulation,
            "lr": self._learning_rate(wl.step_batch),
            **self._kafka_fields("train", assignment.shards),
        }
        self.events.emit("assignment", worker=worker.id, epoch=assignment.epoch, shards=list(assignment.shards),
                         dss=wl.dss, mbs=wl.mbs, accumulation=wl.accumulation, lr=body["lr"])
        return self._reply(MsgType.WORK, worker, msg.header.seq, body)

    async def _on_fetch_shard(self, worker: WorkerRecord, msg: Message) -> list:
        """One shard record (body ``shard``), or several in one reply (body ``shards``).

        Several: the payload is the records back to back and ``lengths`` cuts
        it; one request per assignment instead of one per shard (a fast
        worker's 25-shard cycle made 25 requests).
        """
        body = msg.header.body
        split = body.get("split", "train")
        store = {"train": self.shards, "validation": self.validation_shards}.get(split)
        if store is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"split must be 'train' or 'validation', got {split!r}")
        if "shards" in body:
            ids = body["shards"]
            if (not isinstance(ids, list) or not 0 < len(ids) <= MAX_SHARDS_PER_FETCH
                    or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)):
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"body field 'shards' must be a list of 1..{MAX_SHARDS_PER_FETCH} ints")
        else:
            ids = [_int_field(body, "shard", minimum=0)]
        for shard in ids:
            if not 0 <= shard < store.num_shards:
                raise ProtocolError(ErrorCode.BAD_REQUEST, f"{split} shard {shard} out of range [0, {store.num_shards})")
        if "shards" not in body:
            return self._reply(MsgType.SHARD, worker, msg.header.seq, {"shard": ids[0]}, payload=store.record(ids[0]))
        records = [store.record(i) for i in ids]
        reply = {"shards": ids, "lengths": [len(r) for r in records]}
        return self._reply(MsgType.SHARD, worker, msg.header.seq, reply, payload=b"".join(records))

    async def _on_report(self, worker: WorkerRecord, msg: Message) -> list:
        b = msg.header.body
        counters = {
            "samples": _int_field(b, "samples", minimum=0),
            "bytes_sent": _int_field(b, "bytes_sent", minimum=0),
            "bytes_received": _int_field(b, "bytes_received", minimum=0),
            "compute_seconds": _float_field(b, "compute_seconds"),
            "wait_seconds": _float_field(b, "wait_seconds"),
            "prefetch_wait_seconds": _float_field(b, "prefetch_wait_seconds"),
        }
        for k, v in counters.items():
            setattr(worker, k, v)
        if "collective_bytes" in b:  # topology collective: the all-reduce traffic the agent sent
            worker.collective_bytes = _int_field(b, "collective_bytes", minimum=0)
        missing_before = worker.kafka_data_missing
        _shard_traffic(worker, b)
        if worker.kafka_data_missing > missing_before:
            self.republish_kafka(f"worker {worker.id} found shard records missing from Kafka")
        precision = b.get("precision", "")
        if isinstance(precision, str):
            worker.precision = precision[:16]
        profile = b.get("memory_profile")
        if profile is not None:
            if (not isinstance(profile, list) or not 2 <= len(profile) <= 16
                    or not all(isinstance(p, list) and len(p) == 2 and all(_is_number(v) and v > 0 for v in p)
                               for p in profile)):
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    "body field 'memory_profile' must be 2..16 [batch, bytes] pairs of positive numbers")
            worker.hints["memory_profile"] = profile
            self._apply_memory_limits(worker)
            self._apply_resizes(self.allocator.rebalance(), round(time.time() - self.started_at, 3))
        cycle = _cycle_fields(b.get("cycle"))
        if cycle is not None:
            self._observe_cycle(worker, cycle)
        self.metrics.worker_compute.labels(worker=worker.id).set(worker.compute_seconds)
        self.metrics.worker_wait.labels(worker=worker.id).set(worker.wait_seconds)
        self.metrics.worker_samples.labels(worker=worker.id).set(worker.samples)
        self.metrics.worker_prefetch_wait.labels(worker=worker.id).set(worker.prefetch_wait_seconds)
        for source, nbytes in worker.shard_bytes.items():
            self.metrics.worker_shard_bytes.labels(worker=worker.id, source=source).set(nbytes)
        return self._reply(MsgType.STATS_ACK, worker, msg.header.seq, {})


# The request being handled (each request runs in its own task): replies
# echo its session, so a signed reply cannot answer another connection.
_request: contextvars.ContextVar[Header] = contextvars.ContextVar("hermes_request")


def _going_away() -> ProtocolError:
    return ProtocolError(ErrorCode.UNAVAILABLE, "server is shutting down; retry after it restarts")


_SHARD_SOURCES = ("kafka", "zmq")
_SHARD_COUNTERS = ("corrupt_records", "shard_refetches", "kafka_fallbacks", "kafka_reconnects",
                   "kafka_discarded_bytes", "kafka_data_missing")


def _shard_traffic(worker: WorkerRecord, b: dict) -> None:
    """The shard-fetch part of a stats report (optional: older agents do not send it)."""
    if "prefetch_wait_steady_seconds" in b:
        worker.prefetch_wait_steady_seconds = _float_field(b, "prefetch_wait_steady_seconds")
    for key in ("shard_bytes", "shard_records"):
        raw = b.get(key)
        if raw is None:
            continue
        if not isinstance(raw, dict) or not set(raw) <= set(_SHARD_SOURCES):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"body field {key!r} must map {_SHARD_SOURCES} to counts")
        setattr(worker, key, {src: _int_field(raw, src, minimum=0) for src in raw})
    for key in _SHARD_COUNTERS:
        if key in b:
            setattr(worker, key, _int_field(b, key, minimum=0))
    source = b.get("data_source")
    if isinstance(source, str):
        worker.data_source = source[:16]


def _cycle_fields(raw: Any) -> dict[str, Any] | None:
    """The per-cycle report an agent attaches to a push or a stats message."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.BAD_REQUEST, "body field 'cycle' must be a map")
    out: dict[str, Any] = {
        "dss": _int_field(raw, "dss", minimum=1),
        "mbs": _int_field(raw, "mbs", minimum=1),
        "compute_seconds": _float_field(raw, "compute_seconds"),
        # Older agents do not send it: they never accumulate.
        "accumulation": _int_field(raw, "accumulation", minimum=1) if "accumulation" in raw else 1,
    }
    for key in ("val_loss", "z", "alpha"):
        v = raw.get(key)
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v)):
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"cycle field {key!r} must be a finite number or nil")
        out[key] = None if v is None else float(v)
    pushed, decision = raw.get("pushed", True), raw.get("decision", "always")
    if not isinstance(pushed, bool) or not isinstance(decision, str) or len(decision) > 32:
        raise ProtocolError(ErrorCode.BAD_REQUEST, "cycle fields 'pushed' (bool) and 'decision' (short str) malformed")
    out["pushed"], out["decision"] = pushed, decision
    return out


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_field(body: dict, key: str, *, minimum: int) -> int:
    v = body.get(key)
    if not isinstance(v, int) or isinstance(v, bool) or v < minimum:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body field {key!r} must be an int >= {minimum}, got {v!r}")
    return v


def _float_field(body: dict, key: str) -> float:
    v = body.get(key, 0.0)
    if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v < 0:
        raise ProtocolError(ErrorCode.BAD_REQUEST, f"body field {key!r} must be a finite number >= 0, got {v!r}")
    return float(v)


_HANDLERS = {
    MsgType.PUSH_UPDATE: Engine._on_push,
    MsgType.PULL_MODEL: Engine._on_pull,
    MsgType.REQUEST_WORK: Engine._on_request_work,
    MsgType.FETCH_SHARD: Engine._on_fetch_shard,
    MsgType.REPORT_STATS: Engine._on_report,
}
