"""Shard records in Kafka: publish both splits, republish after a broker lost them, tell readers where."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from hermes.common.clock import Clock
from hermes.common.messages import KafkaRanges
from hermes.server.engine.telemetry import Telemetry
from hermes.server.kafka_publish import KafkaOptions, publish_stores
from hermes.server.shardstore import ShardStore

log = logging.getLogger(__name__)


class KafkaPublisher:
    def __init__(self, train: ShardStore, validation: ShardStore, *, dataset: str, telemetry: Telemetry,
                 clock: Clock) -> None:
        self.train = train
        self.validation = validation
        self.dataset = dataset
        self.telemetry = telemetry
        self.clock = clock
        # Set by publish when a broker is configured: shard records then
        # travel through Kafka and the ZeroMQ data plane is the fallback.
        self.published: dict[str, Any] | None = None
        self.opts: KafkaOptions | None = None
        self._republishing = threading.Lock()
        self._last_publish = 0.0

    def publish(self, opts: KafkaOptions) -> None:
        """Write both splits into Kafka (blocking: run it in a thread before serving)."""
        try:
            import kafka  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the kafka extra is missing
            raise RuntimeError(
                f"the Kafka data plane needs kafka-python: pip install 'hermes-edge[kafka]' ({exc})"
            ) from None
        published = publish_stores(self.train, self.validation, dataset=self.dataset, opts=opts)
        self.opts = opts
        self._last_publish = self.clock.monotonic()
        self.published = {
            "bootstrap": opts.bootstrap,
            "train": published["train"].layout,
            "validation": published["validation"].layout,
            "reused": {k: v.reused for k, v in published.items()},
            "publish_seconds": round(sum(v.seconds for v in published.values()), 6),
        }
        self.telemetry.emit(
            "shards_published", bootstrap=opts.bootstrap, publish_seconds=self.published["publish_seconds"],
            **{split: v.layout.describe() | {"reused": v.reused} for split, v in published.items()},
        )

    def republish(self, reason: str, *, min_interval: float = 2.0) -> bool:
        """Publish the shards again in a background thread, e.g. after an agent found them gone
        (a broker that keeps data in memory restarted). The layout is deterministic, so every
        shard returns to the offset already assigned: agents read from Kafka again as soon as
        it is back, and the data plane serves meanwhile. False when not started (no Kafka,
        already running, or the last publish was less than ``min_interval`` seconds ago)."""
        opts, published_before = self.opts, self.published
        if opts is None or published_before is None or self.clock.monotonic() - self._last_publish < min_interval:
            return False
        if not self._republishing.acquire(blocking=False):
            return False

        def run() -> None:
            t0 = time.perf_counter()
            try:
                published = publish_stores(self.train, self.validation, dataset=self.dataset, opts=opts)
                same = all(published[k].layout == published_before[k] for k in ("train", "validation"))
                self.telemetry.emit("shards_republished", reason=reason, bootstrap=opts.bootstrap,
                                 seconds=round(time.perf_counter() - t0, 6), same_layout=same,
                                 reused={k: v.reused for k, v in published.items()})
            except Exception as exc:  # the broker may still be down; the next report tries again
                self.telemetry.emit("shards_republish_failed", reason=reason, bootstrap=opts.bootstrap,
                                 error=str(exc)[:500])
            finally:
                self._last_publish = self.clock.monotonic()
                self._republishing.release()

        threading.Thread(target=run, name="hermes-kafka-republish", daemon=True).start()
        return True

    def info(self) -> dict[str, Any]:
        p = self.published
        if p is None:
            return {"source": "zmq"}
        return {
            "source": "kafka", "bootstrap": p["bootstrap"],
            "publish_seconds": p["publish_seconds"], "reused": p["reused"],
            "topics": {split: p[split].describe() for split in ("train", "validation")},
        }

    def ranges(self, split: str, shards: Sequence[int]) -> KafkaRanges:
        """What a reader needs to fetch these shards from Kafka (source "zmq" without a broker)."""
        p = self.published
        if p is None:
            return KafkaRanges()
        layout = p[split]
        return KafkaRanges(source="kafka", bootstrap=p["bootstrap"], topic=layout.topic,
                           partitions=layout.partitions, ranges=layout.ranges_for(shards),
                           max_record_bytes=layout.max_record_bytes)
