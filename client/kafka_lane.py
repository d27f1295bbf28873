"""One Kafka consumer reading assigned offset ranges: the worker behind ``KafkaShardReader``.

A lane owns one group-less consumer; it seeks to each assigned range,
verifies every record (``decode_record`` and the shard id the layout puts at
that offset), refetches corrupt ones, rebuilds the consumer after a stall
and waits ``missing_grace`` for data that is not there. See
:mod:`hermes.client.kafka_source` for the guarantees.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from hermes.common.kafka_layout import (
    KafkaUnavailable,
    connect_with_retries,
    shard_at,
)
from hermes.common.shards import RecordError, ShardRecord, decode_record

log = logging.getLogger(__name__)

# Batch header, record framing and key around each value.
RECORD_OVERHEAD = 1024
_MIN_FETCH_BYTES = 64 * 1024


class _Stalled(Exception):
    pass


class _DataMissing(Exception):
    pass


class _Stopped(Exception):
    pass


@dataclass
class ReadResult:
    records: dict[int, ShardRecord] = field(default_factory=dict)
    # Record value bytes received for assigned offsets (accepted and rejected).
    bytes: int = 0
    # Bytes the broker sent beyond the assigned ranges (read ahead, discarded).
    discarded_bytes: int = 0
    missing: list[int] = field(default_factory=list)
    corrupt: int = 0
    refetches: int = 0
    reconnects: int = 0
    # Why ``missing`` is not empty: unavailable | missing_data | corrupt | stalled | stopped | error
    failure_kind: str | None = None
    failure: str | None = None

    def fail(self, kind: str, message: str) -> None:
        if self.failure_kind is None:
            self.failure_kind, self.failure = kind, message


class KafkaLane:
    """One consumer, used by one thread at a time: reads the ranges of its partitions."""

    def __init__(
        self,
        bootstrap: str,
        *,
        connect_retries: int = 3,
        backoff: float = 0.5,
        connect_timeout: float = 2.0,
        stall_seconds: float = 5.0,
        max_reconnects: int = 3,
        max_refetch: int = 2,
        missing_grace: float = 3.0,
        fetch_records: int = 8,
        client_id: str = "hermes-agent",
        should_stop: Callable[[], bool] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.connect_retries = connect_retries
        self.backoff = backoff
        self.connect_timeout = connect_timeout
        self.stall_seconds = stall_seconds
        self.max_reconnects = max_reconnects
        self.max_refetch = max_refetch
        self.missing_grace = missing_grace
        self.fetch_records = max(1, fetch_records)
        self.client_id = client_id
        self.should_stop = should_stop or (lambda: False)
        self._consumer = None
        self._fetch_bytes = 0
        # Set after a read found the data gone: the next read does not wait the grace again.
        self._data_missing = False
        # End offsets seen per (topic, partition) while connected: published
        # topics only grow, so a read inside them needs no new offsets check.
        self._ends: dict[tuple[str, int], int] = {}

    # ---- connection ------------------------------------------------------------

    def connect(self, max_record_bytes: int | None = None):
        """The consumer, built on first use; KafkaUnavailable (naming the address) after the retry budget."""
        record = max(_MIN_FETCH_BYTES, max_record_bytes or 0)
        if self._consumer is not None and record <= self._fetch_bytes:
            return self._consumer
        self.close()
        from kafka import KafkaConsumer

        # The fetch size bounds read-ahead past a range's end. Brokers return
        # whole batches (one record each, as published) until the response
        # reaches fetch_max_bytes, and always at least one (KIP-74): with
        # fetch_records = 1 a fetch carries exactly the record asked for.
        # Tansu ignores max_partition_fetch_bytes; Kafka honours it.
        # Built for the largest fetch; each read then sizes it to its ranges (_size_fetch).
        fetch_total = record * self.fetch_records
        fetch_partition = fetch_total + RECORD_OVERHEAD

        def build():
            return KafkaConsumer(
                bootstrap_servers=self.bootstrap, client_id=self.client_id,
                group_id=None, enable_auto_commit=False, allow_auto_create_topics=False,
                # An offset that is not there is an error for us, never a silent jump.
                auto_offset_reset="none",
                fetch_max_bytes=fetch_total, max_partition_fetch_bytes=fetch_partition, fetch_max_wait_ms=100,
                bootstrap_timeout_ms=int(self.connect_timeout * 1000),
                request_timeout_ms=max(3000, int(self.connect_timeout * 2000)),
                reconnect_backoff_max_ms=1000,
            )

        self._consumer = connect_with_retries(
            self.bootstrap, build, retries=self.connect_retries, backoff=self.backoff,
            what="shard reader", log=log, should_stop=self.should_stop,
        )
        self._fetch_bytes = record
        return self._consumer

    def close(self) -> None:
        self._ends.clear()
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            try:
                consumer.close(autocommit=False)
            except Exception as exc:  # closing a consumer of a dead broker may complain
                log.debug("closing Kafka consumer: %r", exc)

    # ---- reading ---------------------------------------------------------------

    def read(self, topic: str, partitions: int, plan: dict[int, deque[list[int]]], *,
             max_record_bytes: int | None = None, on_record: Callable[[int], None] | None = None) -> ReadResult:
        """Read every offset of ``plan`` ({partition: [[start, end], ...]}) once."""
        from kafka.errors import KafkaError

        res = ReadResult()
        spans = [e - s for ranges in plan.values() for s, e in ranges]
        # Records a fetch may carry: about one range's worth (scattered single
        # records: exactly one, no read-ahead; long runs: up to fetch_records).
        fetch_records = min(self.fetch_records, max(1, round(sum(spans) / max(1, len(spans)))))
        refetch: dict[tuple[int, int], int] = {}
        lost: list[int] = []
        reconnects = 0
        while plan:
            try:
                if self.should_stop():
                    raise _Stopped()
                consumer = self.connect(max_record_bytes)
                self._size_fetch(consumer, fetch_records)
                self._check_data(consumer, topic, plan)
                self._consume(consumer, topic, partitions, plan, res, refetch, lost, on_record)
            except KafkaUnavailable as exc:
                res.fail("unavailable", str(exc))
                break
            except _DataMissing as exc:
                self._data_missing = True
                res.fail("missing_data", f"{exc} (Kafka broker at {self.bootstrap})")
                break
            except _Stopped:
                res.fail("stopped", "reader asked to stop")
                break
            except Exception as exc:  # _Stalled, KafkaError, or whatever else the client library raised
                # Rebuild the consumer and resume at the next unread assigned offset.
                self.close()
                reconnects += 1
                res.reconnects = reconnects
                why = str(exc) if isinstance(exc, (_Stalled, KafkaError)) else f"{type(exc).__name__}: {exc}"
                if reconnects > self.max_reconnects:
                    res.fail("stalled", f"reading {topic} from Kafka broker at {self.bootstrap} failed "
                                        f"after {reconnects - 1} reconnects: {why}")
                    break
                log.warning("reading %s from %s: %s; reconnecting (%d/%d)",
                            topic, self.bootstrap, why, reconnects, self.max_reconnects)
                time.sleep(min(self.backoff * 2 ** (reconnects - 1), 4.0))
        res.missing = sorted(lost + [shard_at(p, o, partitions)
                                     for p, spans in plan.items() for s, e in spans for o in range(s, e)])
        if lost:
            res.fail("corrupt", f"{len(lost)} record(s) still corrupt after {self.max_refetch} refetches")
        return res

    def _size_fetch(self, consumer, records: int) -> None:
        """Fetch at most ``records`` records per response (kafka-python reads these
        settings when it builds each fetch; without that hook the built-in sizes stay)."""
        config = getattr(getattr(consumer, "_fetcher", None), "config", None)
        if isinstance(config, dict) and "fetch_max_bytes" in config:
            config["fetch_max_bytes"] = self._fetch_bytes * records
            config["max_partition_fetch_bytes"] = self._fetch_bytes * records + RECORD_OVERHEAD

    def _check_data(self, consumer, topic: str, plan: dict[int, deque[list[int]]]) -> None:
        """The assigned offsets exist (waiting up to missing_grace, e.g. for a republish)."""
        from kafka import TopicPartition

        if all(self._ends.get((topic, p), -1) >= spans[-1][1] for p, spans in plan.items()):
            return
        deadline = time.monotonic() + (0.0 if self._data_missing else self.missing_grace)
        while True:
            problem = None
            # Metadata only: Tansu auto-creates a topic that offset requests name.
            known = consumer.partitions_for_topic(topic) or set()
            absent = sorted(set(plan) - known)
            if absent:
                problem = f"topic {topic} lacks partition(s) {absent}"
            else:
                tps = [TopicPartition(topic, p) for p in plan]
                begins, ends = consumer.beginning_offsets(tps), consumer.end_offsets(tps)
                for tp in tps:
                    need_start, need_end = plan[tp.partition][0][0], plan[tp.partition][-1][1]
                    if begins[tp] > need_start or ends[tp] < need_end:
                        problem = (f"partition {tp.partition} of {topic} holds offsets [{begins[tp]}, {ends[tp]}), "
                                   f"assigned [{need_start}, {need_end})")
                        break
            if problem is None:
                self._ends.update({(topic, tp.partition): ends[tp] for tp in tps})
                if self._data_missing:
                    log.info("shard records of %s are back on %s", topic, self.bootstrap)
                self._data_missing = False
                return
            if time.monotonic() >= deadline or self.should_stop():
                raise _DataMissing(problem)
            time.sleep(0.25)
            # Unknown to the cached metadata: ask the broker again.
            consumer.topics()

    def _consume(self, consumer, topic, partitions, plan, res: ReadResult, refetch, lost, on_record) -> None:
        from kafka import TopicPartition

        tps = {p: TopicPartition(topic, p) for p in plan}
        consumer.assign(list(tps.values()))
        consumer.resume(*tps.values())
        pos = {p: spans[0][0] for p, spans in plan.items()}
        for p, tp in tps.items():
            consumer.seek(tp, pos[p])

        def advance(p: int) -> bool:
            """Past offset pos[p]; True when the partition's position had to be moved (seek)."""
            pos[p] += 1
            spans = plan[p]
            if pos[p] < spans[0][1]:
                spans[0][0] = pos[p]  # the plan keeps only unread offsets: a reconnect resumes here
                return False
            spans.popleft()
            if not spans:
                del plan[p]
                consumer.pause(tps[p])
                return True
            pos[p] = spans[0][0]
            consumer.seek(tps[p], pos[p])
            return True

        last_progress = time.monotonic()
        while plan:
            if self.should_stop():
                raise _Stopped()
            batch = consumer.poll(timeout_ms=200)
            progressed = False
            for tp, recs in batch.items():
                p = tp.partition
                for i, r in enumerate(recs):
                    if p not in plan or r.offset < pos[p]:
                        res.discarded_bytes += len(r.value or b"")
                        continue
                    progressed = True
                    if self._take(consumer, topic, partitions, tp, r, plan, pos, advance, res, refetch, lost,
                                  on_record):
                        # The position moved (next range, refetch): the rest of this batch is read-ahead.
                        res.discarded_bytes += sum(len(x.value or b"") for x in recs[i + 1:])
                        break
            now = time.monotonic()
            if progressed:
                last_progress = now
            elif now - last_progress > self.stall_seconds:
                raise _Stalled(f"no record for {now - last_progress:.1f}s")

    def _take(self, consumer, topic, partitions, tp, r, plan, pos, advance, res: ReadResult, refetch, lost,
              on_record) -> bool:
        """Handle record ``r`` at or past pos[p]; True when the partition's position was moved."""
        p = tp.partition
        while pos[p] < r.offset:
            # Offsets missing from the log (compaction, aborted transactions): lost to Kafka.
            log.warning("offset %d of %s[%d] is not in the log", pos[p], topic, p)
            lost.append(shard_at(p, pos[p], partitions))
            if advance(p):
                return True
        shard = shard_at(p, r.offset, partitions)
        value = r.value or b""
        res.bytes += len(value)
        try:
            record = decode_record(memoryview(value))
            if record.shard != shard:
                raise RecordError(f"header says shard {record.shard}")
        except RecordError as exc:
            res.corrupt += 1
            n = refetch[(p, r.offset)] = refetch.get((p, r.offset), 0) + 1
            if n <= self.max_refetch:
                res.refetches += 1
                log.warning("shard %d at %s[%d]@%d rejected (%s); refetch %d/%d",
                            shard, topic, p, r.offset, exc, n, self.max_refetch)
                consumer.seek(tp, r.offset)
                return True
            log.error("shard %d at %s[%d]@%d still corrupt after %d refetches (%s); "
                      "it will be fetched from the server", shard, topic, p, r.offset, self.max_refetch, exc)
            lost.append(shard)
        else:
            res.records[shard] = record
            if on_record is not None:
                on_record(shard)
        return advance(p)
