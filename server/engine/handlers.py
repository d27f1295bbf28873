"""The data plane's five requests: authenticate, parse the body once, hand it to the engine, reply.

Bodies are checked at this boundary by ``hermes.common.messages.parse_body``;
past it the engine sees typed values only.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import torch

from hermes.common.clock import Clock
from hermes.common.codecs import DenseScratch, Int8Codec, decode_topk
from hermes.common.codecs import decode as decode_codec
from hermes.common.messages import (
    MAX_SHARDS_PER_FETCH,
    CycleReport,
    FetchShard,
    PullModel,
    PushUpdate,
    ReportStats,
    RequestWork,
    ShardReply,
    parse_body,
)
from hermes.common.policies.compression import CodecError, CodecSpec
from hermes.common.tensors import ModelSpec
from hermes.common.wire import (
    ErrorCode,
    Header,
    Message,
    MsgType,
    Payload,
    PreparedPayload,
    ProtocolError,
    decode,
    dtype_from_name,
    encode,
    prepare,
    verify_mac,
)
from hermes.server.auth import ReplayGuard
from hermes.server.engine.admission import Admission
from hermes.server.engine.bases import Bases
from hermes.server.engine.counters import Counters
from hermes.server.engine.kafka import KafkaPublisher
from hermes.server.engine.membership import Membership
from hermes.server.engine.offload import offload, payload_bytes
from hermes.server.engine.ports import Stepper
from hermes.server.engine.start_gate import StartGate
from hermes.server.metrics import ServerMetrics
from hermes.server.registry import Registry, WorkerRecord
from hermes.server.shardstore import ShardStore
from hermes.server.state import ModelState, validate_update

log = logging.getLogger(__name__)

# The request being handled (each request runs in its own task): replies
# echo its session, so a signed reply cannot answer another connection.
_request: contextvars.ContextVar[Header] = contextvars.ContextVar("hermes_request")

_MODEL_DTYPES = ("float32", "float16", "bfloat16")

# A message's ZeroMQ frames (hermes.common.wire.encode).
Frames = list[Any]


def decompressed(spec: ModelSpec, payload: Payload | None, codec: CodecSpec,
                 scratch: DenseScratch | None = None) -> Payload:
    """A compressed push's update as the fp32 payload it stands for: what screening, the rules, the loss probes
    and the journal see (compression.push). The buffer's size must follow from the codec spec and the model.
    ``scratch``: a top-k push's zeroed vector, reused once the last push's update is gone."""
    if payload is None or payload.dtype != torch.uint8:
        raise ProtocolError(ErrorCode.BAD_DTYPE, f"a {codec.name} push travels as uint8 bytes, not "
                                                 f"{'nothing' if payload is None else payload.dtype}")
    data = payload.flat()
    try:
        if codec.name == "topk":
            # The norm from the k values the decode read, not n: a dense pass saved (issue 31).
            flat, sum_of_squares = decode_topk(data, codec, spec.shapes, scratch)
        else:
            flat, sum_of_squares = decode_codec(data, codec, spec.shapes, scratch), None
    except CodecError as exc:
        raise ProtocolError(ErrorCode.BAD_SHAPE, str(exc)) from None
    out = Payload(dtype=torch.float32, chunks=(flat,), shapes=spec.shapes)
    if sum_of_squares is not None:
        out.know_norm(sum_of_squares)
    return out


class Handlers:
    def __init__(self, step: Stepper, *, state: ModelState, registry: Registry, membership: Membership,
                 start_gate: StartGate, shards: ShardStore, validation_shards: ShardStore, kafka: KafkaPublisher,
                 counters: Counters, replay: ReplayGuard, metrics: ServerMetrics, clock: Clock,
                 max_message_bytes: int, bases: Bases | None = None, admission: Admission | None = None) -> None:
        # The model step (push) and the run's stop: the engine.
        self.step = step
        self.state = state
        self.spec = state.spec
        self.registry = registry
        self.membership = membership
        self.start_gate = start_gate
        self.shards = shards
        self.validation_shards = validation_shards
        self.kafka = kafka
        self.counters = counters
        self.replay = replay
        self.metrics = metrics
        self.clock = clock
        self.max_message_bytes = max_message_bytes
        # From-baseline runs: each worker's base model (engine/bases.py); None: pushes are since-pull changes.
        self.bases = bases
        # concurrency.limit (engine/admission.py): None or open, everyone may hold work.
        self.admission = admission
        # compression.pull int8: chunk -> (version, the model's int8 bytes framed once, the codec spec and its
        # reply entry), the latest version only.
        self._int8_models: dict[int, tuple[int, PreparedPayload, CodecSpec, dict[str, Any]]] = {}
        self._topk_scratch = DenseScratch()
        self._message_counters: dict[MsgType, Any] = {}
        self._by_type: dict[MsgType, Callable[[WorkerRecord, Message], Awaitable[Frames]]] = {
            MsgType.PUSH_UPDATE: self.on_push,
            MsgType.PULL_MODEL: self.on_pull,
            MsgType.REQUEST_WORK: self.on_request_work,
            MsgType.FETCH_SHARD: self.on_fetch_shard,
            MsgType.REPORT_STATS: self.on_report,
        }

    @staticmethod
    def going_away() -> ProtocolError:
        return ProtocolError(ErrorCode.UNAVAILABLE, "server is shutting down; retry after it restarts")

    async def handle(self, frames: Sequence[Any], header: Header | None = None, size: int | None = None) -> Frames:
        """Reply frames for one request; raises ProtocolError for bad input. ``header``: the
        first frame already unpacked (by the data plane's admission), not unpacked again; ``size``: the
        frames' bytes, as the data plane counted them."""
        if size is None:
            size = sum(len(f.buffer) if hasattr(f, "buffer") else len(f) for f in frames)
        self.metrics.bytes_in.inc(size)
        if self.step.shutting_down:
            raise self.going_away()
        msg = await offload(size, decode, frames, max_message_bytes=self.max_message_bytes, header=header)
        h = msg.header
        handler = self._by_type.get(h.type)
        if handler is None:
            raise ProtocolError(ErrorCode.BAD_REQUEST, f"{h.type.value} is a reply type, not a request")
        worker = self.registry.lookup(h.worker)
        # Signature first: nothing unauthenticated may move the replay counters.
        if not await offload(size, verify_mac, frames[0], h, frames[1:], worker.key):
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"bad signature from worker {h.worker!r}")
        self.replay.check(h)
        if worker.state != "active":
            raise ProtocolError(ErrorCode.UNAUTHORIZED, f"worker {worker.id} is {worker.state}; register again")
        worker.last_seen = self.clock.time()
        _request.set(h)
        worker.server_bytes_in += size
        worker.messages += 1
        self.counters.count_message(h.type.value)
        counter = self._message_counters.get(h.type)
        if counter is None:
            # The series of a type, made on its first message as before, then kept: labels() takes a lock and
            # builds its key on every call (issue 31).
            counter = self._message_counters[h.type] = self.metrics.messages.labels(type=h.type.value)
        counter.inc()
        reply = await handler(worker, msg)
        out = sum(len(f) for f in reply)
        worker.server_bytes_out += out
        self.metrics.bytes_out.inc(out)
        return reply

    def reply(self, type_: MsgType, worker: WorkerRecord, seq: int, body: dict[str, Any],
              payload: bytes | None = None) -> Frames:
        body = {**body, "stop": self.step.stopping}
        header = Header.make(type=type_, worker=worker.id, seq=seq, model_version=self.state.version, body=body,
                             session=_request.get().session)
        return encode(header, payload, key=worker.key)

    async def on_push(self, worker: WorkerRecord, msg: Message) -> Frames:
        h = msg.header
        body = parse_body(PushUpdate, h.body)
        if h.model_version < 0 or h.model_version > self.state.version:
            raise ProtocolError(
                ErrorCode.BAD_REQUEST, f"base model_version {h.model_version} not in [0, {self.state.version}]"
            )
        if body.codec is not None:
            msg = Message(h, await offload(4 * self.spec.numel, decompressed, self.spec, msg.payload, body.codec,
                                         self._topk_scratch))
        await offload(payload_bytes(msg.payload), validate_update, self.spec, msg.payload)
        assert msg.payload is not None  # validate_update refuses a push without one
        worker.pushes += 1
        # The skipped cycles came before this one; the stats are as of the push.
        self._carried(worker, body.cycles, body.stats)
        if body.cycle is not None:
            self.membership.observe_cycle(worker, body.cycle, on_push=True)
        payload = msg.payload
        if self.bases is not None and not body.copy_:
            base = self.bases.base(worker.id, body.base_version or 0)
            if base is None:
                worker.rejected += 1
                return self.reply(MsgType.PUSH_REPLY, worker, h.seq, {
                    "status": "rejected", "rebase": True,
                    "reason": f"base version {body.base_version} is not kept for {worker.id}; pull a new base"})
            payload = await offload(payload_bytes(payload), self.bases.rebased, payload, base)
        status, fields = await self.step.push(worker, h.model_version, body.samples, payload)
        if self.admission is not None and not self.admission.open:
            # concurrency.limit: the reply (and the model it brings) waits for the worker's next turn.
            await self.admission.next_turn(worker.id)
        reply = {"status": status, **fields}
        if not body.pull:
            return self.reply(MsgType.PUSH_REPLY, worker, h.seq, reply)
        # The pull that would follow, answered now (if_newer against the push's base).
        worker.pulls += 1
        self.counters.count_carried("pull_model")
        if h.model_version == self.state.version:
            return self.reply(MsgType.PUSH_REPLY, worker, h.seq, {**reply, "model": "unchanged"})
        return await self._model_reply(MsgType.PUSH_REPLY, worker, h, body.pull_dtype, {**reply, "model": "included"},
                                       codec=body.pull_codec)

    async def on_pull(self, worker: WorkerRecord, msg: Message) -> Frames:
        h = msg.header
        body = parse_body(PullModel, h.body)
        if self.admission is not None and not self.admission.open and self.admission.hold_pull:
            # concurrency.hold_pull: taking the model starts a turn, so a worker without a slot (a registration's
            # pull) gets it when its turn begins, not before it waits (answered at once, 900 of 1,000 devices
            # trained their first turn from version 0; at 10,000 up to ~800 versions stale, docs/simulation.md).
            if not await self.admission.admit(worker.id):
                raise ProtocolError(ErrorCode.UNKNOWN_WORKER, f"worker {worker.id} left while it waited for a "
                                                              "training slot; register again")
            if self.step.shutting_down:
                raise self.going_away()
            if self.step.stopping:
                # Released by the stop: told to stop, without a model it would not train from (100,000 simulated
                # devices: 80,000 held pulls released at once were 24 s of server CPU and 7.6 GB on its link).
                return self.reply(MsgType.MODEL, worker, h.seq, {"unchanged": True, "stop": True})
        worker.pulls += 1
        if body.if_newer and h.model_version == self.state.version:
            return self.reply(MsgType.MODEL, worker, h.seq, {"unchanged": True})
        if body.dtype not in _MODEL_DTYPES:
            raise ProtocolError(ErrorCode.BAD_DTYPE, f"models are served as float32/float16/bfloat16, not {body.dtype!r}")
        return await self._model_reply(MsgType.MODEL, worker, h, body.dtype, {"unchanged": False},
                                       pin=body.base and self.bases is not None, codec=body.codec)

    async def _model_reply(self, type_: MsgType, worker: WorkerRecord, h: Header, dtype: str,
                           body: dict[str, Any], *, pin: bool = False, codec: CodecSpec | None = None) -> Frames:
        """A reply carrying the current model in ``dtype`` (a pull, or a push that answered one), or in
        ``codec``; ``pin``: kept as the worker's base (a base pull, engine/bases.py)."""
        if codec is not None:
            return await self._compressed_model_reply(type_, worker, h, body, codec, pin=pin)
        torch_dtype = dtype_from_name(dtype)
        nbytes = self.spec.numel * torch.empty(0, dtype=torch_dtype).element_size()
        version, flat = await offload(nbytes, self.state.prepared, torch_dtype)
        if pin:
            assert self.bases is not None
            # The agent widens a half-precision model to fp32 and measures from that: so does its base.
            served = flat.tensor
            self.bases.pin(worker.id, version, served if served.dtype == torch.float32
                           else await offload(nbytes, served.float))
        header = Header(type=type_, worker=worker.id, seq=h.seq, model_version=version, session=h.session,
                        shapes=self.spec.shapes, body={**body, "stop": self.step.stopping})
        return await offload(nbytes, encode, header, flat, key=worker.key)

    async def _compressed_model_reply(self, type_: MsgType, worker: WorkerRecord, h: Header, body: dict[str, Any],
                                      codec: CodecSpec, *, pin: bool = False) -> Frames:
        """compression.pull int8: the model quantised per chunk, round to nearest (the agent measures its next
        change from what it received, so the rounding does not accumulate; no generator state on the server).
        Encoded once per version and chunk, as the fp32 snapshot is framed once."""
        if codec.name != "int8" or codec.chunk is None:
            raise ProtocolError(ErrorCode.BAD_DTYPE, f"models are served in codec int8 (with its chunk) or a pull "
                                                     f"dtype, not codec {codec.name!r}")
        nbytes = 4 * self.spec.numel
        cached = self._int8_models.get(codec.chunk)
        # The cached bytes of the model's current version are served as they are, without asking the state
        # for its snapshot (issue 31: a cached pull is request overhead only). A fold racing this read in a
        # worker thread is harmless: the bytes and the version sent are one consistent, immutable pair.
        if cached is None or cached[0] != self.state.version:
            version, prepared = await offload(nbytes, self.state.prepared, torch.float32)
            cached = self._int8_models.get(codec.chunk)
            if cached is None or cached[0] != version:
                data = (await offload(nbytes, Int8Codec(codec.chunk, False, 0).encode, prepared.tensor,
                                      self.spec.shapes)).data
                # One entry per chunk size in use (the run's int8.chunk): bounded at a model's quarter each.
                # Framed once, as the fp32 snapshot is: every pull of the version sends the same zmq frames (no
                # new zero-copy buffer, and no wake of pyzmq's collector thread, per pull); the reply's codec
                # entry is dumped once too.
                cached = (version, prepare(data), codec, codec.model_dump(exclude_none=True))
                self._int8_models = {codec.chunk: cached}
        version, frames, dumped_spec, dumped = cached
        if codec != dumped_spec:  # the same chunk asked with other fields: echoed as asked
            dumped = codec.model_dump(exclude_none=True)
        if pin:
            assert self.bases is not None
            # The agent measures its next change from the model as it decodes it: so does its base.
            self.bases.pin(worker.id, version,
                           await offload(nbytes, decode_codec, frames.tensor, codec, self.spec.shapes))
        header = Header(type=type_, worker=worker.id, seq=h.seq, model_version=version, session=h.session,
                        body={**body, "codec": dumped, "stop": self.step.stopping})
        # Only the signature is per request (the MAC covers the payload under a one-time key, so it cannot be
        # computed ahead): the frames are the version's.
        return await offload(nbytes // 4, encode, header, frames, key=worker.key)

    async def on_request_work(self, worker: WorkerRecord, msg: Message) -> Frames:
        body = parse_body(RequestWork, msg.header.body)
        self._carried(worker, body.cycles, body.stats)
        if not self.start_gate.is_open:
            await self.start_gate.wait()  # min_workers (engine/start_gate.py)
            if self.step.shutting_down:
                raise self.going_away()
        if self.admission is not None and not self.admission.open:
            if not await self.admission.admit(worker.id):
                raise ProtocolError(ErrorCode.UNKNOWN_WORKER, f"worker {worker.id} left while it waited for a "
                                                              "training slot; register again")
            if self.step.shutting_down:
                raise self.going_away()
        works = [self.membership.assign(worker, keep=max(2, body.assignments + 1)) for _ in range(body.assignments)]
        work = works[0].model_copy(update={"then": works[1:] or None})
        if len(works) > 1:
            self.counters.count_carried("request_work", len(works) - 1)
        shards = [s for w in works for s in w.shards]
        if not (body.inline_shards and shards and all(w.data.source == "zmq" for w in works)
                and len(shards) <= MAX_SHARDS_PER_FETCH):
            return self.reply(MsgType.WORK, worker, msg.header.seq, work.body())
        # The FETCH_SHARDs that would follow, answered now: one round trip per request.
        records = await self._records(self.shards, shards)
        self.counters.served("train", sum(len(r) for r in records))
        self.counters.count_carried("fetch_shard", sum(1 for w in works if w.shards))
        work = work.model_copy(update={"lengths": [len(r) for r in records]})
        return self.reply(MsgType.WORK, worker, msg.header.seq, work.body(), payload=b"".join(records))

    def _carried(self, worker: WorkerRecord, cycles: list[CycleReport] | None, stats: ReportStats | None) -> None:
        """What a push or work request brings along (combine_messages): skipped cycles, then stats."""
        for cycle in cycles or ():
            self.membership.observe_cycle(worker, cycle)
        if cycles:
            self.counters.count_carried("report_stats:cycle", len(cycles))
            if self.admission is not None:
                self.admission.cycle_done(worker.id)
        if stats is not None:
            self.apply_stats(worker, stats)
            self.counters.count_carried("report_stats")

    async def _records(self, store: ShardStore, ids: list[int]) -> list[bytes]:
        if store.all_cached(ids):
            return [store.record(i) for i in ids]
        # Reading a Dataset (a lazy one generates or loads each sample) is not
        # for the event loop: the other workers' pushes and pulls go on meanwhile.
        return await asyncio.to_thread(lambda: [store.record(i) for i in ids])

    async def on_fetch_shard(self, worker: WorkerRecord, msg: Message) -> Frames:
        """One shard record (body ``shard``), or several in one reply (body ``shards``).

        Several: the payload is the records back to back and ``lengths`` cuts
        it; one request per assignment instead of one per shard (a fast
        worker's 25-shard cycle made 25 requests).
        """
        body = parse_body(FetchShard, msg.header.body)
        store = self.shards if body.split == "train" else self.validation_shards
        ids = body.ids()
        for shard in ids:
            if not 0 <= shard < store.num_shards:
                raise ProtocolError(ErrorCode.BAD_REQUEST,
                                    f"{body.split} shard {shard} out of range [0, {store.num_shards})")
        records = await self._records(store, ids)
        self.counters.served(body.split, sum(len(r) for r in records))
        if body.shards is None:
            return self.reply(MsgType.SHARD, worker, msg.header.seq, ShardReply(shard=ids[0]).body(),
                              payload=records[0])
        reply = ShardReply(shards=ids, lengths=[len(r) for r in records])
        return self.reply(MsgType.SHARD, worker, msg.header.seq, reply.body(), payload=b"".join(records))

    async def on_report(self, worker: WorkerRecord, msg: Message) -> Frames:
        body = parse_body(ReportStats, msg.header.body)
        self.apply_stats(worker, body)
        if body.cycle is not None and self.admission is not None:
            self.admission.cycle_done(worker.id)
        return self.reply(MsgType.STATS_ACK, worker, msg.header.seq, {})

    def apply_stats(self, worker: WorkerRecord, b: ReportStats) -> None:
        """A stats report, sent alone (REPORT_STATS) or carried by a push or work request."""
        for k, v in b.counters().items():
            setattr(worker, k, v)
        if b.collective_bytes is not None:  # topology collective: the all-reduce traffic the agent sent
            worker.collective_bytes = b.collective_bytes
        missing_before = worker.kafka_data_missing
        if b.prefetch_wait_steady_seconds is not None:
            worker.prefetch_wait_steady_seconds = b.prefetch_wait_steady_seconds
        if b.shard_bytes is not None:
            worker.shard_bytes = {str(k): v for k, v in b.shard_bytes.items()}
        if b.shard_records is not None:
            worker.shard_records = {str(k): v for k, v in b.shard_records.items()}
        for k, n in b.shard_counters().items():
            setattr(worker, k, n)
        if b.data_source is not None:
            worker.data_source = b.data_source
        if worker.kafka_data_missing > missing_before:
            self.kafka.republish(f"worker {worker.id} found shard records missing from Kafka")
        if b.precision is not None:
            worker.precision = b.precision
        if b.precision_timings_ms is not None:
            worker.precision_timings_ms = {k: round(v, 3) for k, v in b.precision_timings_ms.items()}
        if b.memory_profile is not None:
            self.membership.set_memory_profile(worker, [list(p) for p in b.memory_profile])
        if b.cycle is not None:
            self.membership.observe_cycle(worker, b.cycle)
