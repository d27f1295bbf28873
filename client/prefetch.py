"""Double-buffered shard prefetching.

A background thread asks the server for the next assignment and fetches its
shards while the trainer works on the current one; the queue holds one
ready assignment, so at most two are in the agent at a time. The time the
trainer spends waiting on the queue is the prefetch wait we report.

Where the records come from is the assignment's business: when the WORK
reply names a Kafka topic (``source: "kafka"``, ``topic``, ``bootstrap``,
``ranges``) they are read from Kafka with :class:`KafkaShardReader`; the
shards Kafka could not deliver (broker unreachable, data lost in a restart,
a record still corrupt after refetching) are fetched by id over the ZeroMQ
data plane, so an assignment always arrives whole, each shard exactly once.
Bytes and records are counted per source in :class:`ShardStats`.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hermes.client.local_data import LocalDataError, LocalSet
from hermes.client.transport import DataClient
from hermes.common.arrays import to_tensor
from hermes.common.kafka_layout import shards_in, validate_ranges
from hermes.common.shards import RecordError, ShardRecord, decode_record
from hermes.common.wire import MsgType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    epoch: int
    shards: tuple[int, ...]
    # Inputs and targets as tensors of the records' dtypes (any: float images, int64
    # token ids, float targets, bfloat16); None: no new samples this cycle.
    x: torch.Tensor | None
    y: torch.Tensor | None
    batch_size: int
    lr: float
    fetched_bytes: int
    # Samples to train this cycle (None: all of x) and micro-batches per optimizer step.
    cycle_samples: int | None = None
    accumulation: int = 1


@dataclass(frozen=True)
class StopSignal:
    reason: str
    error: BaseException | None = None


class ShardStats:
    """Shard traffic of one agent, by source (``kafka``, ``zmq``); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bytes_by_source: dict[str, int] = {"kafka": 0, "zmq": 0}
        self.records_by_source: dict[str, int] = {"kafka": 0, "zmq": 0}
        self.corrupt_records = 0
        self.refetches = 0
        self.kafka_fallbacks = 0
        self.kafka_reconnects = 0
        self.kafka_discarded_bytes = 0
        # Reads that found the assigned records gone from the broker (the server republishes on it).
        self.kafka_data_missing = 0

    def add(self, source: str, records: int, nbytes: int) -> None:
        with self._lock:
            self.bytes_by_source[source] = self.bytes_by_source.get(source, 0) + nbytes
            self.records_by_source[source] = self.records_by_source.get(source, 0) + records

    def bump(self, **counts: int) -> None:
        with self._lock:
            for k, v in counts.items():
                setattr(self, k, getattr(self, k) + v)

    @property
    def data_source(self) -> str:
        """The sources records actually came from: ``kafka``, ``zmq``, ``kafka+zmq`` or ``none``."""
        used = [k for k in ("kafka", "zmq") if self.records_by_source.get(k)]
        return "+".join(used) or "none"

    def report(self) -> dict:
        with self._lock:
            return {
                "data_source": self.data_source,
                "shard_bytes": dict(self.bytes_by_source),
                "shard_records": dict(self.records_by_source),
                "corrupt_records": self.corrupt_records,
                "shard_refetches": self.refetches,
                "kafka_fallbacks": self.kafka_fallbacks,
                "kafka_reconnects": self.kafka_reconnects,
                "kafka_discarded_bytes": self.kafka_discarded_bytes,
                "kafka_data_missing": self.kafka_data_missing,
            }


# Shards per FETCH_SHARD request over the data plane (the server allows 256).
_ZMQ_BATCH = 64


class ShardFetcher:
    """Fetch the shards of one message: Kafka when it names a topic, ZeroMQ for the rest.

    Used by one thread (it owns a Kafka consumer and uses one DataClient).
    After the broker proved unreachable, Kafka is skipped for
    ``kafka_cooldown`` seconds so every assignment does not pay the retry
    budget again; the data plane serves meanwhile.
    """

    def __init__(self, client: DataClient, stats: ShardStats, *, kafka_bootstrap: str | None = None,
                 max_refetch: int = 3, kafka_cooldown: float = 30.0, reader_options: dict | None = None,
                 should_stop=None) -> None:
        self.client = client
        self.stats = stats
        self.kafka_bootstrap = kafka_bootstrap
        self.max_refetch = max_refetch
        self.kafka_cooldown = kafka_cooldown
        self.reader_options = dict(reader_options or {})
        self.should_stop = should_stop or (lambda: False)
        self._reader = None
        self._kafka_off_until = 0.0
        self._kafka_broken: str | None = None  # kafka-python missing

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def fetch(self, shards, spec: dict, split: str = "train") -> tuple[list[ShardRecord], int] | None:
        """(records in ``shards`` order, bytes fetched); None when asked to stop mid-way."""
        shards = [int(s) for s in shards]
        got: dict[int, ShardRecord] = {}
        nbytes = 0
        if spec.get("source") == "kafka":
            kafka_got = self._from_kafka(shards, spec)
            if kafka_got is None:
                return None
            got, nbytes = kafka_got
        missing = list(dict.fromkeys(s for s in shards if s not in got))
        for i in range(0, len(missing), _ZMQ_BATCH):
            batch_got, n = self._from_zmq_batch(missing[i : i + _ZMQ_BATCH], split)
            got.update(batch_got)
            nbytes += n
        return [got[s] for s in shards], nbytes

    def _from_zmq_batch(self, shards: list[int], split: str) -> tuple[dict[int, ShardRecord], int]:
        """Several records in one request; a record that fails its check is refetched alone."""
        if len(shards) == 1:
            record, n = self._from_zmq(shards[0], split)
            return {shards[0]: record}, n
        body = {"shards": shards} if split == "train" else {"shards": shards, "split": split}
        return self.from_reply(shards, self.client.request(MsgType.FETCH_SHARD, body), split)

    def from_reply(self, shards: list[int], reply, split: str = "train") -> tuple[dict[int, ShardRecord], int]:
        """The records of a reply that carries them back to back (``lengths``); a record that
        fails its check, or all of them when the reply does not match, are refetched alone."""
        raw = reply.payload.flat().numpy() if reply.payload is not None else b""
        view, lengths = memoryview(raw), reply.header.body.get("lengths")
        got: dict[int, ShardRecord] = {}
        nbytes = len(raw)
        if isinstance(lengths, list) and len(lengths) == len(shards) and sum(lengths) == len(raw):
            offset = 0
            for shard, length in zip(shards, lengths):
                try:
                    record = decode_record(view[offset : offset + length])
                    if record.shard == shard:
                        got[shard] = record
                except RecordError as exc:
                    log.warning("shard %s rejected (%s); refetching it alone", shard, exc)
                offset += length
            self.stats.add("zmq", len(got), nbytes)
        else:
            log.warning("multi-shard reply does not match its request; refetching shard by shard")
        for shard in shards:
            if shard not in got:
                self.stats.bump(corrupt_records=1)
                got[shard], n = self._from_zmq(shard, split)
                nbytes += n
        return got, nbytes

    def _reader_for(self, bootstrap: str):
        if self._reader is not None and self._reader.bootstrap == bootstrap:
            return self._reader
        self.close()
        from hermes.client.kafka_source import KafkaShardReader

        self._reader = KafkaShardReader(bootstrap, max_refetch=min(self.max_refetch, 2),
                                        should_stop=self.should_stop, **self.reader_options)
        return self._reader

    def _from_kafka(self, shards: list[int], spec: dict) -> tuple[dict[int, ShardRecord], int] | None:
        bootstrap = self.kafka_bootstrap or spec.get("bootstrap")
        if self._kafka_broken or not bootstrap or time.monotonic() < self._kafka_off_until:
            return {}, 0
        try:
            partitions = int(spec["partitions"])
            ranges = validate_ranges(spec["ranges"], partitions)
            if sorted(shards_in(ranges, partitions)) != sorted(set(shards)):
                raise ValueError("ranges do not cover the assigned shards")
            topic = str(spec["topic"])
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("assignment names Kafka but its ranges are unusable (%s); using the data plane", exc)
            return {}, 0
        try:
            reader = self._reader_for(bootstrap)
        except ImportError as exc:
            self._kafka_broken = f"kafka-python is not installed ({exc})"
            log.error("the server publishes shards to Kafka but %s: pip install 'hermes-edge[kafka]'; "
                      "fetching them over the data plane instead", self._kafka_broken)
            return {}, 0
        try:
            res = reader.read(topic, partitions, ranges, max_record_bytes=spec.get("max_record_bytes"))
        except Exception as exc:  # never let the Kafka path take the assignment down
            log.error("reading %s from Kafka at %s failed (%r); using the data plane", topic, bootstrap, exc)
            self.stats.bump(kafka_fallbacks=1)
            reader.close()
            self._reader = None
            return {}, 0
        if res.failure_kind == "stopped" or self.should_stop():
            return None
        wanted = set(shards)
        got = {s: r for s, r in res.records.items() if s in wanted}
        self.stats.add("kafka", len(got), res.bytes)
        self.stats.bump(corrupt_records=res.corrupt, refetches=res.refetches, kafka_reconnects=res.reconnects,
                        kafka_discarded_bytes=res.discarded_bytes)
        if res.missing:
            self.stats.bump(kafka_fallbacks=1)
            log.warning("%d of %d shards not read from Kafka (%s: %s); fetching them over the data plane",
                        len(res.missing), len(wanted), res.failure_kind, res.failure)
            if res.failure_kind == "missing_data":
                self.stats.bump(kafka_data_missing=1)
            if res.failure_kind == "unavailable":
                self._kafka_off_until = time.monotonic() + self.kafka_cooldown
                reader.close()
        return got, res.bytes

    def _from_zmq(self, shard: int, split: str) -> tuple[ShardRecord, int]:
        body = {"shard": shard} if split == "train" else {"shard": shard, "split": split}
        nbytes = 0
        for attempt in range(self.max_refetch + 1):
            reply = self.client.request(MsgType.FETCH_SHARD, body)
            raw = reply.payload.flat().numpy() if reply.payload is not None else b""
            nbytes += len(raw)
            try:
                record = decode_record(memoryview(raw))
                if record.shard != shard:
                    raise RecordError(f"asked for shard {shard}, got shard {record.shard}")
                break
            except RecordError as exc:
                self.stats.bump(corrupt_records=1, refetches=1)
                log.warning("shard %s rejected (%s); refetch %d/%d", shard, exc, attempt + 1, self.max_refetch)
        else:
            raise RecordError(f"shard {shard} corrupt after {self.max_refetch} refetches")
        self.stats.add("zmq", 1, nbytes)
        return record, nbytes


def records_to_tensors(records: list[ShardRecord]) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The records' samples, in order, as (inputs, targets) tensors of their own dtypes; None for no records."""
    if not records:
        return None
    xs = [to_tensor(r.x, r.x_dtype) for r in records]
    ys = [to_tensor(r.y, r.y_dtype) for r in records]
    return (torch.cat(xs) if len(xs) > 1 else xs[0]), (torch.cat(ys) if len(ys) > 1 else ys[0])


class Prefetcher:
    """Prepares the next assignment while the trainer works: its shards fetched, or (device-local
    data, ``source: "local"``) ``local_samples`` samples drawn from ``local``."""

    def __init__(self, client_factory, *, depth: int = 1, max_refetch: int = 3, stats: ShardStats | None = None,
                 kafka_bootstrap: str | None = None, reader_options: dict | None = None,
                 local: LocalSet | None = None, combine: bool = False,
                 carried: Callable[[], dict] | None = None, assignments: int = 1) -> None:
        self._client_factory = client_factory
        self._queue: queue.Queue[Work | StopSignal] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-prefetch", daemon=True)
        self.max_refetch = max_refetch
        self.stats = stats or ShardStats()
        self.kafka_bootstrap = kafka_bootstrap
        self.reader_options = reader_options
        self.local = local
        # combine_messages: ask for the shards in the WORK reply, and bring along what
        # ``carried`` gives (the loop's pending cycles and stats).
        self.combine = combine
        self.carried = carried
        # assignments_per_request (with combine): assignments asked for in one work request.
        self.assignments = assignments
        self.wait_seconds = 0.0
        # The wait for the first assignment: nothing can be prefetched before it,
        # so the steady-state wait is wait_seconds - first_wait_seconds.
        self.first_wait_seconds: float | None = None
        self.fetched_bytes = 0
        self.client: DataClient | None = None
        self.fetcher: ShardFetcher | None = None

    @property
    def steady_wait_seconds(self) -> float:
        return max(0.0, self.wait_seconds - (self.first_wait_seconds or 0.0))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        # Unblock a producer waiting on a full queue.
        try:
            while True:
                self._queue.get_nowait()
        except queue.Empty:
            pass
        if self._thread.ident is not None:  # started (a rejoin may replace it before it starts)
            self._thread.join(timeout=10)

    def next(self) -> Work | StopSignal:
        t0 = time.perf_counter()
        item = self._queue.get()
        waited = time.perf_counter() - t0
        self.wait_seconds += waited
        if self.first_wait_seconds is None:
            self.first_wait_seconds = waited
        return item

    def _put(self, item: Work | StopSignal) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.2)
                return
            except queue.Full:
                continue

    def _run(self) -> None:
        try:
            self.client = self._client_factory()
            self.fetcher = ShardFetcher(self.client, self.stats, kafka_bootstrap=self.kafka_bootstrap,
                                        max_refetch=self.max_refetch, reader_options=self.reader_options,
                                        should_stop=self._stop.is_set)
            while not self._stop.is_set():
                request: dict = {}
                if self.combine:
                    request = {"inline_shards": True, **(self.carried() if self.carried else {})}
                    if self.assignments > 1:
                        request["assignments"] = self.assignments
                reply = self.client.request(MsgType.REQUEST_WORK, request)
                body = reply.header.body
                if body.get("stop"):
                    self._put(StopSignal("server asked to stop"))
                    return
                # Several assignments (``then``), their records inline when the reply carries them.
                bodies = [body, *(body.get("then") or [])]
                inline: tuple[dict[int, ShardRecord], int] | None = None
                if "lengths" in body:
                    inline = self.fetcher.from_reply([int(s) for b in bodies for s in b["shards"]], reply)
                for i, b in enumerate(bodies):
                    work = self._fetch(b, None if inline is None else (inline[0], inline[1] if i == 0 else 0))
                    if work is None:
                        return
                    self._put(work)
        except Exception as exc:  # surfaced to the training loop, which decides
            log.debug("prefetcher stopped by %r", exc)
            self._put(StopSignal(f"prefetch failed: {exc}", exc))
        finally:
            if self.fetcher is not None:
                self.fetcher.close()
            if self.client is not None:
                self.client.close()

    def _fetch(self, body: dict, inline: tuple[dict[int, ShardRecord], int] | None = None) -> Work | None:
        """The assignment's records: from the WORK reply itself when it carried them (``inline``:
        the records by shard and the bytes to count for this assignment)."""
        assert self.fetcher is not None
        if body.get("source") == "local":
            return self._draw(body)
        if inline is not None and body["shards"]:
            records, nbytes = [inline[0][int(s)] for s in body["shards"]], inline[1]
        elif body["shards"]:
            fetched = self.fetcher.fetch(body["shards"], body, "train")
            if fetched is None:
                return None
            records, nbytes = fetched
        else:
            records, nbytes = [], 0  # the samples carried over from the last cycle cover this one
        samples = records_to_tensors(records)
        self.fetched_bytes += nbytes
        return Work(
            epoch=int(body["epoch"]),
            shards=tuple(int(s) for s in body["shards"]),
            x=None if samples is None else samples[0],
            y=None if samples is None else samples[1],
            batch_size=int(body["batch_size"]),
            lr=float(body["lr"]),
            fetched_bytes=nbytes,
            cycle_samples=int(body["cycle_samples"]) if body.get("cycle_samples") else None,
            accumulation=int(body.get("accumulation", 1)),
        )

    def _draw(self, body: dict) -> Work:
        """Device-local data: the server sized the cycle (``local_samples``); no byte crosses the network."""
        if self.local is None:
            raise LocalDataError("the server assigns device-local samples but this agent's task has no local_data")
        n = int(body["local_samples"])
        x, y = self.local.draw(n)
        return Work(epoch=int(body["epoch"]), shards=(), x=x, y=y, batch_size=int(body["batch_size"]),
                    lr=float(body["lr"]), fetched_bytes=0, cycle_samples=n,
                    accumulation=int(body.get("accumulation", 1)))
