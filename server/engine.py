"""The training engine: owns the loop state, asks the policies, folds updates.

The data plane hands it decoded-but-untrusted messages; it authenticates,
validates, consults the sync strategy and the aggregation rule, and returns
reply frames. It never touches a socket. Tensor work (checksums, finiteness,
axpy, snapshots) runs in executor threads so the event loop keeps serving.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from hermes.common.aggregation import aggregation_weights
from hermes.common.config import RunConfig
from hermes.common.datasets import load_dataset
from hermes.common.models import build_model
from hermes.common.shards import ShardQueue, shards_for
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
)
from hermes.server.evaluator import Evaluation, Evaluator
from hermes.server.events import EventLog
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import ShardStore
from hermes.server.state import ModelState, validate_update

log = logging.getLogger(__name__)

# Messages bigger than this are decoded (checksummed) off the event loop.
_INLINE_DECODE_BYTES = 256 * 1024


@dataclass
class _Held:
    info: PushInfo
    payload: Payload | None
    reply: asyncio.Future


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
    ) -> None:
        self.config = config
        self.metrics = metrics
        self.events = events
        self.max_message_bytes = max_message_bytes
        self.out_dir = Path(out_dir) if out_dir else None
        self.train, self.test = load_dataset(
            config.dataset,
            root=config.dataset_root,
            seed=config.seed,
            test_fraction=config.test_fraction,
            num_samples=config.num_samples,
        )
        # Replicas start from identical weights: the server builds the seeded
        # initial model and every agent pulls it before its first step.
        torch.manual_seed(config.seed)
        model = build_model(
            config.model, input_shape=self.train.input_shape, num_classes=self.train.num_classes, **config.model_kwargs
        )
        self.spec = spec_of(model, config.model, self.train.input_shape, self.train.num_classes, **config.model_kwargs)
        self.state = ModelState(self.spec, flatten(model))
        del model
        self.strategy = make_strategy(config.sync, **self._strategy_params())
        self.registry = Registry(max_workers)
        self.shards = ShardStore(self.train, config.shard_size)
        self.queue = ShardQueue(self.shards.num_shards, seed=config.seed)
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
        self._held: dict[str, _Held] = {}
        self._step = asyncio.Lock()
        self.metrics.model_version.set(0)

    def _strategy_params(self) -> dict[str, Any]:
        if self.config.sync == "asp":
            return {"max_staleness": self.config.max_staleness}
        return {}

    # ---- lifecycle -------------------------------------------------------

    def start(self) -> None:
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

    def shutdown(self) -> dict[str, Any]:
        self.request_stop(self.stop_reason or "shutdown")
        self.evaluator.stop()
        final = self.evaluator.evaluate_now()
        summary = self.summary()
        self.events.emit("run_end", version=self.state.version, accuracy=final.accuracy, loss=final.loss)
        if self.out_dir is not None:
            self.out_dir.mkdir(parents=True, exist_ok=True)
            tmp = self.out_dir / "server_summary.json.tmp"
            tmp.write_text(json.dumps(summary, indent=2))
            tmp.replace(self.out_dir / "server_summary.json")
        self.events.close()
        return summary

    def _on_evaluation(self, ev: Evaluation) -> None:
        self.metrics.test_accuracy.set(ev.accuracy)
        self.metrics.test_loss.set(ev.loss)
        self.metrics.evaluated_version.set(ev.version)
        self.metrics.eval_seconds.observe(ev.seconds)
        self.events.emit(
            "evaluation", version=ev.version, accuracy=ev.accuracy, loss=ev.loss,
            seconds=round(ev.seconds, 6), elapsed=round(ev.at - self.started_at, 3),
        )

    # ---- control plane ----------------------------------------------------

    def register(self, name: str, **info: Any) -> tuple[WorkerRecord, bool]:
        rec, rejoined = self.registry.register(name, **info)
        self.strategy.on_join(rec.id)
        self._refresh_worker_gauge()
        self.events.emit("join", worker=rec.id, name=name, rejoined=rejoined, **info)
        log.info("worker %s (%s) %s", rec.id, name, "rejoined" if rejoined else "joined")
        return rec, rejoined

    async def leave(self, worker_id: str, reason: str) -> None:
        rec = self.registry.get(worker_id)
        if rec is None or rec.state != "active":
            return
        rec.state = "left"
        self.strategy.on_leave(worker_id)
        self._refresh_worker_gauge()
        self.events.emit("leave", worker=worker_id, reason=reason)
        log.info("worker %s left: %s", worker_id, reason)
        async with self._step:
            await self._process_releases()

    def _refresh_worker_gauge(self) -> None:
        workers = self.registry.all()
        for state in ("active", "left"):
            self.metrics.workers.labels(state=state).set(sum(1 for w in workers if w.state == state))

    def status(self) -> dict[str, Any]:
        ev = self.evaluator.latest
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
            "workers_total": len(self.registry.all()),
            "stopping": self.stopping,
            "stop_reason": self.stop_reason,
        }

    def summary(self) -> dict[str, Any]:
        ev = self.evaluator.latest
        return {
            **self.status(),
            "config": self.config.model_dump(),
            "model": self.spec.to_dict() | {"entries": len(self.spec.entries)},
            "model_updates": self.state.version,
            "final_accuracy": None if ev is None else ev.accuracy,
            "final_loss": None if ev is None else ev.loss,
            "evaluations": [
                {"version": e.version, "accuracy": e.accuracy, "loss": e.loss,
                 "elapsed": round(e.at - self.started_at, 3), "seconds": round(e.seconds, 6)}
                for e in self.evaluator.history
            ],
            "workers": [w.public() for w in self.registry.all()],
        }

    # ---- data plane ---------------------------------------------------------

    async def handle(self, frames: Sequence[Any]) -> list:
        """Reply frames for one request; raises ProtocolError for bad input."""
        size = sum(len(f.buffer) if hasattr(f, "buffer") else len(f) for f in frames)
        self.metrics.bytes_in.inc(size)
        if size > _INLINE_DECODE_BYTES:
            msg = await asyncio.to_thread(decode, frames, max_message_bytes=self.max_message_bytes)
        else:
            msg = decode(frames, max_message_bytes=self.max_message_bytes)
        h = msg.header
        if h.type not in _HANDLERS:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"{h.type.value} is a reply type, not a request")
        worker = self.registry.authenticate(h.worker, h.token)
        if worker.state != "active":
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"worker {worker.id} has left; register again")
        worker.server_bytes_in += size
        self.metrics.messages.labels(type=h.type.value).inc()
        reply = await _HANDLERS[h.type](self, worker, msg)
        out = sum(len(f) for f in reply)
        worker.server_bytes_out += out
        self.metrics.bytes_out.inc(out)
        return reply

    def _reply(self, type_: MsgType, worker: WorkerRecord, seq: int, body: dict, payload=None) -> list:
        body = {**body, "stop": self.stopping}
        header = Header(type=type_, worker=worker.id, seq=seq, model_version=self.state.version, body=body)
        return encode(header, payload)

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
        await asyncio.to_thread(validate_update, self.spec, msg.payload)
        worker.pushes += 1
        if self.stopping:
            return self._reply(MsgType.PUSH_REPLY, worker, h.seq, {"status": "rejected", "reason": "run is stopping"})
        async with self._step:
            info = PushInfo(worker.id, h.model_version, self.state.version, samples, worker.pushes)
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
                await self._fold([(info, msg.payload)])
            if verdict.decision in (Decision.BUFFER, Decision.APPLY_AND_WAIT):
                held = _Held(info, msg.payload if verdict.decision is Decision.BUFFER else None,
                             asyncio.get_running_loop().create_future())
                self._held[worker.id] = held
            await self._process_releases()
        if held is not None:
            await held.reply
        status = "applied" if not self.stopping or held is None else "abandoned"
        return self._reply(MsgType.PUSH_REPLY, worker, h.seq, {"status": status, "staleness": info.staleness})

    async def _fold(self, group: list[tuple[PushInfo, Payload]]) -> None:
        weights = aggregation_weights(self.config.aggregation, [info.samples for info, _ in group])
        t0 = time.perf_counter()
        version = await asyncio.to_thread(self.state.apply, [(p, w) for (_, p), w in zip(group, weights)])
        self.metrics.apply_seconds.observe(time.perf_counter() - t0)
        self.metrics.model_version.set(version)
        for info, _ in group:
            rec = self.registry.get(info.worker_id)
            if rec is not None:
                rec.applied += 1
            # Staleness against the model the update was folded into.
            self.metrics.staleness.observe(version - 1 - info.base_version)
            self.metrics.updates.labels(outcome="applied").inc()
        self.events.emit(
            "update_applied", version=version, workers=[i.worker_id for i, _ in group],
            staleness=[version - 1 - i.base_version for i, _ in group], weights=[round(w, 6) for w in weights],
        )

    async def _process_releases(self) -> None:
        """Fold and wake whatever the strategy releases. Caller holds _step."""
        while (release := self.strategy.take_release()) is not None:
            group = [(self._held[w].info, self._held[w].payload) for w in release.aggregate if w in self._held]
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
        version, flat = await asyncio.to_thread(self.state.snapshot, dtype_from_name(dtype_name))
        header = Header(
            type=MsgType.MODEL, worker=worker.id, seq=h.seq, model_version=version,
            shapes=self.spec.shapes, body={"unchanged": False, "stop": self.stopping},
        )
        return encode(header, flat)

    async def _on_request_work(self, worker: WorkerRecord, msg: Message) -> list:
        cycle = self.config.cycle_samples
        assignment = self.queue.take(shards_for(cycle, self.config.shard_size))
        body = {
            "epoch": assignment.epoch,
            "shards": list(assignment.shards),
            "batch_size": self.config.batch_size,
            "cycle_samples": cycle,
            "lr": self.config.lr,
        }
        self.events.emit("assignment", worker=worker.id, epoch=assignment.epoch, shards=list(assignment.shards))
        return self._reply(MsgType.WORK, worker, msg.header.seq, body)

    async def _on_fetch_shard(self, worker: WorkerRecord, msg: Message) -> list:
        shard = _int_field(msg.header.body, "shard", minimum=0)
        if shard >= self.shards.num_shards:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"shard {shard} out of range [0, {self.shards.num_shards})")
        record = self.shards.record(shard)
        return self._reply(MsgType.SHARD, worker, msg.header.seq, {"shard": shard}, payload=record)

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
        precision = b.get("precision", "")
        if isinstance(precision, str):
            worker.precision = precision[:16]
        self.metrics.worker_compute.labels(worker=worker.id).set(worker.compute_seconds)
        self.metrics.worker_wait.labels(worker=worker.id).set(worker.wait_seconds)
        self.metrics.worker_samples.labels(worker=worker.id).set(worker.samples)
        return self._reply(MsgType.STATS_ACK, worker, msg.header.seq, {})


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
