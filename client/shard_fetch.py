"""Where an assignment's shard records come from: Kafka first when the WORK reply names a
topic, the ZeroMQ data plane for the rest, each shard exactly once and checked
(:class:`ShardFetcher`), with the traffic counted per source (:class:`ShardStats`).
Split from :mod:`hermes.client.prefetch`, whose thread calls it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

import torch

from hermes.client.transport import DataClient
from hermes.common.arrays import to_tensor
from hermes.common.kafka_layout import shards_in, validate_ranges
from hermes.common.messages import FetchShard, KafkaRanges, ShardReply, Split, parse_reply, request_body
from hermes.common.shards import RecordError, ShardRecord, decode_record
from hermes.common.wire import MsgType

if TYPE_CHECKING:
    from hermes.client.kafka_source import KafkaShardReader

log = logging.getLogger(__name__)


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
        self._reader: KafkaShardReader | None = None
        self._kafka_off_until = 0.0
        self._kafka_broken: str | None = None  # kafka-python missing

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None

    def fetch(self, shards: list[int], spec: KafkaRanges, split: Split = "train") -> tuple[list[ShardRecord], int] | None:
        """(records in ``shards`` order, bytes fetched); None when asked to stop mid-way."""
        got: dict[int, ShardRecord] = {}
        nbytes = 0
        if spec.source == "kafka":
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

    def _from_zmq_batch(self, shards: list[int], split: Split) -> tuple[dict[int, ShardRecord], int]:
        """Several records in one request; a record that fails its check is refetched alone."""
        if len(shards) == 1:
            record, n = self._from_zmq(shards[0], split)
            return {shards[0]: record}, n
        reply = self.client.request(MsgType.FETCH_SHARD, request_body(FetchShard(shards=shards, split=split)))
        return self.from_reply(shards, reply, parse_reply(ShardReply, reply.header.body, "SHARD").lengths, split)

    def from_reply(self, shards: list[int], reply, lengths: list[int] | None,
                   split: Split = "train") -> tuple[dict[int, ShardRecord], int]:
        """The records of a reply that carries them back to back (cut by its ``lengths``); a record
        that fails its check, or all of them when the reply does not match, are refetched alone."""
        raw = reply.payload.flat().numpy() if reply.payload is not None else b""
        view = memoryview(raw)
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

    def _from_kafka(self, shards: list[int], spec: KafkaRanges) -> tuple[dict[int, ShardRecord], int] | None:
        bootstrap = self.kafka_bootstrap or spec.bootstrap
        if self._kafka_broken or not bootstrap or time.monotonic() < self._kafka_off_until:
            return {}, 0
        try:
            if spec.partitions is None or spec.topic is None:
                raise ValueError("no topic or partitions")
            partitions = spec.partitions
            ranges = validate_ranges(spec.ranges, partitions)
            if sorted(shards_in(ranges, partitions)) != sorted(set(shards)):
                raise ValueError("ranges do not cover the assigned shards")
            topic = spec.topic
        except (TypeError, ValueError) as exc:
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
            res = reader.read(topic, partitions, ranges, max_record_bytes=spec.max_record_bytes)
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

    def _from_zmq(self, shard: int, split: Split) -> tuple[ShardRecord, int]:
        body = request_body(FetchShard(shard=shard, split=split))
        nbytes = 0
        for attempt in range(self.max_refetch + 1):
            reply = self.client.request(MsgType.FETCH_SHARD, body)
            raw = reply.payload.flat().numpy() if reply.payload is not None else b""
            nbytes += len(raw)
            try:
                record = decode_record(memoryview(raw) if isinstance(raw, bytes) else raw.data)
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
