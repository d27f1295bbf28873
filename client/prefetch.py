"""Double-buffered shard prefetching.

A background thread asks the server for the next assignment and fetches its
shards while the trainer works on the current one; the queue holds one
ready assignment, so at most two are in the agent at a time. The time the
trainer spends waiting on the queue is the prefetch wait we report.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass

import numpy as np

from hermes.client.transport import DataClient
from hermes.common.shards import RecordError, decode_record
from hermes.common.wire import MsgType

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Work:
    epoch: int
    shards: tuple[int, ...]
    x: np.ndarray
    y: np.ndarray
    batch_size: int
    lr: float
    fetched_bytes: int


@dataclass(frozen=True)
class StopSignal:
    reason: str
    error: BaseException | None = None


class Prefetcher:
    def __init__(self, client_factory, *, depth: int = 1, max_refetch: int = 3) -> None:
        self._client_factory = client_factory
        self._queue: queue.Queue[Work | StopSignal] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hermes-prefetch", daemon=True)
        self.max_refetch = max_refetch
        self.wait_seconds = 0.0
        self.fetched_bytes = 0
        self.client: DataClient | None = None

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
        self._thread.join(timeout=10)

    def next(self) -> Work | StopSignal:
        t0 = time.perf_counter()
        item = self._queue.get()
        self.wait_seconds += time.perf_counter() - t0
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
            while not self._stop.is_set():
                reply = self.client.request(MsgType.REQUEST_WORK, {})
                body = reply.header.body
                if body.get("stop"):
                    self._put(StopSignal("server asked to stop"))
                    return
                self._put(self._fetch(body))
        except Exception as exc:  # surfaced to the training loop, which decides
            log.debug("prefetcher stopped by %r", exc)
            self._put(StopSignal(f"prefetch failed: {exc}", exc))
        finally:
            if self.client is not None:
                self.client.close()

    def _fetch(self, body: dict) -> Work:
        assert self.client is not None
        xs, ys, nbytes = [], [], 0
        for shard in body["shards"]:
            for attempt in range(self.max_refetch + 1):
                reply = self.client.request(MsgType.FETCH_SHARD, {"shard": int(shard)})
                raw = reply.payload.flat().numpy() if reply.payload is not None else b""
                nbytes += len(raw)
                try:
                    record = decode_record(memoryview(raw))
                    if record.shard != int(shard):
                        raise RecordError(f"asked for shard {shard}, got shard {record.shard}")
                    break
                except RecordError as exc:
                    log.warning("shard %s rejected (%s); refetch %d/%d", shard, exc, attempt + 1, self.max_refetch)
            else:
                raise RecordError(f"shard {shard} corrupt after {self.max_refetch} refetches")
            xs.append(record.x)
            ys.append(record.y)
        self.fetched_bytes += nbytes
        return Work(
            epoch=int(body["epoch"]),
            shards=tuple(int(s) for s in body["shards"]),
            x=np.concatenate(xs) if len(xs) > 1 else xs[0],
            y=np.concatenate(ys) if len(ys) > 1 else ys[0],
            batch_size=int(body["batch_size"]),
            lr=float(body["lr"]),
            fetched_bytes=nbytes,
        )
