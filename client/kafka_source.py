"""Read assigned shard records from Kafka: explicit partitions, seek, no consumer group.

An assignment names ``[partition, start, end)`` offset ranges of one topic
(layout in :mod:`hermes.common.kafka_layout`). :class:`KafkaShardReader`
assigns those partitions to a group-less consumer (no offsets are committed),
seeks each to its first range and reads exactly the assigned offsets, across
partitions at once. Every record is verified: ``decode_record`` checks the
HSR1 magic, layout and CRC32C of the array bytes, and the shard id in its
header must be the one the layout puts at that offset.

Failures never lose or duplicate a shard. What could not be read from Kafka
is returned in ``ReadResult.missing`` (the prefetcher then fetches exactly
those shard ids over the ZeroMQ data plane):

- a corrupt record is logged and refetched (re-seek) up to ``max_refetch``
  times, then given up on;
- a broker that stops answering mid-read (restart, network) makes the read
  stall; after ``stall_seconds`` the consumer is rebuilt (bounded retries
  with exponential backoff) and reading resumes at the next unread assigned
  offset, so records already read are not read again;
- data that is not there (a broker that kept it in memory restarted, a topic
  deleted) is waited for ``missing_grace`` seconds (time for a republish),
  then reported missing;
- a broker that cannot be reached within the retry budget is reported with
  its bootstrap address (:class:`KafkaUnavailable` from :meth:`connect`).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hermes.client.kafka_lane import KafkaLane, ReadResult
from hermes.common.kafka_layout import validate_ranges

log = logging.getLogger(__name__)


class KafkaShardReader:
    """Reads assignments of shard records; one thread calls it.

    Ranges are read by up to ``parallel`` consumers at once, partition ``p``
    always by lane ``p % parallel``. One consumer would do, but a broker
    answers a fetch of several partitions with what fits in ``fetch_max_bytes``
    (Tansu: from the first partition only, it ignores the per-partition
    limit), so assignments of scattered single records cost one round trip
    per record; lanes overlap those round trips.
    """

    def __init__(self, bootstrap: str, *, parallel: int = 4, **options) -> None:
        self.bootstrap = bootstrap
        self.parallel = max(1, parallel)
        options.pop("client_id", None)
        self.options = options
        self.max_refetch = options.get("max_refetch", 2)
        self.should_stop = options.get("should_stop") or (lambda: False)
        self._lanes: dict[int, KafkaLane] = {}
        self._pool: ThreadPoolExecutor | None = None
        self._callback_lock = threading.Lock()

    def _lane(self, i: int) -> KafkaLane:
        lane = self._lanes.get(i)
        if lane is None:
            lane = self._lanes[i] = KafkaLane(self.bootstrap, client_id=f"hermes-agent-{i}", **self.options)
        return lane

    def connect(self, max_record_bytes: int | None = None):
        """Connect the first lane; KafkaUnavailable (naming the address) after the retry budget."""
        return self._lane(0).connect(max_record_bytes)

    def close(self) -> None:
        for lane in self._lanes.values():
            lane.close()
        self._lanes.clear()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def read(self, topic: str, partitions: int, ranges, *, max_record_bytes: int | None = None,
             on_record: Callable[[int], None] | None = None) -> ReadResult:
        """Read every assigned offset once; what could not be read is in ``missing``."""
        plans: dict[int, dict[int, deque[list[int]]]] = {}
        for p, s, e in sorted(validate_ranges(ranges, partitions)):
            plans.setdefault(p % self.parallel, {}).setdefault(p, deque()).append([s, e])
        if on_record is not None:
            callback = on_record

            def on_record(shard: int) -> None:  # lanes report one at a time
                with self._callback_lock:
                    callback(shard)

        def run(i: int) -> ReadResult:
            return self._lane(i).read(topic, partitions, plans[i], max_record_bytes=max_record_bytes,
                                      on_record=on_record)

        if len(plans) <= 1:
            results = [run(i) for i in plans]
        else:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="hermes-kafka")
            for i in plans:
                self._lane(i)  # created here, not racing in the pool
            results = list(self._pool.map(run, list(plans)))
        return _merge(results)


def _merge(results: list[ReadResult]) -> ReadResult:
    out = ReadResult()
    for r in results:
        out.records.update(r.records)
        out.bytes += r.bytes
        out.discarded_bytes += r.discarded_bytes
        out.missing.extend(r.missing)
        out.corrupt += r.corrupt
        out.refetches += r.refetches
        out.reconnects += r.reconnects
        if r.failure_kind is not None:
            out.fail(r.failure_kind, r.failure or "")
    out.missing.sort()
    return out
