"""Write a data set's shard records into Kafka topics, once.

Each split (train, validation) goes to its own topic with the deterministic
round-robin layout of :mod:`hermes.common.kafka_layout` (shard i -> partition
i % P, offset i // P). The records are the exact shard-record bytes (HSR1 magic, format 2) the ZeroMQ data
plane serves. Publishing is idempotent: a topic whose name (data set, split,
P, content fingerprint) exists and holds every record is reused as is; an
empty one (a broker that lost its in-memory data and auto-created the name
again) is filled; anything else (partial, wrong partition count) is deleted
and written afresh.

Used by the server's lifespan (``hermes-server --kafka HOST:PORT``) and by
the stand-alone step ``hermes-server shards publish``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from hermes.common.kafka_layout import (
    KafkaUnavailable,
    TopicLayout,
    connect_with_retries,
    fingerprint,
    location,
    partition_counts,
    topic_name,
)

log = logging.getLogger(__name__)

# Bytes a Kafka record batch adds around one value (batch header, record
# framing, key): generous, used to size requests and fetches.
RECORD_OVERHEAD = 1024
_DEFAULT_MAX_MESSAGE = 1_000_000


class PublishError(RuntimeError):
    """The topic could not be brought into the expected layout."""


@dataclass(frozen=True)
class Published:
    layout: TopicLayout
    reused: bool
    seconds: float


@dataclass(frozen=True)
class KafkaOptions:
    bootstrap: str
    partitions: int = 4
    retries: int = 5
    backoff: float = 0.5
    # Per attempt: how long kafka-python may try to bootstrap.
    connect_timeout: float = 3.0

    def common(self) -> dict:
        return {
            "bootstrap_servers": self.bootstrap,
            "client_id": "hermes-publisher",
            "bootstrap_timeout_ms": int(self.connect_timeout * 1000),
            "request_timeout_ms": max(5000, int(self.connect_timeout * 2000)),
            "reconnect_backoff_max_ms": 1000,
        }


def wait_for_broker(opts: KafkaOptions) -> None:
    """Return once the broker answers metadata; KafkaUnavailable (naming it) after the retry budget."""
    from kafka import KafkaAdminClient

    admin = connect_with_retries(
        opts.bootstrap, lambda: KafkaAdminClient(**opts.common()), retries=opts.retries,
        backoff=opts.backoff, what="admin client", log=log,
    )
    try:
        admin.list_topics()
    finally:
        admin.close()


class RecordSource(Protocol):
    """Shard records by id, produced on demand (a ShardStore): never all held at once."""

    @property
    def num_shards(self) -> int: ...

    def record(self, shard: int) -> bytes: ...


class _Listed:
    def __init__(self, records: Sequence[bytes]) -> None:
        self.records = records

    @property
    def num_shards(self) -> int:
        return len(self.records)

    def record(self, shard: int) -> bytes:
        return self.records[shard]


def publish_split(records: Sequence[bytes] | RecordSource, *, dataset: str, split: str,
                  opts: KafkaOptions) -> Published:
    """Publish one split's records (shard i at index i); return where they lie.

    ``records`` is a list, or a source encoding them on demand: a split
    larger than memory is read twice (the fingerprint names the topic before
    anything is sent), one record at a time.
    """
    from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer
    from kafka.admin import NewTopic
    from kafka.errors import (
        KafkaError,
        TopicAlreadyExistsError,
        UnknownTopicOrPartitionError,
    )

    source: RecordSource = _Listed(records) if isinstance(records, Sequence) else records
    n = source.num_shards
    if not n:
        raise PublishError(f"{dataset}/{split}: no records to publish")
    t0 = time.perf_counter()
    P = opts.partitions
    lengths: list[int] = []

    def measured() -> Iterator[bytes]:
        for i in range(n):
            rec = source.record(i)
            lengths.append(len(rec))
            yield rec

    digest = fingerprint(measured())
    topic = topic_name(dataset, split, P, digest)
    max_rec = max(lengths)
    layout = TopicLayout(topic=topic, partitions=P, num_shards=n, fingerprint=digest,
                         max_record_bytes=max_rec, total_bytes=sum(lengths))
    counts = partition_counts(n, P)
    message_bytes = max(_DEFAULT_MAX_MESSAGE, max_rec + RECORD_OVERHEAD)

    admin = connect_with_retries(opts.bootstrap, lambda: KafkaAdminClient(**opts.common()), retries=opts.retries,
                                 backoff=opts.backoff, what="admin client", log=log)
    consumer = None
    try:
        consumer = connect_with_retries(
            opts.bootstrap,
            lambda: KafkaConsumer(**opts.common(), group_id=None, enable_auto_commit=False,
                                  allow_auto_create_topics=False, fetch_max_bytes=message_bytes + RECORD_OVERHEAD,
                                  max_partition_fetch_bytes=message_bytes + RECORD_OVERHEAD),
            retries=opts.retries, backoff=opts.backoff, what="consumer", log=log,
        )
        configs = {"max.message.bytes": str(message_bytes)} if message_bytes > _DEFAULT_MAX_MESSAGE else {}
        # Readers of a broker that lost its data (Tansu restarted) can make it
        # auto-create the name again at any moment, hence a loop.
        for _ in range(4):
            state = _topic_state(admin, consumer, topic)
            if state is None:
                try:
                    admin.create_topics([NewTopic(topic, P, 1, topic_configs=configs)])
                    break
                except TopicAlreadyExistsError:
                    continue  # created meanwhile: look again
            parts, begins, ends = state
            if parts == P and begins == [0] * P and ends == counts and _tail_matches(consumer, topic, source, P):
                log.info("topic %s already holds %d shard records of %s/%s; reusing it",
                         topic, n, dataset, split)
                return Published(layout, True, time.perf_counter() - t0)
            if parts >= P and ends[:P] == [0] * P:
                # Empty, e.g. auto-created by a reader after a restart: partitions
                # beyond P (a broker default) stay unused.
                log.info("topic %s exists but is empty; publishing into it", topic)
                break
            log.warning("topic %s exists with %d partitions and end offsets %s (want %d, %s); recreating it",
                        topic, parts, ends, P, counts)
            try:
                admin.delete_topics([topic])
            except UnknownTopicOrPartitionError:
                pass
            _wait_gone(admin, topic)
        else:
            raise PublishError(f"could not bring topic {topic} on {opts.bootstrap} into shape "
                               f"(something keeps recreating it)")
        producer = connect_with_retries(
            opts.bootstrap,
            lambda: KafkaProducer(**opts.common(), acks="all", linger_ms=5, retries=5,
                                  # One request in flight: a retried batch cannot overtake
                                  # the next one, so offsets follow shard order.
                                  max_in_flight_requests_per_connection=1,
                                  max_request_size=message_bytes + RECORD_OVERHEAD,
                                  # One record per batch. Tansu 0.6 reports a partition's end
                                  # offset as base + 1 after a multi-record batch (seen here:
                                  # 10 records, end offset 1), which would hide records from
                                  # every end-offset check; single-record batches keep it exact.
                                  batch_size=1),
            retries=opts.retries, backoff=opts.backoff, what="producer", log=log,
        )
        try:
            futures = [producer.send(topic, key=str(i).encode(), value=source.record(i), partition=i % P)
                       for i in range(n)]
            producer.flush()
            for i, fut in enumerate(futures):
                md = fut.get(timeout=30)
                if (md.partition, md.offset) != location(i, P):
                    raise PublishError(
                        f"shard {i} of {topic} landed at partition {md.partition} offset {md.offset}, "
                        f"expected {location(i, P)}: another producer is writing to this topic"
                    )
        except KafkaError as exc:
            raise KafkaUnavailable(opts.bootstrap, f"publishing {topic} to Kafka broker at {opts.bootstrap} "
                                                   f"failed: {type(exc).__name__}: {exc}") from exc
        finally:
            producer.close(timeout=10)
        seconds = time.perf_counter() - t0
        log.info("published %d shard records (%.1f MB) of %s/%s to %s (%d partitions) in %.2fs",
                 n, layout.total_bytes / 1e6, dataset, split, topic, P, seconds)
        return Published(layout, False, seconds)
    finally:
        if consumer is not None:
            consumer.close()
        admin.close()


def _topic_state(admin, consumer, topic: str) -> tuple[int, list[int], list[int]] | None:
    """(partitions, beginning offsets, end offsets) of an existing topic, or None."""
    from kafka import TopicPartition

    if topic not in admin.list_topics():
        return None
    desc = admin.describe_topics([topic])
    parts = len(desc[0]["partitions"]) if desc else 0
    tps = [TopicPartition(topic, p) for p in range(parts)]
    begins = consumer.beginning_offsets(tps)
    ends = consumer.end_offsets(tps)
    return parts, [begins[tp] for tp in tps], [ends[tp] for tp in tps]


def _tail_matches(consumer, topic: str, records: RecordSource, P: int) -> bool:
    """The last record of every partition is the one this layout puts there."""
    from kafka import TopicPartition

    want = {}
    n = records.num_shards
    for p in range(min(P, n)):
        last = max(range(p, n, P))
        want[p] = (last // P, records.record(last))
    tps = [TopicPartition(topic, p) for p in want]
    consumer.assign(tps)
    for tp in tps:
        consumer.seek(tp, want[tp.partition][0])
    got: dict[int, bytes] = {}
    deadline = time.monotonic() + 10
    while len(got) < len(want) and time.monotonic() < deadline:
        for tp, recs in consumer.poll(timeout_ms=500).items():
            for r in recs:
                if r.offset == want[tp.partition][0]:
                    got[tp.partition] = r.value
    consumer.assign([])
    return all(got.get(p) == rec for p, (_, rec) in want.items())


def _wait_gone(admin, topic: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while topic in admin.list_topics():
        if time.monotonic() > deadline:
            raise PublishError(f"topic {topic} still exists {timeout:.0f}s after deleting it")
        time.sleep(0.1)


def publish_stores(train_store, validation_store, *, dataset: str, opts: KafkaOptions) -> dict[str, Published]:
    """Both splits of a run; the stores encode the records on demand (and keep a few)."""
    out = {}
    for split, store in (("train", train_store), ("validation", validation_store)):
        out[split] = publish_split(store, dataset=dataset, split=split, opts=opts)
    return out
