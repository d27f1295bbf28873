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
from hermes.client.shard_fetch import ShardFetcher, ShardStats, records_to_tensors
from hermes.client.transport import DataClient
from hermes.common.messages import CycleReport, Reply, ReportStats, RequestWork, WorkReply, parse_reply, request_body
from hermes.common.shards import ShardRecord
from hermes.common.wire import ErrorCode, MsgType, ProtocolError

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
    # A federated evaluation round to answer before training (WorkReply.federated_round).
    federated_round: int | None = None
    # The server's id of the assignment, named in this cycle's report (CycleReport.assignment).
    assignment: int | None = None


@dataclass(frozen=True)
class StopSignal:
    reason: str
    error: BaseException | None = None


class Prefetcher:
    """Prepares the next assignment while the trainer works: its shards fetched, or (device-local
    data, ``source: "local"``) ``local_samples`` samples drawn from ``local``."""

    def __init__(self, client_factory, *, depth: int = 1, max_refetch: int = 3, stats: ShardStats | None = None,
                 kafka_bootstrap: str | None = None, reader_options: dict | None = None,
                 local: LocalSet | None = None, combine: bool = False,
                 carried: Callable[[], tuple[list[CycleReport] | None, ReportStats | None]] | None = None,
                 assignments: int = 1) -> None:
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
                request = RequestWork()
                if self.combine:
                    cycles, stats = self.carried() if self.carried else (None, None)
                    request = RequestWork(inline_shards=True, assignments=self.assignments, cycles=cycles, stats=stats)
                reply = self.client.request(MsgType.REQUEST_WORK, request_body(request))
                if parse_reply(Reply, reply.header.body, "WORK").stop:
                    self._put(StopSignal("server asked to stop"))
                    return
                first = WorkReply.from_body(reply.header.body)
                # Several assignments (``then``), their records inline when the reply carries them.
                works = [first, *(first.then or [])]
                inline: tuple[dict[int, ShardRecord], int] | None = None
                if first.lengths is not None:
                    inline = self.fetcher.from_reply([s for w in works for s in w.shards], reply, first.lengths)
                for i, assignment in enumerate(works):
                    work = self._fetch(assignment, None if inline is None else (inline[0], inline[1] if i == 0 else 0))
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

    def _fetch(self, work: WorkReply, inline: tuple[dict[int, ShardRecord], int] | None = None) -> Work | None:
        """The assignment's records: from the WORK reply itself when it carried them (``inline``:
        the records by shard and the bytes to count for this assignment)."""
        assert self.fetcher is not None
        if work.data.source == "local":
            return self._draw(work)
        if inline is not None and work.shards:
            records, nbytes = [inline[0][s] for s in work.shards], inline[1]
        elif work.shards:
            fetched = self.fetcher.fetch(work.shards, work.data, "train")
            if fetched is None:
                return None
            records, nbytes = fetched
        else:
            records, nbytes = [], 0  # the samples carried over from the last cycle cover this one
        samples = records_to_tensors(records)
        self.fetched_bytes += nbytes
        return Work(
            epoch=work.epoch,
            shards=tuple(work.shards),
            x=None if samples is None else samples[0],
            y=None if samples is None else samples[1],
            batch_size=work.batch_size,
            lr=work.lr,
            fetched_bytes=nbytes,
            cycle_samples=work.cycle_samples or None,
            accumulation=work.accumulation,
            federated_round=work.federated_round,
            assignment=work.assignment,
        )

    def _draw(self, work: WorkReply) -> Work:
        """Device-local data: the server sized the cycle (``local_samples``); no byte crosses the network."""
        if self.local is None:
            raise LocalDataError("the server assigns device-local samples but this agent's task has no local_data")
        n = work.local_samples
        if n is None:
            raise ProtocolError(ErrorCode.MALFORMED, "server's WORK reply: source 'local' without 'local_samples'")
        x, y = self.local.draw(n)
        return Work(epoch=work.epoch, shards=(), x=x, y=y, batch_size=work.batch_size,
                    lr=work.lr, fetched_bytes=0, cycle_samples=n, accumulation=work.accumulation,
                    federated_round=work.federated_round, assignment=work.assignment)
